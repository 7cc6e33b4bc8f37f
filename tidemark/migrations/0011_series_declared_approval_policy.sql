-- A series belongs to the operator: it exists once declared (`tidemark series declare S`, or
-- `tidemark schedule create S`); a plan naming an undeclared series is refused before anything
-- is stored. The declaration may carry the approval policy and approvers of its runs.
CREATE TABLE tidemark.series (
    series       text PRIMARY KEY CHECK (series ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    approval     text,
    approvers    text[],
    declared_by  text NOT NULL,
    os_user      text NOT NULL,
    declared_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE tidemark.series IS
    'Declared series: only these may be named by a plan';
COMMENT ON COLUMN tidemark.series.approval IS
    'The approval policy of its runs (all, none, payments, amount>CUR:FIGURE); null: the '
    'worker''s TIDEMARK_APPROVAL';
COMMENT ON COLUMN tidemark.series.approvers IS
    'Operating-system users who may approve its runs; null: the worker''s TIDEMARK_APPROVERS';
COMMENT ON COLUMN tidemark.series.declared_by IS 'The --by label of who declared it';
COMMENT ON COLUMN tidemark.series.os_user IS 'The operating-system user who declared it';
COMMENT ON COLUMN tidemark.series.series IS 'The series name, as plans name it';
COMMENT ON COLUMN tidemark.series.declared_at IS 'When it was (last) declared';

-- What a run asked a person to approve, as the worker's policy decided at the boundary: the
-- command that records a decision checks the decider against these approvers and shows these
-- lines before it records anything.
CREATE TABLE tidemark.approval_requests (
    task_id      text PRIMARY KEY,
    policy       text NOT NULL,
    approvers    text[] NOT NULL,
    steps        integer[] NOT NULL,
    lines        jsonb NOT NULL,
    asked_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE tidemark.approval_requests IS
    'The latest approval a run waits for: the policy that asked, who may decide, the steps '
    'that wait and what they will do';
COMMENT ON COLUMN tidemark.approval_requests.task_id IS 'The task whose run waits';
COMMENT ON COLUMN tidemark.approval_requests.policy IS
    'The policy that asked (the series'' or the worker''s; "+ plan" when the plan asked too)';
COMMENT ON COLUMN tidemark.approval_requests.approvers IS
    'Operating-system users who may decide; empty: nobody is configured';
COMMENT ON COLUMN tidemark.approval_requests.steps IS 'The irreversible steps that wait';
COMMENT ON COLUMN tidemark.approval_requests.lines IS
    'What the irreversible steps will do, as the person deciding is shown it';
COMMENT ON COLUMN tidemark.approval_requests.asked_at IS 'When a run last asked';
