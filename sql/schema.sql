-- Hand-written part of the pg_realtime extension script, run before the generated functions.
-- CREATE EXTENSION creates schema "realtime" (named in pg_realtime.control) unless it
-- exists, as it does in a database Supabase Realtime made.
--
-- What is the app's and what is the extension's. realtime.messages and the policies an app
-- writes on it are the app's: pg_dump leaves out an extension's member objects and
-- everything on them, so a member realtime.messages lost every policy in a dump and
-- restore. So realtime.messages and realtime.topic() are created only when missing and
-- released at once (ALTER EXTENSION ... DROP): they are dumped, restored and
-- kept by DROP EXTENSION like the app's other objects. In a database Supabase made they
-- exist and are adopted as they are (the same oid, owner, grants, partitions and policies).
-- app_objects.sql records the extension as depending on them, so that a restore creates them
-- before CREATE EXTENSION. Grants are given only on what this script created, as Supabase
-- grants them.

-- Runs as the installer: unqualified names resolve in pg_catalog alone until the end of this
-- file (extension/README.md, "Who runs what": roles that are no superuser may create in
-- schema realtime).
SET LOCAL search_path = pg_catalog, pg_temp;

DO $$
DECLARE
    parent regclass := to_regclass('realtime.messages');
    made_schema boolean;
    missing text;
    r text;
BEGIN
    -- A schema CREATE EXTENSION makes is no member of the extension (it exists before the
    -- extension does): it is the app's already. It is taken as made for us, to be granted
    -- like Supabase's, when nothing is in it and nothing was ever granted on it.
    made_schema := (SELECT n.nspacl IS NULL FROM pg_catalog.pg_namespace n WHERE n.nspname = 'realtime')
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE relnamespace = 'realtime'::regnamespace)
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc WHERE pronamespace = 'realtime'::regnamespace)
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type WHERE typnamespace = 'realtime'::regnamespace);

    IF parent IS NULL THEN
        -- realtime.messages: the table Supabase Realtime users write authorization policies
        -- on, with Supabase's columns. Here it is only the policy table: sending a message
        -- writes no row and no WAL (messages travel through the extension's shared-memory
        -- queue), so it is not partitioned and needs no janitor.
        CREATE TABLE realtime.messages (
            topic text NOT NULL,
            extension text NOT NULL,
            payload jsonb,
            event text,
            private boolean DEFAULT false,
            updated_at timestamp without time zone NOT NULL DEFAULT now(),
            inserted_at timestamp without time zone NOT NULL DEFAULT now(),
            id uuid NOT NULL DEFAULT gen_random_uuid(),
            binary_payload bytea,
            CONSTRAINT messages_payload_exclusive CHECK (payload IS NULL OR binary_payload IS NULL),
            CONSTRAINT messages_pkey PRIMARY KEY (id, inserted_at)
        );
        ALTER TABLE realtime.messages ENABLE ROW LEVEL SECURITY;
        -- Granted while still a member: releasing it then forgets the grants as "initial
        -- privileges", so pg_dump dumps them as the app's.
        FOREACH r IN ARRAY ARRAY['anon', 'authenticated', 'service_role'] LOOP
            IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
                EXECUTE format('GRANT SELECT, INSERT, UPDATE ON realtime.messages TO %I', r);
            END IF;
        END LOOP;
        ALTER EXTENSION pg_realtime DROP TABLE realtime.messages;
    ELSE
        -- realtime.authorize inserts its probe rows with these columns.
        SELECT string_agg(c, ', ') INTO missing
        FROM unnest(ARRAY['topic', 'extension', 'id']) c
        WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                          WHERE attrelid = parent AND attname = c AND attnum > 0 AND NOT attisdropped);
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'realtime.messages exists but lacks column(s) %', missing
                USING HINT = 'pg_realtime adopts a realtime.messages made by Supabase Realtime or by an earlier pg_realtime.';
        END IF;
        -- Supabase's messages is partitioned by day, and its server made the partitions.
        -- Nothing makes them once pg_realtime serves the database, and a probe row with no
        -- partition fails a whole authorization batch: a DEFAULT partition takes every row.
        -- Its name parses as a far date: Supabase's janitor reads partition names as dates
        -- and drops those of past days. A restore of a dump has made the table already and
        -- attaches it later (pg_dump attaches partitions in entries of their own).
        IF (SELECT relkind FROM pg_catalog.pg_class WHERE oid = parent) = 'p'
           AND (SELECT partdefid FROM pg_catalog.pg_partitioned_table WHERE partrelid = parent) = 0
           AND to_regclass('realtime.messages_9999_12_31') IS NULL THEN
            CREATE TABLE realtime.messages_9999_12_31 PARTITION OF realtime.messages DEFAULT;
            ALTER EXTENSION pg_realtime DROP TABLE realtime.messages_9999_12_31;
            EXECUTE format('ALTER TABLE realtime.messages_9999_12_31 OWNER TO %s',
                           (SELECT relowner::regrole FROM pg_catalog.pg_class WHERE oid = parent));
        END IF;
    END IF;

    -- Supabase's grants on a schema made for us, for the roles that exist here (a Supabase
    -- database has all three). A GRANT inside CREATE EXTENSION is also recorded as the
    -- object's "initial privileges", which pg_dump leaves out of a dump even for an object
    -- that is no member (the restored schema then had no grants): the record goes.
    IF made_schema THEN
        FOREACH r IN ARRAY ARRAY['anon', 'authenticated', 'service_role'] LOOP
            IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
                EXECUTE format('GRANT USAGE ON SCHEMA realtime TO %I', r);
            END IF;
        END LOOP;
        DELETE FROM pg_catalog.pg_init_privs
        WHERE classoid = 'pg_catalog.pg_namespace'::regclass AND objoid = 'realtime'::regnamespace AND privtype = 'e';
    END IF;

    -- The channel topic being authorized, for use in policies; same definition as Supabase's.
    IF to_regprocedure('realtime.topic()') IS NULL THEN
        CREATE FUNCTION realtime.topic() RETURNS text
            LANGUAGE sql STABLE
            AS $f$ select nullif(current_setting('realtime.topic', true), '')::text; $f$;
        ALTER EXTENSION pg_realtime DROP FUNCTION realtime.topic();
    END IF;
