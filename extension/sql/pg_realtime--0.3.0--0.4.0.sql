-- pg_realtime 0.3.0 -> 0.4.0: no role gains a superuser's rights through the extension
-- (extension/README.md, "Who runs what"). Every change of the extension's SQL since 0.3.0 (frozen in
-- extension/released/pg_realtime--0.3.0.sql) is written here as well; regress/sql/upgrade.sql
-- proves the result equals a fresh install.

-- Runs as the installer: unqualified names resolve in pg_catalog alone (extension/README.md,
-- "Who runs what": roles that are no superuser may create in schema realtime).
SET LOCAL search_path = pg_catalog, pg_temp;

-- sql/schema.sql: the role the read probe's rows are inserted as.
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

-- extension/src/authorize.rs, visible.rs: no longer SECURITY DEFINER. They run as their
-- caller and switch, step by step, to the role each step needs.
ALTER FUNCTION realtime.authorize(text[], text[], text[], text[], text[], text[]) SECURITY INVOKER;
ALTER FUNCTION realtime.visible(regclass, text[], text[], text[], integer[]) SECURITY INVOKER;
ALTER FUNCTION realtime.selectable(regclass, text[]) SECURITY INVOKER;

-- extension/src/filter_values.rs: a filter's values rendered as the binding's role.
CREATE FUNCTION realtime."render_filter_values"("role" text, type_oid oid, typmod integer, "values" text[])
RETURNS text
STRICT VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', 'render_filter_values_wrapper';

