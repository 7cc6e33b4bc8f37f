"""What a task waits for from a person, read from the journal alone.

One entry (why, since when, what is at stake, the one command that decides it) or none.

A task's newest run writes to the journal what it waits for (an approval asked, a stop or
kill, a row in doubt, a refused step, a compensation, a failed verification gate) and when it
ended with nothing to run the task since. Which of those facts means the task waits, and why,
is the reading `tidemark status` prints (tidemark.report.Report). An attempt still under its
lease is a run acting now, and a task whose every step is done or that was unwound is settled:
neither waits.

Every surface that says what a task needs reads it here, so that they say the same:
`tidemark inbox` and `status` (tools/operate/inbox.py), and the word of the task's row of the Web
UI's worklist (``task_need``): a run opens the row with it when it ends, an unwind when it does not
finish, and a person's command that changes the journal brings the open row in line with it
(tools/operate/rows.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tidemark.limits import NOTE_MAX, cut
from tidemark.needs import Act, Need, command, sentence
from tidemark.payloads import TaskNeed
from tidemark.will_do import what_it_will_do
from tidemark.words import ControlState, Decision, TaskState, Verdict, lifted_for_unwind

# The report and the store (psycopg) are loaded by the commands that read the journal, when
# they read it: `tidemark --help` registers the commands without them.
if TYPE_CHECKING:
    from tidemark.report import Report
    from tidemark.store import JournalRow, JournalStore


@dataclass(frozen=True)
class Entry:
    """One task that waits for a person (the ``--json`` object, keys as named here)."""

    task_id: str
    # The task's state, in the word `tidemark status` and its worklist row say it in
    # (tidemark.words.TaskState): in_doubt, awaiting_approval, verification_failed, halted,
    # stopped, killed, failed, precondition_failed, blocked, partly_unwound, ended
    why: str
    since: datetime
    detail: str  # one line: what happened, in the journal's words
    command: str  # the one command that decides it, once ``fix`` (if any) is done
    at_stake: list[str] = field(default_factory=list)  # the irreversible steps not yet done
    fix: str = ""  # what a person must put right first, or the command would fail again

    @property
    def need(self) -> Need:
        """The TidemarkNeeds word of the Web UI's worklist for this entry.

        The why's, but ``unwind`` whenever the one command is an unwind (a rejected task, say)."""
        if self.command == command(Act.UNWIND, self.task_id):
            return Need.UNWIND
        if self.command == command(Act.RESUME, self.task_id) and self.why == TaskState.IN_DOUBT:
            return Need.RESUME  # a person decided the step: the run that takes it is next
        return NEED_OF_WHY[self.why]

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "need": str(self.need),
                "since": self.since.astimezone(UTC).isoformat()}


# The worklist's word (tidemark.needs.Need) for each why.
NEED_OF_WHY: dict[str, Need] = {
    TaskState.IN_DOUBT: Need.DECISION, TaskState.AWAITING_APPROVAL: Need.APPROVAL,
    TaskState.VERIFICATION_FAILED: Need.VERIFICATION, TaskState.HALTED: Need.HALTED,
    TaskState.STOPPED: Need.STOPPED, TaskState.KILLED: Need.KILLED, TaskState.FAILED: Need.FAILED,
    TaskState.PRECONDITION_FAILED: Need.FAILED, TaskState.BLOCKED: Need.BLOCKED,
    TaskState.PARTLY_UNWOUND: Need.UNWIND, TaskState.ENDED: Need.RESUME}


