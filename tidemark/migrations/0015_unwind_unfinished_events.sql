-- An unwind that ended leaving its task to be unwound again (it failed, met a step in doubt,
-- or had a compensation refused) is journaled as an 'unwind_unfinished' event when it ends:
-- `tidemark inbox` and `tidemark status` then say the task waits for its unwind while it stays
-- stopped, as the worklist row the unwind opened does, also for a task whose every step is
-- done (which, stopped, would otherwise read as settled).
ALTER TABLE tidemark.events DROP CONSTRAINT events_kind_check;
ALTER TABLE tidemark.events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'plan', 'probe', 'precondition', 'error', 'decision', 'stop', 'release', 'run',
    'verification', 'approval', 'unwound', 'kill', 'blocked', 'grant', 'overran',
    'unwind_unfinished'));
COMMENT ON CONSTRAINT events_kind_check ON tidemark.events IS
    'Known event kinds; verification: the boundary gate re-probed the reversible steps; '
    'approval: a person approved or rejected the irreversible steps; unwound: an unwind '
    'compensated every reversible step that happened; kill: tidemark kill, layer by layer; '
    'blocked: a run of a series refused to start; grant: a per-task credential refused; '
    'overran: an action call passed its declared deadline (detail: phase, key, deadline_s); '
    'unwind_unfinished: an unwind ended before its task was unwound (detail: state, error, '
    'undone, refused)';
