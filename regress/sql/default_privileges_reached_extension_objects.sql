-- Route (f): Supabase's default privileges give postgres and dashboard_user ALL on every
-- table, sequence and routine supabase_admin creates in schema realtime, so CREATE
-- EXTENSION run as supabase_admin handed them the extension's own tables (to write and to
-- put triggers on) and EXECUTE on the sidecar's functions (drain sees every private
-- message). The extension grants nothing beyond its API, whatever default privileges say:
-- its own objects keep only their owner's rights and the grants the extension makes.
SELECT c.oid::regclass AS object, a.grantee::regrole AS grantee, string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type) AS privileges
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.relnamespace = 'realtime'::regnamespace AND a.grantee <> c.relowner
  AND (c.oid IN (SELECT objid FROM pg_depend WHERE classid = 'pg_class'::regclass AND deptype = 'e'
                   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_realtime'))
       OR c.relname IN ('messages_9999_12_31', 'replaced_functions'))
GROUP BY 1, 2 ORDER BY c.oid::regclass::text, a.grantee::regrole::text;
SELECT p.oid::regprocedure AS function, a.grantee::regrole AS grantee
FROM pg_proc p, aclexplode(p.proacl) a
WHERE p.oid IN (SELECT objid FROM pg_depend WHERE classid = 'pg_proc'::regclass AND deptype = 'e'
                  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_realtime'))
  AND a.grantee NOT IN (0, p.proowner)
ORDER BY p.oid::regprocedure::text, a.grantee::regrole::text;
-- As the demoted postgres: a trigger on the persisted messages, and a drain.
SET ROLE postgres;
CREATE FUNCTION public.persisted_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.mark('a trigger on the persisted messages');
    RETURN NEW;
END
$$;
CREATE TRIGGER persisted_trigger BEFORE INSERT ON realtime.persisted_messages
    FOR EACH ROW EXECUTE FUNCTION public.persisted_trigger();
SELECT count(*) FROM realtime.create_consumer('postgres_reads_everything');
RESET ROLE;
DROP TRIGGER IF EXISTS persisted_trigger ON realtime.persisted_messages;
