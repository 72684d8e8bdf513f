-- The database Supabase made, with pg_realtime installed, backed up with pg_dump -Fc and
-- restored with pg_restore --exit-on-error into a new database: no error, and the restored
-- database is the installed one (Supabase's realtime.messages with its partitions, the
-- DEFAULT one attached, and the app's policies; our send; Supabase's functions kept for
-- the way back). Then the way back there too, which again leaves the catalog Supabase's
-- Realtime made (supabase_install.sql wrote its description before the first install).
\getenv abs_srcdir PG_ABS_SRCDIR
\getenv abs_builddir PG_ABS_BUILDDIR
\set dump :abs_builddir '/supabase.dump'
\setenv DUMP_FILE :dump
\set describe :abs_srcdir '/fixtures/supabase/describe.sql'
\set facts_before :abs_builddir '/supabase_facts_before.txt'
\set facts_restored :abs_builddir '/supabase_facts_restored.txt'

-- Installed again (supabase_install.sql ended with the way back).
CREATE EXTENSION pg_realtime;
CREATE DATABASE supabase_restored;
\! "$PG_REALTIME_BINDIR/pg_dump" -Fc -d supabase_regression -f "$DUMP_FILE" && echo dumped
\! "$PG_REALTIME_BINDIR/pg_restore" --exit-on-error -d supabase_restored "$DUMP_FILE" && echo restored
DROP EXTENSION pg_realtime CASCADE;
SELECT count(*) AS restored_functions FROM realtime.restore_replaced_functions();

\c supabase_restored
SELECT policyname, cmd FROM pg_policies WHERE schemaname = 'realtime' ORDER BY 1;
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'realtime.messages'::regclass ORDER BY c.relname;
SELECT count(*) AS messages_rows FROM realtime.messages;
SELECT p.oid::regprocedure AS function, l.lanname
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = 'realtime'::regnamespace
  AND p.proname IN ('send', 'send_binary', 'broadcast_changes', 'topic', 'supabase_send', 'supabase_send_binary', 'supabase_broadcast_changes')
ORDER BY p.oid::regprocedure::text;
-- The read probe's grants came back with realtime.messages' others.
SELECT a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = 'realtime.messages'::regclass AND a.grantee = 'realtime_prober'::regrole;
SELECT pg_describe_object(refclassid, refobjid, refobjsubid) AS depends_on
FROM pg_depend WHERE classid = 'pg_extension'::regclass
  AND objid = (SELECT oid FROM pg_extension WHERE extname = 'pg_realtime') ORDER BY 1;
SELECT pubname, schemaname, tablename FROM pg_publication_tables ORDER BY 1, 2, 3;
SELECT tgname FROM pg_trigger WHERE tgrelid = 'public.messages'::regclass AND NOT tgisinternal ORDER BY 1;
-- The delivery triggers of rows inserted into realtime.messages: none was in the dump
-- (internal); the partitions the restore attached after CREATE EXTENSION got theirs from the
-- event trigger. An inserted row is delivered.
SELECT c.relname, count(t.oid) AS delivery_triggers
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
LEFT JOIN pg_trigger t ON t.tgrelid = c.oid AND t.tgisinternal AND t.tgfoid = 'realtime.deliver_inserted()'::regprocedure
WHERE i.inhparent = 'realtime.messages'::regclass GROUP BY c.relname ORDER BY c.relname;
SELECT realtime.create_consumer('restored') >= 0 AS created;
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:lobby', 'broadcast', 'inserted', '{}', true);
SELECT kind, topic, event FROM realtime.drain('restored', NULL, 10, 0);
SELECT realtime.drop_consumer('restored');
DELETE FROM realtime.messages;

-- The way back from the restored database.
DROP EXTENSION pg_realtime CASCADE;
SELECT count(*) AS restored_functions FROM realtime.restore_replaced_functions();
\c
\set ECHO none
\pset format unaligned
\pset tuples_only on
\o :facts_restored
\i :describe
\o
\pset format aligned
\pset tuples_only off
\set ECHO all
CREATE TABLE restore_facts (phase text, line text);
COPY restore_facts (line) FROM :'facts_before' WITH (FORMAT csv, DELIMITER E'\x01', QUOTE E'\x02');
UPDATE restore_facts SET phase = 'before';
COPY restore_facts (line) FROM :'facts_restored' WITH (FORMAT csv, DELIMITER E'\x01', QUOTE E'\x02');
UPDATE restore_facts SET phase = 'restored' WHERE phase IS NULL;
SELECT count(*) > 100 AS described FROM restore_facts WHERE phase = 'restored';
-- One difference, pg_dump's own and not a change: it writes no ACL equal to the default, so
-- schema_migrations' explicit owner-only ACL comes back as the default (the same rights).
-- (ALL on a table is arwdDxt on 15, arwdDxtm with 17's MAINTAIN: shown as on 15.)
SELECT change, replace(line, 'arwdDxtm/', 'arwdDxt/') AS line FROM (
    (SELECT 'gone' AS change, line FROM restore_facts WHERE phase = 'before'
     EXCEPT SELECT 'gone', line FROM restore_facts WHERE phase = 'restored')
    UNION ALL
    (SELECT 'new', line FROM restore_facts WHERE phase = 'restored'
     EXCEPT SELECT 'new', line FROM restore_facts WHERE phase = 'before')) d
ORDER BY 1, 2;

\c supabase_regression
DROP DATABASE supabase_restored;
