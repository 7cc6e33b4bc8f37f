"""Mutation check of the safety surface: break one rule at a time and measure whether the suite
notices.

``python tools/mutation_check.py [--json] [--list] [--rules] [--only NAME ...] [--jobs N]
[--no-baseline] [--full] [--named-only]``

Each mutant below is the smallest plausible bug against one rule Tidemark promises (listed in
docs/safety-rules.md with the mutants that break it): an inverted condition, a dropped check, a
wrong default. It is anchored on a small source snippet that must occur exactly once in its
file; a snippet found zero or several times is an ERROR (the code moved: re-anchor it), never
counted as killed.

How it runs, and why it stays inside CI's budget on two cores:

* the tracked files of the working tree are copied to a temporary directory once; each mutant
  gets its own copy of that copy (a few hundred small files), with one edit applied. The real
  tree is never written.
* pytest runs in the copy (its own ``tests/``, ``conftest.py`` and ``pyproject.toml``) with
  ``PYTHONPATH`` set to the copy, which shadows the editable install (setuptools' editable
  finder comes after the path finder). Subprocesses the tests start (run_one.py, worker
  processes) inherit that environment. Before any mutant runs, the script checks from a
  subprocess that ``tidemark``, ``activities``, ``probes``, ``workflows`` and ``staging`` are
  imported from the copy, and stops with an error otherwise.
* each mutant runs against the whole tier of tests of the module it touches (``TIERS``): first
  the tests named with it, which are known to notice it, with ``-x``; if they all pass, the
  rest of the tier with ``-x``. A killed mutant thus costs its named tests (seconds, a minute
  for RunPlan's), and a survivor has been measured against every test of its module, so a
  survivor means the suite is weak, not that the wrong test was picked. A kill by the rest of
  the tier is reported (``killed_by_tier``): name that test with the mutant.
* a baseline run of the named tests on the unmutated copy comes first: a test that fails
  without a mutant would "kill" every mutant it is named for, so a red baseline is an error,
  not a result. ``--full`` (nightly) runs the baseline over every tier instead, so that a kill
  by the rest of a tier cannot be a test that fails anyway; in CI the suite has just passed.
* three mutants run at a time (``--jobs``, default 3): every pytest session starts its own
  embedded Postgres and staging servers in a private ``--basetemp``, so runs share no state.
  The runs mostly wait (leases lapsing, subprocesses starting), so running several at once cuts
  the wall time at little CPU cost (docs/safety-rules.md, Measured).
* the rules list: docs/safety-rules.md names each rule of the safety surface with its mutants
  and a status; ``--rules`` checks it without running anything, and every run checks it too:
  every covered rule names at least one mutant, every name is a mutant here, every mutant
  breaks a listed rule. Pending rules (no mutant yet) are reported as such.

Where a rule is checked twice on purpose, the mutant breaks the check that enforces it. The stop
and unwound states are read when a step's lock is taken (tidemark.attempt.locked) and checked
again by the statement that writes the intent or claims it (StepSession.begin/claim); the early
read only saves work, so dropping it alone changes nothing a test could see. Those mutants edit
the statement, and the tests that kill them commit the stop (or the release) after the lock was
taken, during the snapshot or the probe.

A mutant is killed when one of its tests fails (or they time out); it survives when its whole
tier passes. A mutant that only makes the tests' set-up fail (pytest ``ERROR``, no ``FAILED``:
e.g. a migration that no longer runs) is an error, not a kill: no test showed the rule broken.
The exit code is 0 only when every mutant was killed, there were no errors and the rules list
has no problem. ``--json`` prints ``{"mutants": N, "killed": K, "survived": [...], "rules":
{"listed", "covered", "pending", "problems"}, "score": K/N, "errors": [...],
"killed_by_tier": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PER_MUTANT_TIMEOUT_S = 240  # the named tests
PER_TIER_TIMEOUT_S = 1200  # the rest of the tier, for a mutant they let through
PACKAGES = ("tidemark", "activities", "probes", "workflows", "staging", "tools", "worker")

RS = "tidemark/run_step.py"
# The journal store, one module per concern (tidemark/store/).
S_BASE = "tidemark/store/base.py"  # the pool and its connection check
S_CONN = "tidemark/store/connection.py"
S_JOURNAL = "tidemark/store/journal.py"  # row shapes, the shared stop / unwound conditions
S_SESSION = "tidemark/store/session.py"  # StepSession: intent, claim, outcome, decision
S_STEPS = "tidemark/store/steps.py"  # the execution lock
S_LEASES = "tidemark/store/leases.py"  # LeaseKeeper and its deadline watch
S_PLANS = "tidemark/store/plans.py"
S_REPORTS = "tidemark/store/reports.py"
S_UNWINDS = "tidemark/store/unwinds.py"
S_CONTROLS = "tidemark/store/controls.py"
S_APPROVALS = "tidemark/store/approvals.py"
S_SERIES = "tidemark/store/series.py"
S_GRANTS = "tidemark/store/grants.py"
AT = "tidemark/attempt.py"  # the attempt sequence shared by run_step and unwind_step
M1 = "tidemark/migrations/0001_journal.sql"
M_STOP = "tidemark/migrations/0007_stop_of_plpgsql.sql"  # tidemark.stop_of: every stop check
T_RS = "tests/test_run_step.py"
T_HZ = "tests/test_hazards.py"
T_SC = "tests/test_schema.py"
T_UW = "tests/test_unwind.py"
T_UC = "tests/test_unwind_cli.py"
T_RP = "tests/test_run_plan.py"
T_AP = "tests/test_approval_policy.py"
T_LS = "tests/test_lease.py"
T_RE = "tests/test_report.py"
T_SS = "tests/test_stop_state.py"
T_OF = "tests/test_outcome_flush.py"
T_PR = "tests/test_probe_rules.py"
T_LZ = "tests/test_leases.py"
# The intent's statement: a 'do' intent needs the task not stopped, an 'undo' one needs it stopped.
INTENT_STOP = ("AND (%(phase)s = 'undo') = {_STOPPED} AND NOT {_UNWOUND}\n"
               "                    RETURNING")
T_CT = "tests/test_controls.py"
T_FP = "tests/test_fast_path.py"
T_GF = "tests/test_graph_fence.py"
T_MF = "tests/test_gmail_fence.py"
T_DO = "tests/test_deadline_overrun.py"
T_PO = "tests/test_pool_restart.py"
T_CR = "tests/test_credentials.py"
# The undo phase's twins of the forward lease tests: a rule of the attempt sequence is held for
# both phases by one mutant of tidemark/attempt.py and a test of each phase.
T_AT = "tests/test_attempt.py"


@dataclass(frozen=True)
class Mutant:
    name: str  # the rule it breaks
    path: str
    anchor: str
    replacement: str
    tests: tuple[str, ...]


MUTANTS: tuple[Mutant, ...] = (
    # -- run_step and the attempt sequence: the two-phase journal, the probe, the gates, the lease
    Mutant("a probe that crashes is read as absent", AT,
           'return ProbeResult.unknown(f"probe failed: {type(e).__name__}: {e}")',
           'return ProbeResult.absent(f"probe failed: {type(e).__name__}: {e}")',
           (f"{T_PR}::test_a_probe_that_raises_stops_for_a_person_and_acts_on_nothing",)),
    Mutant("an unknown probe executes without a person's decision", AT,
           'if decided is None or decided["detail"].get("as") != "absent":',
           'if decided is not None and decided["detail"].get("as") != "absent":',
           (f"{T_RS}::test_unknown_probe_needs_a_decision_and_runs_nothing",)),
    Mutant("a probe that says done is not recorded as resolved by the probe", AT,
           'status="done",\n                          resolved_by="probe")',
           'status="done",\n                          resolved_by="execute")',
           (f"{T_RS}::test_crash_between_rename_and_outcome_resolves_by_probe",)),
    Mutant("gates are not run again when a resumed step is absent", RS,
           "_gate(self.action, ctx, s)  # absent: the world is as before; gates are never trusted",
           "pass  # absent: the world is as before; gates are never trusted",
           (f"{T_RS}::test_gates_run_again_when_a_resumed_step_is_absent",)),
    Mutant("a recorded outcome runs again", RS,
           "if row is not None and row.outcome is not None:\n            return",
           "if row is not None and row.outcome is not None and row.status != 'done':\n"
           "            return",
           (f"{T_RS}::test_fs_rename_happy_path_then_skip",)),
    Mutant("a stopped task still acts", S_SESSION,
           INTENT_STOP, INTENT_STOP.replace(") = {", ") <= {"),
           (f"{T_CT}::test_a_stop_committed_during_the_snapshot_prevents_the_intent[task]",)),
    Mutant("a step in doubt acts after a stop committed while it was probed", S_SESSION,
           "f\"  AND (%(phase)s = 'undo') = {_STOPPED}",
           "f\"  AND (%(phase)s = 'undo') <= {_STOPPED}",
           (f"{T_CT}::test_an_in_doubt_step_checks_the_stop_again_right_before_it_acts",)),
    Mutant("a fresh lease is ignored", AT,
           "if s.lease_left is not None and s.lease_left > 0:",
           "if s.lease_left is not None and s.lease_left > LEASE_S:",
           (f"{T_HZ}::test_twin_does_not_act_while_the_first_attempt_is_alive_but_lost_its_"
            "connection",
            f"{T_AT}::test_a_compensation_whose_attempt_lost_its_session_is_not_applied_by_a_"
            "twin_meanwhile")),
    Mutant("the lease is never renewed", S_LEASES,
           "if held or overran:  # an overrun is journaled even once its call ended\n"
           "                    self._renew(held, overran)",
           "if held or overran:\n                    pass",
           (f"{T_LS}::test_the_lease_is_renewed_while_the_attempt_acts_past_its_first_period",)),
    Mutant("a call past its deadline goes on after its lease lapsed", S_LEASES,
           "            if lapsing:\n                self.on_lapse(lapsing)",
           "            if lapsing:\n                pass",
           (f"{T_DO}::test_an_attempt_past_its_deadline_never_acts_after_a_twin_could",)),
    Mutant("the pool hands out connections unchecked", S_BASE,
           "check=self._check, configure=self._born,",
           "configure=self._born,",
           (f"{T_PO}::test_steps_started_after_a_restart_of_postgres_never_get_a_dead_"
            "connection",)),
    Mutant("a failed attempt keeps its lease", AT,
           "s.renew_lease(key, float(action.horizon_s))",
           "s.renew_lease(key, renewal_lease(action))",
           (f"{T_LS}::test_an_attempt_that_failed_ends_its_lease_and_the_retry_probes_at_once",
            f"{T_AT}::test_a_compensation_that_fails_ambiguously_holds_its_lease_for_the_horizon")),
    Mutant("after an ambiguous failure the lease is cut to zero, not held for the horizon", AT,
           "s.renew_lease(key, float(action.horizon_s))",
           "s.renew_lease(key, 0.0)",
           (f"{T_LZ}::test_a_provider_slower_than_the_client_is_waited_out_not_sent_again",
            f"{T_AT}::test_a_compensation_that_fails_ambiguously_holds_its_lease_for_the_horizon")),
    Mutant("the lease written with the intent does not cover the horizon", AT,
           "return covered_call_s(action) + float(action.horizon_s)",
           "return covered_call_s(action)",
           (f"{T_LZ}::test_the_lease_is_written_with_the_intent_and_renewals_never_shorten_it",
            f"{T_AT}::test_the_lease_written_with_a_compensations_intent_covers_its_deadline_"
            "and_horizon")),
    # -- the store's SQL ----------------------------------------------------------------------
    Mutant("a twin attempt takes a held step", S_STEPS,
           "if not got:\n                    if r is None:",
           "if not got and False:\n                    if r is None:",
           (f"{T_RS}::test_a_step_whose_lock_another_session_holds_is_busy_and_nothing_runs",)),
    Mutant("an intent without a renewal has no lease", S_SESSION,
           "clock_timestamp() + make_interval(secs => %(lease)s)\n                    WHERE (",
           "clock_timestamp()\n                    WHERE (",
           (f"{T_LZ}::test_the_lease_is_written_with_the_intent_and_renewals_never_shorten_it",)),
    Mutant("steps may start out of order", S_SESSION,
           "WHERE (%(phase)s = 'undo' OR %(step)s = 1 OR EXISTS (",
           "WHERE (%(phase)s = 'undo' OR %(step)s >= 1 OR EXISTS (",
           (f"{T_RS}::test_steps_cannot_run_out_of_order",)),
    Mutant("the global stop is ignored", M_STOP,
           "AND (c.scope IN (task, '*')", "AND (c.scope IN (task)",
           (f"{T_CT}::test_a_stop_committed_during_the_snapshot_prevents_the_intent[global]",)),
    Mutant("an unwound task starts again", S_JOURNAL,
           "WHERE w.task_id = %(task_id)s)\"",
           "WHERE w.task_id = %(task_id)s AND false)\"",
           (f"{T_CT}::test_no_intent_is_written_for_an_unwound_task_even_once_released",)),
    Mutant("a released task still reads as stopped", M_STOP,
           "WHERE c.state IN ('stopped', 'killed')",
           "WHERE c.state IN ('stopped', 'killed', 'released')",
           (f"{T_SS}::test_a_stopped_task_acts_on_nothing_until_released",)),
    Mutant("unwind compensates first steps first", S_UNWINDS,
           '" ORDER BY j.step DESC", (task_id,)',
           '" ORDER BY j.step", (task_id,)',
           (f"{T_UW}::test_unwind_restores_reversible_steps_last_first_and_journals_them",)),
    # -- the schema's constraints and migrations ------------------------------------------------
    Mutant("two steps of a task may be in doubt", M1,
           "ON tidemark.journal (task_id) WHERE outcome IS NULL;",
           "ON tidemark.journal (task_id, step) WHERE outcome IS NULL;",
           (f"{T_SC}::test_a_second_open_intent_in_a_task_is_refused_by_the_database",)),
    Mutant("an outcome can be rewritten", M1,
           "FOR EACH ROW WHEN (OLD.outcome IS NOT NULL) EXECUTE",
           "FOR EACH ROW WHEN (OLD.outcome IS NULL AND false) EXECUTE",
           (f"{T_SC}::test_rows_are_never_deleted_and_outcomes_never_rewritten",)),
    Mutant("journal rows can be deleted", M1,
           "CREATE TRIGGER journal_no_delete BEFORE DELETE ON tidemark.journal\n"
           "    FOR EACH ROW EXECUTE FUNCTION tidemark.refuse_change();",
           "-- (no trigger refuses a DELETE of journal rows)",
           (f"{T_SC}::test_rows_are_never_deleted_and_outcomes_never_rewritten",)),
    Mutant("an outcome may lack its resolver", M1,
           "AND (outcome IS NULL) = (resolved_by IS NULL))",
           "AND true)",
           (f"{T_SC}::test_outcome_fields_are_written_together",)),
    Mutant("concurrent migrations race", "tidemark/migrate.py",
           'conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_ID,))',
           'conn.execute("SELECT %s", (MIGRATION_LOCK_ID,))',
           (f"{T_SC}::test_a_migration_waits_while_another_process_holds_the_migration_lock",)),
    Mutant("a person's absent decision licenses every later execution", S_SESSION,
           "AND kind = 'decision' AND at >= %s\"\n                \" ORDER BY id DESC LIMIT 1\"",
           "AND kind = 'decision' AND at >= %s\"\n                \" ORDER BY id LIMIT 1\"",
           (f"{T_HZ}::test_operator_absent_decision_is_used_for_one_execution_only",)),
    Mutant("a changed plan runs under the same task", S_PLANS,
           'if row["plan_hash"] != new_hash:',
           'if row["plan_hash"] != new_hash and False:',
           ("tests/test_plan.py::test_persisting_a_changed_plan_under_the_same_task_is_refused",)),
    # -- plans: end states, irreversible steps last ---------------------------------------------
    Mutant("a delta verb is accepted in a plan", "tidemark/plan.py",
           "    if verb in DELTA_VERBS:\n",
           "    if verb in DELTA_VERBS and False:\n",
           ("tests/test_plan.py::test_bad_plans_name_the_field",)),
    Mutant("a reversible step may follow an irreversible one", "tidemark/plan.py",
           "        if not parsed[j][2]:\n",
           "        if not parsed[j][2] and False:\n",
           ("tests/test_plan.py::test_ordering_lint_names_the_first_offending_pair",)),
    # -- the key travels with every write -------------------------------------------------------
    Mutant("drive: the rename does not carry our key", "activities/drive.py",
           '{"name": ctx.args["name"], "appProperties": {STAMP: ctx.key}}',
           '{"name": ctx.args["name"]}',
           ("tests/test_drive_rename.py::test_happy_path_renames_stamps_and_probes_done",)),
    Mutant("stripe: the create does not carry our Idempotency-Key", "activities/stripe.py",
           'options={"idempotency_key": ctx.key}',
           "options={}",
           ("tests/test_stripe_payment.py::test_executing_twice_replays_instead_of_paying_twice",)),
    # -- every probe's decision -----------------------------------------------------------------
    Mutant("fs: a file that merely has the target name counts as ours", "probes/fs.py",
           "if at_dst is not None and identity(at_dst) == ours:",
           "if at_dst is not None:",
           (f"{T_PR}::test_fs_another_file_under_the_target_name_is_not_done",)),
    Mutant("fs: another file at the source name reads as absent", "probes/fs.py",
           "if at_src is not None and identity(at_src) == ours:",
           "if at_src is not None:",
           (f"{T_PR}::test_fs_another_file_under_the_source_name_is_not_absent",)),
    Mutant("fs: the gate lets a rename overwrite another file", "probes/fs.py",
           "if other is not None and identity(other) != identity(st):",
           "if other is not None and identity(other) == identity(st):",
           (f"{T_PR}::test_fs_gate_refuses_to_overwrite_another_file",)),
    Mutant("drive: the target name without our stamp counts as done", "probes/drive.py",
           "if ours and name == target:",
           "if name == target:",
           ("tests/test_drive_rename.py::test_the_target_name_without_our_stamp_is_not_success",)),
    Mutant("drive: a file renamed by someone else reads as absent", "probes/drive.py",
           'if "name" in before and name == before["name"] and stamp == before_stamp:',
           'if "name" in before and stamp == before_stamp:',
           ("tests/test_drive_rename.py::test_run_step_stops_for_a_person_when_someone_else_"
            "renamed",)),
    Mutant("gmail: a message with another key counts as ours", "probes/gmail.py",
           "_header(msg, KEY_HEADER) == key",
           "_header(msg, KEY_HEADER) is not None",
           ("tests/test_gmail_send.py::test_probe_ignores_other_messages_and_finds_ours_among_them",
            )),
    Mutant("gmail: an unreadable mailbox reads as absent", "probes/gmail.py",
           "return ProbeResult.unknown(\n                f\"cannot read the mailbox:",
           "return ProbeResult.absent(\n                f\"cannot read the mailbox:",
           ("tests/test_gmail_send.py::test_probe_is_unknown_when_search_is_unavailable",)),
    Mutant("graph: an unreadable mailbox reads as absent", "probes/graph.py",
           'return ProbeResult.unknown(f"cannot read the mailbox: {describe_error(e)}")',
           'return ProbeResult.absent(f"cannot read the mailbox: {describe_error(e)}")',
           ("tests/test_graph_send_mail.py::test_probe_is_unknown_when_the_mailbox_cannot_be_"
            "read[1]",)),
    Mutant("graph: Recoverable Items that cannot be read are skipped", "probes/graph.py",
           "if e.response_status_code != 404:  # a mailbox without Recoverable Items",
           "if e.response_status_code < 400:  # a mailbox without Recoverable Items",
           ("tests/test_graph_send_mail.py::test_probe_is_unknown_when_the_mailbox_cannot_be_"
            "read[2]",)),
    Mutant("stripe: a failed listing reads as absent", "probes/stripe.py",
           'return ProbeResult.unknown(f"could not list PaymentIntents: {failure}")',
           'return ProbeResult.absent(f"could not list PaymentIntents: {failure}")',
           ("tests/test_stripe_payment.py::test_a_failing_list_makes_the_probe_unknown",)),
    Mutant("stripe: a duplicate carrying our key counts as done", "probes/stripe.py",
           "if len(mine) > 1:",
           "if len(mine) > 2:",
           ("tests/test_stripe_payment.py::test_a_duplicate_carrying_our_key_is_unknown",)),
    Mutant("stripe: our key on another amount or currency counts as done", "probes/stripe.py",
           "if not _same_payment(pi, ctx.args):",
           "if False:",
           ("tests/test_stripe_payment.py::test_our_key_on_another_amount_or_currency_is_"
            "unknown[2600-usd]",
            "tests/test_stripe_payment.py::test_our_key_on_another_amount_or_currency_is_"
            "unknown[2500-eur]")),
    Mutant("stripe: the probe's window is drawn on Postgres's clock", "probes/stripe.py",
           "return anchor - STRIPE_CLOCK_MARGIN",
           "return int(ctx.started_at.timestamp()) - 300 if ctx.started_at else None",
           ("tests/test_stripe_payment.py::test_clock_skew_and_a_forgotten_key_never_pay_"
            "twice[-600]",)),
    Mutant("stripe: a payment like ours with its metadata hidden reads as absent",
           "probes/stripe.py",
           "    if like:\n",
           "    if False:\n",
           ("tests/test_stripe_payment.py::test_metadata_hidden_from_the_read_key_never_reads_"
            "absent",)),
    Mutant("gmail: a 400 closes the step as failed although the mail went out",
           "activities/gmail.py",
           "if probed.status is ProbeStatus.ABSENT:",
           "if True:",
           (f"{T_MF}::test_any_error_answer_to_a_send_of_a_consumed_draft_leaves_the_step_in_"
            "doubt[400]",)),
    Mutant("gmail: a retry sends while an earlier send may still be going out",
           "activities/gmail.py",
           "self.horizon_s = horizon_s",
           "self.horizon_s = 0.0",
           (f"{T_MF}::test_overlapping_sends_that_both_go_out_still_send_once",)),
    Mutant("gmail: a copy without the SENT label counts as sent", "probes/gmail.py",
           'ours = SENT in msg.get("labelIds", []) and _header',
           "ours = _header",
           (f"{T_MF}::test_an_inbound_copy_with_our_key_does_not_make_an_unsent_mail_done",)),
    Mutant("graph: a copy without the journaled internetMessageId counts as ours",
           "probes/graph.py",
           "if imid and c.internet_message_id == imid]",
           "if imid]",
           (f"{T_GF}::test_a_forged_inbound_copy_does_not_count",)),
    Mutant("graph: a draft still in Drafts counts as submitted", "probes/graph.py",
           "if self.flagged_submitted or self.folder_id == outbox_id:",
           "if self.flagged_submitted or self.folder_id in (outbox_id, drafts_id):",
           (f"{T_GF}::test_probe_with_a_staged_draft",)),
    Mutant("graph: a draft flagged submitted reads as a plain draft", "probes/graph.py",
           "return self.flags is not None and bool(self.flags & MSGFLAG_SUBMIT)",
           "return False",
           (f"{T_GF}::test_a_lost_202_in_the_window_resolves_by_probe_as_done[sent_again]",)),
    Mutant("graph: a draft whose flags do not come back reads as absent", "probes/graph.py",
           "if waiting and waiting[0].flags is None:",
           "if False:",
           ("tests/test_graph_send_mail.py::test_our_draft_whose_flags_do_not_come_back_is_"
            "unknown_not_absent",)),
    Mutant("graph: a draft flagged submitted is sent again", "activities/graph.py",
           "        self._check_unsent(draft_id)\n",
           "",
           (f"{T_GF}::test_execute_sends_nothing_for_a_draft_already_submitted[sent_again]",)),
    Mutant("graph: a send that got no answer is not waited out", "activities/graph.py",
           "            if not unanswered(e):\n                raise failure from e",
           "            if True:\n                raise failure from e",
           (f"{T_GF}::test_a_send_slower_than_the_client_is_waited_out_not_sent_again[window, "
            "sent again]",)),
    Mutant("graph: a refused send of a submitted draft fails the step", "activities/graph.py",
           "            if why is not None:\n                return TargetUnavailable(",
           "            if False:\n                return TargetUnavailable(",
           (f"{T_GF}::test_a_refused_send_of_a_draft_submitted_meanwhile_is_in_doubt_not_"
            "failed",)),
    Mutant("graph: a draft moved out of Drafts unsent counts as submitted", "probes/graph.py",
           "return self.folder_id != drafts_id and not self.is_draft",
           "return self.folder_id != drafts_id",
           (f"{T_GF}::test_a_draft_moved_out_of_drafts_unsent_is_not_done",)),
    Mutant("drive: the old name under another stamp reads as absent", "probes/drive.py",
           'if "name" in before and name == before["name"] and stamp == before_stamp:',
           'if "name" in before and name == before["name"]:',
           ("tests/test_drive_rename.py::test_the_old_name_under_another_key_is_unknown_not_"
            "absent",)),
    Mutant("drive: no horizon after an ambiguous failure", "activities/drive.py",
           "self.horizon_s = horizon_s",
           "self.horizon_s = 0.0",
           ("tests/test_drive_rename.py::test_a_commit_later_than_the_client_is_waited_out_not_"
            "renamed_again",)),
    Mutant("fs: the rename replaces a file that appeared after the gate", "activities/fs.py",
           "RENAME_NOREPLACE = 1  # <linux/fs.h>",
           "RENAME_NOREPLACE = 0  # <linux/fs.h>",
           ("tests/test_fs_rename.py::test_a_file_that_appears_after_the_gate_is_not_replaced",)),
    # -- the irreversible boundary --------------------------------------------------------------
    Mutant("the verification gate passes a step that no longer holds", "tidemark/boundary.py",
           "if probed.status is not ProbeStatus.DONE:",
           "if probed.status is ProbeStatus.ABSENT:",
           ("tests/test_boundary.py::test_the_gate_reprobes_done_steps_only_and_takes_a_persons_"
            "word_for_the_ones_she_settled",)),
    Mutant("an approval by somebody not among the approvers counts", "activities/boundary.py",
           'if decided and asked and decided["actor"] not in asked["approvers"]:',
           'if decided and not asked and decided["actor"] not in asked["approvers"]:',
           ("tests/test_boundary.py::test_a_decision_by_somebody_not_among_the_approvers_does_"
            "not_count",)),
    Mutant("a plan that leaves out approval pays unattended", "tidemark/approval.py",
           "return [n for n, args in steps if plan_asks or policy.needs_person(args)]",
           "return [n for n, args in steps if plan_asks]",
           (f"{T_AP}::test_by_default_every_irreversible_step_waits_and_only_a_listed_os_user_"
            "decides",)),
    Mutant("a plan names a series nobody declared", "tidemark/series.py",
           "if series is not None and store.declared_series(series) is None:",
           "if False and series is not None and store.declared_series(series) is None:",
           (f"{T_AP}::test_a_plan_naming_an_undeclared_series_is_refused_before_anything_is_"
            "stored",)),
    Mutant("a plan submitted by hand takes a scheduled task id", "tidemark/series.py",
           "    if not task_id.startswith(SCHEDULED_PREFIX):\n        return",
           "    if True:\n        return",
           (f"{T_AP}::test_a_scheduled_task_id_cannot_be_taken_by_a_plan_submitted_by_hand",)),
    Mutant("a scheduled run claiming tomorrow's time takes tomorrow's task id",
           "tidemark/series.py", "if scheduled > now + CLOCK_SKEW:",
           "if scheduled > now + CLOCK_SKEW * 10**6:",
           (f"{T_AP}::test_a_scheduled_run_started_by_hand_calls_no_planner_and_takes_no_"
            "scheduled_id",)),
    Mutant("the verification gate calls the targets with the worker's credentials",
           "activities/boundary.py",
           "with _heartbeating(), acting_for(self.grants, inp.task_id):",
           "with _heartbeating(), acting_for(None, inp.task_id):",
           (f"{T_AP}::test_the_verification_gate_presents_the_tasks_grant_and_a_revoked_one_is_"
            "refused",)),
    Mutant("stripe: a replayed 500 is retried for ever instead of left for a person",
           "activities/stripe.py",
           "if (e.http_status or 0) >= 500 and (e.headers or {}).get(",
           "if (e.http_status or 0) >= 600 and (e.headers or {}).get(",
           ("tests/test_stripe_payment.py::test_run_step_after_a_replayed_500_leaves_the_step_"
            "for_a_person_never_failed",)),
    Mutant("stripe: a replayed 500 with our payment listed is not done", "activities/stripe.py",
           "if probed.status is ProbeStatus.DONE:",
           "if probed.status is not ProbeStatus.DONE:",
           ("tests/test_stripe_payment.py::test_a_replayed_500_with_our_payment_listed_is_done",
            )),
    # -- stop, release and resolve ----------------------------------------------------------------
    Mutant("resolve --as never closes a step of a task that is not stopped",
           "tools/commands.py",
           "if s.stopped is None:\n                    raise DecisionError(",
           "if s.stopped is None and False:\n                    raise DecisionError(",
           (f"{T_CT}::test_resolve_never_closes_an_irreversible_step_in_doubt_and_unwind_"
            "proceeds",)),
    Mutant("stop accepts a task id that names no task", "tools/commands.py",
           "if task_id == ALL_TASKS or store.task_known(task_id):",
           "if task_id == ALL_TASKS or store.task_known(task_id) is not None:",
           ("tests/test_cli.py::test_stop_refuses_a_task_id_that_names_no_task",)),
    # -- unwind ---------------------------------------------------------------------------------
    Mutant("unwind runs on a task that is not stopped", S_SESSION,
           INTENT_STOP, INTENT_STOP.replace(") = {", ") >= {"),
           (f"{T_CT}::test_a_release_committed_while_an_unwind_probes_prevents_the_"
            "compensation",)),
    Mutant("unwind compensates an irreversible step", "tidemark/unwind.py",
           "if spec.irreversible:\n            raise Refused(",
           "if spec.irreversible and False:\n            raise Refused(",
           (f"{T_SS}::test_unwind_never_touches_an_irreversible_step",)),
    Mutant("unwind executes a forward step found absent", "tidemark/unwind.py",
           "if settled is None:\n                s.complete(",
           "if settled is None and False:\n                s.complete(",
           (f"{T_UW}::test_a_forward_step_that_never_acted_is_closed_not_executed",)),
    Mutant("a refused compensation is reported as already undone", "tidemark/unwind.py",
           'if last is not None and last.status == "done":',
           "if last is not None and last.outcome is not None:",
           (f"{T_CT}::test_a_refused_compensation_is_tried_again_after_the_way_is_cleared",)),
    Mutant("an unwind acts while an attempt of the step may still be acting", "tidemark/unwind.py",
           "        if row.outcome is None:\n            check_lease(s, ctx)\n",
           "        if row.outcome is None:\n            pass\n",
           (f"{T_UC}::test_an_unwind_waits_out_the_lease_of_an_attempt_that_may_still_be_"
            "acting",)),
    Mutant("a compensation acts without its undo grant", "activities/steps.py",
           "acting_for(self.grants, inp.task_id, GrantPurpose.UNDO)",
           "acting_for(self.grants, inp.task_id)",
           (f"{T_UC}::test_unwind_after_reject_restores_drive_files_on_a_worker_that_holds_no_"
            "grant",)),
    Mutant("resume silently releases a kill", "tools/commands.py",
           'if stop["state"] != ControlState.KILLED:\n        return\n    scope = ""',
           'if True:\n        return\n    scope = ""',
           ("tests/test_control_matrix.py::test_control_matrix[killed-resume]",)),
    Mutant("a partly unwound task runs forward to completed", "activities/steps.py",
           "if progress.undo_rows and progress.unwound is None:",
           "if progress.undo_rows and progress.unwound is None and False:",
           (f"{T_UC}::test_resume_after_a_partial_unwind_is_refused_and_status_says_partly_"
            "unwound",)),
    Mutant("drive: a trashed file with our name and stamp counts as done", "probes/drive.py",
           'if observed["trashed"]:',
           "if False:",
           (f"{T_UC}::test_the_gate_stops_on_a_renamed_file_that_was_trashed_or_unshared",)),
    # -- the report -----------------------------------------------------------------------------
    Mutant("the report says provably not attempted of an attempted step", "tidemark/report.py",
           "            if n > p.last_step:\n",
           "            if n >= p.last_step:\n",
           (f"{T_RE}::test_each_irreversible_step_gets_the_verdict_its_rows_prove",)),
    Mutant("the report always says provably not attempted", "tidemark/report.py",
           "            if n > p.last_step:\n",
           "            if n > 0:\n",
           (f"{T_RE}::test_each_irreversible_step_gets_the_verdict_its_rows_prove",)),
    Mutant("the JSON report calls an attempted step not attempted", "tidemark/report.py",
           '"provably_not_attempted": n > p.last_step}',
           '"provably_not_attempted": n >= p.last_step}',
           (f"{T_RE}::test_each_irreversible_step_gets_the_verdict_its_rows_prove",)),
    Mutant("the report hides the stop state behind completion", "tidemark/report.py",
           "if p.stop is not None:\n            # A kill is named",
           "if p.stop is not None and not p.finished and False:\n            # A kill is named",
           (f"{T_SS}::test_a_stopped_task_acts_on_nothing_until_released",)),
    # -- kill and decisions under a stop -----------------------------------------------------------
    Mutant("an approval after a kill is journaled", "tools/commands.py",
           "        _check_not_stopped(store, task_id, decision)\n",
           "",
           ("tests/test_kill.py::test_an_approval_after_a_kill_changes_nothing_and_says_why",)),
    Mutant("kill terminates without letting the step under way finish", "tools/kill.py",
           "settled = await _settle(self.client, self.announced, self.grace_s)",
           "settled = await _settle(self.client, self.announced, 0.0)",
           ("tests/test_kill.py::test_kill_during_a_slow_step_lets_it_finish_so_it_is_not_left_"
            "in_doubt",)),
    # -- RunPlan's end states and halt ----------------------------------------------------------
    Mutant("runplan: a step that needs a decision ends as failed", "tidemark/errors.py",
           "    end_state = TaskState.NEEDS_DECISION\n",
           "    end_state = TaskState.FAILED\n",
           (f"{T_RP}::test_an_undecidable_step_ends_the_run_as_needs_decision",)),
    Mutant("runplan: a halt is not written as the stop state", "workflows/run_plan.py",
           "    async def _halt(self, next_step: int) -> RunResult:\n"
           "        if self._halt_unrecorded():",
           "    async def _halt(self, next_step: int) -> RunResult:\n"
           "        if self._halt_unrecorded() and False:",
           (f"{T_RP}::test_a_halt_that_arrives_before_any_step_is_written_and_nothing_runs",)),
    # A halt between steps needs no mutant of its own: a step started after it meets the stop
    # state the halt wrote, and the run ends the same (halted, stopped_at that step).
    Mutant("runplan: a halt that arrives while a step runs is not written until the step ends",
           "workflows/run_plan.py",
           "retrying until the target is back.\n"
           "        await workflow.wait_condition(\n"
           "            lambda a=attempt: a.done() or self._halt_unrecorded())",
           "retrying until the target is back.\n"
           "        await workflow.wait_condition(\n"
           "            lambda a=attempt: a.done() or False)",
           (f"{T_RP}::test_halt_stops_a_step_that_keeps_failing_at_its_next_attempt",)),
    # -- the fast path's batches -----------------------------------------------------------------
    Mutant("a batch runs on past a step that did not complete", RS,
           'if (result.status != "done" or len(results) >= max_steps',
           'if (len(results) >= max_steps',
           (f"{T_FP}::test_a_batch_ends_at_the_first_step_that_does_not_complete_and_reports"
            "_its_error",)),
    Mutant("runplan: a batch crosses the irreversible boundary", "workflows/run_plan.py",
           "end = min(last, prep.first_irreversible - 1)",
           "end = last",
           (f"{T_FP}::test_a_batch_stops_before_the_boundary_and_waits_for_approval",)),
    Mutant("a batch returns before its outcomes are on disk", RS,
           "    store.end_batch(task_id, len(results))\n",
           "",
           (f"{T_OF}::test_a_batch_returns_only_once_its_outcomes_survive_a_crash_of_postgres",)),
    Mutant("an intent is committed without waiting for the disk", S_SESSION, INTENT_STOP,
           INTENT_STOP.replace("RETURNING", "  AND set_config('synchronous_commit', 'off', true)"
                               " = 'off' RETURNING"),
           (f"{T_OF}::test_an_outcome_not_yet_flushed_is_lost_by_a_crash_of_postgres_and_its_"
            "intent_is_not",)),
    # -- RunPlan's halt and start-of-run stop check ------------------------------------------------
    Mutant("runplan: a halt that arrives between two steps lets the next step start",
           "workflows/run_plan.py",
           "        if self._killed is not None:\n            return self._end(KILLED)\n"
           "        if self._halt_reason is not None:\n            return await self._halt(step)\n"
           "        # A history from before the boundary existed",
           "        if self._killed is not None:\n            return self._end(KILLED)\n"
           "        if self._halt_reason is not None and False:\n"
           "            return await self._halt(step)\n"
           "        # A history from before the boundary existed",
           (f"{T_RP}::test_halt_signal_stops_cleanly_and_durably",)),
    Mutant("runplan: the stop check at the start of a run is left to the per-step one",
           "workflows/run_plan.py",
           "if prep.stopped is not None:\n            return self._end(STOPPED",
           "if prep.stopped is not None and False:\n            return self._end(STOPPED",
           (f"{T_RP}::test_halt_signal_stops_cleanly_and_durably",)),
    Mutant("runplan: on the fast path a halt between batches lets the next batch start",
           "workflows/run_plan.py",
           "        while step <= last:\n            if self._killed is not None:\n"
           "                return self._end(KILLED)\n"
           "            if self._halt_reason is not None:\n",
           "        while step <= last:\n            if self._killed is not None:\n"
           "                return self._end(KILLED)\n"
           "            if self._halt_reason is not None and False:\n",
           (f"{T_FP}::test_a_halt_on_the_fast_path_stops_between_steps_and_the_stop_state_"
            "refuses",)),
    # -- batches: outcomes on disk before they are reported, counts -------------------------------
    Mutant("a batch that ends on a later step's error returns before its outcomes are on disk",
           RS,
           "            error = e\n            break\n",
           "            return Batch(results, e)\n",
           (f"{T_OF}::test_a_batch_ending_on_a_later_steps_error_flushes_the_outcomes_it_"
            "reports",)),
    # -- the verification gate --------------------------------------------------------------------
    Mutant("the verification gate re-probes only the steps that executed", "tidemark/boundary.py",
           "if row.resolved_by == ResolvedBy.OPERATOR:",
           "if row.resolved_by in (ResolvedBy.OPERATOR, ResolvedBy.PROBE):",
           ("tests/test_boundary.py::test_the_gate_reprobes_done_steps_only_and_takes_a_persons_"
            "word_for_the_ones_she_settled",)),
    # -- the report's counts ----------------------------------------------------------------------
    Mutant("a journaled failed step is counted as confirmed", S_REPORTS,
           "WHERE j.task_id = p.task_id AND j.phase = 'do' AND j.status = 'done')\n"
           "                     AS confirmed,",
           "WHERE j.task_id = p.task_id AND j.phase = 'do' AND j.status <> 'skipped')\n"
           "                     AS confirmed,",
           (f"{T_RE}::test_a_failed_step_is_counted_as_failed_never_as_confirmed",)),
    # -- credential renewal after a 401 -----------------------------------------------------------
    Mutant("a refused token is never renewed, so the request is not sent again",
           "tidemark/credentials.py",
           "if self._token is None or self._token == stale:",
           "if self._token is None:",
           (f"{T_CR}::test_a_write_whose_token_expired_early_is_renewed_and_sent_once",)),
    Mutant("after a 401 a request is sent again without a renewed token",
           "activities/granted.py",
           "if response.status != 401 or not self.credentials.renew():",
           "if response.status != 401:",
           (f"{T_CR}::test_a_refused_token_that_cannot_be_renewed_is_not_sent_again",)),
    Mutant("after a 401 a request is sent again for as long as renewals come",
           "activities/granted.py",
           "        # Safe for writes: a 401 was not processed (see GrantedCredentials).\n"
           "        return super().request(uri, method, body, headers, **kwargs)",
           "        # Safe for writes: a 401 was not processed (see GrantedCredentials).\n"
           "        return self.request(uri, method, body, headers, **kwargs)",
           (f"{T_CR}::test_after_a_401_a_request_is_sent_again_at_most_once",)),
    # -- kill's four layers ------------------------------------------------------------------------
    Mutant("kill: a kill of a series stops its first run, not the series", "tools/kill.py",
           "self.store.set_killed(self.t.scope, self.reason, self.by)",
           "self.store.set_killed(self.t.tasks[0] if self.t.tasks else self.t.scope, self.reason,"
           " self.by)",
           ("tests/test_kill.py::test_a_kill_of_a_series_whose_schedule_cannot_be_paused_still_"
            "kills_and_revokes",)),
    Mutant("kill: the durable stop state is written as a plain stop", S_CONTROLS,
           "\" VALUES (%s, 'killed', %s, %s) ON CONFLICT (scope) DO UPDATE SET\"",
           "\" VALUES (%s, 'stopped', %s, %s) ON CONFLICT (scope) DO UPDATE SET\"",
           ("tests/test_kill.py::test_kill_without_temporal_still_sets_the_stop_state_and_"
            "revokes_the_grants",)),
    Mutant("kill: a kill of a series' run leaves the series' schedule running",
           "tools/kill.py",
           "return Target(task, [task], [named] if named else [])",
           "return Target(task, [task], [])",
           ("tests/test_series.py::test_a_killed_run_blocks_the_next_until_a_person_settles_and_"
            "releases_it",)),
    Mutant("kill --all revokes no grant", "tools/kill.py",
           "for one in (self.t.tasks if not self.t.everything else [None]):",
           "for one in self.t.tasks:",
           ("tests/test_series.py::test_kill_all_stops_everything_pauses_every_schedule_and_"
            "revokes_every_grant",)),
    Mutant("kill: grants are revoked in Postgres only, not at the provider", "tidemark/grants.py",
           '            minter_for(str(g["kind"]), str(g["issuer"])).revoke(handle)\n',
           "",
           ("tests/test_series.py::test_kill_all_stops_everything_pauses_every_schedule_and_"
            "revokes_every_grant",)),
    Mutant("kill --grace 0 terminates a run before it took the signal, which then says running",
           "tools/kill.py",
           "    bound = grace_s if told else max(grace_s, TOLD_S)\n",
           "    bound = grace_s\n",
           ("tests/test_kill.py::test_kill_with_grace_0_terminates_without_waiting_for_the_step_yet_"
            "says_killed",)),
    Mutant("unwind: a run awaiting approval is not told and stays open",
           "workflows/unwind_plan.py",
           "                await self._close_waiting_run(task_id)\n",
           "                pass\n",
           ("tests/test_kill.py::test_an_unwind_of_a_task_awaiting_approval_closes_the_waiting_"
            "run",)),
    Mutant("kill: a layer that fails ends the kill", "tools/kill.py",
           "        layers.append(await _layer(n, what, fn))\n",
           "        layers.append(await _layer(n, what, fn))\n"
           "        if not layers[-1][\"done\"]:\n            break\n",
           ("tests/test_kill.py::test_a_kill_of_a_series_whose_schedule_cannot_be_paused_still_"
            "kills_and_revokes",)),
    # -- series admission -------------------------------------------------------------------------
    Mutant("series: a stopped series admits a run", S_SERIES,
           "            if stop_row is None and not blockers:",
           "            if not blockers:",
           ("tests/test_series.py::test_a_stopped_series_or_an_unsettled_earlier_run_blocks_a_"
            "direct_start",)),
    Mutant("series: a partly unwound earlier run counts as settled", "tidemark/series.py",
           '        if not row["to_undo"] and not row["open"]:',
           '        if not row["open"]:',
           (f"{T_UW}::test_a_partly_unwound_run_blocks_its_series_until_every_step_is_undone",)),
    Mutant("series: a blocked run takes its place in the order", S_SERIES,
           "            blockers = unsettled(earlier)\n",
           "            blockers = unsettled(earlier)\n"
           "            conn.execute(\"INSERT INTO tidemark.series_runs (task_id, series)\"\n"
           "                         \" VALUES (%s, %s) ON CONFLICT DO NOTHING\","
           " (task_id, series))\n",
           ("tests/test_series.py::test_a_killed_run_blocks_the_next_until_a_person_settles_and_"
            "releases_it",)),
    Mutant("series: ScheduledRun calls the planner without reading the series state",
           "activities/planner.py",
           "            series_rules.check(self.store, inp.series, inp.task_id)\n",
           "",
           ("tests/test_series.py::test_a_killed_run_blocks_the_next_until_a_person_settles_and_"
            "releases_it",)),
    # -- grants ------------------------------------------------------------------------------------
    Mutant("grants: a run grant is issued to a stopped task", S_GRANTS,
           "   ELSE tidemark.stop_of(%(task_id)s) IS NULL END",
           "   ELSE true END",
           ("tests/test_kill.py::test_no_grant_is_issued_to_a_stopped_task_on_a_worker_that_"
            "holds_none",)),
    Mutant("grants: a revoked grant still reads as live", S_GRANTS,
           "SELECT revoked IS NULL AND expires > clock_timestamp() AS live",
           "SELECT expires > clock_timestamp() AS live",
           (f"{T_CR}::test_a_revoked_grant_still_stops_the_task_when_tokens_refresh",)),
    Mutant("grants: a held grant outlives the worker's token it was minted from",
           "tidemark/grants.py",
           'if state is not None and state["live"] and held[2] == base:',
           'if state is not None and state["live"]:',
           (f"{T_CR}::test_a_plan_outliving_several_token_lifetimes_completes_with_every_effect_"
            "once",)),
    # -- unwind: never replace ---------------------------------------------------------------------
    Mutant("unwind: a compensation replaces a file that took the original name",
           "activities/fs.py",
           "rename_noreplace(dir_fd, dst.name, original.name)",
           "os.rename(dst.name, original.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)",
           (f"{T_UC}::test_an_unwind_never_replaces_a_file_that_took_the_original_name",)),
    # -- the decider -------------------------------------------------------------------------------
    Mutant("approval: the --by label is taken as the decider", "tools/commands.py",
           "    who = user if user is not None else os_user()\n",
           "    who = by or (user if user is not None else os_user())\n",
           (f"{T_AP}::test_a_decision_by_an_os_user_not_listed_is_refused_whatever_by_says",)),
    Mutant("approval: with no approvers configured anybody decides", "tidemark/boundary.py",
           "    if user not in approvers:\n",
           "    if approvers and user not in approvers:\n",
           (f"{T_AP}::test_with_no_approvers_configured_nobody_decides",)),
)


# The tier of tests of each module a mutant touches: every test file that exercises that
# module's rules. A mutant runs its named tests first (a known bug is still caught, in seconds),
# then, if they all pass, the rest of its module's tier with ``-x``: a survivor is one that the
# whole tier lets through, not one that a single chosen test missed. tests/test_mutation_check.py
# checks that every mutant's file has a tier and every tier file exists.
T_ST = "tests/test_stripe_payment.py"
T_DR = "tests/test_drive_rename.py"
T_BD = "tests/test_boundary.py"
T_KL = "tests/test_kill.py"
T_SE = "tests/test_series.py"
# The tests that run a step's attempt against the journal: its intent, claim, lock and outcome.
ST_TIER = (T_RS, T_HZ, T_SC, T_LS, T_LZ, T_CT, T_SS, T_OF, T_RE, T_UW, "tests/test_plan.py")
TIERS: dict[str, tuple[str, ...]] = {
    RS: (T_RS, T_HZ, T_LS, T_LZ, T_PR, T_OF, T_SS, T_CT, "tests/test_fs_rename.py"),
    # The store: the modules of an attempt's statements, every test that runs attempts; each
    # other concern's module, the tests of that concern.
    S_SESSION: ST_TIER,
    S_STEPS: ST_TIER,
    S_JOURNAL: ST_TIER,
    S_LEASES: (T_LS, T_LZ, T_DO, "tests/test_deadlines.py", T_HZ),
    S_BASE: (T_PO, T_SC, T_RS),
    S_CONN: (T_PO, T_SC),
    "tidemark/store/__init__.py": (T_SC, T_RS),
    S_PLANS: ("tests/test_plan.py", T_RS, "tests/test_stored_plan_gates.py"),
    S_REPORTS: (T_RE, T_SS, T_CT),
    S_UNWINDS: (T_UW, T_UC, T_CT, T_SS),
    S_CONTROLS: (T_CT, T_SS, T_KL, "tests/test_cli.py"),
    S_APPROVALS: (T_BD, T_AP),
    S_SERIES: (T_SE, T_AP, T_UW),
    S_GRANTS: (T_CR, T_KL, T_SE),
    # run_step's tier and unwind's: the sequence is both phases'.
    AT: (T_RS, T_HZ, T_LS, T_LZ, T_PR, T_OF, T_SS, T_CT, "tests/test_fs_rename.py", T_UW, T_UC,
         T_DO, T_AT),
    M1: (T_SC, T_RS, T_CT),
    M_STOP: (T_CT, T_SS, T_SC),
    "tidemark/migrate.py": (T_SC,),
    "tidemark/plan.py": ("tests/test_plan.py", T_HZ),
    "tidemark/boundary.py": (T_BD, T_AP),
    "activities/boundary.py": (T_BD,),
    "tidemark/report.py": (T_RE, T_SS),
    "tidemark/unwind.py": (T_UW, T_SS, T_CT),
    "tools/commands.py": ("tests/test_cli.py", T_CT, T_KL, T_AP),
    "tidemark/credentials.py": (T_CR,),
    "activities/granted.py": (T_CR, "tests/test_google_http.py"),
    "activities/drive.py": (T_DR, T_PR),
    "probes/drive.py": (T_DR, T_PR),
    "activities/fs.py": ("tests/test_fs_rename.py", T_PR, T_UC, T_UW),
    "probes/fs.py": (T_PR, "tests/test_fs_rename.py"),
    "activities/stripe.py": (T_ST,),
    "probes/stripe.py": (T_ST,),
    "probes/gmail.py": ("tests/test_gmail_send.py", T_MF),
    "probes/graph.py": ("tests/test_graph_send_mail.py", T_GF),
    "activities/graph.py": (T_GF, "tests/test_graph_send_mail.py"),
    "workflows/run_plan.py": (T_RP, T_FP, T_BD, T_HZ),
    "tools/kill.py": (T_KL, T_SE, T_UC),
    "workflows/unwind_plan.py": (T_KL, T_UC, T_UW),
    "tidemark/errors.py": (T_RP, T_FP, T_BD, T_HZ),
    "tidemark/grants.py": (T_CR, T_SE, T_KL, T_AP),
    "tidemark/series.py": (T_SE, T_AP, T_UW),
    "activities/planner.py": (T_SE, T_AP),
    "tidemark/approval.py": (T_AP,),
    "activities/steps.py": (T_UC, T_UW),
    "activities/gmail.py": (T_MF, "tests/test_gmail_send.py"),
}
RULES_DOC = ROOT / "docs" / "safety-rules.md"


@dataclass
class Result:
    name: str
    outcome: str  # killed | survived | error
    seconds: float
    detail: str = ""
    by_tier: bool = False  # killed by the rest of the tier, not by a named test


@dataclass(frozen=True)
class Rule:
    """One rule of docs/safety-rules.md: its text, status (covered | pending) and mutants."""

    text: str
    status: str
    mutants: tuple[str, ...]


def read_rules(path: Path = RULES_DOC) -> list[Rule]:
    """The rules listed in the docs. Each is a ``### `` heading followed by ``- status: covered``
    or ``- status: pending`` and, for a covered rule, one ``- mutant: NAME`` line per mutant."""
    rules: list[Rule] = []
    text: str | None = None
    status, names = "", list[str]()

    def close() -> None:
        if text is not None:
            rules.append(Rule(text, status, tuple(names)))

    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            close()
            text, status, names = line[4:].strip(), "", []
        elif text is not None and line.startswith("- status: "):
            status = line.removeprefix("- status: ").strip()
        elif text is not None and line.startswith("- mutant: "):
            names.append(line.removeprefix("- mutant: ").strip())
    close()
    return rules


def rule_problems(rules: list[Rule], mutants: tuple[Mutant, ...] = MUTANTS) -> list[str]:
    """What is wrong with the rules list against the mutants: a covered rule without a mutant,
    a mutant name no mutant has, a mutant no rule names, a status other than the two."""
    known = {m.name for m in mutants}
    problems = []
    for r in rules:
        if r.status not in ("covered", "pending"):
            problems.append(f"rule {r.text!r}: status {r.status!r} is not covered or pending")
        elif r.status == "covered" and not r.mutants:
            problems.append(f"rule {r.text!r}: covered, but names no mutant")
        for name in r.mutants:
            if name not in known:
                problems.append(f"rule {r.text!r}: no mutant is named {name!r}")
    named = {n for r in rules for n in r.mutants}
    problems += [f"mutant {m.name!r} breaks no rule listed in {RULES_DOC.name}"
                 for m in mutants if m.name not in named]
    return problems


def tier_of(mutant: Mutant) -> list[str]:
    """The test files of the mutant's module, its named tests' files included."""
    files = list(TIERS.get(mutant.path, ()))
    for t in mutant.tests:
        f = t.split("::")[0]
        if f not in files:
            files.append(f)
    return files


def tracked_copy(dest: Path) -> Path:
    """Copies the working tree's tracked files (as they are now) to ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def env_for(copy: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}


