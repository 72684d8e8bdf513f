-- ALTER EXTENSION pg_realtime UPDATE from every released version (the frozen full scripts of
-- extension/released/, installed beside the current one) gives what a fresh install of the
-- current version gives, with the app's objects and data on it kept. For each old version:
-- CREATE EXTENSION at that version on the current library (so every C symbol its script
-- names must still be exported: CREATE FUNCTION ... LANGUAGE c looks it up), the app's
-- objects that depend on the extension, UPDATE, then the catalog described below; then the
-- same from a fresh install; then the difference, which must be empty. Nothing here names a
-- version: a new release only adds its frozen script and its upgrade script.

-- Supabase's API roles: the extension grants them what Supabase does.
CREATE ROLE anon NOLOGIN;
CREATE ROLE authenticated NOLOGIN;
CREATE ROLE service_role NOLOGIN;

-- The catalog of everything the extension made or touches, one line per fact, by name and
-- signature (never by oid; the schema is looked up at each call, as it comes and goes): the extension's members and dependencies, its config tables,
-- schema realtime, functions with their definitions, relations, columns, constraints,
-- indexes, triggers, policies, grants and initial privileges, event triggers, publications.
CREATE FUNCTION catalog() RETURNS SETOF text LANGUAGE sql AS $$
    WITH ext AS (SELECT * FROM pg_extension WHERE extname = 'pg_realtime'),
    rels AS (SELECT c.* FROM pg_class c WHERE c.relnamespace IN (to_regnamespace('realtime'), 'public'::regnamespace))
    SELECT format('extension version=%s config=%s conditions=%s', extversion, extconfig::regclass[], extcondition) FROM ext
    UNION ALL
    -- An internal trigger's name ends in its oid (the delivery triggers, inserted.rs).
    SELECT format('member %s deptype=%s',
                  regexp_replace(pg_describe_object(d.classid, d.objid, d.objsubid), 'realtime_deliver_[0-9]+', 'realtime_deliver_N'),
                  d.deptype)
    FROM pg_depend d, ext WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid
    UNION ALL
    SELECT format('extension depends on %s deptype=%s', pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid), d.deptype)
    FROM pg_depend d, ext WHERE d.classid = 'pg_extension'::regclass AND d.objid = ext.oid
    UNION ALL
    SELECT format('schema %s owner=%s acl=%s', nspname, nspowner::regrole, nspacl) FROM pg_namespace WHERE nspname = 'realtime'
    UNION ALL
    SELECT format('function %s owner=%s acl=%s %s', p.oid::regprocedure, p.proowner::regrole, p.proacl, pg_get_functiondef(p.oid))
    FROM pg_proc p WHERE p.pronamespace IN (to_regnamespace('realtime'), 'public'::regnamespace)
      AND p.proname NOT IN ('catalog', 'app_objects', 'reset', 'released_versions')
    UNION ALL
    SELECT format('relation %s kind=%s persistence=%s owner=%s acl=%s rls=%s', c.oid::regclass, c.relkind, c.relpersistence, c.relowner::regrole, c.relacl, c.relrowsecurity)
    FROM rels c
    UNION ALL
    SELECT format('column %s.%s %s notnull=%s default=%s acl=%s', c.oid::regclass, a.attname, format_type(a.atttypid, a.atttypmod),
                  a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid), a.attacl)
    FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
    UNION ALL
    SELECT format('constraint %s.%s %s', c.oid::regclass, k.conname, pg_get_constraintdef(k.oid))
    FROM rels c JOIN pg_constraint k ON k.conrelid = c.oid
    UNION ALL
    SELECT format('index %s', pg_get_indexdef(i.indexrelid)) FROM rels c JOIN pg_index i ON i.indrelid = c.oid
    UNION ALL
    SELECT format('trigger %s internal=%s', regexp_replace(pg_get_triggerdef(t.oid), 'realtime_deliver_[0-9]+', 'realtime_deliver_N'), t.tgisinternal)
    FROM rels c JOIN pg_trigger t ON t.tgrelid = c.oid AND (NOT t.tgisinternal OR t.tgname LIKE 'realtime\_deliver\_%')
    UNION ALL
    SELECT format('policy %s.%s.%s %s %s to=%s using=%s check=%s', schemaname, tablename, policyname, permissive, cmd, roles, qual, with_check)
    FROM pg_policies
    UNION ALL
    SELECT format('initial privileges %s %s %s', pg_describe_object(classoid, objoid, objsubid), privtype, initprivs)
    FROM pg_init_privs WHERE objoid >= 16384
    UNION ALL
    SELECT format('event trigger %s on %s runs %s tags=%s enabled=%s', evtname, evtevent, evtfoid::regprocedure, evttags, evtenabled)
    FROM pg_event_trigger
    UNION ALL
    SELECT format('publication %s all_tables=%s', pubname, puballtables) FROM pg_publication
    UNION ALL
    SELECT format('publication table %s %s.%s', pubname, schemaname, tablename) FROM pg_publication_tables
$$;

