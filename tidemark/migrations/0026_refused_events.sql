-- A start refused before its plan was stored (the plan, its input or the worker's configuration
-- could not be taken: a PlanError, a changed plan, an action the worker lacks) is journaled as a
-- 'refused' event of the task id it named, when the journal knows no plan of it: nothing of the
-- start is stored, and `tidemark inbox` and `status` say what its worklist row says, as they do
-- for a run its series blocked.
ALTER TABLE tidemark.events DROP CONSTRAINT events_kind_check;
ALTER TABLE tidemark.events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'plan', 'probe', 'precondition', 'error', 'decision', 'stop', 'release', 'run',
    'verification', 'approval', 'unwound', 'kill', 'blocked', 'grant', 'overran',
    'unwind_unfinished', 'refused'));
COMMENT ON CONSTRAINT events_kind_check ON tidemark.events IS
    'Known event kinds; verification: the boundary gate re-probed the reversible steps; '
    'approval: a person approved or rejected the irreversible steps; unwound: an unwind '
    'compensated every reversible step that happened; kill: tidemark kill, layer by layer; '
    'blocked: a run of a series refused to start; grant: a per-task credential refused; '
    'overran: an action call passed its declared deadline (detail: phase, key, deadline_s); '
    'unwind_unfinished: an unwind ended before its task was unwound (detail: state, error, '
    'undone, refused); refused: a start refused before its plan was stored (detail: error, run)';
