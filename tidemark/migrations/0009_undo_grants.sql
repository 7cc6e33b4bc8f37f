-- A grant for the undo of a task: a person's unwind acts on a stopped task, and a task's
-- ordinary grants are issued only while nothing stops it. An undo grant is issued only while the
-- task is stopped (not killed) and not yet unwound; a kill revokes it like any other grant.
ALTER TABLE tidemark.grants ADD COLUMN purpose text NOT NULL DEFAULT 'run'
    CHECK (purpose IN ('run', 'undo'));
DROP INDEX tidemark.grants_task;
CREATE INDEX grants_task ON tidemark.grants (task_id, target, scope, purpose);
COMMENT ON COLUMN tidemark.grants.purpose IS
    'run: the steps of a task that nothing stops; undo: the compensations of a person''s '
    'unwind of a stopped (not killed) task, revoked when the unwind ends';