def _when(value: Any) -> datetime:
    """A timestamp from the journal: a datetime, or the ISO text a jsonb column holds."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _report(store: JournalStore, task_id: str) -> Report:
    from tidemark.report import build_report  # see TYPE_CHECKING above

    return build_report(store, task_id)


def at_stake(store: JournalStore, task_id: str) -> list[str]:
    """The irreversible steps of the task not yet done, one line each."""
    return [what_it_will_do(s["step"], s["action"], s["args"])
            for s in store.irreversible_pending(task_id)]


def _stopped(store: JournalStore, t: str, report: Report, stop: dict[str, Any],
             stake: list[str]) -> Entry:
    since, scope = _when(stop["set_at"]), stop.get("scope")
    said = f"by {stop['set_by']}: {stop['reason']}"
    release = command(Act.RELEASE, t, scope=scope)
    if lifted_for_unwind(stop):  # an unwind may act; nothing runs it forward, resume included
        return Entry(t, "killed", since, f"{said}; its kill is lifted for an unwind only",
                     command(Act.UNWIND, t), stake)
    if stop.get("state") == ControlState.KILLED:
        return Entry(t, "killed", since, said, release, stake)
    if scope not in (None, t):
        return Entry(t, "stopped", since, f"{said} (scope {scope})", release, stake)
    if report.state == TaskState.HALTED:
        return Entry(t, "halted", since, f"halted: {stop['reason']}", command(Act.RESUME, t),
                     stake)
    if (report.approval or {}).get("decision") == Decision.REJECT:
        return Entry(t, "stopped", since, said, command(Act.UNWIND, t), stake)
    if report.asks_approval and "began" in (store.latest_run(t) or {}).get("detail", {}):
        # its run waits at the boundary, held by the stop (a resume would meet it open)
        return Entry(t, "stopped", since, f"{said}; its run waits for approval",
                     release, stake)
    return Entry(t, "stopped", since, said, command(Act.RESUME, t), stake)


def _unwind_unfinished(t: str, report: Report, event: dict[str, Any],
                       stake: list[str]) -> Entry:
    """A stopped task whose unwind ended before it was unwound.

    That is an unwind_unfinished event since the stop: it waits for its unwind, also when every
    step is done. A refused compensation is refused again until a person clears its way."""
    d = event["detail"]
    err = d.get("error") or {}
    why = err.get("type") or d.get("state")
    refused = f", step(s) {', '.join(map(str, d['refused']))} refused" if d.get("refused") \
        else ""
    fix = (f"clear the way for the compensation of step(s) {', '.join(map(str, d['refused']))}"
           " (what took their old names or state)" if d.get("refused") else "")
    return Entry(t, report.state, _when(event["at"]),
                 f"its unwind {event['actor']} ended {d.get('state')} ({why}) with "
                 f"{len(d.get('undone') or [])} step(s) put back{refused}",
                 command(Act.UNWIND, t), stake, fix)


def _ended(t: str, report: Report, run: dict[str, Any], stake: list[str]) -> Entry:
    """A task whose latest run ended and that nothing runs since.

    With no other fact that holds it (its stop was released, say): it waits for a person to resume
    it. A gate that refused the run refuses a resumed one too, until a person put right what it
    names."""
    d = run["detail"]
    err = d.get("error") or {}
    at = f" at step {err['step']}" if err.get("step") else ""
    message = " ".join(str(err.get("message") or "").split())
    why = f" ({err.get('type')}: {message})" if err.get("type") else ""
    fix = ""
    if report.state == TaskState.PRECONDITION_FAILED:  # said once: as what to put right
        fix, why = f"put right what its gate refused ({message})", f" ({err.get('type')})"
    return Entry(t, report.state, _when(run["at"]),
                 f"its run ended {d['ended']}{at}{why}; no run of it began since",
                 command(Act.RESUME, t), stake, fix)


def _in_doubt(store: JournalStore, t: str, d: JournalRow, stake: list[str]) -> Entry:
    """A step in doubt waits for a person's word.

    Once a person said it did not happen (absent), it waits for the run that takes that word."""
    said = store.person_said(t, d.step, d.started_at)
    if said is not None and said["detail"].get("as") == Verdict.ABSENT:
        return Entry(t, "in_doubt", _when(said["at"]),
                     f"step {d.step} {d.action}: {said['actor']} said it did not happen "
                     "(absent); a resumed run probes it once more, then executes it",
                     command(Act.RESUME, t), stake)
    return Entry(t, "in_doubt", d.started_at,
                 f"step {d.step} {d.action}: intent journaled, no outcome; only its probe "
                 "or a person can say whether it happened",
                 command(Act.RESOLVE, t, step=d.step), stake)


def _verification_failed(t: str, v: dict[str, Any], stake: list[str]) -> Entry:
    """The gate found reversible steps that no longer hold.

    They are put back (or unwound) before a resume, whose gate refuses again until they hold. The
    first SHOWN are named."""
    failures = v["failures"]
    named = "; ".join(f"step {f['step']} {f['action']}: {f['reason']}" for f in failures[:SHOWN])
    more = f"; and {len(failures) - SHOWN} more" if len(failures) > SHOWN else ""
    where = "at the end of the plan" if v.get("at_end") else f"before step {v['boundary']}"
    return Entry(t, "verification_failed", _when(v["at"]),
                 f"{where}, {len(failures)} reversible step(s) no longer "
                 f"hold: {named}{more}", command(Act.RESUME, t), stake,
                 f"put back what the gate found changed (or `{command(Act.UNWIND, t)}` puts "
                 "the reversible steps back instead): a resume runs the gate again, which "
                 "refuses until they hold")


def entry_of(store: JournalStore, candidate: dict[str, Any],
             report: Report | None = None) -> Entry | None:
    """The task's entry, or None when it does not wait for a person.

    ``report``: the task's interruption report when the caller has read it already."""
    t = candidate["task_id"]
    report = report or _report(store, t)
    p = report.progress
    unfinished = store.unwind_unfinished(t) if p.stop else None
    if report.state == TaskState.UNWOUND or (p.finished and not p.undo_rows and unfinished is None
                                             and not report.end_unverified):
        return None  # settled: a stop or kill of a completed task holds nothing back
    last = _when(candidate["last_at"] or candidate["created_at"])
    stake = at_stake(store, t)
    return (_held(store, t, report, unfinished, last, stake)
            or _asked(store, t, report, last, stake))


