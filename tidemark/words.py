"""The journal's words: every closed set of strings the journal writes, reads or ends a run with.

Each set is a ``StrEnum``: a member *is* its string (``Phase.UNDO == "undo"``, it formats,
JSON-encodes and binds as a query parameter as the bare string), so the store, Temporal payloads
and histories see exactly the strings they saw before, while Python code names a word that a
type checker and a reader can follow to this one place.

Where the schema holds a set to a CHECK list (tidemark/migrations/), tests/test_words.py reads the
constraint back from a migrated database and holds the enum to it, both ways: a word added to one
and not the other fails there. Words that no CHECK guards (the states a run ends in, approval
decisions, a person's verdict on a step in doubt) live here too, so that each is spelled once.
The limits on what enters the journal are beside them, in tidemark/limits.py.

A task's state has one word (TaskState) wherever it is said: `tidemark status` and its JSON,
`tidemark inbox` (an entry's ``why``), the TidemarkState of its Web UI worklist row and the
state table of docs/operate.md; tests/test_vocabulary.py holds them together.

Pure: the standard library only, so that workflow code, the core and the tooling may all import it.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """``journal.phase``: whether a row is a plan step or its compensation during an unwind."""

    DO = "do"
    UNDO = "undo"


class StepStatus(StrEnum):
    """``journal.status``: the settled outcome of a row (NULL while the row is in doubt)."""

    DONE = "done"  # the step's end state holds
    FAILED = "failed"  # the target definitely refused; nothing was applied


class ResolvedBy(StrEnum):
    """``journal.resolved_by``: who settled a row's outcome."""

    EXECUTE = "execute"  # the action returned
    PROBE = "probe"  # a later attempt's read-only probe of the target, after a crash
    OPERATOR = "operator"  # a person (`tidemark resolve`)


class EventKind(StrEnum):
    """``events.kind``: what an entry of the append-only event log records."""

    PLAN = "plan"
    PROBE = "probe"
    PRECONDITION = "precondition"
    ERROR = "error"
    DECISION = "decision"  # a person's verdict on a step in doubt
    STOP = "stop"
    RELEASE = "release"
    RUN = "run"
    VERIFICATION = "verification"  # the boundary's gate re-probed the reversible steps
    APPROVAL = "approval"  # a person approved or rejected the irreversible steps
    UNWOUND = "unwound"  # an unwind compensated every reversible step that happened
    KILL = "kill"  # tidemark kill, layer by layer
    BLOCKED = "blocked"  # a run of a series refused to start
    GRANT = "grant"  # a per-task credential refused
    OVERRAN = "overran"  # an action call passed its declared deadline
    UNWIND_UNFINISHED = "unwind_unfinished"  # an unwind ended before its task was unwound
    REFUSED = "refused"  # a start refused before its plan was stored


class ControlState(StrEnum):
    """``controls.state``: the durable stop state of a scope (a task, ``series:S`` or ``*``)."""

    STOPPED = "stopped"  # nothing may act until a person releases it
    KILLED = "killed"  # not even a compensation acts until a person lifts the kill
    RELEASED = "released"  # a person allowed it to run again


# The control states that stop a task (what tidemark.stop_of() returns a row for).
STOPS = frozenset({ControlState.STOPPED, ControlState.KILLED})
# ``controls.set_by`` of the stop a run writes when it takes the ``halt`` signal: a halt is told
# apart from a person's `tidemark stop` by it.
HALT_ACTOR = "halt signal"


def kill_holds(stop: dict[str, object] | None) -> bool:
    """Whether ``stop`` (a task's stop_of row) is a kill nobody lifted, even for an unwind."""
    return stop is not None and stop.get("state") == ControlState.KILLED \
        and not stop.get("for_unwind")


def lifted_for_unwind(stop: dict[str, object] | None) -> bool:
    """Whether ``stop`` is a kill an operator lifted for an unwind only.

    Compensations may act, nothing runs the task forward until `tidemark release T`."""
    return stop is not None and stop.get("state") == ControlState.KILLED \
        and bool(stop.get("for_unwind"))


class GrantScope(StrEnum):
    """``grants.scope``: which of a target's two credentials a grant stands for."""

    WRITE = "write"
    READ = "read"


class GrantKind(StrEnum):
    """``grants.kind``: who issued a per-task grant, hence whether revoking it reaches anyone."""

    STAGING = "staging"  # minted by a token issuer, revoked there
    LOCAL = "local"  # handed out from the worker's own credential: nothing to revoke


class GrantPurpose(StrEnum):
    """``grants.purpose``: the steps of a run, or the compensations of a person's unwind."""

    RUN = "run"
    UNDO = "undo"


class TaskState(StrEnum):
    """The state of a RunPlan or UnwindPlan run, or of a task by its rows.

    The state a RunPlan or UnwindPlan run is in or ended in (its result's ``state`` and the
    TidemarkState search attribute), and the state a task's journal rows say it is in
    (tidemark.report, tidemark.series). Not a column: it is read from the rows or the run."""

    RUNNING = "running"
    COMPLETED = "completed"
    HALTED = "halted"
    STOPPED = "stopped"
    NEEDS_DECISION = "needs_decision"
    PRECONDITION_FAILED = "precondition_failed"
    FAILED = "failed"
    UNWOUND = "unwound"  # terminal: the unwind completed; every later start refuses the task
    BLOCKED = "blocked"  # a run of a series refused to start (tidemark.series); nothing acted
    KILLED = "killed"
    PARTLY_UNWOUND = "partly_unwound"  # some steps compensated: never runs forward again
    AWAITING_APPROVAL = "awaiting_approval"  # waits at its first irreversible step for a person
    VERIFICATION_FAILED = "verification_failed"  # a reversible step before it no longer holds
    # Only read from the journal (a run is never in these):
    IN_DOUBT = "in_doubt"  # a step's intent has no outcome
    NOT_STARTED = "not_started"  # no journal row yet
    PARTIAL = "partial"  # some steps settled, none in doubt, not stopped, a run goes on
    ENDED = "ended"  # its run ended, and what held it is gone: nothing runs it until resumed


class Decision(StrEnum):
    """``decisions.decision``: a person's decision on a task's irreversible steps.

    Made with ``tidemark approve|reject``, or RunPlan's updates of the same names."""

    APPROVE = "approve"
    REJECT = "reject"


class JournalRole(StrEnum):
    """The journal's group roles (migration 0016): what an operator grants a login role."""

    TIDEMARK_WORKER = "tidemark_worker"  # runs plans; decides nothing
    TIDEMARK_OPERATOR = "tidemark_operator"  # policy, series, releases, settling a step in doubt
    TIDEMARK_APPROVER = "tidemark_approver"  # approves or rejects irreversible steps


class DecisionVia(StrEnum):
    """``decisions.via``: how a decision reached the journal."""

    CLI = "cli"  # `tidemark approve|reject`, under the person's own login role
    TEMPORAL = "temporal"  # a RunPlan update, recorded by a decider under its login role


class SeriesAdmits(StrEnum):
    """``series.admits``: which runs may join a series."""

    ANY = "any"  # any plan that names it
    SCHEDULED = "scheduled"  # only the runs its schedule starts


class Verdict(StrEnum):
    """A person's verdict on the step in doubt.

    Given with ``tidemark resolve --as``, journaled as a ``decision`` event."""

    DONE = "done"  # it happened: recorded done, resolved_by operator
    ABSENT = "absent"  # it did not happen: a resumed run probes, then executes
    NEVER = "never"  # it did not happen and must not: closed failed, resolved_by operator
