"""Plan loading: each bad-plan class gives a clear error naming the field, and writes nothing."""

import json
from pathlib import Path

import pytest

from activities.catalog import spec_registry
from helpers.ledger import LedgerRecord
from tidemark.actions import Action, Arg, ProbeResult, Registry, StepContext
from tidemark.errors import PlanChanged, PlanError
from tidemark.plan import load_plan, load_plan_file

REG = spec_registry(LedgerRecord)


def rename(path: str = "/d/a.txt", name: str = "b.txt") -> dict:
    return {"action": "fs.rename", "args": {"path": path, "name": name}}


def record(entry: str = "x") -> dict:
    return {"action": "ledger.record", "args": {"ledger": "/tmp/l", "entry": entry}}


@pytest.mark.parametrize(("doc", "field", "words"), [
    ([], "plan", "must be a JSON object"),
    ({"steps": []}, "steps", "empty"),
    ({"steps": "x"}, "steps", "list"),
    ({"steps": [rename()], "owner": "me"}, "owner", "unknown top-level field"),
    ({"steps": [42]}, "steps[0]", "must be an object"),
    ({"steps": [{"args": {}}]}, "steps[0].action", "non-empty string"),
    ({"steps": [rename(), {"action": "fs.delete", "args": {}}]}, "steps[1].action",
     "unknown action 'fs.delete'"),
    ({"steps": [{"action": "drive.append_suffix", "args": {}}]}, "steps[0].action", "delta"),
    ({"steps": [{"action": "fs.rename", "args": {"path": "/d/a"}}]}, "steps[0].args.name",
     "requires 'name'"),
    ({"steps": [{"action": "fs.rename", "args": {"path": "/d/a", "name": 7}}]},
     "steps[0].args.name", "must be string, got int"),
    ({"steps": [{"action": "fs.rename", "args": {"path": "rel/a", "name": "b"}}]},
     "steps[0].args.path", "absolute"),
    ({"steps": [{"action": "fs.rename", "args": {"path": "/d/a", "name": "x/y"}}]},
     "steps[0].args.name", "without '/'"),
    ({"steps": [{"action": "fs.rename", "args": {"path": "/d/a", "name": "b", "mode": 1}}]},
     "steps[0].args.mode", "takes no argument 'mode'"),
    ({"steps": [{"action": "fs.rename", "args": ["/d/a", "b"]}]}, "steps[0].args",
     "must be an object"),
    ({"steps": [rename()], "task_id": "has space"}, "task_id", "letters, digits"),
    ({"steps": [rename()], "task_id": 5}, "task_id", "letters, digits"),
    ({"steps": [{"action": "fs.rename", "args": {"path": "/d/a", "name": "b"}, "when": 1}]},
     "steps[0].when", "unknown field"),
])
def test_bad_plans_name_the_field(doc: object, field: str, words: str) -> None:
    with pytest.raises(PlanError) as e:
        load_plan(doc, REG)
    assert e.value.field == field
    assert words in e.value.message


def test_bool_is_not_an_integer() -> None:
    doc = {"steps": [{"action": "ledger.record",
                      "args": {"ledger": "/l", "entry": "e", "hold_s": True}}]}
    with pytest.raises(PlanError, match="must be integer or number, got bool"):
        load_plan(doc, REG)


def test_steps_are_numbered_from_one_and_task_id_derived_from_hash() -> None:
    plan = load_plan({"steps": [rename(), rename("/d/c.txt", "d.txt")]}, REG)
    assert [s.number for s in plan.steps] == [1, 2]
    assert plan.task_id == "plan-" + plan.plan_hash[:16]
    same = load_plan({"steps": [rename(), rename("/d/c.txt", "d.txt")]}, REG)
    assert same.task_id == plan.task_id


def test_ordering_lint_names_the_first_offending_pair() -> None:
    doc = {"steps": [rename(), record("a"), rename("/d/c.txt", "d.txt"), record("b"),
                     rename("/d/e.txt", "f.txt")]}
    with pytest.raises(PlanError) as e:
        load_plan(doc, REG)
    assert e.value.field == "steps[2]"
    assert "reversible step 3 (fs.rename) comes after irreversible step 2" in e.value.message