-- sql/subscribable.sql: runs as its caller; values rendered by render_filter_values.
CREATE OR REPLACE FUNCTION realtime.subscribable(bindings jsonb)
RETURNS TABLE(item integer, error text, "values" jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    b jsonb;
    f jsonb;
    n integer := 0;
    rel regclass;
    r jsonb;
    relname text;
    sel record;
    col record;
    typ oid;
    category "char";
    c text;
    one jsonb;
BEGIN
    IF jsonb_typeof(bindings) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'bindings must be a JSON array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR b IN SELECT e FROM jsonb_array_elements(bindings) e LOOP
        n := n + 1;
        item := n;
        error := NULL;
        "values" := NULL;
        IF b ->> 'table' IS NULL OR b ->> 'schema' = '*' THEN
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT c.oid, format('%I.%I', ns.nspname, c.relname) INTO rel, relname
        FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
        WHERE ns.nspname = b ->> 'schema' AND c.relname = b ->> 'table' AND c.relkind IN ('r', 'p');
        IF rel IS NULL THEN
            error := format('table %I.%I does not exist', b ->> 'schema', b ->> 'table');
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- A partitioned table's rows are captured on the partition written to and named
        -- after it (as Supabase names them under publish_via_partition_root = false): a
        -- binding on its own name would never match one, so it is refused, not left silent.
        IF (SELECT c.relkind FROM pg_class c WHERE c.oid = rel) = 'p' THEN
            error := format('table %s is partitioned: its rows'' changes are named after the '
                            'partition they are written to; bind its partitions instead', relname);
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_publication_tables pt
                       WHERE pt.pubname = 'supabase_realtime'
                         AND pt.schemaname = b ->> 'schema' AND pt.tablename = b ->> 'table') THEN
            -- Without the publication itself that hint would fail too: name what is missing.
            IF NOT EXISTS (SELECT 1 FROM pg_publication p WHERE p.pubname = 'supabase_realtime') THEN
                error := format('publication supabase_realtime does not exist, so no table''s changes '
                                'are captured; create it with CREATE PUBLICATION supabase_realtime, then '
                                'ALTER PUBLICATION supabase_realtime ADD TABLE %s', relname);
            ELSE
                error := format('table %s is not in publication supabase_realtime; add it with '
                                'ALTER PUBLICATION supabase_realtime ADD TABLE %s', relname, relname);
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- The role guard, the 400 (no primary key) and the 401 (the role may not select it).
        SELECT s.columns, s.error INTO sel FROM realtime.selectable(rel, ARRAY[b ->> 'role']) s;
        IF sel.error IS NOT NULL THEN
            error := sel.error;
            RETURN NEXT;
            CONTINUE;
        END IF;
        FOR c IN SELECT jsonb_array_elements_text(coalesce(b -> 'select', '[]'))
                 UNION ALL SELECT x ->> 'column' FROM jsonb_array_elements(coalesce(b -> 'filters', '[]')) x LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = c
                           AND a.attnum > 0 AND NOT a.attisdropped) THEN
                error := format('column %I does not exist in %s', c, relname);
            ELSIF c <> ALL (sel.columns) THEN
                error := format('role %I may not select column %I of %s', b ->> 'role', c, relname);
            END IF;
            EXIT WHEN error IS NOT NULL;
        END LOOP;
        IF error IS NULL AND b ? 'filters' THEN
            "values" := '[]';
            FOR f IN SELECT x FROM jsonb_array_elements(b -> 'filters') x LOOP
                SELECT a.atttypid, a.atttypmod INTO col FROM pg_attribute a
                WHERE a.attrelid = rel AND a.attname = f ->> 'column';
                -- A domain's values are read as its base type: a domain's CHECK may call any
                -- function, and a value that fails it matches no row anyway.
                typ := col.atttypid;
                WHILE (SELECT t.typtype = 'd' FROM pg_type t WHERE t.oid = typ) LOOP
                    SELECT t.typbasetype INTO typ FROM pg_type t WHERE t.oid = typ;
                END LOOP;
                SELECT t.typcategory INTO category FROM pg_type t WHERE t.oid = typ;
                one := NULL;
                IF f ->> 'op' IN ('like', 'ilike', 'match', 'imatch') THEN
                    IF category <> 'S' THEN
                        error := format('%s applies to text; column %I of %s is of type %s', f ->> 'op',
                                        f ->> 'column', relname, format_type(col.atttypid, col.atttypmod));
                    ELSIF f ->> 'op' IN ('match', 'imatch') THEN
                        -- The pattern is compiled here, by the regex engine that evaluates it
                        -- at delivery, so an invalid one refuses the join instead of failing
                        -- every change (Supabase's check and text). Its length is capped by
                        -- the sidecar before it gets here; compiling a capped pattern is
                        -- bounded by the caller's statement_timeout.
                        BEGIN
                            PERFORM '' ~ (f -> 'values' ->> 0);
                        EXCEPTION WHEN invalid_regular_expression OR program_limit_exceeded THEN
                            error := format('invalid regular expression for %s filter: %s', f ->> 'op', SQLERRM);
                        END;
                    END IF;
                ELSIF f ->> 'op' = 'is' THEN
                    IF f -> 'values' ->> 0 <> 'null' AND category <> 'B' THEN
                        error := format('is.%s applies to booleans; column %I of %s is of type %s', f -> 'values' ->> 0,
                                        f ->> 'column', relname, format_type(col.atttypid, col.atttypmod));
                    END IF;
                -- Arrays only of base and enum elements: a composite element's input would run
                -- its fields' domain CHECKs as the owner, with the client's text.
                ELSIF EXISTS (SELECT 1 FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typlen = -1
                              WHERE t.oid = typ AND (t.typtype NOT IN ('b', 'e') OR e.typtype NOT IN ('b', 'e'))) THEN
                    error := format('column %I of %s is of type %s, which filters do not support',
                                    f ->> 'column', relname, format_type(col.atttypid, col.atttypmod));
                ELSE
                    -- isdistinct.null is the value 'null' of the column's type, as in
                    -- Supabase's check_equality_op (the text "null"; refused for an
                    -- integer): use is.null for NULL.
                    r := realtime.render_filter_values(b ->> 'role', typ, col.atttypmod,
                             ARRAY(SELECT jsonb_array_elements_text(f -> 'values')))::jsonb;
                    IF r ? 'values' THEN
                        one := r -> 'values';
                    ELSIF r ? 'value' THEN
                        error := format('filter value %L is not a valid %s: %s', r ->> 'value',
                                        format_type(col.atttypid, col.atttypmod), r ->> 'error');
                    ELSE
                        error := r ->> 'error';
                    END IF;
                END IF;
                EXIT WHEN error IS NOT NULL;
                "values" := "values" || jsonb_build_array(one);
            END LOOP;
            IF error IS NOT NULL THEN
                "values" := NULL;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION realtime.render_filter_values(text, oid, integer, text[]) FROM PUBLIC;

