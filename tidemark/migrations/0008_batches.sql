-- The fast path commits the outcomes of a batch's steps without waiting for the disk and ends
-- each batch with one commit that does wait (tidemark.run_step.run_steps): this row's update.
-- Postgres writes its log in order, so that commit puts every earlier outcome on disk too. A
-- commit that writes nothing would not wait, hence a row to write.
CREATE TABLE tidemark.batches (
    task_id   text PRIMARY KEY REFERENCES tidemark.plans (task_id),
    batches   bigint NOT NULL CHECK (batches > 0),
    steps     bigint NOT NULL CHECK (steps >= 0),
    last_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE tidemark.batches IS
    'Batches of the fast path per task; each ends by updating its row in a synchronous commit, '
    'which makes the outcomes the batch committed before it durable';
COMMENT ON COLUMN tidemark.batches.task_id IS 'The task';
COMMENT ON COLUMN tidemark.batches.batches IS 'Batches that ended so far';
COMMENT ON COLUMN tidemark.batches.steps IS 'Steps those batches settled';
COMMENT ON COLUMN tidemark.batches.last_at IS 'When the latest batch ended';
