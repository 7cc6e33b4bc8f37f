-- A step whose target can fence (a mail draft that can be sent only once) journals the fenced
-- handle between its intent and its action: the action then consumes exactly that handle, and a
-- probe after a crash knows which handle to look for.

ALTER TABLE tidemark.journal ADD COLUMN staged jsonb;
COMMENT ON COLUMN tidemark.journal.staged IS
    'The handle the action staged before acting (e.g. a draft id), journaled before the action '
    'consumes it; NULL for actions that do not stage, or before staging';
