-- A backup of a database using pg_realtime restores the app's authorization and data:
-- CREATE EXTENSION, a policy on realtime.messages, a published table, one persisted
-- broadcast; pg_dump -Fc; pg_restore --exit-on-error into a new database of this cluster,
-- which preloads the extension. Everything is there afterwards, and the restore met no error
-- (it stops at the first): the extension makes no publication the dump would make again,
-- and the app's objects it uses (realtime.messages, realtime.topic()) are restored before
-- CREATE EXTENSION, which adopts them (sql/schema.sql).
\getenv abs_builddir PG_ABS_BUILDDIR
\set dump :abs_builddir '/dump_restore.dump'
\setenv DUMP_FILE :dump
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'authenticated') THEN
        CREATE ROLE authenticated NOLOGIN;
    END IF;
END
$$;
CREATE DATABASE dump_source;
CREATE DATABASE dump_target;
\c dump_source
CREATE EXTENSION pg_realtime;
CREATE PUBLICATION supabase_realtime;
CREATE TABLE public.todos (id int PRIMARY KEY, room text);
ALTER PUBLICATION supabase_realtime ADD TABLE public.todos;
CREATE POLICY members_read ON realtime.messages FOR SELECT TO authenticated
    USING ((SELECT realtime.topic()) = 'room:1');
-- What the sidecar writes for a client broadcast sent with persist.
INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, expires_at)
VALUES ('55555555-5555-4555-8555-555555555555', 'room:1', true, 'chat', '{"text": "kept"}', now() + interval '1 day');

\! "$PG_REALTIME_BINDIR/pg_dump" -Fc -d dump_source -f "$DUMP_FILE" && echo dumped
\! "$PG_REALTIME_BINDIR/pg_restore" --exit-on-error -d dump_target "$DUMP_FILE" && echo restored

\c dump_target
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_realtime') AS current_version
FROM pg_extension WHERE extname = 'pg_realtime';
SELECT policyname, roles, qual FROM pg_policies WHERE schemaname = 'realtime';
SELECT id, topic, private, event, payload FROM realtime.persisted_messages;
-- Supabase's grants the extension gave (the API roles exist: upgrade.sql made them).
SELECT r AS role, has_schema_privilege(r, 'realtime', 'USAGE') AS schema_usage,
       has_table_privilege(r, 'realtime.messages', 'SELECT, INSERT, UPDATE') AS messages
FROM unnest(ARRAY['anon', 'authenticated', 'service_role']) r;
SELECT relrowsecurity FROM pg_class WHERE oid = 'realtime.messages'::regclass;
SELECT pubname, tablename FROM pg_publication_tables;
SELECT tgname, tgfoid::regprocedure FROM pg_trigger WHERE tgrelid = 'public.todos'::regclass AND NOT tgisinternal;
SELECT pg_describe_object(refclassid, refobjid, refobjsubid) AS depends_on
FROM pg_depend WHERE classid = 'pg_extension'::regclass
  AND objid = (SELECT oid FROM pg_extension WHERE extname = 'pg_realtime') ORDER BY 1;
-- The restored database works: a send reaches the queue.
SELECT realtime.create_consumer('restored') >= 0 AS created;
SELECT realtime.send('{"a": 1}', 'ev', 'room:1', true);
-- The delivery trigger of rows inserted into realtime.messages is internal, so the dump had
-- none to make again (the restore met no error): the restore's CREATE EXTENSION made it.
SELECT count(*) AS delivery_triggers FROM pg_trigger
WHERE tgrelid = 'realtime.messages'::regclass AND tgisinternal AND tgfoid = 'realtime.deliver_inserted()'::regprocedure;
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:1', 'broadcast', 'inserted', '{"b": 2}', true);
SELECT kind, topic, event, private FROM realtime.drain('restored', NULL, 10, 0);
SELECT realtime.drop_consumer('restored');

-- The read probe's role: made by the first CREATE EXTENSION of the cluster, found by the
-- restore's (a second database), granted INSERT on realtime.messages in both.
SELECT rolname, rolsuper, rolcanlogin, rolbypassrls FROM pg_roles WHERE rolname = 'realtime_prober';
SELECT a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = 'realtime.messages'::regclass AND a.grantee = 'realtime_prober'::regrole;
-- DROP EXTENSION leaves the role (the cluster's, and another database's) and the app's
-- table with its grant; CREATE EXTENSION again finds both.
DROP EXTENSION pg_realtime CASCADE;
SELECT count(*) AS prober_kept FROM pg_roles WHERE rolname = 'realtime_prober';
CREATE EXTENSION pg_realtime;
SELECT a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = 'realtime.messages'::regclass AND a.grantee = 'realtime_prober'::regrole;
-- A role of that name that could log in is refused: its rights would reach every probe.
DROP EXTENSION pg_realtime CASCADE;
ALTER ROLE realtime_prober LOGIN;
CREATE EXTENSION pg_realtime;
ALTER ROLE realtime_prober NOLOGIN;

-- The same dump restored into a new cluster that has never seen the extension: the app's
-- roles made first (as pg_dumpall --globals-only would), realtime_prober not: the restore's
-- CREATE EXTENSION makes it before the dump's grant to it is restored.
\set fresh :abs_builddir '/fresh_cluster'
\setenv FRESH :fresh
\! rm -rf "$FRESH" && mkdir -p "$FRESH" && "$PG_REALTIME_BINDIR/initdb" -D "$FRESH/data" -U postgres --auth=trust >/dev/null 2>&1 && echo initialized
\! printf "shared_preload_libraries = 'pg_realtime'\nrealtime.queue_size = '16MB'\nlisten_addresses = ''\nunix_socket_directories = '%s'\n" "$FRESH" >> "$FRESH/data/postgresql.conf"
\! "$PG_REALTIME_BINDIR/pg_ctl" -D "$FRESH/data" -l "$FRESH/server.log" -w start >/dev/null && echo started
\! "$PG_REALTIME_BINDIR/psql" -X -q -h "$FRESH" -d postgres -c "CREATE ROLE anon" -c "CREATE ROLE authenticated" -c "CREATE ROLE service_role" -c "CREATE DATABASE restored" && echo prepared
\! "$PG_REALTIME_BINDIR/psql" -X -At -h "$FRESH" -d postgres -c "SELECT count(*) AS prober_before FROM pg_roles WHERE rolname = 'realtime_prober'"
\! "$PG_REALTIME_BINDIR/pg_restore" --exit-on-error -h "$FRESH" -d restored "$DUMP_FILE" && echo restored
\! "$PG_REALTIME_BINDIR/psql" -X -At -h "$FRESH" -d restored -c "SELECT rolname, rolsuper, rolcanlogin, rolbypassrls FROM pg_roles WHERE rolname = 'realtime_prober'" -c "SELECT a.privilege_type FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = 'realtime.messages'::regclass AND a.grantee = 'realtime_prober'::regrole" -c "SELECT count(*) FROM realtime.persisted_messages"
\! "$PG_REALTIME_BINDIR/pg_ctl" -D "$FRESH/data" -m fast -w stop >/dev/null && rm -rf "$FRESH" && echo stopped

\c regression
DROP DATABASE dump_source;
DROP DATABASE dump_target;
