-- stop_of() is evaluated in every step's read and in the statement that writes its intent. As
-- an SQL function it is planned again at every call (its ORDER BY ... LIMIT keeps it from being
-- inlined); in PL/pgSQL its query is prepared once per session. Same query, same answer, and
-- STABLE as before: it reads the snapshot of the statement that calls it.
CREATE OR REPLACE FUNCTION tidemark.stop_of(task text) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT to_jsonb(c) FROM tidemark.controls c
        WHERE c.state IN ('stopped', 'killed')
          AND (c.scope IN (task, '*')
               OR c.scope = (SELECT 'series:' || r.series FROM tidemark.series_runs r
                             WHERE r.task_id = task))
        ORDER BY c.state = 'killed' DESC, c.scope = '*', c.scope LIKE 'series:%' LIMIT 1);
END
$$;
COMMENT ON FUNCTION tidemark.stop_of(text) IS
    'The stop state (controls row as jsonb) that applies to a task, or NULL';
