"""Plans: loading with clear errors, the canonical form and its hash, and the ordering lint.

A plan file is JSON::

    {"task_id": "supplier-sync-2026-11-30",
     "steps": [{"action": "fs.rename",
                "args": {"path": "/abs/dir/draft.txt", "name": "final.txt"}}]}

``task_id`` is optional; without it the task id is derived from the plan's hash, so the same plan
file started twice is the same task. Steps are numbered from 1 and the number goes into the key.

``approval`` is optional: ``{"required": true}`` makes every irreversible step wait for a
person, whatever the operator's policy says (tidemark/approval.py). A plan can ask for more
approval, never for less, and cannot name approvers: who may approve is the operator's. It is
part of the plan hash.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemark.actions import DELTA_VERBS, Registry
from tidemark.errors import ActionUnavailable, InputError, PlanError
from tidemark.limits import (
    ACTION_MAX,
    ID_RE,
    ID_RULE,
    PLAN_BYTES_MAX,
    bad_character,
    check_id,
    decode_json,
)

TASK_ID_RE = ID_RE  # the schema's CHECK of plans.task_id (tidemark.limits)
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
    # {"required": True} when the plan asks a person to approve every irreversible step; None
    # otherwise (also for {"required": false}: the operator's policy decides).
    approval: dict[str, Any] | None = None
    series: str | None = None  # runs of one series are ordered (tidemark.series)

    @property
    def plan_hash(self) -> str:
        return plan_hash([s.as_json() for s in self.steps], self.approval, self.series)

    def canonical(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"task_id": self.task_id}
        if self.series is not None:
            doc["series"] = self.series
        doc["steps"] = [s.as_json() for s in self.steps]
        if self.approval is not None:
            doc["approval"] = self.approval
        return doc

    @property
    def first_irreversible(self) -> int | None:
        return next((s.number for s in self.steps if s.irreversible), None)

    def step(self, number: int) -> Step:
        if not 1 <= number <= len(self.steps):
            raise PlanError("step", f"task {self.task_id!r} has steps 1..{len(self.steps)}, "
                                    f"not {number}")
        return self.steps[number - 1]


def plan_hash(steps: list[dict[str, Any]], approval: dict[str, Any] | None = None,
              series: str | None = None) -> str:
    """sha256 over the canonical JSON of the plan's steps.

    The JSON has sorted keys and no spaces. With an approval requirement or a series, over
    ``{"approval"?: ..., "series"?: ..., "steps": ...}`` (a plan with neither keeps the hash it
    always had)."""
    body: Any = steps
    if approval is not None or series is not None:
        body = {"steps": steps}
        if approval is not None:
            body["approval"] = approval
        if series is not None:
            body["series"] = series
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def load_plan_file(path: str | Path, registry: Registry, *, sort: bool = False) -> Plan:
    """Reads and validates a plan file. Raises PlanError naming the bad field."""
    try:
        with Path(path).open("rb") as f:
            data = f.read(PLAN_BYTES_MAX + 1)  # a larger file is refused: not read to its end
    except OSError as e:
        raise PlanError("file", f"cannot read {path}: {e.strerror}") from None
    return load_plan(decode_json(data, "plan", max_bytes=PLAN_BYTES_MAX), registry, sort=sort)


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
    extra = sorted(set(data) - {"task_id", "series", "steps", "approval"})
    if extra:
        raise PlanError(extra[0], "unknown top-level field (a plan has task_id, series, steps "
                                  "and approval)")
    series = data.get("series")
    if series is not None:
        if not isinstance(series, str):
            raise InputError("series", f"must be {ID_RULE}, got {type(series).__name__}")
        check_id("series", series)
    approval = load_approval(data.get("approval"))
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
        task_id = "plan-" + plan_hash([s.as_json() for s in steps], approval, series)[:16]
    elif not isinstance(task_id, str):
        raise InputError("task_id", f"must be {ID_RULE}, got {type(task_id).__name__}")
    else:
        check_id("task_id", task_id)
    return Plan(task_id, steps, approval=approval, series=series)


def load_approval(raw: Any) -> dict[str, Any] | None:
    """The normalised approval ask: None, or ``{"required": True}``.

    Names of approvers are refused: they are the operator's."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise PlanError("approval", f"must be an object, got {type(raw).__name__}")
    extra = sorted(set(raw) - {"required", "approvers"})
    if extra:
        raise PlanError(f"approval.{extra[0]}", "unknown field (approval has required)")
    required = raw.get("required")
    if not isinstance(required, bool):
        raise PlanError("approval.required", "must be true or false")
    if "approvers" in raw:
        raise PlanError("approval.approvers",
                        "a plan cannot name its own approvers: who may approve is the "
                        "operator's (TIDEMARK_APPROVERS, or the series' --approvers)")
    return {"required": True} if required else None


def _check_text(value: Any, where: str) -> None:
    """Refuses strings that cannot be stored or hashed.

    That is NUL (Postgres text and jsonb refuse it) and lone surrogates (not encodable as UTF-8),
    anywhere in the step."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InputError(where, "contains a NUL character, which the journal cannot hold")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(where, "contains a lone surrogate (invalid Unicode)") from None
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
    if len(action) > ACTION_MAX or bad_character(action):
        raise InputError(f"{where}.action", f"unknown action of {len(action):,} characters; an "
                                            f"action name has at most {ACTION_MAX} printable ones")
    verb = action.rsplit(".", 1)[-1]
    if verb in DELTA_VERBS:
        raise PlanError(f"{where}.action",
                        f"{action!r} is a delta ({verb}); write the end state instead, "
                        "e.g. rename to the final name, so that applying it twice is harmless")
    try:
        spec = registry.spec(action)
    except ActionUnavailable as e:  # known, but its client library is not installed here
        raise PlanError(f"{where}.action", str(e)) from None
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
