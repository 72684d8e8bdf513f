-- Tables and policies of the load generator's scenarios (pgbench/scenarios.py, peers.py,
-- connections.py): the database-broadcast table with Supabase's documented trigger, the
-- policy its private channels are joined under, and Centrifugo's outbox.
CREATE EXTENSION IF NOT EXISTS pg_realtime;
\ir supabase_auth.sql

-- db-broadcast: every row is broadcast to room:<k> by realtime.broadcast_changes from a
-- plpgsql trigger, as Supabase's "Broadcast: using the database" writes it (private).
CREATE TABLE bench_rows (id bigserial PRIMARY KEY, k bigint, n bigint, t bigint, body text,
                         created_at timestamptz DEFAULT now());
CREATE FUNCTION bench_rows_broadcast() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
BEGIN
    PERFORM realtime.broadcast_changes('room:' || NEW.k, TG_OP, TG_OP, TG_TABLE_NAME, TG_TABLE_SCHEMA, NEW, OLD);
    RETURN NULL;
END
$$;
CREATE TRIGGER bench_rows_broadcast AFTER INSERT OR UPDATE OR DELETE ON bench_rows
    FOR EACH ROW EXECUTE FUNCTION bench_rows_broadcast();
CREATE POLICY bench_rooms_read ON realtime.messages FOR SELECT TO authenticated
    USING ((SELECT realtime.topic()) LIKE 'room:%');

\ir centrifugo_outbox.sql
