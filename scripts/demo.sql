-- The demo schema: a chat table whose native trigger broadcasts every change to its room's
-- topic (public topics), and a task list in publication supabase_realtime, whose changes
-- the page receives as Postgres Changes. Idempotent, so the demo-page test can load it
-- into its database too.
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

CREATE TABLE IF NOT EXISTS demo_tasks (
    id bigserial PRIMARY KEY,
    title text NOT NULL,
    done boolean NOT NULL DEFAULT false,
    -- As chat_messages.updated_at: the page's commit-to-page latency.
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
DO $$
BEGIN
    -- A Supabase project has it; the extension does not make it.
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'supabase_realtime') THEN
        CREATE PUBLICATION supabase_realtime;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_publication_tables
                   WHERE pubname = 'supabase_realtime' AND tablename = 'demo_tasks') THEN
        ALTER PUBLICATION supabase_realtime ADD TABLE demo_tasks;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'anon') THEN
        GRANT SELECT ON demo_tasks TO anon;
    END IF;
END
$$;
