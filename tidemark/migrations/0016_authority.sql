-- Authority held by the journal. Who may decide is the database's to know, and the decision is
-- enforced in the statement that writes an irreversible step's intent, as a stop is.
--
-- Three group roles, granted by the operator to login roles:
--   tidemark_worker    runs plans: intents, outcomes, events, asks; it decides nothing
--   tidemark_operator  sets the approval policy, declares series, releases stops and kills,
--                      settles a step in doubt
--   tidemark_approver  approves or rejects a task's irreversible steps
-- A decision is recorded under session_user, the login role of the connection. `--by` and the
-- operating-system user are labels beside it. A superuser is a member of every role, so a laptop
-- stack whose person connects as one can do everything.
--
-- Roles belong to the cluster, not to one database: two journals on one cluster share them.

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['tidemark_worker', 'tidemark_operator', 'tidemark_approver'] LOOP
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            END IF;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database of the cluster created it meanwhile
        END;
    END LOOP;
END $$;

-- Whether the connection's login role is a member of ``role`` (a superuser is of every role).
CREATE FUNCTION tidemark.acts_as(role text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT pg_has_role(session_user, role, 'MEMBER')
$$;
COMMENT ON FUNCTION tidemark.acts_as(text) IS
    'Whether the login role of the connection (session_user) is a member of the role';

-- A worker's login role decides nothing, also when somebody granted it more.
CREATE FUNCTION tidemark.is_worker() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT NOT r.rolsuper AND pg_has_role(session_user, 'tidemark_worker', 'MEMBER')
    FROM pg_roles r WHERE r.rolname = session_user
$$;
COMMENT ON FUNCTION tidemark.is_worker() IS
    'Whether the login role of the connection is a worker''s (a member of tidemark_worker, '
    'not a superuser)';

CREATE FUNCTION tidemark.require_role(role text, what text) RETURNS void LANGUAGE plpgsql
    STABLE AS $$
BEGIN
    IF NOT tidemark.acts_as(role) OR (role <> 'tidemark_worker' AND tidemark.is_worker()) THEN
        RAISE EXCEPTION '% needs the role %: % is not a member of it (an operator grants it: '
            'GRANT % TO %)', what, role, session_user, role, session_user
            USING ERRCODE = 'TA001';
    END IF;
END $$;
COMMENT ON FUNCTION tidemark.require_role(text, text) IS
    'Raises TA001 naming the act unless the login role of the connection holds the role';


-- == Epochs: every stop, kill, release or reject starts a new one ==========================

CREATE SEQUENCE tidemark.control_epochs;
COMMENT ON SEQUENCE tidemark.control_epochs IS
    'Orders every change of a stop state: a decision holds only in the epoch it was made in';

ALTER TABLE tidemark.controls ADD COLUMN epoch bigint;
UPDATE tidemark.controls SET epoch = nextval('tidemark.control_epochs');
ALTER TABLE tidemark.controls ALTER COLUMN epoch SET NOT NULL;
ALTER TABLE tidemark.controls ADD COLUMN for_unwind boolean NOT NULL DEFAULT false;
ALTER TABLE tidemark.controls ADD COLUMN set_role name NOT NULL DEFAULT session_user;
ALTER TABLE tidemark.controls ADD CONSTRAINT controls_for_unwind_of_a_kill
    CHECK (NOT for_unwind OR state = 'killed');
COMMENT ON COLUMN tidemark.controls.epoch IS
    'Bumped by every change (tidemark.control_epochs): a task''s epoch is the largest of its '
    'own, its series'' and the global row; a decision of an earlier epoch is void';
COMMENT ON COLUMN tidemark.controls.for_unwind IS
    'A kill an operator lifted for an unwind only (`tidemark release T --for-unwind`): '
    'compensations may act, nothing runs forward until `tidemark release T`';
COMMENT ON COLUMN tidemark.controls.set_role IS
    'The login role that set it (set_by is the label the person gave)';

-- Who may change a stop state: anybody may stop or kill (the safe direction, a worker's halt
-- included); only an operator releases a stop, lifts a kill or lifts it for an unwind.
CREATE FUNCTION tidemark.guard_control() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'released' THEN
        PERFORM tidemark.require_role('tidemark_operator', 'releasing ' || NEW.scope);
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.for_unwind THEN
            PERFORM tidemark.require_role('tidemark_operator',
                                          'lifting the kill of ' || NEW.scope || ' for an unwind');
        END IF;
    ELSE
        IF NEW.for_unwind AND NOT OLD.for_unwind THEN
            PERFORM tidemark.require_role('tidemark_operator',
                                          'lifting the kill of ' || NEW.scope || ' for an unwind');
        END IF;
        IF OLD.state = 'killed' AND NEW.state = 'stopped' THEN
            RAISE EXCEPTION 'a stop does not replace the kill of %: only a release lifts it',
                NEW.scope USING ERRCODE = 'TA002';
        END IF;
    END IF;
    NEW.epoch := nextval('tidemark.control_epochs');
    NEW.set_role := session_user;
    RETURN NEW;
END $$;
CREATE TRIGGER controls_guard BEFORE INSERT OR UPDATE ON tidemark.controls
    FOR EACH ROW EXECUTE FUNCTION tidemark.guard_control();
COMMENT ON FUNCTION tidemark.guard_control() IS
    'Only an operator releases or lifts a kill; every change starts a new epoch';

-- The stop that applies to a task; an unlifted kill first, then a kill lifted for an unwind.
CREATE OR REPLACE FUNCTION tidemark.stop_of(task text) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT to_jsonb(c) FROM tidemark.controls c
        WHERE c.state IN ('stopped', 'killed')
          AND (c.scope IN (task, '*')
               OR c.scope = (SELECT 'series:' || r.series FROM tidemark.series_runs r
                             WHERE r.task_id = task))
        ORDER BY c.state = 'killed' DESC, c.for_unwind, c.scope = '*',
                 c.scope LIKE 'series:%' LIMIT 1);