def _held(store: JournalStore, t: str, report: Report, unfinished: dict[str, Any] | None,
          last: datetime, stake: list[str]) -> Entry | None:
    """The entry of the first fact that holds the task.

    In the order they count: a kill, a compensation, a step in doubt, an unwind that did not finish,
    a stop, a run that ended."""
    p = report.progress
    if p.stop and p.stop.get("state") == ControlState.KILLED:
        return _stopped(store, t, report, p.stop, stake)  # nothing else acts until it is released
    if report.state == TaskState.PARTLY_UNWOUND:
        return Entry(t, "partly_unwound", last, f"{p.undo_rows} compensation row(s) journaled, "
                     "the task is not unwound", command(Act.UNWIND, t), stake)
    if p.in_doubt is not None and p.in_doubt.phase == "do":
        return _in_doubt(store, t, p.in_doubt, stake)
    if unfinished is not None:
        return _unwind_unfinished(t, report, unfinished, stake)
    if p.stop:
        return _stopped(store, t, report, p.stop, stake)
    if report.run_end is not None and not p.failed and report.state in (
            TaskState.ENDED, TaskState.PRECONDITION_FAILED, TaskState.FAILED):
        # nothing runs it (no run asks for an approval either: it asks again when resumed)
        return _ended(t, report, report.run_end, stake)
    return None


def _asked(store: JournalStore, t: str, report: Report, last: datetime,
           stake: list[str]) -> Entry | None:
    """The entry of a task nothing holds, by its state.

    A refused step, a failed gate, an approval asked. Not started or partial: a run goes on by
    itself, nobody is asked."""
    if report.state == TaskState.FAILED:
        # A refused step's outcome is final: the task never runs forward again, and a resume
        # ends failed at once. Putting its reversible steps back is what settles it.
        return Entry(t, "failed", last, f"{report.progress.failed} step(s) refused by the "
                     "target for good; the task does not run forward again",
                     command(Act.UNWIND, t), stake)
    if report.state == TaskState.VERIFICATION_FAILED:
        v = report.boundary["end_verification" if report.end_unverified else "verification"]
        return _verification_failed(t, v, stake)
    if report.state == TaskState.AWAITING_APPROVAL:
        asked = store.approval_request(t) or {}
        who = ", ".join(asked.get("approvers") or []) or "nobody configured"
        return Entry(t, "awaiting_approval", _when(asked.get("asked_at") or last),
                     f"may decide: {who}", command(Act.APPROVE, t),
                     list(asked.get("lines") or stake))
    return None


