-- The demo schema: a chat table whose native trigger broadcasts every change to the
-- room's topic, and a consumer slot for the live view.
CREATE EXTENSION pg_realtime;
CREATE TABLE chat_messages (
    id bigserial PRIMARY KEY,
    room_id text NOT NULL,
    author text NOT NULL,
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER chat_broadcast AFTER INSERT OR UPDATE OR DELETE ON chat_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room_id}');
SELECT realtime.create_consumer('demo') AS start_position;
