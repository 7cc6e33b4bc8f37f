-- A compensation the target refused can be tried again after a person cleared the way. Every
-- try is a journal row of its own, numbered, so no outcome is ever rewritten: attempt 1 is the
-- first try, attempt 2 the next one, and so on. A forward step has exactly one row.

ALTER TABLE tidemark.journal ADD COLUMN attempt integer NOT NULL DEFAULT 1;
ALTER TABLE tidemark.journal ADD CONSTRAINT journal_attempt_valid
    CHECK (attempt >= 1 AND (phase = 'undo' OR attempt = 1));
ALTER TABLE tidemark.journal DROP CONSTRAINT journal_pkey;
ALTER TABLE tidemark.journal ADD CONSTRAINT journal_pkey
    PRIMARY KEY (task_id, phase, step, attempt);
COMMENT ON COLUMN tidemark.journal.attempt IS
    'Which try of this step and phase the row records: always 1 for a forward step; a refused '
    'compensation is tried again under the next number, never by rewriting its row';

-- An unwound task is finished for good: no start runs it forward again. The row is written by
-- the unwind that left nothing to compensate, in the same statement that checks it.
CREATE TABLE tidemark.unwinds (
    task_id     text PRIMARY KEY REFERENCES tidemark.plans (task_id),
    unwound_by  text NOT NULL CHECK (length(unwound_by) BETWEEN 1 AND 200),
    detail      jsonb NOT NULL DEFAULT '{}'::jsonb,
    unwound_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE tidemark.unwinds IS
    'Tasks whose unwind completed: a terminal state that every start of the task refuses';
COMMENT ON COLUMN tidemark.unwinds.task_id IS 'The unwound task';
COMMENT ON COLUMN tidemark.unwinds.unwound_by IS 'Who ran the unwind (the workflow id or a person)';
COMMENT ON COLUMN tidemark.unwinds.detail IS 'What the unwind settled: steps restored, irreversible steps left';
COMMENT ON COLUMN tidemark.unwinds.unwound_at IS 'When the unwind completed';

CREATE TRIGGER unwinds_append_only BEFORE UPDATE OR DELETE ON tidemark.unwinds
    FOR EACH ROW EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER unwinds_no_truncate BEFORE TRUNCATE ON tidemark.unwinds
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark.refuse_change();

ALTER TABLE tidemark.events DROP CONSTRAINT events_kind_check;
ALTER TABLE tidemark.events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'plan', 'probe', 'precondition', 'error', 'decision', 'stop', 'release', 'run',
    'verification', 'approval', 'unwound'));
COMMENT ON CONSTRAINT events_kind_check ON tidemark.events IS
    'Known event kinds; verification: the boundary gate re-probed the reversible steps; '
    'approval: a person approved or rejected the irreversible steps; unwound: an unwind '
    'compensated every reversible step that happened';

COMMENT ON COLUMN tidemark.journal.lease_until IS
    'Until when the attempt acting on this open intent may still be acting or its request still '
    'land: written before the call to cover the action''s deadline plus the target''s horizon, '
    'extended (never shortened) by renewals while it acts, held for the horizon after an '
    'ambiguous failure. NULL: started_at plus the lease (rows written before this column)';
