"""The mutants of time.

They cover the checks at the wire (the cover, the mark), what a probe may conclude after an
unanswered mark, the take-over's own clock, and the verification at a plan's end."""

from __future__ import annotations

from dev.mutants.base import AT, S_LEASES, S_SESSION, T_GL, T_LC, T_LR, T_WI, Mutant

MUTANTS: tuple[Mutant, ...] = (
    Mutant("a write leaves once the lease no longer covers it", "tidemark/wire.py",
           "        if not self.covered():",
           "        if not self.covered() and False:",
           (f"{T_WI}::test_a_drive_write_never_leaves_once_the_lease_no_longer_covers_it"
            "[blocking]",
            f"{T_WI}::test_a_graph_write_never_leaves_once_the_lease_no_longer_covers_it")),
    Mutant("the wire lets a request leave within the margin of its cover", S_LEASES,
           "return h is not None and time.monotonic() + LAPSE_MARGIN_S < h.cover_until",
           "return h is not None and time.monotonic() < h.cover_until",
           (f"{T_WI}::test_a_request_within_the_margin_of_its_cover_does_not_leave",)),
    Mutant("a renewal's cover counts the horizon in", S_LEASES,
           "h.cover_until = max(h.cover_until, sent + renew - horizon)",
           "h.cover_until = max(h.cover_until, sent + renew)",
           (f"{T_LC}::test_a_renewal_covers_a_request_only_while_it_can_land_before_the_lease_"
            "ends",)),
    Mutant("a renewal's cover runs from its statement's return", S_LEASES,
           "            renewed = {r[0] for r in cur.fetchall()}\n",
           "            renewed = {r[0] for r in cur.fetchall()}\n"
           "            sent = time.monotonic()\n",
           (f"{T_LC}::test_a_renewal_covers_from_before_its_statement_was_sent",)),
    Mutant("the overrun watch fires only once the cover has ended", S_LEASES,
           "if now >= h.cover_until - LAPSE_MARGIN_S:",
           "if now >= h.cover_until:",
           (f"{T_LC}::test_the_overrun_watch_fires_a_margin_before_the_cover_ends",)),
    Mutant("a renewal extends a lease it did not renew", S_LEASES,
           "            for key in renewed:\n",
           "            for key in held:\n",
           (f"{T_WI}::test_a_renewal_extends_only_the_cover_of_a_lease_it_renewed",)),
    Mutant("a send that a late request could repeat leaves unmarked", AT,
           "marks = side.direction is DO and action.marks_sends",
           "marks = False",
           (f"{T_GL}::test_a_send_whose_flag_shows_late_is_never_sent_again[sent_again]",
            f"{T_LR}::test_a_worker_frozen_after_its_mark_makes_its_twin_ask_a_person_not_"
            "rename_again")),
    Mutant("the mark is written whoever owns the intent", S_SESSION,
           '"UPDATE tidemark.journal SET sent_at = clock_timestamp(), returned_at = NULL"\n'
           '                " WHERE idem_key = %s AND outcome IS NULL AND owner = %s"',
           '"UPDATE tidemark.journal SET sent_at = clock_timestamp(), returned_at = NULL"\n'
           '                " WHERE idem_key = %s AND outcome IS NULL AND %s IS NOT NULL"',
           (f"{T_WI}::test_the_mark_is_refused_once_a_twin_owns_the_intent",)),
    Mutant("absent is a verdict after a mark its sender never answered", AT,
           "    return ProbeResult.unknown(\n        f\"the target shows nothing of this step",
           "    return probed or ProbeResult.unknown(\n        f\"the target shows nothing of "
           "this step",
           (f"{T_LR}::test_a_worker_frozen_after_its_mark_makes_its_twin_ask_a_person_not_"
            "rename_again",)),
    Mutant("graph: a draft whose send was requested reads absent once its sender answered",
           "probes/graph.py",
           "if waiting and ctx.sent_at is not None:",
           "if waiting and ctx.sent_at is not None and not ctx.answered:",
           (f"{T_GL}::test_a_send_whose_flag_shows_late_is_never_sent_again[sent_again]",
            f"{T_GL}::test_a_lost_202_in_the_unflagged_window_sends_one_mail[sent_again]")),
    Mutant("a twin takes over on the database's clock alone", AT,
           "    seen = SIGHTINGS.left(key, (s.seen_owner, s.seen_version), s.lease_length)\n"
           "    if 0 < seen",
           "    seen = 0.0\n    if 0 < seen",
           (f"{T_LR}::test_a_step_of_the_databases_clock_hands_no_step_over_while_its_rename_"
            "is_at_drive",)),
    Mutant("a plan ends completed without the verification at its end",
           "workflows/run_plan.py",
           "        self._show(RUNNING, Need.NOTHING,\n"
           "                   f\"**verifying** the targets steps 1-{count}",
           "        return self._end(COMPLETED)\n"
           "        self._show(RUNNING, Need.NOTHING,\n"
           "                   f\"**verifying** the targets steps 1-{count}",
           ("tests/test_end_verification.py::test_a_plan_never_ends_completed_over_a_file_that_"
            "shows_an_earlier_steps_name",)),
    Mutant("the verification at a plan's end checks nothing", "tidemark/boundary.py",
           "        if at_end and last is None:\n            continue",
           "        if at_end:\n            continue",
           ("tests/test_end_verification.py::test_the_gate_and_the_end_check_the_last_step_of_a_"
            "target_set_twice",)),
)