END
$$;

CREATE FUNCTION tidemark.epoch_of(task text) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(c.epoch), 0) FROM tidemark.controls c
    WHERE c.scope IN (task, '*')
       OR c.scope = (SELECT 'series:' || r.series FROM tidemark.series_runs r
                     WHERE r.task_id = task)
$$;
COMMENT ON FUNCTION tidemark.epoch_of(text) IS
    'The task''s epoch: the latest change of its own, its series'' or the global stop state';


-- == The approval policy: the operator's, in the journal ===================================

-- rules: {"all": bool, "payments": bool, "nobody": bool, "limits": {"usd": minor units},
-- "daily": {"usd": minor units}}, parsed from the text by tidemark.approval.
CREATE FUNCTION tidemark.rules_valid(rules jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_typeof(rules) = 'object'
       AND rules ?& ARRAY['all', 'payments', 'nobody', 'limits', 'daily']
       AND jsonb_typeof(rules->'limits') = 'object'
       AND jsonb_typeof(rules->'daily') = 'object'
$$;
COMMENT ON FUNCTION tidemark.rules_valid(jsonb) IS 'The shape of a parsed approval policy';

CREATE TABLE tidemark.approval_policy (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    approval   text NOT NULL CHECK (length(approval) BETWEEN 1 AND 500),
    rules      jsonb NOT NULL CHECK (tidemark.rules_valid(rules)),
    approvers  text[] CHECK (approvers IS NULL OR cardinality(approvers) BETWEEN 1 AND 100),
    set_role   name NOT NULL DEFAULT session_user,
    set_by     text NOT NULL CHECK (length(set_by) BETWEEN 1 AND 200),
    set_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE tidemark.approval_policy IS
    'The operator''s approval policy for every task (`tidemark policy set`); none set: every '
    'irreversible step waits for a person. A series and a plan can add to it, never remove';
COMMENT ON COLUMN tidemark.approval_policy.one IS 'Always true: the table holds one row';
COMMENT ON COLUMN tidemark.approval_policy.approval IS
    'The policy as written: all, none, payments, amount>CUR:FIGURE, daily>CUR:FIGURE';
COMMENT ON COLUMN tidemark.approval_policy.rules IS 'The policy parsed (tidemark.rules_valid)';
COMMENT ON COLUMN tidemark.approval_policy.approvers IS
    'Login roles that may decide (each also a member of tidemark_approver); NULL: every member';
COMMENT ON COLUMN tidemark.approval_policy.set_role IS 'The login role that set it';
COMMENT ON COLUMN tidemark.approval_policy.set_by IS 'The label the person gave (--by)';
COMMENT ON COLUMN tidemark.approval_policy.set_at IS 'When it was set';

ALTER TABLE tidemark.series ADD COLUMN rules jsonb CHECK (rules IS NULL OR tidemark.rules_valid(rules));
ALTER TABLE tidemark.series ADD COLUMN admits text NOT NULL DEFAULT 'any'
    CHECK (admits IN ('any', 'scheduled'));
ALTER TABLE tidemark.series ADD COLUMN declared_role name NOT NULL DEFAULT session_user;
COMMENT ON COLUMN tidemark.series.rules IS
    'The series'' policy parsed; NULL with an approval written before rules existed: every '
    'irreversible step of its runs waits';
COMMENT ON COLUMN tidemark.series.admits IS
    'any: a plan started by hand may name it; scheduled: only its schedule''s runs join it';
COMMENT ON COLUMN tidemark.series.declared_role IS 'The login role that (last) declared it';
COMMENT ON COLUMN tidemark.series.approvers IS
    'Login roles that may approve its runs (narrowing the policy''s); NULL: no narrowing';

CREATE FUNCTION tidemark.guard_operator_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    a text;
BEGIN
    PERFORM tidemark.require_role('tidemark_operator', TG_ARGV[0]);
    FOREACH a IN ARRAY coalesce(NEW.approvers, '{}') LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = a) THEN
            RAISE EXCEPTION 'approver %: no such database role (an operator creates it and '
                'grants it tidemark_approver)', a USING ERRCODE = 'TA003';
        END IF;
        IF NOT pg_has_role(a, 'tidemark_approver', 'MEMBER') THEN
            RAISE EXCEPTION 'approver %: the role is not a member of tidemark_approver (GRANT '
                'tidemark_approver TO %)', a, a USING ERRCODE = 'TA003';
        END IF;
    END LOOP;
    IF TG_TABLE_NAME = 'series' THEN
        NEW.declared_role := session_user;
    ELSE
        NEW.set_role := session_user;
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION tidemark.guard_operator_row() IS
    'Only an operator writes the row; records the login role that did';
CREATE TRIGGER series_guard BEFORE INSERT OR UPDATE ON tidemark.series
    FOR EACH ROW EXECUTE FUNCTION tidemark.guard_operator_row('declaring a series');
CREATE TRIGGER approval_policy_guard BEFORE INSERT OR UPDATE ON tidemark.approval_policy
    FOR EACH ROW EXECUTE FUNCTION tidemark.guard_operator_row('setting the approval policy');

-- The irreversible payments of a task: (currency, amount in minor units).
CREATE FUNCTION tidemark.payments_of(task text) RETURNS TABLE (currency text, amount numeric)
    LANGUAGE sql STABLE AS $$
    SELECT lower(s.args->>'currency'), (s.args->>'amount')::numeric
    FROM tidemark.plan_steps s
    WHERE s.task_id = task AND s.irreversible AND s.args ? 'amount' AND s.args ? 'currency'
$$;
COMMENT ON FUNCTION tidemark.payments_of(text) IS
    'The irreversible steps of a task that move money, as (currency, minor units)';

-- Whether parsed policy ``rules`` asks a person for task ``task`` (a series' daily limit counts
-- the payments of the other runs of ``series`` begun today, UTC).
CREATE FUNCTION tidemark.policy_asks(rules jsonb, task text, series text) RETURNS boolean
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF rules IS NULL THEN
        RETURN true;  -- a declaration from before rules: the strictest reading
    END IF;
    IF (rules->>'nobody')::boolean THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM tidemark.plan_steps s WHERE s.task_id = task AND s.irreversible)
    THEN
        RETURN false;
    END IF;
    IF (rules->>'all')::boolean THEN
        RETURN true;
    END IF;
    IF (rules->>'payments')::boolean AND EXISTS (SELECT 1 FROM tidemark.payments_of(task)) THEN
        RETURN true;
    END IF;
    IF rules->'limits' <> '{}'::jsonb AND EXISTS (
        SELECT 1 FROM tidemark.payments_of(task) p GROUP BY p.currency
        HAVING NOT (rules->'limits' ? p.currency)
            OR sum(p.amount) > (rules->'limits'->>p.currency)::numeric) THEN
        RETURN true;
    END IF;
    IF series IS NOT NULL AND rules->'daily' <> '{}'::jsonb AND EXISTS (
        SELECT 1 FROM (
            SELECT p.currency, p.amount FROM tidemark.payments_of(task) p
            UNION ALL
            SELECT lower(j.args->>'currency'), (j.args->>'amount')::numeric
            FROM tidemark.series_runs r
            JOIN tidemark.journal j ON j.task_id = r.task_id AND j.phase = 'do'
            JOIN tidemark.plan_steps s ON s.task_id = j.task_id AND s.step = j.step
            WHERE r.series = policy_asks.series AND r.task_id <> task AND s.irreversible
              AND j.args ? 'amount' AND j.args ? 'currency'
              AND j.status IS DISTINCT FROM 'failed'
              AND j.started_at >= date_trunc('day', now() AT TIME ZONE 'UTC')
                                  AT TIME ZONE 'UTC'
        ) spent
        WHERE rules->'daily' ? spent.currency
        GROUP BY spent.currency
        HAVING sum(spent.amount) > (rules->'daily'->>spent.currency)::numeric) THEN
        RETURN true;
    END IF;
    RETURN false;
