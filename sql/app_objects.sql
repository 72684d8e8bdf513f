-- Hand-written part of the pg_realtime extension script, run after the generated functions.

-- What the extension keeps on the app's objects (sql/schema.sql adopts or creates them),
-- made wherever it is missing:
-- * the extension's recorded dependencies on them: pg_dump then puts them before CREATE
--   EXTENSION in a dump, so that a restore adopts them, and they cannot be dropped from under
--   it. The DEFAULT partition sql/schema.sql adds to a partitioned realtime.messages too:
--   restored after CREATE EXTENSION, it would meet the one the script had made meanwhile.
-- * the delivery trigger of rows inserted into realtime.messages (extension/src/inserted.rs:
--   internal, so that no dump carries it), on each leaf.
-- The dump pg_upgrade makes carries neither: it makes the extension's members one by one and
-- records no other dependency of the extension's, and leaves internal triggers out. So each
-- sidecar calls this whenever its drain connects (granted to its login by
-- scripts/sidecar_login.sql), and the first after a pg_upgrade makes them again; so does
-- realtime.sync_capture(), at CREATE EXTENSION, ALTER EXTENSION UPDATE and after CREATE TABLE
-- and ALTER TABLE (a partition made or attached, by the app or by a restore). SECURITY
-- DEFINER, owned by the installing superuser: recording a dependency and creating a trigger
-- on the app's table need it; it reads catalogs and calls realtime.depend_on and
-- realtime.add_delivery_trigger (superusers only), which run no code of another role's.
CREATE FUNCTION realtime.sync_app_objects() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    leaf oid;
BEGIN
    PERFORM realtime.depend_on(o.catalog, o.object)
    FROM (VALUES ('pg_catalog.pg_class'::regclass, to_regclass('realtime.messages')::oid),
                 ('pg_catalog.pg_proc'::regclass, to_regprocedure('realtime.topic()')::oid),
                 ('pg_catalog.pg_class'::regclass, to_regclass('realtime.messages_9999_12_31')::oid)
         ) AS o(catalog, object)
    WHERE o.object IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM pg_depend d
                      WHERE d.classid = 'pg_catalog.pg_extension'::regclass
                        AND d.objid = (SELECT oid FROM pg_extension WHERE extname = 'pg_realtime')
                        AND d.refclassid = o.catalog AND d.refobjid = o.object);
    IF to_regclass('realtime.messages') IS NULL THEN
        RETURN;
    END IF;
    FOR leaf IN
        -- pg_partition_tree() of a table that is not partitioned is empty: the table is its
        -- own leaf.
        SELECT c.oid FROM pg_class c
        WHERE c.relkind = 'r'
          AND (c.oid = 'realtime.messages'::regclass
               OR c.oid IN (SELECT t.relid FROM pg_partition_tree('realtime.messages'::regclass) t WHERE t.isleaf))
          AND NOT EXISTS (SELECT 1 FROM pg_trigger g
                          WHERE g.tgrelid = c.oid AND g.tgfoid = 'realtime.deliver_inserted()'::regprocedure)
    LOOP
        PERFORM realtime.add_delivery_trigger(leaf);
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION realtime.sync_app_objects() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.depend_on(oid, oid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.add_delivery_trigger(oid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.expire_messages(integer) FROM PUBLIC;
SELECT realtime.sync_app_objects();