def test_sort_gives_the_stable_reorder() -> None:
    doc = {"steps": [rename(), record("a"), rename("/d/c.txt", "d.txt"), record("b"),
                     rename("/d/e.txt", "f.txt")]}
    plan = load_plan(doc, REG, sort=True)
    assert [(s.action, s.args.get("entry") or s.args["name"]) for s in plan.steps] == [
        ("fs.rename", "b.txt"), ("fs.rename", "d.txt"), ("fs.rename", "f.txt"),
        ("ledger.record", "a"), ("ledger.record", "b")]


def test_plan_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read"):
        load_plan_file(tmp_path / "missing.json", REG)
    bad = tmp_path / "bad.json"
    bad.write_text('{"steps": [}')
    with pytest.raises(PlanError, match=r"not JSON.*line 1"):
        load_plan_file(bad, REG)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"task_id": "t-1", "steps": [rename()]}))
    assert load_plan_file(good, REG).task_id == "t-1"


def test_an_action_without_a_probe_cannot_be_registered() -> None:
    class Blind(Action):
        name = "blind.send"
        irreversible = True
        args: dict[str, Arg] = {}

        def execute(self, ctx: StepContext) -> dict:
            return {}

    with pytest.raises(TypeError, match="without a probe cannot be registered"):
        Registry([Blind])


def test_a_reversible_action_needs_compensate() -> None:
    class NoUndo(Action):
        name = "x.set"
        irreversible = False
        args: dict[str, Arg] = {}

        def probe(self, ctx: StepContext) -> ProbeResult:
            return ProbeResult.absent("never")

        def execute(self, ctx: StepContext) -> dict:
            return {}

    with pytest.raises(TypeError, match="must implement compensate"):
        Registry([NoUndo])


def test_persisting_a_changed_plan_under_the_same_task_is_refused(store) -> None:
    plan = load_plan({"task_id": "t-1", "steps": [rename()]}, REG)
    assert store.persist_plan(plan) is True
    assert store.persist_plan(plan) is False  # same hash: a no-op
    changed = load_plan({"task_id": "t-1", "steps": [rename(name="other.txt")]}, REG)
    with pytest.raises(PlanChanged) as e:
        store.persist_plan(changed)
    assert e.value.stored_hash == plan.plan_hash
    assert store.load_plan("t-1") == plan  # the stored plan is untouched


def test_a_bad_plan_writes_nothing(store) -> None:
    with pytest.raises(PlanError):
        load_plan({"task_id": "t-2", "steps": [rename(), {"action": "nope", "args": {}}]}, REG)
    with store._conn() as conn:
        counts = conn.execute("SELECT (SELECT count(*) FROM tidemark.plans) AS p,"
                              " (SELECT count(*) FROM tidemark.events) AS e").fetchone()
    assert counts == {"p": 0, "e": 0}


def test_a_stored_plan_reads_back_as_it_was_written_whatever_its_arguments_hold(store) -> None:
    """A stored plan reads back as it was written, whatever its arguments hold.

    Every step's arguments go to Postgres in one statement, as arrays. An argument with the
    characters an array literal is made of (quotes, backslashes, braces, commas), with unicode or
    with nothing in it comes back equal, and so does a plan of many steps."""
    awkward = ['a "quoted", {braced} name.txt', "back\\slash.txt", "NULL", "é 雪 ✓.txt", "{}",
               '{"a": [1, 2]}']
    steps = [rename(path=f"/d/{i}.txt", name=name) for i, name in enumerate(awkward)]
    steps += [record(entry=entry) for entry in ("", "tab\tand\nnewline", "\\\"", "NULL")]
    steps += [record(entry=f"line {i}") for i in range(500)]
    plan = load_plan({"task_id": "t-awkward", "steps": steps}, REG)
    assert store.persist_plan(plan) is True
    assert store.load_plan("t-awkward") == plan
    assert store.persist_plan(plan) is False  # its hash is the stored one