END $$;
COMMENT ON FUNCTION tidemark.policy_asks(jsonb, text, text) IS
    'Whether a parsed policy asks a person before the task''s irreversible steps: amounts '
    'summed per task per currency, a daily limit over the series'' runs begun today (UTC)';

-- Whether a person must approve the task's irreversible steps: the operator's policy (every
-- step when none is set), its series' policy, the plan's own ask and a worker's ask, together.
CREATE FUNCTION tidemark.approval_needed(task text) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    g jsonb;
    series_name text;
    series_approval text;
    series_rules jsonb;
BEGIN
    IF EXISTS (SELECT 1 FROM tidemark.plans p WHERE p.task_id = task AND p.approval IS NOT NULL)
       OR EXISTS (SELECT 1 FROM tidemark.approval_requests a WHERE a.task_id = task) THEN
        RETURN EXISTS (SELECT 1 FROM tidemark.plan_steps st
                       WHERE st.task_id = task AND st.irreversible);
    END IF;
    SELECT p.rules INTO g FROM tidemark.approval_policy p;
    IF NOT FOUND THEN
        g := '{"all": true, "payments": false, "nobody": false, "limits": {}, "daily": {}}';
    END IF;
    SELECT d.series, d.approval, d.rules INTO series_name, series_approval, series_rules
        FROM tidemark.series_runs r JOIN tidemark.series d ON d.series = r.series
        WHERE r.task_id = task;
    RETURN tidemark.policy_asks(g, task, series_name)
        OR (series_approval IS NOT NULL AND tidemark.policy_asks(series_rules, task, series_name));
