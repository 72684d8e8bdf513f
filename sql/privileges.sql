-- Hand-written part of the pg_realtime extension script, run after the generated functions.

-- Runs as the installer: unqualified names resolve in pg_catalog alone (extension/README.md,
-- "Who runs what": roles that are no superuser may create in schema realtime).
SET LOCAL search_path = pg_catalog, pg_temp;

-- Grants on realtime.messages and the schema: sql/schema.sql, on what it creates.

-- Draining moves a consumer's position and sees every message, private or not; relaying
-- speaks for a client connection: only roles granted these functions (the sidecar's) may
-- call them.
REVOKE EXECUTE ON FUNCTION realtime.create_consumer(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.drop_consumer(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.confirm(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.drain(text, bigint, integer, integer, integer, oid[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.drain_packed(text, bigint, integer, integer, integer, oid[]) FROM PUBLIC;
-- It hands back json values it never validated: any role calling it could make invalid
-- json datums.
REVOKE EXECUTE ON FUNCTION realtime.drain_unpack(bytea) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.listen(text, text[], text[], boolean, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.unlisten(text, text[], text[], boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.listen_all(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.history(bigint, text[], boolean[], timestamptz, integer, boolean, integer, oid[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.relay(bigint, text, text, boolean, json, bytea, uuid, boolean, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.authorize(text[], text[], text[], text[], text[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.visible(regclass, text[], text[], text[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.visible_current(regclass, text[], text[], text[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.selectable(regclass, text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.match_patterns(text[], text[], text[], integer[], integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.check_privileges() FROM PUBLIC;

-- What a database's default privileges gave on the extension's own objects, revoked: they
-- apply to whatever the installing role creates in schema realtime, and a database Supabase
-- made gives postgres and dashboard_user ALL on tables and routines there, which would hand
-- them the sidecar's functions (a drain sees every private message) and the extension's
-- tables. Only what the default ACLs of the objects' creator (the extension's owner) or
-- owner added is revoked, so a later grant of an administrator's survives an update. Also
-- the DEFAULT partition sql/schema.sql adds, and 0.3.0's realtime.replaced_functions.
CREATE FUNCTION realtime.revoke_default_grants() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o record;
    g record;
BEGIN
    FOR o IN
        WITH ext AS (SELECT e.oid, e.extowner FROM pg_extension e WHERE e.extname = 'pg_realtime')
        SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END AS kind, c.oid::regclass::text AS name,
               c.relowner AS owner, c.relacl AS acl, CASE c.relkind WHEN 'S' THEN 'S' ELSE 'r' END::"char" AS objtype,
               ext.extowner AS creator
        FROM pg_class c, ext
        WHERE c.relnamespace = 'realtime'::regnamespace
          AND (c.relname IN ('messages_9999_12_31', 'replaced_functions')
               OR c.oid IN (SELECT d.objid FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                              AND d.deptype = 'e' AND d.refobjid = ext.oid))
        UNION ALL
        SELECT 'FUNCTION', p.oid::regprocedure::text, p.proowner, p.proacl, 'f', ext.extowner
        FROM pg_proc p, ext
        WHERE p.oid IN (SELECT d.objid FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                          AND d.deptype = 'e' AND d.refobjid = ext.oid)
        UNION ALL
        SELECT 'TYPE', t.oid::regtype::text, t.typowner, t.typacl, 'T', ext.extowner
        FROM pg_type t, ext
        WHERE t.oid IN (SELECT d.objid FROM pg_depend d WHERE d.classid = 'pg_type'::regclass
                          AND d.deptype = 'e' AND d.refobjid = ext.oid)
    LOOP
        FOR g IN
            SELECT DISTINCT a.grantee, a.privilege_type FROM aclexplode(o.acl) a
            WHERE a.grantee <> o.owner
              AND EXISTS (SELECT 1 FROM pg_default_acl d, aclexplode(d.defaclacl) da
                          WHERE d.defaclrole IN (o.owner, o.creator)
                            AND d.defaclnamespace IN (0, 'realtime'::regnamespace)
                            AND d.defaclobjtype = o.objtype
                            AND da.grantee = a.grantee AND da.privilege_type = a.privilege_type)
        LOOP
            EXECUTE format('REVOKE %s ON %s %s FROM %s', g.privilege_type, o.kind, o.name,
                           CASE g.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
        END LOOP;
    END LOOP;
    -- A REVOKE inside CREATE or ALTER EXTENSION is recorded as initial privileges even on an
    -- object that is no member, which pg_dump would then leave out of a dump: the records of
    -- the app's objects go.
    DELETE FROM pg_init_privs i
    WHERE i.classoid = 'pg_class'::regclass AND i.privtype = 'e'
      AND i.objoid IN (SELECT c.oid FROM pg_class c WHERE c.relnamespace = 'realtime'::regnamespace)
      AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = i.classoid AND d.objid = i.objoid AND d.deptype = 'e');
END
$$;
REVOKE EXECUTE ON FUNCTION realtime.revoke_default_grants() FROM PUBLIC;
SELECT realtime.revoke_default_grants();

-- What realtime.check_privileges() finds, said once at install (the sidecar logs it at each
-- start, so rights granted later are seen too).
DO $$
DECLARE
    rights text;
BEGIN
    SELECT string_agg(format('%s: %s on %s: such code runs as %s', g.role, g.privilege, g.objects, g.runs_as),
                      E'\n' ORDER BY g.role, g.privilege, g.objects)
    INTO rights
    FROM (SELECT c.role, c.privilege, c.runs_as, string_agg(c.object, ', ' ORDER BY c.object) AS objects
          FROM realtime.check_privileges() c GROUP BY 1, 2, 3) g;
    IF rights IS NOT NULL THEN
        RAISE WARNING 'roles that are no superuser can place code where pg_realtime runs it'
            USING DETAIL = rights,
                  HINT = 'None of it runs with a superuser''s rights. Revoke what no role needs; SELECT * FROM realtime.check_privileges() lists it again.';
    END IF;
END
$$;
