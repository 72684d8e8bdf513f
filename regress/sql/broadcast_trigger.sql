-- realtime.broadcast_trigger(topic [, event [, private]]): a native trigger with
-- broadcast_changes' payload, the topic built from the row's columns.
CREATE TABLE room_messages (id int PRIMARY KEY, room_id text, body text);
CREATE TRIGGER room_broadcast AFTER INSERT OR UPDATE OR DELETE ON room_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room_id}');
INSERT INTO room_messages VALUES (1, 'lobby', 'hi');
UPDATE room_messages SET body = 'hi!', room_id = 'den' WHERE id = 1;
DELETE FROM room_messages WHERE id = 1;
SELECT * FROM take();

-- The payload equals Supabase's for the same change.
INSERT INTO room_messages VALUES (2, 'lobby', 'yo');
SELECT d.payload::jsonb - 'id' = jsonb_build_object('old_record', NULL, 'record', to_jsonb(r),
           'operation', 'INSERT', 'table', 'room_messages', 'schema', 'public') AS equals_supabase
FROM realtime.drain('test', NULL, 10, 0) d, room_messages r WHERE r.id = 2;
SELECT count(*) AS confirmed FROM take();
DROP TRIGGER room_broadcast ON room_messages;

-- Event and private arguments; braces doubled are literal.
CREATE TRIGGER room_custom AFTER INSERT ON room_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('{{x}}:{room_id}:{id}', 'new_message', 'false');
INSERT INTO room_messages VALUES (3, 'lobby', 'hey');
SELECT * FROM take();
DROP TRIGGER room_custom ON room_messages;

-- Misuse is refused with a clear error, and the statement fails.
CREATE TRIGGER bad_column AFTER INSERT ON room_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{nope}');
INSERT INTO room_messages VALUES (4, 'lobby', 'x');
DROP TRIGGER bad_column ON room_messages;
CREATE TRIGGER null_topic AFTER INSERT ON room_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room_id}');
INSERT INTO room_messages VALUES (4, NULL, 'x');
DROP TRIGGER null_topic ON room_messages;
CREATE TRIGGER no_args AFTER INSERT ON room_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger();
INSERT INTO room_messages VALUES (4, 'lobby', 'x');
DROP TRIGGER no_args ON room_messages;
CREATE TRIGGER bad_private AFTER INSERT ON room_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room', 'e', 'maybe');
INSERT INTO room_messages VALUES (4, 'lobby', 'x');
DROP TRIGGER bad_private ON room_messages;
CREATE TRIGGER unterminated AFTER INSERT ON room_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room_id');
INSERT INTO room_messages VALUES (4, 'lobby', 'x');
DROP TRIGGER unterminated ON room_messages;
CREATE TRIGGER before_row BEFORE INSERT ON room_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room');
INSERT INTO room_messages VALUES (4, 'lobby', 'x');
DROP TRIGGER before_row ON room_messages;
CREATE TRIGGER per_statement AFTER INSERT ON room_messages
    FOR EACH STATEMENT EXECUTE FUNCTION realtime.broadcast_trigger('room');
INSERT INTO room_messages VALUES (4, 'lobby', 'x');
DROP TRIGGER per_statement ON room_messages;
SELECT realtime.broadcast_trigger();
SELECT count(*) AS rows_with_id_4 FROM room_messages WHERE id = 4;
SELECT * FROM take();
