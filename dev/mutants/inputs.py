"""Mutants of the rules on hostile input.

The rules: every input checked where it enters, the emergency controls over whatever the
worklist holds, results kept small, secrets kept out of logs."""

from __future__ import annotations

from dev.mutants.base import Mutant

T_HI = "tests/test_hostile_input.py"
T_LR = "tests/test_large_results.py"
T_SL = "tests/test_secrets_in_logs.py"

MUTANTS: tuple[Mutant, ...] = (
    Mutant("input: the command checks no argument before it acts", "tools/cli/main.py",
           "        check_arguments(args)  # before anything is read or written",
           "        pass",
           (f"{T_HI}::test_case2_a_reason_over_the_journal_limit_is_refused_before_anything_"
            "is_written",)),
    Mutant("input: a run's input is decoded as Python's json decodes it", "workflows/shared.py",
           "    return decode_json(payload.data, field)",
           "    return json.loads(payload.data)",
           (f"{T_HI}::test_case3_a_run_started_with_undecodable_json_ends_at_once[deep]",)),
    Mutant("input: a halt whose payload does not decode is not taken", "workflows/shared.py",
           '    except InputError as e:\n        return cut(f"({e})", max_chars)',
           "    except InputError:\n        raise",
           (f"{T_HI}::test_case2_a_halt_with_any_payload_halts[undecodable]",)),
    Mutant("input: stop --all takes every worklist row for a task of the journal",
           "tools/operate/rows.py",
           "        if ID_RE.fullmatch(task_id):\n            tasks.append(task_id)",
           "        if True:\n            tasks.append(task_id)",
           (f"{T_HI}::test_case1_a_task_id_the_journal_cannot_hold_breaks_no_emergency_"
            "control",)),
    Mutant("input: the gate returns every failure to the workflow", "activities/boundary.py",
           "failures=checked.brief(), verified=checked.verified,",
           "failures=checked.failures, verified=checked.verified,",
           (f"{T_LR}::test_case4_a_plan_whose_every_step_fails_verification_ends_in_one_"
            "attempt",)),
    Mutant("input: a DATABASE_URL that does not read is handed to the driver",
           "tidemark/database.py",
           "    if parts is None or any(",
           "    if False and any(",
           (f"{T_SL}::test_case5_the_command_names_the_setting_and_never_shows_the_password"
            "[DEBUG]",)),
)
