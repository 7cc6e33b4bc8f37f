"""What the mutants break and which tests must notice: the files, the test modules, a mutant."""

from __future__ import annotations

from dataclasses import dataclass

RS = "tidemark/run_step.py"
STH = "tidemark/step_threads.py"  # an attempt awaited to its end
# The journal store, one module per concern (tidemark/store/).
S_BASE = "tidemark/store/base.py"  # the pool and its connection check
S_CONN = "tidemark/store/connection.py"
S_JOURNAL = "tidemark/store/journal.py"  # row shapes, the shared stop / unwound conditions
S_SESSION = "tidemark/store/session.py"  # StepSession: intent, take-over, claim, outcome
S_STEPS = "tidemark/store/steps.py"  # what an attempt reads when it begins
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
# Who may decide, declare and release; epochs; decisions; the approval check of an intent.
M_AUTH = "tidemark/migrations/0016_authority.sql"
T_RS = "tests/test_run_step.py"
T_HZ = "tests/test_hazards.py"
T_SC = "tests/test_schema.py"
T_UW = "tests/test_unwind.py"
T_UC = "tests/test_unwind_cli.py"
T_RP = "tests/test_run_plan.py"
T_AP = "tests/test_approval_policy.py"
T_AU = "tests/test_authority.py"  # authority held by the journal
T_DU = "tests/test_decision_updates.py"  # approve and reject as Temporal updates
T_LS = "tests/test_lease.py"
T_RE = "tests/test_report.py"
T_SS = "tests/test_stop_state.py"
T_OF = "tests/test_outcome_flush.py"
T_PR = "tests/test_probe_rules.py"
T_LZ = "tests/test_leases.py"
# The intent's statement: a 'do' intent needs the task not stopped, an 'undo' one needs it stopped.
INTENT_STOP = ("AND (%(phase)s = 'undo') = {_STOPPED} AND NOT {_UNWOUND}\n"
               "                      AND (%(phase)s = 'undo' OR tidemark.approval_holds(\n"
               "                             %(task_id)s, %(step)s, %(action)s, %(args)s))\n"
               "                    RETURNING")
T_CT = "tests/test_controls.py"
T_FP = "tests/test_fast_path.py"
T_GF = "tests/test_graph_fence.py"
T_MF = "tests/test_gmail_fence.py"
T_DO = "tests/test_deadline_overrun.py"
T_WL = "tests/test_worklist.py"
T_PO = "tests/test_pool_restart.py"
T_CR = "tests/test_credentials.py"
# The undo phase's twins of the forward lease tests: a rule of the attempt sequence is held for
# both phases by one mutant of tidemark/attempt.py and a test of each phase.
T_AT = "tests/test_attempt.py"
T_AW = "tests/test_awaited_step.py"  # a step whose call is awaited on the event loop
T_ST = "tests/test_stripe_payment.py"
T_DR = "tests/test_drive_rename.py"
T_BD = "tests/test_boundary.py"
T_KL = "tests/test_kill.py"
T_SE = "tests/test_series.py"
T_OW = "tests/test_ownership.py"  # the fenced lease: take-over, lost intents, no held connection
T_TK = "tests/test_takeover_kill.py"  # a worker killed in its take-over's probe
T_IL = "tests/test_unwind_intent_lock.py"  # the plan row's lock: an unwind against an intent
# Time: the checks at the wire, requests that leave late, the clocks of a take-over.
T_WI = "tests/test_wire.py"
T_LC = "tests/test_lease_cover.py"  # the cover the lease keeper counts, and its watch
T_LR = "tests/test_late_requests.py"
T_GL = "tests/test_graph_late.py"
T_EV = "tests/test_end_verification.py"
# The tests that run a step's attempt against the journal: its intent, take-over, claim and
# outcome.
ST_TIER = (T_RS, T_HZ, T_SC, T_LS, T_LZ, T_CT, T_SS, T_OF, T_RE, T_UW, T_OW, T_IL, T_TK,
           "tests/test_plan.py")


@dataclass(frozen=True)
class Mutant:
    name: str  # the rule it breaks
    path: str
    anchor: str
    replacement: str
    tests: tuple[str, ...]
