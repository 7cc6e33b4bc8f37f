-- The irreversible boundary: a plan may ask a person to approve before its first irreversible
-- step, and the verification gate that runs there, and the person's decision, are logged.

ALTER TABLE tidemark.plans ADD COLUMN approval jsonb
    CHECK (approval IS NULL OR jsonb_typeof(approval) = 'object');
COMMENT ON COLUMN tidemark.plans.approval IS
    'The plan''s approval requirement ({"required": true, "approvers"?: [names]}), part of the '
    'plan hash; NULL: no approval is asked before the irreversible steps';

ALTER TABLE tidemark.events DROP CONSTRAINT events_kind_check;
ALTER TABLE tidemark.events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'plan', 'probe', 'precondition', 'error', 'decision', 'stop', 'release', 'run',
    'verification', 'approval'));
COMMENT ON CONSTRAINT events_kind_check ON tidemark.events IS
    'Known event kinds; verification: the boundary gate re-probed the reversible steps; '
    'approval: a person approved or rejected the irreversible steps';
