-- The attempt that owns an open intent: a token written with the intent (or when a later
-- attempt takes the intent over once its lease has lapsed). Every later write of that attempt
-- (its stage, lease, outcome) is conditional on it, so an attempt that lost the intent to a
-- twin writes nothing more, and no connection has to be held across the action's call to keep
-- a twin out (tidemark.attempt).
ALTER TABLE tidemark.journal ADD COLUMN owner uuid;
COMMENT ON COLUMN tidemark.journal.owner IS
    'Token of the attempt that owns this row while it is open (NULL: a row written before '
    'owners existed, or by a person); writes of the attempt are conditional on it';