-- sql/check_privileges.sql.
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

-- sql/schema.sql: Supabase's replaced functions are no longer kept as SQL text to execute.
-- A 0.3.0 install keeps its table (its rows are the app's to review: the way back now
-- refuses to execute them), with the rights Supabase's default privileges gave on it
-- revoked below; the function that executed them is replaced by one that does not.
DO $$
BEGIN
    IF to_regprocedure('realtime.restore_replaced_functions()') IS NULL THEN
        RETURN;
    END IF;
    DROP FUNCTION realtime.restore_replaced_functions();
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

-- extension/src/visible.rs: a resume's changes asked as versions (a version is resent only
-- while the row still holds it). The roles that may ask realtime.visible may ask this.
CREATE FUNCTION realtime."visible_current"(entity regclass, roles text[], claims text[], records text[], asked integer[] DEFAULT NULL)
RETURNS TABLE(identity integer, record integer, error text)
VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', 'visible_current_wrapper';
REVOKE EXECUTE ON FUNCTION realtime.visible_current(regclass, text[], text[], text[], integer[]) FROM PUBLIC;
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT pg_catalog.quote_ident(a.rolname) FROM pg_catalog.pg_roles a
             WHERE NOT a.rolsuper
               AND pg_catalog.has_function_privilege(a.oid, 'realtime.visible(regclass, text[], text[], text[], integer[])', 'EXECUTE') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.visible_current(regclass, text[], text[], text[], integer[]) TO %s', r);
    END LOOP;
END
$$;

-- sql/persisted.sql: persist quotas per sender and in total (MAX_PERSISTED_*_PER_USER,
-- MAX_PERSISTED_MESSAGES, MAX_PERSISTED_BYTES). Rows kept before have no sender: they count
-- in the total only.
ALTER TABLE realtime.persisted_messages ADD COLUMN sender text;
CREATE TABLE realtime.persisted_totals (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    messages bigint NOT NULL,
    bytes bigint NOT NULL
);
INSERT INTO realtime.persisted_totals
SELECT true, count(*), coalesce(sum(coalesce(pg_column_size(m.payload), 0)
                                    + coalesce(pg_column_size(m.binary_payload), 0)), 0)
