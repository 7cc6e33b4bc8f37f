"""The database itself keeps the journal's promises, whatever the code does."""

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tidemark.migrate import MIGRATION_LOCK_ID, migrate, migration_files
from tidemark.store import JournalStore


def seed_task(conn: psycopg.Connection, task_id: str = "t") -> None:
    conn.execute("INSERT INTO tidemark.plans (task_id, plan_hash, step_count) VALUES (%s, %s, 3)",
                 (task_id, "0" * 64))


def open_intent(conn: psycopg.Connection, step: int, key: str, task_id: str = "t") -> None:
    conn.execute("INSERT INTO tidemark.journal (task_id, step, idem_key, action, args)"
                 " VALUES (%s, %s, %s, 'ledger.record', %s)", (task_id, step, key, Jsonb({})))


def test_a_second_open_intent_in_a_task_is_refused_by_the_database(store: JournalStore) -> None:
    with psycopg.connect(store.conninfo, autocommit=True) as conn:
        seed_task(conn)
        open_intent(conn, 1, "a" * 32)
        with pytest.raises(psycopg.errors.UniqueViolation) as e:
            open_intent(conn, 2, "b" * 32)
        assert e.value.diag.constraint_name == "journal_one_in_doubt"
        # Another task is independent.
        seed_task(conn, "u")
        open_intent(conn, 1, "c" * 32, task_id="u")


def test_rows_are_never_deleted_and_outcomes_never_rewritten(store: JournalStore) -> None:
    with psycopg.connect(store.conninfo, autocommit=True) as conn:
        seed_task(conn)
        open_intent(conn, 1, "a" * 32)
        conn.execute("UPDATE tidemark.journal SET outcome = '{}', status = 'done',"
                     " resolved_by = 'execute', finished_at = now()")
        conn.execute("INSERT INTO tidemark.events (task_id, kind) VALUES ('t', 'run')")
        for sql in ("DELETE FROM tidemark.journal",
                    "TRUNCATE tidemark.journal",
                    "TRUNCATE tidemark.events",
                    "UPDATE tidemark.journal SET outcome = '{\"x\": 1}'",
                    "DELETE FROM tidemark.plans",
                    "DELETE FROM tidemark.events"):
            with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
                conn.execute(sql)


OUTCOME_FIELDS = {"outcome": "'{}'::jsonb", "status": "'done'",
                  "finished_at": "clock_timestamp()", "resolved_by": "'execute'"}


@pytest.mark.parametrize("missing", [None, *OUTCOME_FIELDS])
def test_outcome_fields_are_written_together(store: JournalStore, missing: str | None) -> None:
    """An outcome's value, status, time and resolver are written together.

    An outcome is all four at once. Any one of them alone, or all but one, is refused."""
    with psycopg.connect(store.conninfo, autocommit=True) as conn:
        seed_task(conn)
        open_intent(conn, 1, "a" * 32)
        if missing is None:  # one field alone
            fields = {"outcome": OUTCOME_FIELDS["outcome"]}
        else:
            fields = {k: v for k, v in OUTCOME_FIELDS.items() if k != missing}
        sets = ", ".join(f"{k} = {v}" for k, v in fields.items())  # constants of this test
        with pytest.raises(psycopg.errors.CheckViolation, match="journal_outcome_complete"):
            conn.execute(f"UPDATE tidemark.journal SET {sets}")  # type: ignore[arg-type]
        conn.execute("UPDATE tidemark.journal SET "
                     + ", ".join(f"{k} = {v}" for k, v in OUTCOME_FIELDS.items()))  # all: fine


@pytest.mark.parametrize(("column", "value"), [("idem_key", "not-hex"), ("step", 0)])
def test_checks_constrain_values(store: JournalStore, column: str, value: object) -> None:
    with psycopg.connect(store.conninfo, autocommit=True) as conn:
        seed_task(conn)
        row = {"step": 1, "idem_key": "a" * 32, column: value}
        with pytest.raises(psycopg.errors.CheckViolation):
            open_intent(conn, row["step"], row["idem_key"])


def test_every_table_and_column_is_commented(store: JournalStore) -> None:
    with psycopg.connect(store.conninfo) as conn:
        missing = conn.execute(
            "SELECT c.relname, a.attname FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'tidemark'"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
            " WHERE c.relkind = 'r' AND c.relname <> 'schema_migrations'"
            " AND col_description(c.oid, a.attnum) IS NULL").fetchall()
        tables = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'tidemark' AND c.relkind = 'r' AND c.relname <> 'schema_migrations'"
            " AND obj_description(c.oid, 'pg_class') IS NULL").fetchall()
    assert missing == []
    assert tables == []


def test_migrate_is_idempotent(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        first = migrate(conn)
        assert first == [name for _, name, _ in migration_files()]
        assert migrate(conn) == []


def test_two_processes_migrating_at_once_both_succeed(db_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = ("import os, sys, time, json, psycopg; from tidemark.migrate import migrate;"
            "c = psycopg.connect(sys.argv[1], autocommit=True)\n"
            "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"
            "print(json.dumps(migrate(c)))")
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url, str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(0.5)  # both connected and waiting: released together, they race
    go.write_text("")
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    # Between them they applied every migration exactly once (in whatever interleaving).
    applied = sorted(name for out, _ in results for name in json.loads(out))
    assert applied == [name for _, name, _ in migration_files()]
    with psycopg.connect(db_url) as conn:
        versions = [r[0] for r in conn.execute(
            "SELECT version FROM tidemark.schema_migrations ORDER BY version")]
    assert versions == [v for v, _, _ in migration_files()]


def test_a_migration_waits_while_another_process_holds_the_migration_lock(db_url: str) -> None:
    """A migration waits while another process holds the migration lock.

    It is the deterministic counterpart of the race above. While the lock is held, a migrator
    applies nothing (it waits on the lock, as Postgres shows), and it applies everything once the
    lock is let go."""
    code = ("import sys, json, psycopg; from tidemark.migrate import migrate;"
            "print(json.dumps(migrate(psycopg.connect(sys.argv[1], autocommit=True))))")
    waiting_sql = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                   " AND database = (SELECT oid FROM pg_database"
                   "                 WHERE datname = current_database())")
    with psycopg.connect(db_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_ID,))
        proc = subprocess.Popen([sys.executable, "-c", code, db_url], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        waiting = False
        deadline = time.monotonic() + 30
        while not waiting and proc.poll() is None and time.monotonic() < deadline:
            row = holder.execute(waiting_sql).fetchone()
            waiting = row is not None and row[0] == 1
            if not waiting:
                time.sleep(0.02)
        try:
            assert waiting, f"the migrator never waited for the lock: {proc.poll()=}"
            gone = holder.execute("SELECT to_regclass('tidemark.schema_migrations')").fetchone()
            assert gone is not None and gone[0] is None  # nothing applied meanwhile
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_ID,))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out) == [name for _, name, _ in migration_files()]
