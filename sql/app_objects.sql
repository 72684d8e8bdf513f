-- Hand-written part of the pg_realtime extension script, run after the generated functions.

-- The app's objects the extension uses (sql/schema.sql adopts or creates them): recorded as
-- dependencies of the extension, so that pg_dump puts them before CREATE EXTENSION in a
-- dump and a restore adopts them, and so that they cannot be dropped from under it. The
-- DEFAULT partition sql/schema.sql adds to a partitioned realtime.messages too: restored
-- after CREATE EXTENSION, it would meet the one the script had made meanwhile. Idempotent
-- (the update scripts run it again).
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
