-- The demo schema: a chat table whose native trigger broadcasts every change to its room's
-- topic. Public topics (private => false) until private channels are authorized (issue 4).
-- Idempotent, so the demo-page test can load it into its database too.
CREATE EXTENSION IF NOT EXISTS pg_realtime;
CREATE TABLE IF NOT EXISTS chat_messages (
    id bigserial PRIMARY KEY,
    room_id text NOT NULL,
    author text NOT NULL,
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Set by every write, with clock_timestamp(): in a one-statement transaction, close to
    -- its commit. The page subtracts it from the arrival time: commit-to-page latency.
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE TRIGGER chat_broadcast AFTER INSERT OR UPDATE OR DELETE ON chat_messages
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room_id}', '', 'false');
