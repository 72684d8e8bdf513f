-- pg_realtime 0.1.0 -> 0.2.0: the app's objects become the app's (see sql/schema.sql).
-- 0.1.0 made realtime.messages and realtime.topic() members of the
-- extension, so pg_dump dropped the app's policies on realtime.messages; it created
-- publication supabase_realtime, which a restore then failed to create again; and it did
-- not dump persisted broadcasts.

-- Released, as 0.2.0 releases what it creates; their grants and policies stay as they are.
ALTER EXTENSION pg_realtime DROP TABLE realtime.messages;
ALTER EXTENSION pg_realtime DROP FUNCTION realtime.topic();
-- Publication supabase_realtime was never a member: it stays, now the app's.
-- 0.1.0's grants on the schema (never a member) were recorded as initial privileges, so
-- pg_dump left them out: they are the app's (sql/schema.sql tells why).
DELETE FROM pg_catalog.pg_init_privs
WHERE classoid = 'pg_catalog.pg_namespace'::regclass AND objoid = 'realtime'::regnamespace AND privtype = 'e';

-- extension/src/app_objects.rs
CREATE FUNCTION realtime."depend_on"(
	"catalog" oid, /* pg_sys :: Oid */
	"object" oid /* pg_sys :: Oid */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'depend_on_wrapper';

-- sql/app_objects.sql
SELECT realtime.depend_on(o.catalog, o.object)
FROM (VALUES ('pg_catalog.pg_class'::regclass, 'realtime.messages'::regclass::oid),
             ('pg_catalog.pg_proc'::regclass, 'realtime.topic()'::regprocedure::oid),
             ('pg_catalog.pg_class'::regclass, to_regclass('realtime.messages_9999_12_31')::oid)
     ) AS o(catalog, object)
WHERE o.object IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                  WHERE d.classid = 'pg_catalog.pg_extension'::regclass
                    AND d.objid = (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'pg_realtime')
                    AND d.refclassid = o.catalog AND d.refobjid = o.object);
REVOKE EXECUTE ON FUNCTION realtime.depend_on(oid, oid) FROM PUBLIC;

-- sql/persisted.sql
SELECT pg_catalog.pg_extension_config_dump('realtime.persisted_messages', '');
