-- CREATE EXTENSION pg_realtime in a database Supabase made (supabase_fixture.sql loaded it):
-- realtime.messages is adopted as it is (its oid, owner, grants, partitions and the app's
-- policies) with a DEFAULT partition added; Supabase's send, send_binary and
-- broadcast_changes are replaced by ours and saved; nothing else of Supabase's changes.
-- Then the app works unchanged: its policies decide private channels, its trigger's
-- broadcast_changes and its published table's changes reach the queue. Then the way back:
-- DROP EXTENSION and realtime.restore_replaced_functions() leave the catalog Supabase's
-- Realtime made, fact for fact (regress/fixtures/supabase/describe.sql).
\getenv abs_srcdir PG_ABS_SRCDIR
\getenv abs_builddir PG_ABS_BUILDDIR
\set describe :abs_srcdir '/fixtures/supabase/describe.sql'
\set facts_before :abs_builddir '/supabase_facts_before.txt'
\set facts_installed :abs_builddir '/supabase_facts_installed.txt'
\set facts_after :abs_builddir '/supabase_facts_after.txt'

-- Supabase's catalog before, one line per fact.
\set ECHO none
\pset format unaligned
\pset tuples_only on
\o :facts_before
\i :describe
\o
\pset format aligned
\pset tuples_only off
\set ECHO all
CREATE TABLE facts (phase text, line text);
CREATE FUNCTION read_facts(phase text, file text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- csv with quote and delimiter characters no line has: every line read as it is.
    EXECUTE format($c$COPY facts (line) FROM %L WITH (FORMAT csv, DELIMITER E'\x01', QUOTE E'\x02')$c$, file);
    UPDATE facts SET phase = read_facts.phase WHERE facts.phase IS NULL;
END
$$;
SELECT read_facts('before', :'facts_before');
SELECT 'realtime.messages'::regclass::oid AS messages_oid \gset

-- The control file says superuser = true: the demoted postgres of Supabase's image may not
-- create it (there supabase_admin does, or supautils' privileged extensions list names it).
SET ROLE postgres;
CREATE EXTENSION pg_realtime;
RESET ROLE;

CREATE EXTENSION pg_realtime;

-- realtime.messages is the same table, Supabase's, with its owner and the app's policies.
SELECT c.oid = :messages_oid AS same_table, c.relowner::regrole AS owner, c.relkind,
       EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e') AS member
FROM pg_class c WHERE c.oid = 'realtime.messages'::regclass;
SELECT policyname, cmd, roles FROM pg_policies WHERE schemaname = 'realtime' ORDER BY 1;
-- Its partitions: Supabase's daily ones, and a DEFAULT one nothing has to make each day.
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default, c.relowner::regrole AS owner
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'realtime.messages'::regclass ORDER BY c.relname;
-- send, send_binary and broadcast_changes are ours now (members, in C); topic() is Supabase's.
SELECT p.oid::regprocedure AS function, l.lanname, p.proowner::regrole AS owner,
       EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e') AS member
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = 'realtime'::regnamespace AND p.proname IN ('send', 'send_binary', 'broadcast_changes', 'topic')
ORDER BY 1::text;
-- Supabase's three, kept for the way back as they are (the same owner, grants and body),
-- under other names.
SELECT p.oid::regprocedure AS kept, l.lanname, p.proowner::regrole AS owner, p.proacl AS acl,
       p.oid IN (SELECT objid FROM pg_depend WHERE classid = 'pg_proc'::regclass AND deptype = 'e') AS member
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = 'realtime'::regnamespace AND p.proname LIKE 'supabase\_%' ORDER BY p.proname;
-- The extension depends on the app's objects it uses, so pg_dump creates them before it.
SELECT pg_describe_object(refclassid, refobjid, refobjsubid) AS depends_on
FROM pg_depend WHERE classid = 'pg_extension'::regclass
  AND objid = (SELECT oid FROM pg_extension WHERE extname = 'pg_realtime') ORDER BY 1;
-- The publications are Supabase's, untouched; the published chat table is captured.
SELECT pubname FROM pg_publication ORDER BY 1;
SELECT tgname FROM pg_trigger WHERE tgrelid = 'public.messages'::regclass AND NOT tgisinternal ORDER BY 1;

-- Every fact of Supabase's that changed, besides the extension's own functions and tables:
-- the three functions replaced by ours and kept under other names; the DEFAULT partition
-- added (in Supabase's publication of realtime.messages; the grants the database's default
-- privileges gave on it revoked); realtime_prober's USAGE on schema realtime and INSERT on
-- realtime.messages, the read probe's. No other grant or owner of Supabase's objects changed.
-- Our functions hold no grant the default privileges would give (postgres, dashboard_user).
\c
\set ECHO none
\pset format unaligned
\pset tuples_only on
\o :facts_installed
\i :describe
\o
\pset format aligned
\pset tuples_only off
\set ECHO all
SELECT read_facts('installed', :'facts_installed');
SELECT 'gone' AS change, replace(line, 'arwdDxtm/', 'arwdDxt/') AS line FROM (SELECT line FROM facts WHERE phase = 'before'
                                    EXCEPT SELECT line FROM facts WHERE phase = 'installed') x
UNION ALL
-- (ALL on a table is arwdDxt on 15, arwdDxtm with 17's MAINTAIN: shown as on 15.)
SELECT 'new', replace(line, 'arwdDxtm/', 'arwdDxt/') FROM (SELECT line FROM facts WHERE phase = 'installed'
                                                          EXCEPT SELECT line FROM facts WHERE phase = 'before') y
WHERE (line NOT LIKE 'function %' OR line ~ '^function (supabase_)?(send|send_binary|broadcast_changes|topic)\(')
  AND line !~ '(persisted_messages|presence_sessions|presences|presence_refs)'
ORDER BY 1, 2;

-- Private channels, decided by the app's own policies on realtime.messages: the member of
-- room:lobby may read and write there, the other user may not, anon may not. Asked as the
-- sidecar asks, from a login granted the roles its clients act as (scripts/sidecar_login.sql).
CREATE ROLE fixture_sidecar LOGIN;
GRANT anon, authenticated TO fixture_sidecar;
GRANT USAGE ON SCHEMA realtime TO fixture_sidecar;
GRANT EXECUTE ON FUNCTION realtime.authorize(text[], text[], text[], text[], text[], text[]) TO fixture_sidecar;
\c - fixture_sidecar
SELECT v.ordinality, v.allowed, v.error
FROM realtime.authorize(
    ARRAY['authenticated', 'authenticated', 'authenticated', 'authenticated', 'authenticated', 'anon'],
    ARRAY['{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}',
          '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}',
          '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}',
          '{"sub": "22222222-2222-4222-8222-222222222222", "role": "authenticated"}',
          '{"sub": "22222222-2222-4222-8222-222222222222", "role": "authenticated"}',
          '{"role": "anon"}'],
    ARRAY['{}', '{}', '{}', '{}', '{}', '{}'],
    ARRAY['room:lobby', 'room:lobby', 'room:lobby', 'room:lobby', 'room:lobby', 'room:lobby'],
    ARRAY['broadcast', 'presence', 'broadcast', 'broadcast', 'broadcast', 'broadcast'],
    ARRAY['read', 'read', 'write', 'read', 'write', 'read']) v
ORDER BY 1;
\c - supabase_admin
DROP OWNED BY fixture_sidecar;
DROP ROLE fixture_sidecar;

-- A chat message written as its member: the app's trigger calls realtime.broadcast_changes
-- (ours now: into the queue, no row in realtime.messages) and the published table's change
-- is captured; both are drained, the broadcast on the room's private topic.
SELECT realtime.create_consumer('fixture') >= 0 AS created;
SELECT count(*) AS messages_rows_before FROM realtime.messages;
BEGIN;
SET LOCAL ROLE authenticated;
SELECT set_config('request.jwt.claims', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', true);
INSERT INTO public.messages (room_topic, content) VALUES ('room:lobby', 'after the switch');
COMMIT;
SELECT d.kind, d.topic, d.event, d.private,
       d.payload::jsonb #>> '{record,content}' AS content, d.payload::jsonb ->> 'table' AS "table"
FROM realtime.drain('fixture', NULL, 100, 0, 0, ARRAY['public.messages'::regclass::oid]) d ORDER BY d.seq;
SELECT count(*) AS messages_rows_after FROM realtime.messages;
-- A row the app inserts into Supabase's partitioned realtime.messages (an integration, a cron
-- job) is delivered, as Supabase's server delivers it: each leaf has the delivery trigger,
-- and the row, routed to the DEFAULT partition, reaches the queue at commit with its id.
SELECT c.relname, count(t.oid) AS delivery_triggers
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
LEFT JOIN pg_trigger t ON t.tgrelid = c.oid AND t.tgisinternal AND t.tgfoid = 'realtime.deliver_inserted()'::regprocedure
WHERE i.inhparent = 'realtime.messages'::regclass GROUP BY c.relname ORDER BY c.relname;
BEGIN;
SET LOCAL ROLE authenticated;
SELECT set_config('request.jwt.claims', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', true);
-- The documented INSERT policy reads realtime.topic(), as Supabase's send sets it.
SELECT set_config('realtime.topic', 'room:lobby', true);
INSERT INTO realtime.messages (topic, extension, event, payload, private, id)
VALUES ('room:lobby', 'broadcast', 'inserted', '{"from": "a cron job"}', true, '22222222-2222-4222-8222-222222222222');
COMMIT;
-- (The chat message's two records above are read again: nothing was confirmed.)
SELECT d.kind, d.topic, d.event, d.private, d.payload, d.id
FROM realtime.drain('fixture', NULL, 100, 0) d WHERE d.event = 'inserted' ORDER BY d.seq;
DELETE FROM realtime.messages WHERE id = '22222222-2222-4222-8222-222222222222';
SELECT realtime.drop_consumer('fixture');

-- The way back. DROP EXTENSION cascades to the capture trigger of the published table only;
-- then Supabase's functions return, the DEFAULT partition goes, and the catalog is the
-- one Supabase Realtime made, fact for fact.
DROP EXTENSION pg_realtime CASCADE;
SELECT realtime.restore_replaced_functions();
\c
\set ECHO none
\pset format unaligned
\pset tuples_only on
\o :facts_after
\i :describe
\o
\pset format aligned
\pset tuples_only off
\set ECHO all
SELECT read_facts('after', :'facts_after');
SELECT count(*) > 100 AS described FROM facts WHERE phase = 'after';
(SELECT 'gone' AS change, line FROM facts WHERE phase = 'before' EXCEPT SELECT 'gone', line FROM facts WHERE phase = 'after')
UNION ALL
(SELECT 'new', line FROM facts WHERE phase = 'after' EXCEPT SELECT 'new', line FROM facts WHERE phase = 'before')
ORDER BY 1, 2;
SELECT 'realtime.messages'::regclass::oid = :messages_oid AS same_table,
       (SELECT count(*) FROM pg_policies WHERE schemaname = 'realtime') AS policies;
