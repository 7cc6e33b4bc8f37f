-- Series of runs, the `killed` stop state, series-wide stop scopes, and per-task credential
-- grants.

-- A run of a series is admitted (gets its place in the order) only when every earlier run of
-- its series is settled and nothing stops the series; a refused start gets no place and its
-- plan is not persisted. Admission comes just before the plan is persisted (no foreign key).
CREATE TABLE tidemark.series_runs (
    task_id      text PRIMARY KEY CHECK (task_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    series       text NOT NULL CHECK (series ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    position     bigint GENERATED ALWAYS AS IDENTITY,
    admitted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (series, position)
);
COMMENT ON TABLE tidemark.series_runs IS
    'Runs that belong together, in the order they were admitted; an earlier unsettled run '
    'blocks every later one';
COMMENT ON COLUMN tidemark.series_runs.task_id IS 'The run (its task id)';
COMMENT ON COLUMN tidemark.series_runs.series IS 'The series named in the plan';
COMMENT ON COLUMN tidemark.series_runs.position IS 'Order of admission (increasing, with gaps)';
COMMENT ON COLUMN tidemark.series_runs.admitted_at IS 'When the run was admitted to its series';

-- `killed`: set by `tidemark kill`; only `release` lifts it, as it lifts `stopped`.
-- Scopes: a task id, `*`, or `series:<S>` for every run of series S.
ALTER TABLE tidemark.controls DROP CONSTRAINT controls_state_check;
ALTER TABLE tidemark.controls ADD CONSTRAINT controls_state_check
    CHECK (state IN ('stopped', 'killed', 'released'));
COMMENT ON COLUMN tidemark.controls.state IS
    'stopped: nothing may act; killed: stopped by `tidemark kill` (grants revoked, schedules '
    'paused, workflow terminated); released: a person allowed it';
COMMENT ON COLUMN tidemark.controls.scope IS
    'A task id, * for every task, or series:<S> for every run of series S';

ALTER TABLE tidemark.events DROP CONSTRAINT events_kind_check;
ALTER TABLE tidemark.events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'plan', 'probe', 'precondition', 'error', 'decision', 'stop', 'release', 'run',
    'verification', 'approval', 'unwound', 'kill', 'blocked', 'grant'));
COMMENT ON CONSTRAINT events_kind_check ON tidemark.events IS
    'Known event kinds; verification: the boundary gate re-probed the reversible steps; '
    'approval: a person approved or rejected the irreversible steps; unwound: an unwind '
    'compensated every reversible step that happened; kill: tidemark kill, layer by layer; '
    'blocked: a run of a series refused to start; grant: a per-task credential refused';

-- The stop that applies to a task: its own, its series', or the global one, killed first.
CREATE FUNCTION tidemark.stop_of(task text) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(c) FROM tidemark.controls c
    WHERE c.state IN ('stopped', 'killed')
      AND (c.scope IN (task, '*')
           OR c.scope = (SELECT 'series:' || r.series FROM tidemark.series_runs r
                         WHERE r.task_id = task))
    ORDER BY c.state = 'killed' DESC, c.scope = '*', c.scope LIKE 'series:%' LIMIT 1
$$;
COMMENT ON FUNCTION tidemark.stop_of(text) IS
    'The stop state (controls row as jsonb) that applies to a task, or NULL';

CREATE TABLE tidemark.grants (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     text NOT NULL CHECK (length(task_id) BETWEEN 1 AND 128),
    target      text NOT NULL CHECK (length(target) BETWEEN 1 AND 100),
    scope       text NOT NULL CHECK (scope IN ('write', 'read')),
    kind        text NOT NULL CHECK (kind IN ('staging', 'local')),
    issuer      text NOT NULL DEFAULT '' CHECK (length(issuer) <= 2000),
    handle      text NOT NULL CHECK (length(handle) BETWEEN 1 AND 2000),
    issued      timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires     timestamptz NOT NULL,
    revoked     timestamptz,
    revoked_by  text CHECK (length(revoked_by) BETWEEN 1 AND 200),
    CHECK ((revoked IS NULL) = (revoked_by IS NULL))
);
CREATE INDEX grants_task ON tidemark.grants (task_id, target, scope);
COMMENT ON TABLE tidemark.grants IS
    'Per-task credential grants from the grant broker: every outbound call of a task presents '
    'a live one; `tidemark kill` revokes them';
COMMENT ON COLUMN tidemark.grants.id IS 'Grant id';
COMMENT ON COLUMN tidemark.grants.task_id IS 'The task the grant was issued to';
COMMENT ON COLUMN tidemark.grants.target IS 'The target (drive, gmail, ...)';
COMMENT ON COLUMN tidemark.grants.scope IS 'write (actions) or read (probes, snapshots, gates)';
COMMENT ON COLUMN tidemark.grants.kind IS
    'staging: a token minted and revocable at the provider; local: the worker credential, '
    'refused by the broker once revoked (nothing to revoke at the provider)';
COMMENT ON COLUMN tidemark.grants.issuer IS 'Where the grant was minted (provider base URL)';
COMMENT ON COLUMN tidemark.grants.handle IS
    'What revokes it at the provider (for staging the short-lived token itself, useless once '
    'revoked or expired); a fingerprint for local grants. Never logged';
COMMENT ON COLUMN tidemark.grants.issued IS 'When it was issued';
COMMENT ON COLUMN tidemark.grants.expires IS 'When it stops being presented';
COMMENT ON COLUMN tidemark.grants.revoked IS 'When it was revoked, or NULL';
COMMENT ON COLUMN tidemark.grants.revoked_by IS 'Who revoked it';
