-- The journal: persisted plans, two-phase step rows, an append-only event log, stop states.
-- Rows are never deleted: the journal is also the audit trail.

CREATE SCHEMA IF NOT EXISTS tidemark;
COMMENT ON SCHEMA tidemark IS 'Tidemark: durable two-phase journal of agent plans';

CREATE TABLE tidemark.plans (
    task_id     text PRIMARY KEY
                CHECK (task_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    plan_hash   text NOT NULL CHECK (plan_hash ~ '^[0-9a-f]{64}$'),
    step_count  integer NOT NULL CHECK (step_count >= 1),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE tidemark.plans IS
    'One row per task: the plan as persisted before its first step. A changed plan is a new task.';
COMMENT ON COLUMN tidemark.plans.task_id IS 'The task id; workflow id is tidemark-<task_id>';
COMMENT ON COLUMN tidemark.plans.plan_hash IS 'sha256 of the canonical plan JSON (hex)';
COMMENT ON COLUMN tidemark.plans.step_count IS 'Number of steps, kept for constant-cost reports';
COMMENT ON COLUMN tidemark.plans.created_at IS 'When the plan was first persisted';

CREATE TABLE tidemark.plan_steps (
    task_id       text NOT NULL REFERENCES tidemark.plans (task_id),
    step          integer NOT NULL CHECK (step >= 1),
    action        text NOT NULL CHECK (length(action) BETWEEN 1 AND 100),
    args          jsonb NOT NULL CHECK (jsonb_typeof(args) = 'object'),
    irreversible  boolean NOT NULL,
    PRIMARY KEY (task_id, step)
);
COMMENT ON TABLE tidemark.plan_steps IS
    'The persisted plan, one row per step, so that a step is looked up at constant cost';
COMMENT ON COLUMN tidemark.plan_steps.task_id IS 'The task';
COMMENT ON COLUMN tidemark.plan_steps.step IS 'Step number, counted from 1';
COMMENT ON COLUMN tidemark.plan_steps.action IS 'Registered action name';
COMMENT ON COLUMN tidemark.plan_steps.args IS 'Normalised arguments (they go into the key)';
COMMENT ON COLUMN tidemark.plan_steps.irreversible IS 'Whether the action can be compensated';

CREATE TABLE tidemark.journal (
    task_id       text NOT NULL REFERENCES tidemark.plans (task_id),
    phase         text NOT NULL DEFAULT 'do' CHECK (phase IN ('do', 'undo')),
    step          integer NOT NULL CHECK (step >= 1),
    idem_key      text NOT NULL UNIQUE CHECK (idem_key ~ '^[0-9a-f]{32}$'),
    action        text NOT NULL CHECK (length(action) BETWEEN 1 AND 100),
    args          jsonb NOT NULL,
    before_state  jsonb,
    started_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    outcome       jsonb,
    status        text CHECK (status IN ('done', 'failed')),
    finished_at   timestamptz,
    resolved_by   text CHECK (resolved_by IN ('execute', 'probe', 'operator')),
    PRIMARY KEY (task_id, phase, step),
    -- outcome, status, finished_at and resolved_by are written together, once.
    CONSTRAINT journal_outcome_complete CHECK (
        (outcome IS NULL) = (status IS NULL)
        AND (outcome IS NULL) = (finished_at IS NULL)
        AND (outcome IS NULL) = (resolved_by IS NULL))
);
COMMENT ON TABLE tidemark.journal IS
    'Two-phase step journal: the intent row is committed before the action, its outcome after. '
    'A row with no outcome is the (single) step in doubt.';
COMMENT ON COLUMN tidemark.journal.task_id IS 'The task this step belongs to';
COMMENT ON COLUMN tidemark.journal.phase IS 'do: a plan step; undo: its compensation during unwind';
COMMENT ON COLUMN tidemark.journal.step IS 'Step number in the plan, counted from 1';
COMMENT ON COLUMN tidemark.journal.idem_key IS
    'Deterministic idempotency key stamped into the outside write (tidemark.keys.key_for)';
COMMENT ON COLUMN tidemark.journal.action IS 'Registered action name, e.g. drive.rename';
COMMENT ON COLUMN tidemark.journal.args IS 'The step''s normalised arguments';
COMMENT ON COLUMN tidemark.journal.before_state IS
    'Snapshot of the target before the action: what a probe compares with and unwind restores';
COMMENT ON COLUMN tidemark.journal.started_at IS 'When the intent was committed';
COMMENT ON COLUMN tidemark.journal.outcome IS 'What the action returned or the probe observed';
COMMENT ON COLUMN tidemark.journal.status IS 'done: the end state holds; failed: definitely refused';
COMMENT ON COLUMN tidemark.journal.finished_at IS 'When the outcome was committed';
COMMENT ON COLUMN tidemark.journal.resolved_by IS
    'Who settled the outcome: execute (the action returned), probe (after a crash), operator';

-- Promise 1, in the schema: a task can never hold two intents without an outcome.
CREATE UNIQUE INDEX journal_one_in_doubt ON tidemark.journal (task_id) WHERE outcome IS NULL;
COMMENT ON INDEX tidemark.journal_one_in_doubt IS
    'At most one step per task can be in doubt: a second open intent is refused by the database';

CREATE TABLE tidemark.events (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id   text NOT NULL,
    step      integer CHECK (step >= 1),
    kind      text NOT NULL CHECK (kind IN (
                  'plan', 'probe', 'precondition', 'error', 'decision', 'stop', 'release',
                  'run')),
    detail    jsonb NOT NULL DEFAULT '{}'::jsonb,
    actor     text NOT NULL DEFAULT 'tidemark' CHECK (length(actor) BETWEEN 1 AND 200),
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX events_task ON tidemark.events (task_id, id);
COMMENT ON TABLE tidemark.events IS
    'Append-only log: probe results, precondition refusals, errors, operator decisions, stops';
COMMENT ON COLUMN tidemark.events.id IS 'Monotonic id, the order of events';
COMMENT ON COLUMN tidemark.events.task_id IS 'The task concerned';
COMMENT ON COLUMN tidemark.events.step IS 'The step concerned, if any';
COMMENT ON COLUMN tidemark.events.kind IS 'What happened';
COMMENT ON COLUMN tidemark.events.detail IS 'Structured detail; never holds secrets';
COMMENT ON COLUMN tidemark.events.actor IS 'Who caused it: tidemark, or the person (operator name)';
COMMENT ON COLUMN tidemark.events.at IS 'When it was recorded';

CREATE TABLE tidemark.controls (
    scope    text PRIMARY KEY CHECK (length(scope) BETWEEN 1 AND 200),
    state    text NOT NULL CHECK (state IN ('stopped', 'released')),
    reason   text NOT NULL DEFAULT '' CHECK (length(reason) <= 2000),
    set_by   text NOT NULL CHECK (length(set_by) BETWEEN 1 AND 200),
    set_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE tidemark.controls IS
    'Durable stop state. Every start reads it first; a stopped task stays stopped until released.';
COMMENT ON COLUMN tidemark.controls.scope IS 'A task id, or * for every task';
COMMENT ON COLUMN tidemark.controls.state IS 'stopped: nothing may act; released: a person allowed it';
COMMENT ON COLUMN tidemark.controls.reason IS 'Why it was stopped or released';
COMMENT ON COLUMN tidemark.controls.set_by IS 'Who set it';
COMMENT ON COLUMN tidemark.controls.set_at IS 'When it was set';

-- Rows are never deleted, and an outcome once written is never rewritten.
CREATE FUNCTION tidemark.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tidemark.%: % is not allowed (the journal is append-only)',
        TG_TABLE_NAME, TG_OP USING ERRCODE = 'restrict_violation';
END $$;

CREATE TRIGGER plans_append_only BEFORE UPDATE OR DELETE ON tidemark.plans
    FOR EACH ROW EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER plan_steps_append_only BEFORE UPDATE OR DELETE ON tidemark.plan_steps
    FOR EACH ROW EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON tidemark.events
    FOR EACH ROW EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER journal_no_delete BEFORE DELETE ON tidemark.journal
    FOR EACH ROW EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER journal_outcome_once BEFORE UPDATE ON tidemark.journal
    FOR EACH ROW WHEN (OLD.outcome IS NOT NULL) EXECUTE FUNCTION tidemark.refuse_change();

-- TRUNCATE skips row triggers, so it gets a statement trigger of its own.
CREATE TRIGGER plans_no_truncate BEFORE TRUNCATE ON tidemark.plans
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER plan_steps_no_truncate BEFORE TRUNCATE ON tidemark.plan_steps
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON tidemark.journal
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON tidemark.events
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark.refuse_change();
