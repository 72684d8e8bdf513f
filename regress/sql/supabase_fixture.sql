-- A database Supabase made (regress/fixtures/supabase/README.md): the platform's roles and
-- auth, schema realtime after Supabase Realtime's migrations, the partitions and publication
-- its server makes at run time, and the tutorial app. Loaded quietly; the next files install
-- pg_realtime into it.
\getenv abs_srcdir PG_ABS_SRCDIR
\set ECHO none
\set ON_ERROR_STOP on
\set fixture :abs_srcdir '/fixtures/supabase/'
\set f :fixture '01_platform.sql'
\i :f
\set f :fixture '02_realtime_schema.sql'
\i :f
\set f :fixture '03_realtime_runtime.sql'
\i :f
\set f :fixture '04_tutorial_app.sql'
\i :f
\set ON_ERROR_STOP off
\set ECHO all
RESET ROLE;
SELECT current_user, (SELECT count(*) FROM realtime.schema_migrations) AS migrations,
       (SELECT count(*) FROM pg_policies WHERE schemaname = 'realtime' AND tablename = 'messages') AS policies,
       (SELECT count(*) FROM realtime.messages) AS messages;
