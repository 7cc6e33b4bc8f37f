-- The mark of a request that may have left (tidemark.wire): the attempt that owns an open
-- intent writes sent_at, on the thread that sends, just before the step's effect request
-- leaves; returned_at once that attempt knows its request's fate is out of its hands (its call
-- returned without an outcome). While sent_at stands and returned_at does not, the attempt
-- that sent may be frozen with its request still to leave: a probe's absent is then no verdict
-- for a target whose fence cannot stop a late request (tidemark.attempt.resolve_in_doubt).
ALTER TABLE tidemark.journal ADD COLUMN sent_at timestamptz;
ALTER TABLE tidemark.journal ADD COLUMN returned_at timestamptz;
ALTER TABLE tidemark.journal ADD CONSTRAINT journal_returned_after_sent
    CHECK (returned_at IS NULL OR sent_at IS NOT NULL);
COMMENT ON COLUMN tidemark.journal.sent_at IS
    'When the owning attempt marked its effect request as leaving (database clock): from then '
    'on the request may reach the target. NULL: no request of this row left, or the attempt '
    'knows its marked request never left';
COMMENT ON COLUMN tidemark.journal.returned_at IS
    'When the attempt that wrote sent_at reported back (its call ended without an outcome): '
    'its request can no longer leave later. NULL while sent_at stands: the sender never '
    'reported back (it crashed, or it is frozen and may still send)';
COMMENT ON CONSTRAINT journal_returned_after_sent ON tidemark.journal IS
    'Only a marked request reports back';

-- The length of the attempt lease as last written, in seconds, measured by nobody's clock:
-- a twin takes an open intent over only once it has seen the row unchanged (same owner, same
-- row version) for this long on its own monotonic clock, whatever the database's clock did
-- meanwhile (tidemark.attempt.taken_over). Renewals and a stage never shorten it; a take-over,
-- a new intent or claim, the horizon after an ambiguous failure and a lease given back set it.
ALTER TABLE tidemark.journal ADD COLUMN lease_s float8;
ALTER TABLE tidemark.journal ADD CONSTRAINT journal_lease_s_check
    CHECK (lease_s IS NULL OR lease_s >= 0);
COMMENT ON COLUMN tidemark.journal.lease_s IS
    'Seconds the attempt lease covers from its last write (a twin observes the unchanged row '
    'this long on its own clock before it takes it over); NULL: written before lengths were '
    'kept (lease_until - started_at stands in)';
COMMENT ON CONSTRAINT journal_lease_s_check ON tidemark.journal IS
    'A lease length is never negative';