END $$;
COMMENT ON FUNCTION tidemark.approval_needed(text) IS
    'Whether the task''s irreversible steps wait for a person: the strictest of the operator''s '
    'policy, its series'' policy, the plan''s ask and a worker''s ask';


-- == Decisions: one per task and epoch, by an approver the journal knows ===================

CREATE TABLE tidemark.decisions (
    task_id     text NOT NULL REFERENCES tidemark.plans (task_id),
    epoch       bigint NOT NULL CHECK (epoch >= 0),
    decision    text NOT NULL CHECK (decision IN ('approve', 'reject')),
    plan_hash   text NOT NULL CHECK (plan_hash ~ '^[0-9a-f]{64}$'),
    decided_by  name NOT NULL,
    os_user     text CHECK (length(os_user) BETWEEN 1 AND 200),
    label       text CHECK (length(label) BETWEEN 1 AND 200),
    note        text NOT NULL DEFAULT '' CHECK (length(note) <= 2000),
    via         text NOT NULL DEFAULT 'cli' CHECK (via IN ('cli', 'temporal')),
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (task_id, epoch)
);
COMMENT ON TABLE tidemark.decisions IS
    'A person''s approve or reject of a task''s irreversible steps: one per task and epoch (the '
    'first wins); only the current epoch''s approval lets an irreversible intent be written';
