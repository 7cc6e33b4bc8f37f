"""The mutants of the provider moments.

They cover reads that wait out a throttle or a blip, writes the target turned away, the stamp
check at start, Gmail past its history, the conformance kit."""

from __future__ import annotations

from dev.mutants.base import AT, Mutant

T_PM = "tests/test_provider_moments.py"
T_BI = "tests/test_bind_identity.py"
T_KIT = "tests/test_providers_kit.py"

MUTANTS: tuple[Mutant, ...] = (
    Mutant("reads: a failed probe read is never asked again", "tidemark/reads.py",
           "if time.monotonic() + wait > self.deadline:",
           "if True:",
           (f"{T_PM}::test_one_failed_probe_read_is_asked_again_not_a_decision[drive-"
            "fail_before_commit]",)),
    Mutant("reads: a probe's reads get no budget to wait in", AT,
           "with patient_reads():  # a throttled or failing read is waited out before unknown",
           "with contextlib.nullcontext():",
           (f"{T_PM}::test_one_failed_probe_read_is_asked_again_not_a_decision[stripe-"
            "throttle]",)),
    Mutant("reads: the provider's Retry-After is not honoured", "tidemark/reads.py",
           "wait = max(wait, transient.retry_after)",
           "wait = min(wait, transient.retry_after)",
           (f"{T_PM}::test_the_wait_is_what_retry_after_asks_and_never_past_the_budget",
            f"{T_PM}::test_graphs_retry_after_is_honoured")),
    Mutant("google: a rate-limit 403 reads as a refused credential", "probes/google_http.py",
           "if (status == 403 and reasons and reasons <= RATE_LIMIT_REASONS) or status == 429:",
           "if status == 429:",
           (f"{T_PM}::test_googles_403_rate_limit_is_waited_out_not_read_as_a_refused_"
            "credential",)),
    Mutant("writes: a throttled write holds the target's horizon", AT,
           "if isinstance(e, NotSent):  # turned away or held back: nothing of it can land later",
           "if False:",
           (f"{T_PM}::test_a_throttled_write_applied_nothing_and_the_next_attempt_acts_at_"
            "once[drive]",)),
    Mutant("drive: a read token that cannot see our stamps is let start",
           "activities/drive_identity.py",
           "if (seen.get(\"appProperties\") or {}).get(IDENTITY_PROPERTY) != stamp:",
           "if False:",
           (f"{T_BI}::test_drive_refuses_a_read_token_of_another_oauth_client_that_cannot_see_"
            "our_stamps",)),
    Mutant("gmail: past its history the probe does not search SENT", "probes/gmail.py",
           "ids, doubt = self._sent_by_search(ctx, start)",
           "ids, doubt = [], \"history gone\"",
           ("tests/test_gmail_send.py::test_a_sent_mail_whose_history_expired_is_found_in_sent_"
            "not_left_unknown",)),
    Mutant("kit: facts that must hold together are checked one by one", "tools/kit/providers.py",
           "if facts.get(when) == is_ and facts.get(then) != must]",
           "if False]",
           (f"{T_KIT}::test_a_recording_in_drafts_right_after_the_202_without_the_flag_is_"
            "refused",)),
    Mutant("kit: Graph's property ids are compared as text", "tools/kit/providers.py",
           'return f"{kind.lower()} {int(tag, 16):#x}" if',
           "return value.strip().lower() if",
           (f"{T_KIT}::test_the_kit_reads_graphs_flag_whichever_way_graph_spells_its_id",)),
)