END
$$;

-- The role realtime.authorize inserts its read-probe rows as (extension/src/identity.rs,
-- `prober`): no login, no superuser, nothing but BYPASSRLS (a reader may have no INSERT
-- policy), USAGE on schema realtime and INSERT on realtime.messages, so a trigger someone
-- put on realtime.messages or on a partition runs with those rights, inside a probe that is
-- rolled back. Roles belong to the cluster: a second database, or a restore into a cluster
-- that has it, finds it made; one that could log in or is a superuser is refused, since its
-- rights would reach every probe. It stays after DROP EXTENSION (another database may use
-- it): extension/README.md says how to drop it. The grants on the app's schema and table are recorded
-- nowhere as initial privileges (pg_dump would then leave the objects' other grants out of
-- a dump): they are dumped with them, and restored after CREATE EXTENSION made the role.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'realtime_prober') THEN
        CREATE ROLE realtime_prober NOLOGIN NOINHERIT BYPASSRLS;
    ELSIF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'realtime_prober' AND (rolsuper OR rolcanlogin)) THEN
        RAISE EXCEPTION 'role realtime_prober exists and is a superuser or can log in'
            USING HINT = 'pg_realtime inserts its read probes as realtime_prober, so triggers on realtime.messages run with its rights: ALTER ROLE realtime_prober NOSUPERUSER NOLOGIN, then CREATE EXTENSION again.';
    ELSE
        ALTER ROLE realtime_prober BYPASSRLS;
    END IF;
    GRANT USAGE ON SCHEMA realtime TO realtime_prober;
    GRANT INSERT ON realtime.messages TO realtime_prober;
    DELETE FROM pg_catalog.pg_init_privs
    WHERE privtype = 'e'
      AND ((classoid = 'pg_catalog.pg_class'::regclass AND objoid = 'realtime.messages'::regclass)
           OR (classoid = 'pg_catalog.pg_namespace'::regclass AND objoid = 'realtime'::regnamespace));
END
$$;

-- Supabase's realtime.send, send_binary and broadcast_changes (what apps and their triggers
-- call) write rows into realtime.messages for Supabase's server to pick up. Ours, created
-- next with the same signatures, put the message into the extension's queue instead, for
-- the sidecar. Supabase's are kept as they are (the same oid, owner, grants and body) under
-- the names supabase_send, supabase_send_binary and supabase_broadcast_changes, and
-- realtime.restore_replaced_functions() renames them back after DROP EXTENSION pg_realtime:
-- the way back to a database Supabase Realtime can serve (extension/README.md, "The way back").
-- Nothing is kept as SQL text to be executed later: text in a table is whatever the roles
-- that may write the table made it. A function something depends on by oid (a view, a
-- BEGIN ATOMIC body) is refused, as DROP FUNCTION would refuse it: renamed, it would go on
-- calling Supabase's function.
DO $$
DECLARE
    f record;
    replaced boolean := false;