FROM realtime.persisted_messages m WHERE m.expires_at > now();
REVOKE ALL ON realtime.persisted_totals FROM PUBLIC;
CREATE TABLE realtime.persisted_senders (
    sender text PRIMARY KEY,
    messages bigint NOT NULL,
    bytes bigint NOT NULL
);
REVOKE ALL ON realtime.persisted_senders FROM PUBLIC;
-- relay_batch keeps quotas per sender and in total, and takes the ids senders named; relay
-- shows such an id (show_id). The roles that could call the old ones (a sidecar's login)
-- may call the new ones and count the quotas' totals, as scripts/sidecar_login.sql grants.
-- (Carried across the DROPs in a setting of this transaction: nothing is left behind.)
SELECT pg_catalog.set_config('pg_realtime.relay_callers',
    coalesce(pg_catalog.string_agg(pg_catalog.quote_ident(a.rolname), ','), ''), true)
FROM pg_catalog.pg_roles a
WHERE NOT a.rolsuper
  AND pg_catalog.has_function_privilege(a.oid, 'realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[], integer, bigint)', 'EXECUTE');
DROP FUNCTION realtime.relay(bigint, text, text, boolean, json, bytea, uuid, boolean);
CREATE FUNCTION realtime.relay(origin bigint, topic text, event text, private boolean, payload json, binary_payload bytea, id uuid DEFAULT NULL, persist boolean DEFAULT false, show_id boolean DEFAULT false)
RETURNS void VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'relay_wrapper';
REVOKE EXECUTE ON FUNCTION realtime.relay(bigint, text, text, boolean, json, bytea, uuid, boolean, boolean) FROM PUBLIC;
DROP FUNCTION realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[], integer, bigint);
CREATE FUNCTION realtime.relay_batch(origins bigint[], topics text[], events text[],
    privates boolean[], payloads text[], binary_payloads bytea[], ttls integer[] DEFAULT NULL,
    max_kept integer DEFAULT NULL, max_kept_bytes bigint DEFAULT NULL,
    senders text[] DEFAULT NULL, max_kept_per_sender integer DEFAULT NULL,
    max_kept_bytes_per_sender bigint DEFAULT NULL, max_kept_total bigint DEFAULT NULL,
    max_kept_bytes_total bigint DEFAULT NULL, ids uuid[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
    over record;
BEGIN
    IF ttls IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(ttls) AS x(ttl) WHERE ttl IS NOT NULL) THEN
        SELECT count(realtime.relay(o, t, e, p, j::json, b, i, false, i IS NOT NULL)) INTO n
        FROM unnest(origins, topics, events, privates, payloads, binary_payloads, ids) AS u(o, t, e, p, j, b, i);
        RETURN n;
    END IF;
    IF senders IS NULL THEN
        senders := array_fill(NULL::text, ARRAY[cardinality(topics)]);
    END IF;
    -- The total first: its row's lock, held to commit, makes this the one keeping relay
    -- running, whichever sidecar relays it, so each count and its insert are one decision.
    UPDATE realtime.persisted_totals t
    SET messages = t.messages + k.n, bytes = t.bytes + k.size
    FROM (SELECT count(*) AS n, coalesce(sum(coalesce(octet_length(j), 0) + coalesce(octet_length(b), 0)), 0) AS size
          FROM unnest(payloads, binary_payloads, ttls) AS u(j, b, ttl) WHERE ttl IS NOT NULL) k
    RETURNING t.messages, t.bytes INTO over;
    IF over.messages > coalesce(max_kept_total, over.messages)
       OR over.bytes > coalesce(max_kept_bytes_total, over.bytes) THEN
        RAISE EXCEPTION 'PersistQuotaExceeded: this database keeps at most % persisted messages and % bytes (MAX_PERSISTED_MESSAGES, MAX_PERSISTED_BYTES) until some expire',
            max_kept_total, max_kept_bytes_total
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF max_kept IS NOT NULL OR max_kept_bytes IS NOT NULL THEN
        SELECT k.t, k.p, k.n + held.n AS n, k.bytes + held.bytes AS bytes INTO over
        FROM (SELECT t, p, count(*) AS n,
                     sum(coalesce(octet_length(j), 0) + coalesce(octet_length(b), 0)) AS bytes
              FROM unnest(topics, privates, payloads, binary_payloads, ttls) AS u(t, p, j, b, ttl)
              WHERE ttl IS NOT NULL GROUP BY t, p) k
        CROSS JOIN LATERAL (
            SELECT count(*) AS n,
                   coalesce(sum(coalesce(pg_column_size(m.payload), 0)
                                + coalesce(pg_column_size(m.binary_payload), 0)), 0) AS bytes
            FROM realtime.persisted_messages m
            WHERE m.topic = k.t AND m.private = k.p AND m.expires_at > now()) held
        WHERE k.n + held.n > coalesce(max_kept, k.n + held.n)
           OR k.bytes + held.bytes > coalesce(max_kept_bytes, k.bytes + held.bytes)
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'PersistQuotaExceeded: topic % keeps at most % persisted messages and % bytes (MAX_PERSISTED_MESSAGES_PER_TOPIC, MAX_PERSISTED_BYTES_PER_TOPIC) until some expire',
                over.t, max_kept, max_kept_bytes
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END IF;
    -- Each sender's count, added to (a row per sender, in one order).
    INSERT INTO realtime.persisted_senders AS c (sender, messages, bytes)
    SELECT s, count(*), sum(coalesce(octet_length(j), 0) + coalesce(octet_length(b), 0))
    FROM unnest(senders, payloads, binary_payloads, ttls) AS u(s, j, b, ttl)
    WHERE ttl IS NOT NULL AND s IS NOT NULL GROUP BY s ORDER BY s
    ON CONFLICT (sender) DO UPDATE
    SET messages = c.messages + excluded.messages, bytes = c.bytes + excluded.bytes;
    IF max_kept_per_sender IS NOT NULL OR max_kept_bytes_per_sender IS NOT NULL THEN
        SELECT c.sender INTO over FROM realtime.persisted_senders c
        WHERE c.sender IN (SELECT s FROM unnest(senders, ttls) AS u(s, ttl) WHERE ttl IS NOT NULL)
          AND (c.messages > coalesce(max_kept_per_sender, c.messages)
               OR c.bytes > coalesce(max_kept_bytes_per_sender, c.bytes))
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'PersistQuotaExceeded: % keeps at most % persisted messages and % bytes (MAX_PERSISTED_MESSAGES_PER_USER, MAX_PERSISTED_BYTES_PER_USER) until some expire',
                over.sender, max_kept_per_sender, max_kept_bytes_per_sender
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END IF;
    WITH m AS (
        SELECT coalesce(u.i, gen_random_uuid()) AS id, u.*
        FROM unnest(origins, topics, events, privates, payloads, binary_payloads, ttls, senders, ids)
            AS u(o, t, e, p, j, b, ttl, s, i)
    ), kept AS (
        INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, binary_payload, expires_at, sender)
        SELECT id, t, p, e, j::json, b, clock_timestamp() + ttl * interval '1 second', s
        FROM m WHERE ttl IS NOT NULL
    )
    SELECT count(realtime.relay(o, t, e, p, j::json, b, id, ttl IS NOT NULL, i IS NOT NULL)) INTO n FROM m;
    RETURN n;
