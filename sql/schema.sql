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

-- Supabase's realtime.send, send_binary and broadcast_changes (what apps and their triggers
-- call) write rows into realtime.messages for Supabase's server to pick up. Ours, created
-- next with the same signatures, put the message into the extension's queue instead, for
-- the sidecar. Supabase's are dropped here, their definitions, owners and grants kept in
-- realtime.replaced_functions (the app's table, like realtime.messages), and
-- realtime.restore_replaced_functions() puts them back after DROP EXTENSION pg_realtime: the
-- way back to a database Supabase Realtime can serve (README, "Leaving pg_realtime").
DO $$
DECLARE
    replaced regprocedure[] := ARRAY[
        to_regprocedure('realtime.send(jsonb, text, text, boolean)'),
        to_regprocedure('realtime.send_binary(bytea, text, text, boolean)'),
        to_regprocedure('realtime.broadcast_changes(text, text, text, text, text, record, record, text)')];
    f regprocedure;
BEGIN
    IF array_remove(replaced, NULL) = '{}' THEN
        RETURN;  -- none of them: a database Supabase did not make
    END IF;
    CREATE TABLE IF NOT EXISTS realtime.replaced_functions (
        signature text PRIMARY KEY,
        owner name NOT NULL,
        acl aclitem[],
        definition text NOT NULL
    );
    ALTER EXTENSION pg_realtime DROP TABLE realtime.replaced_functions;
    REVOKE ALL ON realtime.replaced_functions FROM PUBLIC;
    FOREACH f IN ARRAY array_remove(replaced, NULL) LOOP
        INSERT INTO realtime.replaced_functions
        SELECT format('realtime.%I(%s)', p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid)),
               p.proowner::regrole::name, p.proacl, pg_catalog.pg_get_functiondef(p.oid)
        FROM pg_catalog.pg_proc p WHERE p.oid = f;
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;

    CREATE OR REPLACE FUNCTION realtime.restore_replaced_functions() RETURNS SETOF text
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
    DECLARE
        s record;
        g record;
    BEGIN
        IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_realtime') THEN
            RAISE EXCEPTION 'pg_realtime is still installed'
                USING HINT = 'Run DROP EXTENSION pg_realtime CASCADE first.';
        END IF;
        FOR s IN SELECT * FROM realtime.replaced_functions ORDER BY signature LOOP
            EXECUTE s.definition;
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', s.signature, s.owner);
            IF s.acl IS NOT NULL THEN  -- NULL: the default grants CREATE FUNCTION gave
                EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, %I', s.signature, s.owner);
                FOR g IN SELECT * FROM aclexplode(s.acl) LOOP
                    EXECUTE format('GRANT %s ON FUNCTION %s TO %s%s', g.privilege_type, s.signature,
                                   CASE g.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END,
                                   CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
                END LOOP;
            END IF;
            RETURN NEXT s.signature;
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
        DROP TABLE realtime.replaced_functions;
        DROP FUNCTION realtime.restore_replaced_functions();
    END
    $f$;
    ALTER EXTENSION pg_realtime DROP FUNCTION realtime.restore_replaced_functions();
    REVOKE ALL ON FUNCTION realtime.restore_replaced_functions() FROM PUBLIC;
END
$$;