COMMENT ON COLUMN tidemark.decisions.task_id IS 'The task decided on';
COMMENT ON COLUMN tidemark.decisions.epoch IS
    'tidemark.epoch_of(task) when it was made; a later stop, kill, release or reject voids it';
COMMENT ON COLUMN tidemark.decisions.decision IS 'approve or reject';
COMMENT ON COLUMN tidemark.decisions.plan_hash IS 'The hash of the plan the person was shown';
COMMENT ON COLUMN tidemark.decisions.decided_by IS
    'The login role of the connection (session_user): the identity that counts';
COMMENT ON COLUMN tidemark.decisions.os_user IS 'The operating-system user (a label)';
COMMENT ON COLUMN tidemark.decisions.label IS 'The name the person gave (--by; a label)';
COMMENT ON COLUMN tidemark.decisions.note IS 'Why, as the person said it';
COMMENT ON COLUMN tidemark.decisions.via IS
    'cli: `tidemark approve|reject`; temporal: a RunPlan update, recorded by a decider';
COMMENT ON COLUMN tidemark.decisions.at IS 'When it was recorded';

CREATE TRIGGER decisions_append_only BEFORE UPDATE OR DELETE ON tidemark.decisions
    FOR EACH ROW EXECUTE FUNCTION tidemark.refuse_change();
CREATE TRIGGER decisions_no_truncate BEFORE TRUNCATE ON tidemark.decisions
    FOR EACH STATEMENT EXECUTE FUNCTION tidemark.refuse_change();

-- Whether login role ``who`` may decide on ``task``: every approver list that applies names it
-- (the operator's policy, the series' declaration, the worker's ask; none given: no narrowing).
CREATE FUNCTION tidemark.approvers_of(task text) RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT ARRAY(
        SELECT unnest(p.approvers) FROM tidemark.approval_policy p
        UNION ALL
        SELECT unnest(d.approvers) FROM tidemark.series_runs r
            JOIN tidemark.series d ON d.series = r.series WHERE r.task_id = task
        UNION ALL
        SELECT unnest(a.approvers) FROM tidemark.approval_requests a WHERE a.task_id = task)
$$;
COMMENT ON FUNCTION tidemark.approvers_of(text) IS
    'Every approver list that applies to a task, run together (for messages)';

CREATE FUNCTION tidemark.may_decide(task text, who text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT who = ANY(p.approvers) FROM tidemark.approval_policy p
                     WHERE p.approvers IS NOT NULL), true)
       AND coalesce((SELECT who = ANY(d.approvers) FROM tidemark.series_runs r
                     JOIN tidemark.series d ON d.series = r.series
                     WHERE r.task_id = task AND d.approvers IS NOT NULL), true)
       AND coalesce((SELECT who = ANY(a.approvers) FROM tidemark.approval_requests a
                     WHERE a.task_id = task AND cardinality(a.approvers) > 0), true)
$$;
COMMENT ON FUNCTION tidemark.may_decide(text, text) IS
    'Whether every approver list that applies to the task names the login role';

