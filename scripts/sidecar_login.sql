-- The least-privilege login a sidecar connects as, in a database where pg_realtime is
-- installed (sidecar/README.md, "Running it"); the test suite and the demo run their sidecars
-- as it. Like PostgREST's authenticator it holds no privilege of its own: EXECUTE on the
-- functions the sidecar calls, and membership in the roles its clients' JWTs may name (a
-- Supabase database's anon, authenticated and service_role). realtime.authorize refuses any
-- other role, and every superuser. Idempotent.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['anon', 'authenticated', 'service_role', 'realtime_sidecar'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I %s', r, CASE WHEN r = 'realtime_sidecar' THEN 'LOGIN' ELSE 'NOLOGIN' END);
        END IF;
    END LOOP;
END
$$;
ALTER ROLE service_role BYPASSRLS;
-- What the clients' roles need so that policies can be evaluated as them.
GRANT USAGE ON SCHEMA realtime TO anon, authenticated, service_role;
GRANT SELECT, INSERT ON realtime.messages TO anon, authenticated, service_role;
-- What the sidecar calls, and whom it may act as.
GRANT USAGE ON SCHEMA realtime TO realtime_sidecar;
GRANT EXECUTE ON FUNCTION realtime.create_consumer(text), realtime.drain(text, bigint, integer, integer, integer, oid[]),
    realtime.drain_packed(text, bigint, integer, integer, integer, oid[]),
    realtime.confirm(text, bigint), realtime.listen(text, text[], text[], boolean, boolean),
    realtime.unlisten(text, text[], text[], boolean), realtime.listen_all(text),
    realtime.relay(bigint, text, text, boolean, json, bytea, uuid, boolean, boolean),
    realtime.authorize(text[], text[], text[], text[], text[], text[]),
    realtime.visible(regclass, text[], text[], text[], integer[]),
    realtime.visible_current(regclass, text[], text[], text[], integer[]),
    realtime.selectable(regclass, text[]), realtime.subscribable(jsonb),
    realtime.render_filter_values(text, oid, integer, text[]), realtime.check_privileges(),
    realtime.match_patterns(text[], text[], text[], integer[], integer),
    realtime.table_oids(text[], text[]), realtime.table_access(text, text, text[]),
    realtime.history(bigint, text[], boolean[], timestamptz, integer, boolean, integer, oid[]),
    realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[], integer, bigint,
        text[], integer, bigint, bigint, bigint, uuid[]),
    realtime.persisted_history(text[], boolean[], timestamptz, integer),
    realtime.expire_persisted(integer), realtime.expire_messages(integer),
    realtime.sync_app_objects() TO realtime_sidecar;
-- Persisted client broadcasts (through the functions above, which run as their caller):
-- written when relayed, read at a replay, deleted when expired.
GRANT SELECT, INSERT, DELETE ON realtime.persisted_messages TO realtime_sidecar;
-- What every sender keeps together and each sender keeps (the persist quotas' counts),
-- added to and counted again.
GRANT SELECT, UPDATE ON realtime.persisted_totals TO realtime_sidecar;
GRANT SELECT, INSERT, UPDATE, DELETE ON realtime.persisted_senders TO realtime_sidecar;
-- Presence: the members and the sidecars' leases, changed only through these functions.
GRANT EXECUTE ON FUNCTION realtime.queue_presence(text, boolean, text),
    realtime.backend_alive(integer), realtime.presence_reap_due(integer),
    realtime.presence_renew(text, interval),
    realtime.presence_track(text, text, boolean, text, jsonb, text),
    realtime.presence_untrack(text, text), realtime.presence_reap(interval),
    realtime.presence_end(text), realtime.presence_state(text[], boolean[], interval) TO realtime_sidecar;
GRANT SELECT, INSERT, UPDATE, DELETE ON realtime.presences, realtime.presence_sessions TO realtime_sidecar;
GRANT USAGE ON SEQUENCE realtime.presence_refs TO realtime_sidecar;
GRANT anon, authenticated, service_role TO realtime_sidecar;
