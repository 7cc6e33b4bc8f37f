"""The mutants of the controls.

They cover the boundary, stop, unwind, report, kill, RunPlan's ends and halts, batches,
credentials, series, grants, and authority held by the journal."""

from __future__ import annotations

from dev.mutants.base import (
    INTENT_STOP,
    M_AUTH,
    RS,
    S_CONTROLS,
    S_GRANTS,
    S_REPORTS,
    S_SERIES,
    S_SESSION,
    S_STEPS,
    S_UNWINDS,
    T_AP,
    T_AU,
    T_BD,
    T_CR,
    T_CT,
    T_DR,
    T_DU,
    T_FP,
    T_IL,
    T_KL,
    T_OF,
    T_RE,
    T_RP,
    T_SS,
    T_UC,
    T_UW,
    T_WL,
    Mutant,
)

MUTANTS: tuple[Mutant, ...] = (
    # -- a stop's scope and kill's target, matched whole --------------------------------------
    Mutant("stop: a scope holds every task whose id it begins", M_AUTH,
           "          AND (c.scope IN (task, '*')\n",
           "          AND (task LIKE c.scope || '%' OR c.scope = '*'\n",
           (f"{T_SS}::test_a_stop_or_kill_holds_the_task_it_names_and_no_task_whose_id_it_"
            "begins",)),
    Mutant("kill: '*' is taken as a task id", "tools/operate/kill.py",
           'if task.startswith("series:") or task == "*":',
           'if task.startswith("series:"):',
           (f"{T_KL}::test_kill_takes_neither_every_task_nor_a_series_scope_as_a_task_id",)),
    # -- the irreversible boundary --------------------------------------------------------------
    Mutant("the verification gate passes a step that no longer holds", "tidemark/boundary.py",
           "if probed.status is not ProbeStatus.DONE:",
           "if probed.status is ProbeStatus.ABSENT:",
           ("tests/test_boundary.py::test_the_gate_reprobes_done_steps_only_and_takes_a_persons_"
            "word_for_the_ones_she_settled",)),
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
           "return bool((e.http_status or 0) >= 500 and (e.headers or {}).get(",
           "return bool((e.http_status or 0) >= 600 and (e.headers or {}).get(",
           ("tests/test_stripe_payment.py::test_run_step_after_a_replayed_500_leaves_the_step_"
            "for_a_person_never_failed",)),
    Mutant("stripe: a replayed 500 with our payment listed is not done", "activities/stripe.py",
           "if probed.status is ProbeStatus.DONE:",
           "if probed.status is not ProbeStatus.DONE:",
           ("tests/test_stripe_payment.py::test_a_replayed_500_with_our_payment_listed_is_done",
            )),
    # -- stop, release and resolve ----------------------------------------------------------------
    Mutant("resolve --as never closes a step of a task that is not stopped",
           "tools/operate/commands.py",
           "if as_ == Verdict.NEVER and s.stopped is None:\n",
           "if as_ == Verdict.NEVER and s.stopped is None and False:\n",
           (f"{T_CT}::test_resolve_never_closes_an_irreversible_step_in_doubt_and_unwind_"
            "proceeds",)),
    Mutant("stop accepts a task id that names no task", "tools/operate/commands.py",
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
           "if settled is None:\n                    s.complete(",
           "if settled is None and False:\n                    s.complete(",
           (f"{T_UW}::test_a_forward_step_that_never_acted_is_closed_not_executed",)),
    Mutant("a refused compensation is reported as already undone", "tidemark/unwind.py",
           'if last is not None and last.status == "done":',
           "if last is not None and last.outcome is not None:",
           (f"{T_CT}::test_a_refused_compensation_is_tried_again_after_the_way_is_cleared",)),
    Mutant("an unwind acts while an attempt of the step may still be acting", S_SESSION,
           'f" AND owner IS NOT DISTINCT FROM %(seen)s AND {_LEASE_PASSED}"',
           'f" AND owner IS NOT DISTINCT FROM %(seen)s"',
           (f"{T_UC}::test_an_unwind_waits_out_the_lease_of_an_attempt_that_may_still_be_"
            "acting",
            # the lease is judged on two clocks; the database's alone holds a twin only where
            # its clock was set back
            "tests/test_late_requests.py::test_a_backward_step_of_the_databases_clock_keeps_a_"
            "twin_out_until_the_database_agrees")),
    Mutant("an intent is written beside an unwind's list without waiting for it", S_SESSION,
           '"SELECT 1 FROM tidemark.plans WHERE task_id = %s FOR SHARE",',
           '"SELECT 1 FROM tidemark.plans WHERE task_id = %s",',
           (f"{T_IL}::test_an_unwind_waits_for_an_intent_being_written_and_lists_its_step",)),
    Mutant("an intent's lock on the plan row ends before its insert", S_SESSION,
           "with conn.pipeline():\n                    conn.execute(\"SELECT 1 FROM",
           "if True:\n                    conn.execute(\"SELECT 1 FROM",
           (f"{T_IL}::test_an_unwind_waits_for_an_intent_being_written_and_lists_its_step",)),
    Mutant("an unwound mark is written beside an intent it did not see", S_UNWINDS,
           "_translated(), _plan_row_taken(conn, task_id):\n            r = conn.execute(",
           "_translated(), conn.transaction():\n            r = conn.execute(",
           (f"{T_IL}::test_an_intent_never_stands_beside_an_unwound_mark_that_did_not_see_it",)),
    Mutant("a compensation acts without its undo grant", "activities/steps.py",
           "acting_for(self.grants, inp.task_id, GrantPurpose.UNDO)",
           "acting_for(self.grants, inp.task_id)",
           (f"{T_UC}::test_unwind_after_reject_restores_drive_files_on_a_worker_that_holds_no_"
            "grant",)),
    Mutant("resolve: the lease is read from the intent's start, not lease_until", S_STEPS,
           "extract(epoch FROM coalesce(j.lease_until, j.started_at",
           "extract(epoch FROM coalesce(j.started_at",
           (f"{T_CT}::test_resolve_waits_out_the_lease_it_reads_from_lease_until",)),
    Mutant("inbox: a series' stop names the release of the task", "tidemark/needs.py",
           "        return f\"--series {scope.removeprefix('series:')}\"\n",
           "        return task_id\n",
           ("tests/test_release_hint.py::test_the_inbox_names_the_release_of_a_series_stop"
            "[stopped]",
            "tests/test_release_hint.py::test_the_inbox_names_the_release_of_a_series_stop"
            "[killed]")),
    Mutant("resume silently releases a kill", "tools/operate/commands.py",
           'if stop["state"] != ControlState.KILLED:\n        return\n    if lifted_for_unwind',
           'if True:\n        return\n    if lifted_for_unwind',
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
    Mutant("drive: an unwind renames back a file somebody trashed", "activities/drive.py",
           '        if f.get("trashed"):\n            raise Refused(',
           '        if False:\n            raise Refused(',
           (f"{T_DR}::test_compensate_never_renames_back_a_file_someone_trashed",)),
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
    Mutant("kill terminates without letting the step under way finish", "tools/operate/kill.py",
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
    # The release is sent by prepare from the worker (worker.row_release), which returns once
    # Temporal took it. The mutant returns at once and lets the release follow a second later,
    # as an unawaited signal does when the server is slow: the run's own word can cross it.
    Mutant("runplan: a run that ends needing a person opens its row before its release is "
           "answered", "worker.py",
           "        asyncio.run_coroutine_threadsafe(settle(task_id, by), loop)"
           ".result(RELEASE_TIMEOUT_S)\n",
           "        loop.call_soon_threadsafe(loop.call_later, 1.0, asyncio.ensure_future,\n"
           "                                  settle(task_id, by))\n",
           ("tests/test_worklist.py::test_a_run_that_ends_at_its_start_reopens_the_row_only_"
            "after_its_release_reached_it",
            f"{T_WL}::test_a_run_killed_as_it_starts_reopens_the_row_only_after_its_release_"
            "reached_it")),
    Mutant("unwindplan: an unwind that ends unwound leaves a row a run opened while it worked",
           "workflows/unwind_plan.py",
           "            await release(result.task_id, workflow.info().workflow_id)\n",
           "            pass\n",
           ("tests/test_worklist.py::test_an_unwind_that_ends_unwound_closes_a_row_opened_while_"
            "it_ran",)),
    Mutant("unwindplan: an unwind that never began says its task needs its unwind",
           "workflows/unwind_plan.py",
           'if r.error.get("type") == "NotStopped" and not self._run_told:',
           'if r.error.get("type") == "NotStopped" and False:',
           ("tests/test_control_matrix.py::test_control_matrix[unwinding-release]",)),
    Mutant("an unwind that did not finish is not journaled", "activities/steps.py",
           'if inp.detail.get("unfinished"):',
           "if False:",
           ("tests/test_worklist.py::test_a_stop_and_unwind_during_a_step_leave_one_row_that_"
            "says_the_task_waits",
            "tests/test_control_matrix.py::test_control_matrix[running-unwind]")),
    # -- a run's end in the journal, and the rows that say what the journal says -----------------
    Mutant("a run's end is not journaled", "activities/steps.py",
           "            self.store.record_run_ended(inp.task_id, TaskState(inp.state), inp.error,",
           "            False and self.store.record_run_ended(inp.task_id, TaskState(inp.state),"
           " inp.error,",
           (f"{T_WL}::test_a_run_that_ended_stopped_then_released_waits_for_its_resume_in_row_"
            "and_inbox",)),
    Mutant("prepare journals no run's beginning", "activities/steps.py",
           "            self.store.record_run_began(task_id, info.workflow_run_id or \"\",",
           "            False and self.store.record_run_began(task_id, "
           "info.workflow_run_id or \"\",",
           (f"{T_WL}::test_a_resumed_run_waiting_for_approval_is_not_read_as_ended",)),
    Mutant("kill: the end of a run it terminated is not journaled", "tools/operate/kill.py",
           '            if kinds.get(wid) == "RunPlan" and said.startswith("terminated"):',
           '            if False:',
           (f"{T_WL}::test_a_run_killed_at_once_then_released_waits_for_its_resume",)),
    Mutant("inbox: a run terminated outside tidemark is taken for one going on",
           "tools/operate/inbox.py",
           '        if status != "RUNNING":\n            gone[task_id] = status',
           '        if False:\n            gone[task_id] = status',
           (f"{T_WL}::test_a_run_terminated_outside_tidemark_is_listed_as_ended_by_the_inbox",)),
    Mutant("status: a task whose run journaled its beginning alone needs nothing, flatly",
           "tidemark/needs_journal.py",
           '        if run is not None and "began" in run["detail"]:',
           "        if False:",
           (f"{T_WL}::test_a_run_terminated_outside_tidemark_is_listed_as_ended_by_the_inbox",)),
    Mutant("runplan: the row a run opens says the run's word, not the journal's",
           "workflows/run_plan.py",
           "            if word.need != Need.NOTHING or word.settled:\n"
           "                state, need, said = word.state",
           "            if False:\n"
           "                state, need, said = word.state",
           ("tests/test_control_matrix.py::test_control_matrix[halted-start]",
            "tests/test_control_matrix.py::test_control_matrix[killed-start]")),
    Mutant("unwindplan: the row an unfinished unwind opens says the unwind's word",
           "workflows/unwind_plan.py",
           "            if word.need != Need.NOTHING:\n"
           "                state, need, said = word.state",
           "            if False:\n"
           "                state, need, said = word.state",
           ("tests/test_control_matrix.py::test_control_matrix[in_doubt-unwind]",)),
    Mutant("a person's command leaves the task's row as its run left it", "tools/operate/rows.py",
           "    with open_store(url) as store:\n"
           "        one = _need(store, scope) if _one_task(scope) else None\n",
           "    return\n"
           "    with open_store(url) as store:\n"
           "        one = _need(store, scope) if _one_task(scope) else None\n",
           (f"{T_WL}::test_a_step_resolved_as_done_closes_the_row_its_run_opened_for_the_"
            "decision",
            f"{T_WL}::test_a_run_that_ended_stopped_then_released_waits_for_its_resume_in_row_"
            "and_inbox")),
    Mutant("a command on every task brings no row in line", "tools/operate/rows.py",
           "        return [t for t in tasks if store.task_known(t)]",
           "        return []",
           (f"{T_WL}::test_a_release_of_every_task_brings_each_row_of_this_journal_in_line",)),
    Mutant("a row opened for a task settled meanwhile stays open", "workflows/needs_person.py",
           "            if now.settled and self._settled is None:",
           "            if False:",
           (f"{T_WL}::test_a_row_opened_for_a_task_settled_meanwhile_closes_itself",)),
    Mutant("runplan: a run waiting for approval does not read a stop", "workflows/run_plan.py",
           "        if self._waiting:\n            self._approval_news = True",
           "        if False:\n            self._approval_news = True",
           (f"{T_WL}::test_a_stop_holds_a_run_waiting_for_approval_and_it_says_so_until_"
            "released",)),
    Mutant("runplan: a stop read while it waits for approval ends the run",
           "workflows/run_plan.py",
           "            waited = True\n",
           "            waited = False\n",
           (f"{T_WL}::test_a_stop_holds_a_run_waiting_for_approval_and_it_says_so_until_"
            "released",
            "tests/test_kill.py::test_an_approval_under_a_stop_is_refused_then_approve_wait_"
            "follows_the_run")),
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
    Mutant("graph: after a 401 a request is sent again with the token it presented",
           "probes/graph.py",
           "if not fresh or fresh == presented:",
           "if not fresh:",
           (f"{T_CR}::test_graphs_transport_never_sends_again_with_the_token_graph_refused",)),
    # -- kill's four layers ------------------------------------------------------------------------
    Mutant("kill: a kill of a series stops its first run, not the series", "tools/operate/kill.py",
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
           "tools/operate/kill.py",
           "return Target(task, [task], [named] if named else [])",
           "return Target(task, [task], [])",
           ("tests/test_series.py::test_a_killed_run_blocks_the_next_until_a_person_settles_and_"
            "releases_it",)),
    Mutant("kill --all revokes no grant", "tools/operate/kill.py",
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
           "tools/operate/kill.py",
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
    Mutant("kill: a layer that fails ends the kill", "tools/operate/kill.py",
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
    # -- authority held by the journal ------------------------------------------------------------
    Mutant("authority: an irreversible intent is written without an approval",
           M_AUTH, "    RETURN NOT tidemark.approval_needed(task) OR tidemark.approved(task);",
           "    RETURN true;",
           (f"{T_AU}::test_an_activity_called_directly_cannot_act_without_a_valid_approval",)),
    Mutant("authority: a stop or release of the task does not start a new epoch", M_AUTH,
           "    SELECT coalesce(max(c.epoch), 0) FROM tidemark.controls c\n"
           "    WHERE c.scope IN (task, '*')",
           "    SELECT coalesce(max(c.epoch), 0) FROM tidemark.controls c\n"
           "    WHERE false AND c.scope IN (task, '*')",
           (f"{T_AU}::test_an_activity_called_directly_cannot_act_without_a_valid_approval",)),
    Mutant("authority: a second decision of an epoch is recorded too", M_AUTH,
           "    IF FOUND THEN\n        RAISE EXCEPTION 'task % was decided already",
           "    IF false THEN\n        RAISE EXCEPTION 'task % was decided already",
           (f"{T_AU}::test_the_second_decision_is_one_line_naming_the_first_and_exits_non_zero",
            f"{T_AU}::test_a_hundred_approve_reject_pairs_sent_at_once_record_one_decision_"
            "each")),
    Mutant("authority: a decision under a kill is recorded", M_AUTH,
           "    IF stop IS NOT NULL AND (NEW.decision = 'approve' OR stop->>'state' = 'killed') "
           "THEN",
           "    IF stop IS NOT NULL AND NEW.decision = 'approve' AND false THEN",
           ("tests/test_kill.py::test_an_approval_after_a_kill_changes_nothing_and_says_why",)),
    Mutant("authority: the --by label is taken as the decider", M_AUTH,
           "    NEW.decided_by := session_user;",
           "    NEW.decided_by := coalesce(NEW.label, session_user);",
           (f"{T_BD}::test_the_run_waits_and_approve_runs_the_irreversible_steps_once",
            f"{T_AP}::test_by_default_every_irreversible_step_waits_and_only_a_listed_role_"
            "decides")),
    Mutant("authority: a role no approver list names decides", M_AUTH,
           "    SELECT coalesce((SELECT who = ANY(p.approvers) FROM tidemark.approval_policy p",
           "    SELECT true OR coalesce((SELECT who = ANY(p.approvers) FROM "
           "tidemark.approval_policy p",
           (f"{T_BD}::test_the_run_waits_and_approve_runs_the_irreversible_steps_once",
            f"{T_AP}::test_a_decision_by_a_role_not_listed_is_refused_whatever_by_says")),
    Mutant("authority: a role that lacks the act's group role is let through", M_AUTH,
           "    IF NOT tidemark.acts_as(role) OR (role <> 'tidemark_worker' AND "
           "tidemark.is_worker()) THEN",
           "    IF false THEN",
           (f"{T_AU}::test_the_worker_credentials_record_no_approval_declare_no_series_and_lift_"
            "no_kill",)),
    Mutant("authority: a worker's role releases a stop", M_AUTH,
           "    IF NEW.state = 'released' THEN\n        PERFORM tidemark.require_role",
           "    IF false THEN\n        PERFORM tidemark.require_role",
           (f"{T_AU}::test_the_worker_credentials_record_no_approval_declare_no_series_and_lift_"
            "no_kill",)),
    Mutant("authority: a series' policy replaces the operator's", M_AUTH,
           "    RETURN tidemark.policy_asks(g, task, series_name)\n"
           "        OR (series_approval IS NOT NULL AND ",
           "    RETURN (series_approval IS NULL AND tidemark.policy_asks(g, task, series_name))\n"
           "        OR (series_approval IS NOT NULL AND ",
           (f"{T_AU}::test_the_journal_takes_the_strictest_policy_and_sums_amounts_per_task",)),
    Mutant("authority: the journal judges each payment, not the task's sum", M_AUTH,
           "            OR sum(p.amount) > (rules->'limits'->>p.currency)::numeric) THEN",
           "            OR max(p.amount) > (rules->'limits'->>p.currency)::numeric) THEN",
           (f"{T_AU}::test_the_journal_takes_the_strictest_policy_and_sums_amounts_per_task",)),
    Mutant("approval: a policy judges each payment, not the task's sum", "tidemark/approval.py",
           "                totals[cur] = totals.get(cur, 0) + int(args[\"amount\"])",
           "                totals[cur] = max(totals.get(cur, 0), int(args[\"amount\"]))",
           (f"{T_AP}::test_the_policy_setting_is_parsed_and_bad_values_are_one_line",)),
    Mutant("approval: a plan's own ask is not a reason to wait", "tidemark/approval.py",
           "    if plan_asks and irreversible:\n",
           "    if False:\n",
           (f"{T_AP}::test_a_plan_asks_and_the_strictest_policy_is_why_a_person_is_asked",)),
    Mutant("approval: a series policy that no longer parses lets every step through",
           "tidemark/approval.py",
           '        return ApprovalPolicy(text=f"{declared[\'approval\']} (unreadable: all)")',
           "        return None",
           (f"{T_AP}::test_a_series_policy_that_no_longer_parses_makes_every_irreversible_"
            "step_wait",)),
    Mutant("authority: resume runs forward a kill lifted for an unwind",
           "tools/operate/commands.py",
           "    if lifted_for_unwind(stop):\n        raise KilledNotReleased(",
           "    if False:\n        raise KilledNotReleased(",
           (f"{T_AU}::test_a_kill_lifted_for_an_unwind_is_not_lifted_for_a_resume",)),
    Mutant("authority: a plan started by hand joins a scheduled series", "tidemark/series.py",
           "    if declared is not None and declared.get(\"admits\") == \"scheduled\":",
           "    if False:",
           (f"{T_AU}::test_a_plan_started_by_hand_cannot_squat_a_scheduled_series",)),
    Mutant("authority: releasing a series resumes its schedule unasked", "tools/cli/decisions.py",
           "        if a.unpause_schedule:\n",
           "        if True:\n",
           (f"{T_AU}::test_release_of_a_killed_series_says_what_it_did_to_its_schedule",)),
    Mutant("limits: a payment over the per-step limit passes the plan's check",
           "tidemark/payment_limits.py",
           "            refused = self.step_refusal(amount, currency)\n",
           "            refused = None\n",
           (f"{T_AU}::test_a_payment_over_the_per_step_limit_is_refused_by_plan_check_and_at_"
            "start",)),
    Mutant("approval: the approver is not shown what the steps do in all", "tidemark/will_do.py",
           "    if totals:\n        parts.append(\"in all \"",
           "    if False:\n        parts.append(\"in all \"",
           (f"{T_AU}::test_the_approver_sees_every_step_currency_and_recipient_however_long_the_"
            "plan",)),
    Mutant("runplan: an update decides for a run that waits for nothing", "workflows/run_plan.py",
           "        if not (self._waiting and self._result.state == AWAITING_APPROVAL):",
           "        if False:",
           (f"{T_DU}::test_an_update_decides_through_a_decider_as_its_login_role",)),
    Mutant("runplan: a step the journal refuses for want of approval fails the run",
           "workflows/run_plan.py",
           "            if _approval_required(e):\n                # The journal refused",
           "            if False:\n                # The journal refused",
           (f"{T_AU}::test_a_resume_past_the_first_irreversible_step_asks_again_before_the_"
            "next",)),
)