CREATE FUNCTION tidemark.release_command(task text, scope text) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN scope = '*' THEN 'tidemark release --all'
                WHEN scope LIKE 'series:%' THEN 'tidemark release --series ' || substr(scope, 8)
                ELSE 'tidemark release ' || task END
$$;
COMMENT ON FUNCTION tidemark.release_command(text, text) IS
    'The command that lifts the stop of scope on the task (as tidemark.errors.release_command)';

CREATE FUNCTION tidemark.check_decision() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    stored text;
    stop jsonb;
    first record;
    reason text;
BEGIN
    PERFORM tidemark.require_role('tidemark_approver', 'deciding on task ' || NEW.task_id);
    NEW.decided_by := session_user;
    NEW.at := clock_timestamp();
    -- One decision at a time per task: a second waits here, then reads what the first did.
    SELECT p.plan_hash INTO stored FROM tidemark.plans p WHERE p.task_id = NEW.task_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no task % is known', NEW.task_id USING ERRCODE = 'TD005';
    END IF;
    IF stored <> NEW.plan_hash THEN
        RAISE EXCEPTION 'task %: the plan shown (%) is not the stored plan (%); nothing was '
            'recorded', NEW.task_id, left(NEW.plan_hash, 12), left(stored, 12)
            USING ERRCODE = 'TD006';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM tidemark.approval_requests a WHERE a.task_id = NEW.task_id)
       OR NOT tidemark.approval_needed(NEW.task_id) THEN
        RAISE EXCEPTION 'task % is not waiting for approval: no run of it reached its '
            'irreversible steps under a policy that asks a person', NEW.task_id
            USING ERRCODE = 'TD005';
    END IF;
    IF EXISTS (SELECT 1 FROM tidemark.unwinds w WHERE w.task_id = NEW.task_id) THEN
        RAISE EXCEPTION 'task % was unwound; there is nothing to decide', NEW.task_id
            USING ERRCODE = 'TD005';
    END IF;
    stop := tidemark.stop_of(NEW.task_id);
    IF stop IS NOT NULL AND (NEW.decision = 'approve' OR stop->>'state' = 'killed') THEN
        RAISE EXCEPTION 'task % is % by % at %: %; a% % now changes nothing and is not '
            'recorded. Release it first (`%`); its run then asks again', NEW.task_id,
            (stop->>'state') || CASE WHEN stop->>'scope' = NEW.task_id THEN ''
                                     ELSE ' (through ' || (stop->>'scope') || ')' END,
            stop->>'set_by', replace(left(stop->>'set_at', 19), 'T', ' '),
            coalesce(nullif(stop->>'reason', ''), 'no reason'),
            CASE WHEN NEW.decision = 'approve' THEN 'n' ELSE '' END, NEW.decision,
            tidemark.release_command(NEW.task_id, stop->>'scope') USING ERRCODE = 'TD004';
    END IF;
    -- Every irreversible step attempted: nothing is left that a decision could hold back or
    -- let go. (After a stop between two of them, the ones left wait for a new decision.)
    IF NOT EXISTS (SELECT 1 FROM tidemark.plan_steps s
                   WHERE s.task_id = NEW.task_id AND s.irreversible AND NOT EXISTS (
                       SELECT 1 FROM tidemark.journal j WHERE j.task_id = s.task_id
                         AND j.phase = 'do' AND j.step = s.step)) THEN
        RAISE EXCEPTION 'task %: irreversible step % was attempted already; a decision now '
            'would change nothing', NEW.task_id, (
                SELECT max(j.step) FROM tidemark.journal j WHERE j.task_id = NEW.task_id
                  AND j.phase = 'do') USING ERRCODE = 'TD005';
    END IF;
    NEW.epoch := tidemark.epoch_of(NEW.task_id);
    SELECT d.decision, d.decided_by, d.label, d.at INTO first FROM tidemark.decisions d
        WHERE d.task_id = NEW.task_id AND d.epoch = NEW.epoch;
    IF FOUND THEN
        RAISE EXCEPTION 'task % was decided already: % by % at %; nothing was recorded',
            NEW.task_id, first.decision,
            first.decided_by || coalesce(' (' || first.label || ')', ''),
            to_char(first.at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"')
            USING ERRCODE = 'TD003';
    END IF;
    IF NOT tidemark.may_decide(NEW.task_id, session_user) THEN
        RAISE EXCEPTION '% may not decide on task %: its approvers are %', session_user,
            NEW.task_id, array_to_string(ARRAY(
                SELECT DISTINCT a FROM unnest(tidemark.approvers_of(NEW.task_id)) a
                ORDER BY a), ', ') USING ERRCODE = 'TD002';
    END IF;
    IF NEW.decision = 'reject' THEN
        -- A reject stops the task: the stop starts the epoch the reject holds in, so that it
        -- stands until a person releases the task (a release starts the next one).
        reason := left('irreversible steps rejected by ' || session_user
                       || coalesce(': ' || nullif(NEW.note, ''), ''), 2000);
        INSERT INTO tidemark.controls (scope, state, reason, set_by)
            VALUES (NEW.task_id, 'stopped', reason, session_user)
            ON CONFLICT (scope) DO UPDATE SET state = EXCLUDED.state, for_unwind = false,
                reason = EXCLUDED.reason, set_by = EXCLUDED.set_by, set_at = clock_timestamp();
        INSERT INTO tidemark.events (task_id, kind, detail, actor)
            VALUES (NEW.task_id, 'stop', jsonb_build_object('reason', reason), session_user);
        NEW.epoch := tidemark.epoch_of(NEW.task_id);
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION tidemark.check_decision() IS
    'A decision is recorded only by an approver the policy names, for the stored plan, in the '
    'current epoch, once; an approve never under a stop, nothing under a kill; a reject stops '
    'the task and holds in the epoch its stop starts';
CREATE TRIGGER decisions_check BEFORE INSERT ON tidemark.decisions
    FOR EACH ROW EXECUTE FUNCTION tidemark.check_decision();

-- The audit trail of a decision: an approval event.
CREATE FUNCTION tidemark.after_decision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tidemark.events (task_id, kind, detail, actor) VALUES (
        NEW.task_id, 'approval', jsonb_build_object(
            'decision', NEW.decision, 'note', NEW.note, 'epoch', NEW.epoch, 'via', NEW.via)
            || jsonb_strip_nulls(jsonb_build_object('label', NEW.label, 'os_user', NEW.os_user)),
        NEW.decided_by);
    RETURN NULL;
END $$;
COMMENT ON FUNCTION tidemark.after_decision() IS 'Journals the decision as an approval event';
CREATE TRIGGER decisions_after AFTER INSERT ON tidemark.decisions
    FOR EACH ROW EXECUTE FUNCTION tidemark.after_decision();

CREATE FUNCTION tidemark.approved(task text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM tidemark.decisions d JOIN tidemark.plans p ON p.task_id = d.task_id
        WHERE d.task_id = task AND d.epoch = tidemark.epoch_of(task)
          AND d.decision = 'approve' AND d.plan_hash = p.plan_hash)
$$;
COMMENT ON FUNCTION tidemark.approved(text) IS
    'Whether the task''s current epoch holds an approval of its stored plan';

-- Whether an irreversible intent may be written: a reversible step always; an irreversible one
-- only with the plan's own action and arguments, and when no approval is needed or the current
-- epoch holds an approval of the stored plan.
CREATE FUNCTION tidemark.approval_holds(task text, step integer, action text, args jsonb)
    RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    planned_action text;
    planned_args jsonb;
    irreversible boolean;
BEGIN
    SELECT ps.action, ps.args, ps.irreversible INTO planned_action, planned_args, irreversible
        FROM tidemark.plan_steps ps WHERE ps.task_id = task AND ps.step = approval_holds.step;
    IF NOT FOUND OR NOT irreversible THEN
        RETURN true;  -- a step outside the plan is refused by the intent's other conditions
    END IF;
    IF planned_action <> approval_holds.action OR planned_args <> approval_holds.args THEN
        RETURN false;
    END IF;
    RETURN NOT tidemark.approval_needed(task) OR tidemark.approved(task);
END $$;
COMMENT ON FUNCTION tidemark.approval_holds(text, integer, text, jsonb) IS
    'Whether a ''do'' intent of the step may be written: reversible, or the plan''s own '
    'irreversible step with no approval needed or an approval of the current epoch';


-- == Events a worker cannot forge ===========================================================

-- A person's verdict on a step in doubt licenses an execution (`tidemark resolve --as absent`),
-- an approval event records a decision: neither may come from a worker.
CREATE FUNCTION tidemark.guard_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'decision' AND NEW.detail->>'as' IS DISTINCT FROM 'used' THEN
        -- ("used": an attempt consumed a person's absent; that only takes a license away)
        PERFORM tidemark.require_role('tidemark_operator', 'deciding on a step in doubt');
    ELSIF NEW.kind = 'approval' THEN
        PERFORM tidemark.require_role('tidemark_approver', 'recording an approval');
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION tidemark.guard_event() IS
    'decision events need an operator, approval events an approver';
CREATE TRIGGER events_guard BEFORE INSERT ON tidemark.events
    FOR EACH ROW WHEN (NEW.kind IN ('decision', 'approval'))
    EXECUTE FUNCTION tidemark.guard_event();

-- An outcome a person settled (`tidemark resolve --as done|never`) needs an operator.
CREATE FUNCTION tidemark.guard_operator_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tidemark.require_role('tidemark_operator', 'settling a step in doubt');
    RETURN NEW;
END $$;
COMMENT ON FUNCTION tidemark.guard_operator_outcome() IS
    'An outcome resolved by operator is written by an operator';
CREATE TRIGGER journal_operator_outcome BEFORE UPDATE ON tidemark.journal
    FOR EACH ROW WHEN (OLD.outcome IS NULL AND NEW.resolved_by = 'operator')
    EXECUTE FUNCTION tidemark.guard_operator_outcome();


-- == Privileges: what each role may read and write ==========================================

REVOKE ALL ON ALL TABLES IN SCHEMA tidemark FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA tidemark FROM PUBLIC;
GRANT USAGE ON SCHEMA tidemark TO tidemark_worker, tidemark_operator, tidemark_approver;
GRANT SELECT ON ALL TABLES IN SCHEMA tidemark
    TO tidemark_worker, tidemark_operator, tidemark_approver;
GRANT USAGE ON SEQUENCE tidemark.control_epochs
    TO tidemark_worker, tidemark_operator, tidemark_approver;
-- A worker: plans and their steps, the journal, events, a halt's stop, asks, grants, admissions,
-- unwinds, batches. UPDATE on plans takes their row locks only (they are append-only).
GRANT INSERT, UPDATE ON tidemark.plans, tidemark.journal, tidemark.controls, tidemark.grants,
    tidemark.approval_requests, tidemark.batches TO tidemark_worker;
GRANT INSERT ON tidemark.plan_steps, tidemark.events, tidemark.series_runs, tidemark.unwinds
    TO tidemark_worker;
-- An operator: stops and releases, series and the policy, settling a step, revoking grants.
GRANT INSERT, UPDATE ON tidemark.controls, tidemark.series, tidemark.approval_policy,
    tidemark.journal, tidemark.grants TO tidemark_operator;
GRANT INSERT ON tidemark.events TO tidemark_operator;
GRANT UPDATE ON tidemark.plans TO tidemark_operator;
-- An approver: decisions (a reject also stops the task and journals it).
GRANT INSERT ON tidemark.decisions, tidemark.events TO tidemark_approver;
GRANT INSERT, UPDATE ON tidemark.controls TO tidemark_approver;
GRANT UPDATE ON tidemark.plans TO tidemark_approver;
