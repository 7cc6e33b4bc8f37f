-- An action call that ran past its declared deadline (deadline_s) is journaled as an 'overran'
-- event by the attempt's lease keeper: from then on only renewals cover the call, and the
-- worker ends itself before its lease could lapse (tidemark.store.LeaseKeeper).
ALTER TABLE tidemark.events DROP CONSTRAINT events_kind_check;
ALTER TABLE tidemark.events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'plan', 'probe', 'precondition', 'error', 'decision', 'stop', 'release', 'run',
    'verification', 'approval', 'unwound', 'kill', 'blocked', 'grant', 'overran'));
COMMENT ON CONSTRAINT events_kind_check ON tidemark.events IS
    'Known event kinds; verification: the boundary gate re-probed the reversible steps; '
    'approval: a person approved or rejected the irreversible steps; unwound: an unwind '
    'compensated every reversible step that happened; kill: tidemark kill, layer by layer; '
    'blocked: a run of a series refused to start; grant: a per-task credential refused; '
    'overran: an action call passed its declared deadline (detail: phase, key, deadline_s)';