# The state whose sentence (tidemark.needs.sentence) says an entry's why, where it is another.
STATE_OF_WHY: dict[str, str] = {TaskState.IN_DOUBT: TaskState.NEEDS_DECISION}
# Failures of the verification gate an entry names one by one (the rest are counted; the
# journal's verification event holds them all).
SHOWN = 5


def entry_for(store: JournalStore, task_id: str,
              report: Report | None = None) -> Entry | None:
    """The inbox entry of one task, or None when it does not wait for a person."""
    found = store.needs_candidates(task_id)
    return entry_of(store, found[0], report) if found else None


def first_line(store: JournalStore, report: Report) -> str:
    """The sentence `tidemark status T` opens with.

    It is in the words a run's failure opens with in the Web UI (tidemark.needs.sentence): what
    holds the task ``report`` is of, and the one command next."""
    task_id = report.progress.task_id
    e = entry_for(store, task_id, report)
    if e is None and report.state in (TaskState.NOT_STARTED, TaskState.PARTIAL):
        run = store.latest_run(task_id)
        if run is not None and "began" in run["detail"]:
            # The journal reads a run going on; only Temporal can tell one that ended outside
            # tidemark (a Terminate journals no end), and this command does not ask it.
            return (f"Task {task_id} needs nothing from a person while its run goes on "
                    f"({report.state}): the journal has the beginning of {run['actor']} at "
                    f"{_when(run['at']).astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC and no end of "
                    "it; a run terminated outside tidemark journals none: `tidemark inbox` "
                    "asks Temporal whether it is open.")
    return _line(report, e)


def _line(report: Report, e: Entry | None) -> str:
    """first_line, of the task's entry ``e`` (None: it waits for nobody)."""
    task_id = report.progress.task_id
    if e is None:
        return f"Task {task_id} needs nothing from a person ({report.state})."
    if e.why == TaskState.ENDED:
        return (f"Task {task_id} waits for a person: {e.detail}, so nothing runs it; continue "
                f"it with `{e.command}` or put its steps back with "
                f"`{command(Act.UNWIND, task_id)}`.")
    if e.fix:
        return (f"Task {task_id} waits for a person: {e.detail}. First {e.fix}; then "
                f"`{e.command}`.")
    if e.why == TaskState.IN_DOUBT and e.command == command(Act.RESUME, task_id):
        return f"Task {task_id} waits for a person: {e.detail}; continue it with `{e.command}`."
    if e.why == "awaiting_approval":
        return (f"Task {task_id} waits for approval of its irreversible steps ({e.detail}); "
                f"approve with `{e.command}` or reject with `{command(Act.REJECT, task_id)}`.")
    if e.why == TaskState.FAILED and e.need == Need.UNWIND:  # a step refused for good
        return (f"Task {task_id} failed: {e.detail}; put its reversible steps back with "
                f"`{e.command}`.")
    doubt = report.progress.in_doubt
    state = STATE_OF_WHY.get(e.why, e.why)
    if e.why == TaskState.STOPPED and e.need == Need.UNWIND:  # only an unwind settles it
        state = TaskState.PARTLY_UNWOUND
    said = sentence(task_id, state, {"message": e.detail, "step": doubt.step if doubt else None})
    return said if f"`{e.command}" in said else f"{said} Next: `{e.command}`."


def task_need(store: JournalStore, task_id: str) -> TaskNeed:
    """What the task's worklist row says now.

    The word, state and first line of its entry; ``nothing`` and ``settled`` once it is completed
    or unwound (nobody is needed, and no run goes on); ``nothing`` alone when the journal says a
    run goes on with it (that run's end says what it needs)."""
    report = _report(store, task_id)
    entry = entry_for(store, task_id, report)
    if entry is not None:
        # the row's sentence: an activity's result, kept small
        return TaskNeed(str(entry.need), str(report.state), cut(_line(report, entry), NOTE_MAX))
    settled = report.state in (TaskState.COMPLETED, TaskState.UNWOUND) or (
        report.progress.finished and not report.end_unverified)
    return TaskNeed(str(Need.NOTHING), str(report.state), settled=settled)