END
$$;
REVOKE EXECUTE ON FUNCTION realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[], integer, bigint, text[], integer, bigint, bigint, bigint, uuid[]) FROM PUBLIC;
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT x FROM pg_catalog.unnest(pg_catalog.string_to_array(
                 pg_catalog.current_setting('pg_realtime.relay_callers'), ',')) x LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.relay(bigint, text, text, boolean, json, bytea, uuid, boolean, boolean) TO %s', r);
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[], integer, bigint, text[], integer, bigint, bigint, bigint, uuid[]) TO %s', r);
        EXECUTE format('GRANT SELECT, UPDATE ON realtime.persisted_totals TO %s', r);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON realtime.persisted_senders TO %s', r);
    END LOOP;
END
$$;
CREATE OR REPLACE FUNCTION realtime.expire_persisted(max_rows integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gone integer;
BEGIN
    WITH g AS (
        DELETE FROM realtime.persisted_messages
        WHERE id IN (SELECT id FROM realtime.persisted_messages
                     WHERE expires_at < now() ORDER BY expires_at LIMIT max_rows)
        RETURNING 1
    )
    SELECT count(*)::integer INTO gone FROM g;
    IF gone < max_rows THEN
        -- No keeping relay runs while this holds the total's lock (they take it first).
        PERFORM 1 FROM realtime.persisted_totals FOR UPDATE;
        UPDATE realtime.persisted_totals t
        SET messages = c.n, bytes = c.bytes
        FROM (SELECT count(*) AS n,
                     coalesce(sum(coalesce(pg_column_size(m.payload), 0)
                                  + coalesce(pg_column_size(m.binary_payload), 0)), 0) AS bytes
              FROM realtime.persisted_messages m WHERE m.expires_at > now()) c;
        DELETE FROM realtime.persisted_senders;
        INSERT INTO realtime.persisted_senders (sender, messages, bytes)
        SELECT m.sender, count(*), sum(coalesce(pg_column_size(m.payload), 0)
                                       + coalesce(pg_column_size(m.binary_payload), 0))
        FROM realtime.persisted_messages m
        WHERE m.sender IS NOT NULL AND m.expires_at > now()
        GROUP BY m.sender;
    END IF;
    RETURN gone;
END
$$;

-- sql/privileges.sql: realtime.drain_unpack is no longer PUBLIC's (it hands back json values
-- it never validated); the roles that may drain may still unpack.
REVOKE EXECUTE ON FUNCTION realtime.drain_unpack(bytea) FROM PUBLIC;
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT pg_catalog.quote_ident(a.rolname) FROM pg_catalog.pg_roles a
             WHERE NOT a.rolsuper
               AND pg_catalog.has_function_privilege(a.oid, 'realtime.drain_packed(text, bigint, integer, integer, integer, oid[])', 'EXECUTE') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.drain_unpack(bytea) TO %s', r);
    END LOOP;
