-- Tables for the trigger-cost benchmark: the same 6-column table, once per way of broadcasting.
CREATE EXTENSION pg_realtime;

CREATE TABLE t_plain (id bigserial PRIMARY KEY, room int, author text, body text, score numeric, created_at timestamptz);
CREATE TABLE t_noop (LIKE t_plain INCLUDING ALL);
CREATE TABLE t_changes (LIKE t_plain INCLUDING ALL);
CREATE TABLE t_native (LIKE t_plain INCLUDING ALL);
CREATE TABLE t_notify (LIKE t_plain INCLUDING ALL);

-- (a') the floor any row trigger pays: an AFTER ROW plpgsql trigger that does nothing.
CREATE FUNCTION t_noop_nothing() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END
$$;
CREATE TRIGGER t_noop_nothing AFTER INSERT OR UPDATE OR DELETE ON t_noop
    FOR EACH ROW EXECUTE FUNCTION t_noop_nothing();

-- (b) broadcast_changes called from a plpgsql trigger, as Supabase's docs write it.
CREATE FUNCTION t_changes_broadcast() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM realtime.broadcast_changes('room:' || NEW.room, TG_OP, TG_OP, TG_TABLE_NAME, TG_TABLE_SCHEMA, NEW, OLD);
    RETURN NULL;
END
$$;
CREATE TRIGGER t_changes_broadcast AFTER INSERT OR UPDATE OR DELETE ON t_changes
    FOR EACH ROW EXECUTE FUNCTION t_changes_broadcast();

-- (b') the native trigger, same payload.
CREATE TRIGGER t_native_broadcast AFTER INSERT OR UPDATE OR DELETE ON t_native
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room}');

-- (c) the same payload through NOTIFY.
CREATE FUNCTION t_notify_broadcast() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('bench', jsonb_build_object('old_record', OLD, 'record', NEW, 'operation', TG_OP,
                                                   'table', TG_TABLE_NAME, 'schema', TG_TABLE_SCHEMA)::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER t_notify_broadcast AFTER INSERT OR UPDATE OR DELETE ON t_notify
    FOR EACH ROW EXECUTE FUNCTION t_notify_broadcast();

-- (d) Supabase's path: the docs' trigger calling a plpgsql broadcast_changes that inserts
-- into the partitioned messages table, streamed by a logical-replication consumer.
\ir supabase_messages.sql
CREATE TABLE t_supabase (LIKE t_plain INCLUDING ALL);
CREATE FUNCTION t_supabase_broadcast() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM supa.broadcast_changes('room:' || NEW.room, TG_OP, TG_OP, TG_TABLE_NAME, TG_TABLE_SCHEMA, NEW, OLD);
    RETURN NULL;
END
$$;
CREATE TRIGGER t_supabase_broadcast AFTER INSERT OR UPDATE OR DELETE ON t_supabase
    FOR EACH ROW EXECUTE FUNCTION t_supabase_broadcast();

-- (e) Centrifugo's outbox: the trigger writes the publication into the outbox table that
-- Centrifugo's consumer drains.
\ir centrifugo_outbox.sql
CREATE TABLE t_outbox (LIKE t_plain INCLUDING ALL);
CREATE FUNCTION t_outbox_broadcast() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO centrifugo_outbox (method, payload)
    VALUES ('publish', jsonb_build_object('channel', 'bench:room' || NEW.room, 'data',
            jsonb_build_object('old_record', OLD, 'record', NEW, 'operation', TG_OP,
                               'table', TG_TABLE_NAME, 'schema', TG_TABLE_SCHEMA)));
    RETURN NULL;
END
$$;
CREATE TRIGGER t_outbox_broadcast AFTER INSERT OR UPDATE OR DELETE ON t_outbox
    FOR EACH ROW EXECUTE FUNCTION t_outbox_broadcast();

SELECT realtime.create_consumer('bench');

-- Postgres Changes capture (profiled by `profile.py trigger --variant t_captured`; its own
-- benchmark is capture_cost.py): a table in publication supabase_realtime.
CREATE TABLE t_captured (LIKE t_plain INCLUDING ALL);
CREATE PUBLICATION supabase_realtime;
ALTER PUBLICATION supabase_realtime ADD TABLE t_captured;
