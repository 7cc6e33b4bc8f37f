"""Plans: loading with clear errors, the canonical form and its hash, and the ordering lint.

A plan file is JSON::

    {"task_id": "supplier-sync-2026-11-30",
     "steps": [{"action": "fs.rename",
                "args": {"path": "/abs/dir/draft.txt", "name": "final.txt"}}]}

``task_id`` is optional; without it the task id is derived from the plan's hash, so the same plan
file started twice is the same task. Steps are numbered from 1 and the number goes into the key.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemark.actions import DELTA_VERBS, Registry
from tidemark.errors import PlanError

TASK_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # also a CHECK in the schema
MAX_STEPS = 100_000  # far beyond any agent plan; keeps a typo'd generator from filling the journal


@dataclass(frozen=True)
class Step:
    number: int
    action: str
    args: dict[str, Any]
    irreversible: bool

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action, "args": self.args}


@dataclass(frozen=True)
class Plan:
    task_id: str
    steps: tuple[Step, ...]
    series: str | None = None  # runs of one series are ordered (tidemark.series)

    @property
    def plan_hash(self) -> str:
        return _hash_of(self.series, self.steps)

    def canonical(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"task_id": self.task_id}
        if self.series is not None:
            doc["series"] = self.series
        return {**doc, "steps": [s.as_json() for s in self.steps]}

    def step(self, number: int) -> Step:
        if not 1 <= number <= len(self.steps):
            raise PlanError("step", f"task {self.task_id!r} has steps 1..{len(self.steps)}, "
                                    f"not {number}")
        return self.steps[number - 1]


def _hash_of(series: str | None, steps: tuple[Step, ...]) -> str:
    """The plan hash: over the steps alone, or over series and steps when a series is named
    (so a plan without a series keeps the hash it always had)."""
    listed = [s.as_json() for s in steps]
    return plan_hash(listed if series is None else {"series": series, "steps": listed})


def plan_hash(steps: list[dict[str, Any]] | dict[str, Any]) -> str:
    """sha256 over the canonical JSON of the steps (sorted keys, no spaces)."""
    text = json.dumps(steps, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def load_plan_file(path: str | Path, registry: Registry, *, sort: bool = False) -> Plan:
    """Reads and validates a plan file. Raises PlanError naming the bad field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PlanError("file", f"cannot read {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError("file", f"{path} is not JSON: {e.msg} at line {e.lineno} column {e.colno}"
                        ) from None
    return load_plan(data, registry, sort=sort)


def load_plan(data: Any, registry: Registry, *, sort: bool = False) -> Plan:
    """Validates a plan document and returns the Plan.

    Args:
        data: The parsed JSON document.
        registry: The actions that may appear in it.
        sort: Reorder steps stably so that every irreversible step comes after every reversible
            one, instead of refusing an interleaved plan.

    Raises:
        PlanError: The plan is malformed; ``field`` names the first offending place.
    """
    if not isinstance(data, dict):
        raise PlanError("plan", f"must be a JSON object, got {type(data).__name__}")
    extra = sorted(set(data) - {"task_id", "series", "steps"})
    if extra:
        raise PlanError(extra[0], "unknown top-level field (a plan has task_id, series and "
                                  "steps)")
    series = data.get("series")
    if series is not None and (not isinstance(series, str) or not TASK_ID_RE.fullmatch(series)):
        raise PlanError("series", "must be 1-128 characters of letters, digits and . _ : -, "
                                  "starting with a letter or digit")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list):
        raise PlanError("steps", "must be a list of steps")
    if not raw_steps:
        raise PlanError("steps", "the plan is empty")
    if len(raw_steps) > MAX_STEPS:
        raise PlanError("steps", f"{len(raw_steps)} steps; at most {MAX_STEPS}")
    parsed = [_load_step(i, raw, registry) for i, raw in enumerate(raw_steps)]
    if sort:
        parsed = sorted(parsed, key=lambda s: s[2])  # stable: reversible first, order kept
    else:
        _check_order(parsed)
    steps = tuple(Step(n, action, args, irr) for n, (action, args, irr) in
                  enumerate(parsed, start=1))
    task_id = data.get("task_id")
    if task_id is None:
        task_id = "plan-" + _hash_of(series, steps)[:16]
    elif not isinstance(task_id, str) or not TASK_ID_RE.fullmatch(task_id):
        raise PlanError("task_id", "must be 1-128 characters of letters, digits and . _ : -, "
                                   "starting with a letter or digit")
    return Plan(task_id, steps, series)


def _check_text(value: Any, where: str) -> None:
    """Refuses strings that cannot be stored or hashed: NUL (Postgres text and jsonb refuse
    it) and lone surrogates (not encodable as UTF-8), anywhere in the step."""
    if isinstance(value, str):
        if "\x00" in value:
            raise PlanError(where, "contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise PlanError(where, "contains a lone surrogate (invalid Unicode)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, f"{where} (a key)")
            _check_text(v, f"{where}.{k}")
    elif isinstance(value, list):
        for j, v in enumerate(value):
            _check_text(v, f"{where}[{j}]")


def _load_step(i: int, raw: Any, registry: Registry) -> tuple[str, dict[str, Any], bool]:
    where = f"steps[{i}]"
    if not isinstance(raw, dict):
        raise PlanError(where, f"must be an object, got {type(raw).__name__}")
    _check_text(raw, where)
    extra = sorted(set(raw) - {"action", "args"})
    if extra:
        raise PlanError(f"{where}.{extra[0]}", "unknown field (a step has action and args)")
    action = raw.get("action")
    if not isinstance(action, str) or not action:
        raise PlanError(f"{where}.action", "must be a non-empty string")
    verb = action.rsplit(".", 1)[-1]
    if verb in DELTA_VERBS:
        raise PlanError(f"{where}.action",
                        f"{action!r} is a delta ({verb}); write the end state instead, "
                        "e.g. rename to the final name, so that applying it twice is harmless")
    spec = registry.spec(action)
    if spec is None:
        raise PlanError(f"{where}.action",
                        f"unknown action {action!r}; known: {', '.join(registry.names())}")
    args = spec.validate_args(raw.get("args"), f"{where}.args")
    return action, args, spec.irreversible


def _check_order(parsed: list[tuple[str, dict[str, Any], bool]]) -> None:
    first_irreversible = next((i for i, p in enumerate(parsed) if p[2]), None)
    if first_irreversible is None:
        return
    for j in range(first_irreversible + 1, len(parsed)):
        if not parsed[j][2]:
            raise PlanError(
                f"steps[{j}]",
                f"reversible step {j + 1} ({parsed[j][0]}) comes after irreversible step "
                f"{first_irreversible + 1} ({parsed[first_irreversible][0]}); put irreversible "
                "steps last (`tidemark plan check --sort` gives the stable reorder)")