BEGIN
    FOR f IN
        SELECT p.oid, p.oid::regprocedure AS proc, p.proname
        FROM pg_catalog.pg_proc p
        WHERE p.oid IN (to_regprocedure('realtime.send(jsonb, text, text, boolean)'),
                        to_regprocedure('realtime.send_binary(bytea, text, text, boolean)'),
                        to_regprocedure('realtime.broadcast_changes(text, text, text, text, text, record, record, text)'))
    LOOP
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                   WHERE d.refclassid = 'pg_catalog.pg_proc'::regclass AND d.refobjid = f.oid AND d.deptype = 'n') THEN
            RAISE EXCEPTION 'cannot replace % because other objects depend on it', f.proc
                USING HINT = format('Drop them, CREATE EXTENSION pg_realtime, then recreate them so that they call its function '
                                    '(SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend WHERE refobjid = %L::regprocedure lists them).',
                                    f.proc);
        END IF;
        EXECUTE format('ALTER FUNCTION %s RENAME TO %I', f.proc, 'supabase_' || f.proname);
        replaced := true;
    END LOOP;
    IF NOT replaced THEN
        RETURN;  -- none of them: a database Supabase did not make
    END IF;

    CREATE OR REPLACE FUNCTION realtime.restore_replaced_functions() RETURNS SETOF text
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
    DECLARE
        p record;
    BEGIN
        IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_realtime') THEN
            RAISE EXCEPTION 'pg_realtime is still installed'
                USING HINT = 'Run DROP EXTENSION pg_realtime CASCADE first.';
        END IF;
        -- pg_realtime 0.3.0 kept Supabase's functions as SQL text in this table, which roles
        -- other than its owner could edit (Supabase's default privileges gave postgres and
        -- dashboard_user every right on it): the text is never executed here.
        IF to_regclass('realtime.replaced_functions') IS NOT NULL THEN
            RAISE EXCEPTION 'realtime.replaced_functions holds the SQL text of functions pg_realtime 0.3.0 replaced; it is not executed, since roles other than its owner could edit it'
                USING HINT = 'Review each definition (SELECT signature, definition FROM realtime.replaced_functions), run those you trust, then DROP TABLE realtime.replaced_functions and call realtime.restore_replaced_functions() again.';
        END IF;
        FOR p IN SELECT oid, proname FROM pg_proc
                 WHERE pronamespace = 'realtime'::regnamespace
                   AND proname IN ('supabase_send', 'supabase_send_binary', 'supabase_broadcast_changes')
                 ORDER BY proname LOOP
            EXECUTE format('ALTER FUNCTION %s RENAME TO %I', p.oid::regprocedure, substr(p.proname, length('supabase_') + 1));
            RETURN NEXT p.oid::regprocedure::text;
        END LOOP;
        -- Supabase's server makes a partition per day; a DEFAULT partition holding rows of
        -- those days would stop it, so it goes (if it holds rows, they are the app's to move).
        IF to_regclass('realtime.messages_9999_12_31') IS NOT NULL THEN
            IF EXISTS (SELECT 1 FROM realtime.messages_9999_12_31) THEN
                RAISE EXCEPTION 'realtime.messages_9999_12_31 holds rows'
                    USING HINT = 'Move or delete them, then call realtime.restore_replaced_functions() again.';
            END IF;
            DROP TABLE realtime.messages_9999_12_31;
        END IF;
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'realtime_prober') THEN
            REVOKE INSERT ON realtime.messages FROM realtime_prober;
            REVOKE USAGE ON SCHEMA realtime FROM realtime_prober;
        END IF;
        DROP FUNCTION realtime.restore_replaced_functions();
    END
    $f$;
    ALTER EXTENSION pg_realtime DROP FUNCTION realtime.restore_replaced_functions();
    REVOKE ALL ON FUNCTION realtime.restore_replaced_functions() FROM PUBLIC;
END
$$;

-- The path CREATE EXTENSION gave this script: the generated statements that follow create the
-- extension's functions under unqualified names, in its first schema.
SET LOCAL search_path = realtime;
