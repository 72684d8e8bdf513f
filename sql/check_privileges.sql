-- Hand-written part of the pg_realtime extension script.

-- realtime.check_privileges(): every right through which a role that is no superuser could
-- place code where pg_realtime runs it, and the role such code runs as (extension/README.md,
-- "Who runs what"). pg_realtime has no SECURITY DEFINER function that runs anything another role
-- controls: each step that meets such code switches first to the role whose rights it
-- needs. So no row here is a way to a superuser's rights; each says whose rights a trigger,
-- an overload or a table's rows would get, and CREATE EXTENSION and the sidecar's start
-- print them, so that a right granted by mistake (or by a database's default privileges)
-- is seen. The rights:
--   CREATE on schema realtime: an overload of a function the extension calls;
--   ownership of (membership in the owner of), or TRIGGER on, realtime.messages or any of
--     its partitions: a trigger that fires on the read probe's rows;
--   ownership of, or any right to change or put a trigger on, a table of the extension's
--     own (persisted messages, presence) or realtime.replaced_functions (0.3.0's), but a
--     sidecar login's own grants there (scripts/sidecar_login.sql);
--   membership in realtime_prober: the read probe's role itself;
--   ownership of an object of the extension's.
-- INSERT, UPDATE and SELECT on realtime.messages are not listed: Supabase's clients need
-- them for its policies, and they place no code. Nor are the predefined roles (pg_*, such
-- as pg_write_all_data): a role granted one is listed under its own name.
CREATE FUNCTION realtime.check_privileges()
RETURNS TABLE("role" name, privilege text, object text, runs_as text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH roles AS (
        SELECT r.oid, r.rolname FROM pg_roles r
        WHERE NOT r.rolsuper AND r.rolname <> 'realtime_prober' AND r.rolname !~ '^pg_'
    ),
    ext AS (
        SELECT e.oid FROM pg_extension e WHERE e.extname = 'pg_realtime'
    ),
    probed AS (
        SELECT c.oid, c.relowner FROM pg_class c
        WHERE c.oid = 'realtime.messages'::regclass
           OR c.oid IN (SELECT t.relid FROM pg_partition_tree('realtime.messages'::regclass) t)
    ),
    own_tables AS (
        SELECT c.oid, c.relowner,
               CASE WHEN c.relname = 'replaced_functions'
                    THEN 'nobody (no row of it is executed)'
                    ELSE 'the sidecar''s login (it writes the rows)' END AS runs_as
        FROM pg_class c
        WHERE c.relnamespace = 'realtime'::regnamespace AND c.relkind IN ('r', 'p')
          AND (c.relname = 'replaced_functions'
               OR c.oid IN (SELECT d.objid FROM pg_depend d, ext
                            WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e' AND d.refobjid = ext.oid))
    ),
    members AS (
        SELECT d.classid, d.objid FROM pg_depend d, ext
        WHERE d.deptype = 'e' AND d.refobjid = ext.oid AND d.refclassid = 'pg_extension'::regclass
    )
    SELECT r.rolname, 'CREATE', 'schema realtime',
           'nobody (the extension calls its functions by their exact signatures)'
    FROM roles r WHERE has_schema_privilege(r.oid, 'realtime', 'CREATE')
    UNION ALL
    SELECT r.rolname, 'OWNER', 'table ' || p.oid::regclass,
           'realtime_prober (read probe) or the client''s role (write probe)'
    FROM probed p, roles r WHERE pg_has_role(r.oid, p.relowner, 'MEMBER')
    UNION ALL
    SELECT r.rolname, 'TRIGGER', 'table ' || p.oid::regclass,
           'realtime_prober (read probe) or the client''s role (write probe)'
    FROM probed p, roles r
    WHERE has_table_privilege(r.oid, p.oid, 'TRIGGER') AND NOT pg_has_role(r.oid, p.relowner, 'MEMBER')
    UNION ALL
    SELECT r.rolname, 'OWNER', 'table ' || t.oid::regclass, t.runs_as
    FROM own_tables t, roles r WHERE pg_has_role(r.oid, t.relowner, 'MEMBER')
    UNION ALL
    SELECT r.rolname, x.privilege, 'table ' || t.oid::regclass, t.runs_as
    FROM own_tables t, roles r, unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) x(privilege)
    WHERE has_table_privilege(r.oid, t.oid, x.privilege) AND NOT pg_has_role(r.oid, t.relowner, 'MEMBER')
      -- A sidecar's login (it may drain, and so read every message) writes these rows itself:
      -- code it places there runs with its own rights.
      AND NOT has_function_privilege(r.oid, 'realtime.drain(text, bigint, integer, integer, integer, oid[])', 'EXECUTE')
    UNION ALL
    SELECT r.rolname, 'MEMBER', 'role realtime_prober',
           'realtime_prober (BYPASSRLS, INSERT on realtime.messages)'
    FROM roles r WHERE pg_has_role(r.oid, 'realtime_prober', 'MEMBER')
    UNION ALL
    SELECT r.rolname, 'OWNER', pg_describe_object(m.classid, m.objid, 0), 'its owner'
    FROM members m
    JOIN LATERAL (SELECT p.proowner AS owner FROM pg_proc p WHERE m.classid = 'pg_proc'::regclass AND p.oid = m.objid
                  UNION ALL SELECT c.relowner FROM pg_class c WHERE m.classid = 'pg_class'::regclass AND c.oid = m.objid
                  UNION ALL SELECT t.typowner FROM pg_type t WHERE m.classid = 'pg_type'::regclass AND t.oid = m.objid) o ON true,
         roles r
    WHERE pg_has_role(r.oid, o.owner, 'MEMBER')
$$;
