-- The previous file's session may still be exiting with consumer "test" held.
SELECT wait_until_released('test') AS released;
-- realtime.broadcast_changes from a plpgsql trigger, as Supabase's docs write it. Each
-- payload must equal what Supabase's own plpgsql builds (jsonb_build_object over NEW/OLD),
-- which the trigger records beside it for comparison.
CREATE TABLE notes (id int PRIMARY KEY, body text, n numeric, at timestamptz, tags text[], meta jsonb);
CREATE TABLE supabase_payloads (i serial, payload jsonb);
CREATE FUNCTION notes_broadcast() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM realtime.broadcast_changes('notes:' || COALESCE(NEW.id, OLD.id), TG_OP, TG_OP,
                                       TG_TABLE_NAME, TG_TABLE_SCHEMA, NEW, OLD);
    INSERT INTO supabase_payloads (payload) VALUES (jsonb_build_object(
        'old_record', OLD, 'record', NEW, 'operation', TG_OP, 'table', TG_TABLE_NAME, 'schema', TG_TABLE_SCHEMA));
    RETURN NULL;
END
$$;
CREATE TRIGGER notes_broadcast AFTER INSERT OR UPDATE OR DELETE ON notes
    FOR EACH ROW EXECUTE FUNCTION notes_broadcast();

INSERT INTO notes VALUES (1, 'hello "world"', 1.50, '2026-01-02 03:04:05+00', '{a,b}', '{"k": [1, 2]}');
UPDATE notes SET body = 'edited', n = NULL WHERE id = 1;
DELETE FROM notes WHERE id = 1;

CREATE TEMP TABLE got AS SELECT row_number() OVER () AS i, * FROM realtime.drain('test', NULL, 100, 0);
SELECT i, topic, event, private, payload::jsonb - 'id' AS payload FROM got ORDER BY i;
SELECT g.i, g.payload::jsonb - 'id' = s.payload AS equals_supabase,
       g.payload::jsonb->>'id' = g.id::text AS id_is_message_id
FROM got g JOIN supabase_payloads s ON s.i = g.i ORDER BY g.i;
-- Top-level keys in the order jsonb prints them, as Supabase's payload text has them.
SELECT array_agg(k) FROM (SELECT json_object_keys(payload) k FROM got WHERE i = 1) s;
SELECT count(*) AS confirmed FROM take();

-- Supabase's errors, with the same texts; a NULL topic is a WARNING, as Supabase's send's.
SELECT realtime.broadcast_changes('t', 'e', 'INSERT', 'notes', 'public', NULL, NULL, 'STATEMENT');
SELECT realtime.broadcast_changes('t', 'e', 'TRUNCATE', 'notes', 'public', NULL, NULL);
SELECT realtime.broadcast_changes('t', 'e', NULL, 'notes', 'public', NULL, NULL);
SELECT realtime.broadcast_changes(NULL, 'e', 'INSERT', 'notes', 'public', NULL, NULL);

-- A statement-level trigger that passes TG_LEVEL is refused on its first statement.
CREATE FUNCTION notes_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM realtime.broadcast_changes('notes', TG_OP, TG_OP, TG_TABLE_NAME, TG_TABLE_SCHEMA, NULL, NULL, TG_LEVEL);
    RETURN NULL;
END
$$;
CREATE TRIGGER notes_stmt AFTER INSERT ON notes FOR EACH STATEMENT EXECUTE FUNCTION notes_stmt();
INSERT INTO notes VALUES (2, 'x');
SELECT count(*) AS rows_after_refusal FROM notes;
DROP TRIGGER notes_stmt ON notes;

-- Direct calls with NULL rows give JSON nulls.
SELECT realtime.broadcast_changes('t', 'e', 'DELETE', NULL, NULL, NULL, NULL);
SELECT * FROM take();