END
$$;

-- sql/privileges.sql.
REVOKE EXECUTE ON FUNCTION realtime.check_privileges() FROM PUBLIC;

-- The roles that could ask realtime.subscribable (a sidecar's login) may ask it still: it
-- now calls render_filter_values as its caller. They may also read realtime.check_privileges(),
-- which the sidecar logs at its start.
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT pg_catalog.quote_ident(a.rolname) FROM pg_catalog.pg_roles a
             WHERE NOT a.rolsuper
               AND pg_catalog.has_function_privilege(a.oid, 'realtime.subscribable(jsonb)', 'EXECUTE') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.render_filter_values(text, oid, integer, text[]) TO %s', r);
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.check_privileges() TO %s', r);
    END LOOP;
END
$$;

-- realtime.stats() counts the messages dropped when sent, by reason (extension/src/dropped.rs:
-- by default a message that cannot be sent is a WARNING, as on Supabase, not an ERROR).
DROP FUNCTION realtime.stats();
CREATE FUNCTION realtime."stats"() RETURNS TABLE (
	"epoch" timestamp with time zone,
	"capacity_bytes" bigint,
	"used_bytes" bigint,
	"oldest_seq" bigint,
	"last_seq" bigint,
	"messages_enqueued" bigint,
	"bytes_enqueued" bigint,
	"transactions" bigint,
	"messages_evicted" bigint,
	"aborted_reservations" bigint,
	"oversize_rejections" bigint,
	"queue_full_errors" bigint,
	"consumers" INT,
	"pending_bytes" bigint,
	"oldest_pending_since" timestamp with time zone,
	"oldest_committed_at" timestamp with time zone,
	"dropped_invalid" bigint,
	"dropped_too_large" bigint,
	"dropped_queue_full" bigint,
	"dropped_unauthorized" bigint
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'stats_wrapper';

-- extension/src/inserted.rs, messages_expiry.rs, sql/inserted.sql: rows the app inserts into
-- realtime.messages are delivered at commit, and deleted after Supabase's 72 hours.
CREATE FUNCTION realtime."deliver_inserted"() RETURNS trigger
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'deliver_inserted_wrapper';
CREATE FUNCTION realtime."add_delivery_trigger"(
	"leaf" oid
) RETURNS bool
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'add_delivery_trigger_wrapper';
CREATE FUNCTION realtime."expire_messages"(
	"max_rows" INT DEFAULT 10000
) RETURNS INT
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'expire_messages_wrapper';

-- sql/app_objects.sql: what the extension keeps on the app's objects, made again wherever
-- it is missing (its dependencies were recorded by a bare statement before).
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

-- sql/capture.sql: sync_capture keeps what the extension keeps on the app's objects too,
-- and makes it now.
CREATE OR REPLACE FUNCTION realtime.sync_capture() RETURNS void
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
SELECT realtime.sync_capture();

-- The roles that may expire persisted messages (a sidecar's login) may expire these, and make
-- what pg_upgrade leaves out again (the sidecar asks at each connection).
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT pg_catalog.quote_ident(a.rolname) FROM pg_catalog.pg_roles a
             WHERE NOT a.rolsuper
               AND pg_catalog.has_function_privilege(a.oid, 'realtime.expire_persisted(integer)', 'EXECUTE') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.expire_messages(integer) TO %s', r);
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.sync_app_objects() TO %s', r);
    END LOOP;
END
$$;

-- sql/presence.sql: a presence session's backend is checked in the proc array
-- (realtime.backend_alive) instead of in pg_stat_activity, which copied every backend's
-- status for each renewal and each reap (every second from every sidecar); its start time
-- is no longer kept.
CREATE FUNCTION realtime."backend_alive"(pid integer) RETURNS boolean
VOLATILE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'backend_alive_wrapper';
REVOKE EXECUTE ON FUNCTION realtime.backend_alive(integer) FROM PUBLIC;
-- Every sidecar's reaper asks it first, so that about one reap a second goes ahead.
CREATE FUNCTION realtime."presence_reap_due"(every_ms integer) RETURNS boolean
VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'presence_reap_due_wrapper';
REVOKE EXECUTE ON FUNCTION realtime.presence_reap_due(integer) FROM PUBLIC;
ALTER TABLE realtime.presence_sessions DROP COLUMN backend_start;
-- A lease lives no longer than its server: no renewal writes the WAL or waits for the standbys.
ALTER TABLE realtime.presence_sessions SET UNLOGGED;
CREATE OR REPLACE FUNCTION realtime.presence_renew(session_id text, lease interval DEFAULT '3 seconds')
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held boolean;
BEGIN
    SELECT s.expires_at >= clock_timestamp() INTO held
    FROM realtime.presence_sessions s WHERE s.session = session_id FOR UPDATE;
    -- A session is renewed from one connection only (a sidecar takes a new session when it
    -- connects again), so this backend's pid names it for as long as the session lives.
    INSERT INTO realtime.presence_sessions AS s (session, expires_at, pid)
    VALUES (session_id, clock_timestamp() + lease, pg_backend_pid())
    ON CONFLICT (session) DO UPDATE SET expires_at = excluded.expires_at, pid = excluded.pid;
    RETURN coalesce(held, false);
END
$$;

CREATE OR REPLACE FUNCTION realtime.presence_reap(keep_left interval DEFAULT '1 minute')
RETURNS integer LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('realtime.presence_reap')) THEN
        RETURN 0;
    END IF;
    FOR t IN
        WITH ended AS (
            DELETE FROM realtime.presence_sessions s
            WHERE s.expires_at < clock_timestamp()
               OR (s.pid IS NOT NULL AND NOT realtime.backend_alive(s.pid))
            RETURNING s.session),
        gone AS (
            UPDATE realtime.presences p SET left_at = clock_timestamp()
            WHERE p.left_at IS NULL
              AND (p.session IN (SELECT e.session FROM ended e)
                   OR NOT EXISTS (SELECT 1 FROM realtime.presence_sessions s WHERE s.session = p.session))
            RETURNING p.topic, p.private, p.key, p.meta, p.ref)
        SELECT g.topic, g.private, sum(g.c)::integer AS members,
               jsonb_object_agg(g.key, g.metas) AS leaves
        FROM (SELECT topic, private, key, count(*) AS c,
                     jsonb_build_object('metas', jsonb_agg(meta || jsonb_build_object('phx_ref', ref) ORDER BY ref)) AS metas
              FROM gone GROUP BY topic, private, key) g
        GROUP BY g.topic, g.private
    LOOP
        PERFORM realtime.queue_presence(t.topic, t.private,
            jsonb_build_object('joins', '{}'::jsonb, 'leaves', t.leaves)::text);
        n := n + t.members;
    END LOOP;
    DELETE FROM realtime.presences p WHERE p.left_at < clock_timestamp() - keep_left;
    RETURN n;
END
$$;

-- The roles that may reap (a sidecar's login) may ask these too.
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT pg_catalog.quote_ident(a.rolname) FROM pg_catalog.pg_roles a
             WHERE NOT a.rolsuper
               AND pg_catalog.has_function_privilege(a.oid, 'realtime.presence_reap(interval)', 'EXECUTE') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.backend_alive(integer) TO %s', r);
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.presence_reap_due(integer) TO %s', r);
    END LOOP;
END
$$;

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