def check_imports(copy: Path) -> None:
    """Fails unless a subprocess with the mutants' environment imports the copy's code."""
    code = ("import importlib, json; print(json.dumps({m: importlib.import_module(m).__file__ "
            f"for m in {PACKAGES!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], env=env_for(copy), cwd="/",
                         capture_output=True, text=True, check=True).stdout
    wrong = {m: f for m, f in json.loads(out).items()
             if not Path(f).resolve().is_relative_to(copy.resolve())}
    if wrong:
        raise SystemExit(f"the copy does not shadow the installed package: {wrong}")


def anchor_errors(base: Path, mutant: Mutant) -> str | None:
    path = base / mutant.path
    if not path.is_file():
        return f"{mutant.path}: no such file"
    count = path.read_text(encoding="utf-8").count(mutant.anchor)
    if count != 1:
        return f"{mutant.path}: anchor found {count} times, not once: {mutant.anchor[:60]!r}"
    return None


def pytest(copy: Path, tests: list[str], timeout: float,
           deselect: tuple[str, ...] = ()) -> tuple[int | None, str]:
    # A private basetemp: pytest prunes old numbered temp dirs, which would delete the
    # embedded Postgres of a session running next to this one.
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           f"--basetemp={copy.parent / 'pytest-tmp'}", *tests,
           *(f"--deselect={t}" for t in deselect)]
    try:
        p = subprocess.run(cmd, cwd=copy, env=env_for(copy), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return p.returncode, (p.stdout + p.stderr)[-3000:]


def failure_line(out: str) -> str:
    """The first ``FAILED``/``ERROR`` line of pytest's summary (what killed the mutant)."""
    lines = out.strip().splitlines()
    hits = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    return (hits or lines or [""])[0][:300]


def verdict(name: str, code: int | None, out: str, took: float) -> Result | None:
    """A pytest run's verdict on a mutant; None when every test passed (not killed yet)."""
    if code == 1 and "\nFAILED " not in out and "\nERROR " in out:
        # Only set-up or collection errors: the mutant broke the tests' machinery (e.g. SQL
        # that no longer migrates), so no test showed the rule broken.
        return Result(name, "error", took,
                      f"no test failed, the tests' set-up did: {failure_line(out)}")
    if code is None or code == 1:
        return Result(name, "killed", took, failure_line(out))
    if code in (0, 5):  # 5: no test left to run once the named ones are deselected
        return None
    return Result(name, "error", took, f"pytest exit {code}: {out}")


def run_mutant(base: Path, mutant: Mutant, tier: bool = True) -> Result:
    """Applies the mutant to a copy of ``base`` and runs its named tests, then (``tier``) the
    rest of its module's tier, each with ``-x``."""
    started = time.monotonic()
    error = anchor_errors(base, mutant)
    if error:
        return Result(mutant.name, "error", 0.0, error)
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(base, copy)
        target = copy / mutant.path
        text = target.read_text(encoding="utf-8").replace(mutant.anchor, mutant.replacement)
        target.write_text(text, encoding="utf-8")
        if target.suffix == ".py":
            try:
                compile(text, str(target), "exec")
            except SyntaxError as e:
                return Result(mutant.name, "error", 0.0, f"mutant does not compile: {e}")
        code, out = pytest(copy, list(mutant.tests), PER_MUTANT_TIMEOUT_S)
        found = verdict(mutant.name, code, out, time.monotonic() - started)
        if found is not None or not tier:
            return found or Result(mutant.name, "survived", time.monotonic() - started)
        code, out = pytest(copy, tier_of(mutant), PER_TIER_TIMEOUT_S, deselect=mutant.tests)
        if code is None:  # a slow tier is no kill: the mutant was not measured to the end
            return Result(mutant.name, "error", time.monotonic() - started,
                          f"the rest of the tier did not finish in {PER_TIER_TIMEOUT_S}s")
        found = verdict(mutant.name, code, out, time.monotonic() - started)
    if found is None:
        return Result(mutant.name, "survived", time.monotonic() - started,
                      f"the whole tier passed: {' '.join(tier_of(mutant))}")
    found.by_tier = found.outcome == "killed"
    return found


def summarize(results: list[Result], rules: list[Rule], problems: list[str]
              ) -> dict[str, Any]:
    killed = [r for r in results if r.outcome == "killed"]
    covered = [r for r in rules if r.status == "covered" and r.mutants]
    return {
        "mutants": len(results), "killed": len(killed),
        "survived": [r.name for r in results if r.outcome == "survived"],
        "errors": [f"{r.name}: {r.detail[:300]}" for r in results if r.outcome == "error"],
        # Killed only by the rest of the tier: worth naming the test that did it.
        "killed_by_tier": [f"{r.name}: {r.detail}" for r in killed if r.by_tier],
        "rules": {"listed": len(rules), "covered": len(covered),
                  "pending": [r.text for r in rules if r.status == "pending"],
                  "problems": problems},
        "score": round(len(killed) / len(results), 4) if results else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--json", action="store_true", help="print the summary as JSON only")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests")
    ap.add_argument("--rules", action="store_true",
                    help="check the rules list of docs/safety-rules.md against the mutants only")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the unmutated run of the selected tests")
    ap.add_argument("--full", action="store_true",
                    help="the baseline runs every selected mutant's whole tier, not only the "
                         "named tests (nightly; see README, Testing)")
    ap.add_argument("--named-only", action="store_true",
                    help="run each mutant against its named tests only (quick; not a score)")
    args = ap.parse_args(argv)
    mutants = list(MUTANTS)
    if args.only:
        unknown = set(args.only) - {m.name for m in mutants}
        if unknown:
            ap.error(f"no such mutant: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in args.only]
    rules = read_rules()
    problems = rule_problems(rules)
    if args.list:
        for m in mutants:
            print(f"- {m.name} ({m.path}; {', '.join(t.split('::')[-1] for t in m.tests)})")
        return 0
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (
        lambda *a: print(*a, flush=True))
    if args.rules:
        for p in problems:
            say(p)
        say(f"{len(rules)} rules, {sum(r.status == 'pending' for r in rules)} pending, "
            f"{len(problems)} problems")
        return 1 if problems else 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutation-base-") as tmp:
        base = tracked_copy(Path(tmp) / "tree")
        check_imports(base)
        results: list[Result] = []
        if not args.no_baseline:
            tests = sorted({t for m in mutants for t in m.tests})
            if args.full:
                tests = sorted({f for m in mutants for f in tier_of(m)})
            code, out = pytest(base, tests, PER_TIER_TIMEOUT_S * 2)
            say(f"baseline: {len(tests)} {'test files' if args.full else 'tests'}, exit {code}")
            if code != 0:
                results = [Result(m.name, "error", 0.0, "baseline failed") for m in mutants]
                say(out)
        if not results:
            with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
                for r in pool.map(lambda m: run_mutant(base, m, not args.named_only), mutants):
                    say(f"{r.outcome:8} {r.seconds:6.1f}s  {r.name}"
                        + (" (by the rest of its tier)" if r.by_tier else "")
                        + (f"\n         {r.detail}" if r.detail else ""))
                    results.append(r)
    summary = summarize(results, rules, problems)
    for p in problems:
        say(f"rules: {p}")
    if args.json:
        print(json.dumps(summary))
    else:
        say(f"{summary['killed']}/{len(results)} killed (score {summary['score']}), "
            f"{len(summary['survived'])} survived, {len(summary['errors'])} errors; "
            f"{summary['rules']['covered']}/{len(rules)} rules covered, "
            f"{len(summary['rules']['pending'])} pending; "
            f"{time.monotonic() - started:.0f}s")
    return 0 if not (summary["survived"] or summary["errors"] or problems) else 1


if __name__ == "__main__":
    sys.exit(main())
