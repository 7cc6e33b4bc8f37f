-- An attempt that acts on an intent holds a lease on it: a twin does not probe or act while an
-- earlier attempt may still be acting, even if that attempt lost its database connection (and
-- with it the execution lock) mid-action.

ALTER TABLE tidemark.journal ADD COLUMN lease_until timestamptz;
COMMENT ON COLUMN tidemark.journal.lease_until IS
    'Until when the attempt acting on this open intent may still be acting: renewed while it '
    'acts, cut short when it ends without an outcome. NULL: started_at plus the lease';