-- The app's objects on the extension: a published table (captured by a trigger on
-- realtime.capture()), a broadcast trigger, a policy on realtime.messages, a SQL function
-- whose body depends on realtime.send, a view on realtime.topic(), a persisted broadcast.
CREATE FUNCTION app_objects() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'supabase_realtime') THEN
        CREATE PUBLICATION supabase_realtime;
    END IF;
    CREATE TABLE public.app_items (id int PRIMARY KEY, room text);
    ALTER PUBLICATION supabase_realtime ADD TABLE public.app_items;
    CREATE TRIGGER app_items_broadcast AFTER INSERT ON public.app_items
        FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room}');
    CREATE POLICY members_read ON realtime.messages FOR SELECT TO PUBLIC USING (realtime.topic() = 'room:1');
    CREATE FUNCTION public.app_send(t text) RETURNS void LANGUAGE sql
        BEGIN ATOMIC SELECT realtime.send('{}'::jsonb, 'ev', t, false); END;
    CREATE VIEW public.app_topic AS SELECT realtime.topic() AS topic;
    INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, expires_at)
    VALUES (gen_random_uuid(), 'room:1', true, 'chat', '{"text": "kept"}', now() + interval '1 day');
END
$$;

-- Back to a database without the extension or anything of the app's on it.
CREATE FUNCTION reset() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DROP EXTENSION IF EXISTS pg_realtime CASCADE;
    DROP VIEW IF EXISTS public.app_topic;
    DROP FUNCTION IF EXISTS public.app_send(text);
    DROP TABLE IF EXISTS public.app_items;
    DROP SCHEMA IF EXISTS realtime CASCADE;
    DROP PUBLICATION IF EXISTS supabase_realtime;
END
$$;

-- Every released version: each one installed beside the current one.
CREATE FUNCTION released_versions() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT version FROM pg_available_extension_versions
    WHERE name = 'pg_realtime' AND version <> (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_realtime')
$$;

CREATE TABLE described (version text, how text, line text);
CREATE TABLE kept (version text, persisted bigint, app_send_works boolean);

-- The resets' cascade notices repeat once per released version: the output must not grow
-- with each release.
SET client_min_messages = warning;
DO $$
DECLARE
    v text;
BEGIN
    FOR v IN SELECT released_versions() LOOP
        PERFORM reset();
        EXECUTE format('CREATE EXTENSION pg_realtime VERSION %L', v);
        PERFORM app_objects();
        ALTER EXTENSION pg_realtime UPDATE;
        INSERT INTO described SELECT v, 'updated', line FROM catalog() line;
        PERFORM public.app_send('room:1');
        INSERT INTO kept SELECT v, count(*), true FROM realtime.persisted_messages;

        PERFORM reset();
        CREATE EXTENSION pg_realtime;
        PERFORM app_objects();
        INSERT INTO described SELECT v, 'fresh', line FROM catalog() line;
    END LOOP;
END
$$;
RESET client_min_messages;

-- At least one released version was tested, and each ended at the current version.
SELECT count(DISTINCT version) > 0 AS some_released_version_tested FROM described;
SELECT count(*) AS versions_not_at_default FROM described
WHERE how = 'updated' AND line LIKE 'extension version=%'
  AND line NOT LIKE 'extension version=' || (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_realtime') || ' %';
-- The app's data and objects survived the update.
SELECT bool_and(persisted = 1 AND app_send_works) AS kept_everywhere FROM kept;
-- Every fact of an updated database is one of a fresh install, and the other way round.
(SELECT version, 'only after UPDATE' AS where_, line FROM described WHERE how = 'updated'
 EXCEPT SELECT version, 'only after UPDATE', line FROM described WHERE how = 'fresh')
UNION ALL
(SELECT version, 'only in a fresh install', line FROM described WHERE how = 'fresh'
 EXCEPT SELECT version, 'only in a fresh install', line FROM described WHERE how = 'updated')
ORDER BY 1, 2, 3;
-- What the extension depends on outside itself: its schema, and the app's objects it uses
-- (recorded so that pg_dump creates them first).
SELECT DISTINCT line FROM described WHERE line LIKE 'extension depends on %' ORDER BY 1;
-- The description is not empty (a compare of two empty sets would pass): it has the members.
SELECT count(*) > 30 AS described_members FROM described WHERE how = 'fresh' AND line LIKE 'member %';

SET client_min_messages = warning;
SELECT reset();

-- A sidecar's login keeps what it may call across an update: one granted every function of
-- an old version (as that version's sidecar_login.sql granted what its sidecar called) may
-- call this version's relay and relay_batch and count the persist quotas' totals, which the
-- updates replaced or added (a DROP takes a function's grants along: 0.4.0's update once left
-- them out, and every client broadcast of an updated database was refused).
CREATE ROLE old_sidecar NOLOGIN;
CREATE TABLE carried (version text, relay boolean, relay_batch boolean, totals boolean);
DO $$
DECLARE
    v text;
BEGIN
    FOR v IN SELECT released_versions() LOOP
        PERFORM reset();
        EXECUTE format('CREATE EXTENSION pg_realtime VERSION %L', v);
        GRANT USAGE ON SCHEMA realtime TO old_sidecar;
        GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA realtime TO old_sidecar;
        ALTER EXTENSION pg_realtime UPDATE;
        INSERT INTO carried SELECT v,
            has_function_privilege('old_sidecar', 'realtime.relay(bigint,text,text,boolean,json,bytea,uuid,boolean,boolean)', 'EXECUTE'),
            has_function_privilege('old_sidecar', 'realtime.relay_batch(bigint[],text[],text[],boolean[],text[],bytea[],integer[],integer,bigint,text[],integer,bigint,bigint,bigint,uuid[])', 'EXECUTE'),
            has_table_privilege('old_sidecar', 'realtime.persisted_totals', 'UPDATE');
    END LOOP;
    PERFORM reset();
END
$$;
SELECT count(*) > 0 AS some_released_version_tested, bool_and(relay AND relay_batch AND totals) AS carried FROM carried;
DROP OWNED BY old_sidecar;
DROP ROLE old_sidecar;
RESET client_min_messages;
