-- Postgres Changes: which tables are captured. `extension/src/capture.rs` tells how a
-- change travels; this file keeps a `realtime_capture` trigger on exactly the tables of
-- publication `supabase_realtime`, as Supabase apps declare them:
--     ALTER PUBLICATION supabase_realtime ADD TABLE public.todos;

-- A Supabase project has this publication from the start; elsewhere the app creates it once
-- (`CREATE PUBLICATION supabase_realtime;`). The extension does not: a publication cannot be
-- an extension's member, so pg_dump dumps it and a restore's CREATE PUBLICATION would fail
-- after CREATE EXTENSION had made it. Capture does not use logical decoding, so
-- wal_level need not be `logical` (Postgres warns at CREATE PUBLICATION if it is not).

-- Creates the capture trigger on every published table that lacks it and drops it from
-- every table no longer published; then what the extension keeps on the app's objects. Run by the event trigger below after any DDL that can
-- change the set; callable by hand (it is idempotent).
CREATE FUNCTION realtime.sync_capture() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rel text;
BEGIN
    -- Each loop reads the publication and the triggers in one query, so with one snapshot:
    -- a list of published tables read before another session's ALTER PUBLICATION had
    -- committed made the second loop drop that session's new trigger (its table looked
    -- unpublished). Names are read in the same query, and a table dropped by another
    -- session meanwhile is skipped: creating or dropping its trigger fails.
    FOR rel IN
        SELECT format('%I.%I', n.nspname, c.relname)
        FROM pg_publication_tables pt
        JOIN pg_namespace n ON n.nspname = pt.schemaname
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
        WHERE pt.pubname = 'supabase_realtime' AND c.relkind IN ('r', 'p')
          AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'realtime_capture')
    LOOP
        BEGIN
            EXECUTE format('CREATE TRIGGER realtime_capture AFTER INSERT OR UPDATE OR DELETE ON %s '
                           'FOR EACH ROW EXECUTE FUNCTION realtime.capture()', rel);
        EXCEPTION WHEN undefined_table THEN
            NULL;
        END;
    END LOOP;
    FOR rel IN
        SELECT format('%I.%I', n.nspname, c.relname)
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE t.tgname = 'realtime_capture' AND NOT t.tgisinternal
          AND t.tgfoid = 'realtime.capture()'::regprocedure
          AND NOT EXISTS (SELECT 1 FROM pg_publication_tables pt
                          WHERE pt.pubname = 'supabase_realtime'
                            AND pt.schemaname = n.nspname AND pt.tablename = c.relname)
    LOOP
        BEGIN
            EXECUTE format('DROP TRIGGER realtime_capture ON %s', rel);
        EXCEPTION WHEN undefined_table OR undefined_object THEN
            NULL;
        END;
    END LOOP;
    -- And what the extension keeps on the app's objects (sql/app_objects.sql).
    PERFORM realtime.sync_app_objects();
END
$$;

CREATE FUNCTION realtime.sync_capture_on_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM realtime.sync_capture();
END
$$;

-- The commands that can add a table to the publication or take one out of it.
CREATE EVENT TRIGGER realtime_sync_capture ON ddl_command_end
    WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION', 'DROP PUBLICATION',
                 'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE',
                 'CREATE SCHEMA', 'ALTER SCHEMA')
    EXECUTE FUNCTION realtime.sync_capture_on_ddl();

REVOKE EXECUTE ON FUNCTION realtime.sync_capture() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.sync_capture_on_ddl() FROM PUBLIC;

-- Tables published before the extension was created.
SELECT realtime.sync_capture();
