-- Hand-written part of the pg_realtime extension script.

-- Rows the app inserts into realtime.messages, delivered at commit: extension/src/inserted.rs
-- tells how and why its trigger is internal; this keeps that trigger on every leaf of
-- realtime.messages (the table itself when it is not partitioned).

-- Creates the delivery trigger on each leaf that lacks it. realtime.sync_capture() calls it,
-- so it runs at CREATE EXTENSION and ALTER EXTENSION UPDATE, and by the event trigger after
-- CREATE TABLE and ALTER TABLE (a partition made or attached, by the app or by a restore).
-- pg_upgrade carries no internal trigger: each sidecar calls this whenever its drain connects
-- (granted to its login by scripts/sidecar_login.sql), so the first after a pg_upgrade makes
-- them again (extension/README.md, "Versions and upgrades"). SECURITY DEFINER, owned by the
-- installing superuser: creating a trigger on the app's table needs it; it reads catalogs and
-- calls realtime.add_delivery_trigger, which runs no code of another role's.
CREATE FUNCTION realtime.sync_delivery() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    leaf oid;
BEGIN
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

REVOKE EXECUTE ON FUNCTION realtime.sync_delivery() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.add_delivery_trigger(oid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.expire_messages(integer) FROM PUBLIC;
