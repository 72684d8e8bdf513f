-- pg_realtime 0.1.0 -> 0.2.0: the app's objects become the app's (see sql/schema.sql).
-- 0.1.0 made realtime.messages and realtime.topic() members of the
-- extension, so pg_dump dropped the app's policies on realtime.messages; it created
-- publication supabase_realtime, which a restore then failed to create again; and it did
-- not dump persisted broadcasts.

-- Runs as the installer: unqualified names resolve in pg_catalog alone (extension/README.md,
-- "Who runs what": roles that are no superuser may create in schema realtime).
SET LOCAL search_path = pg_catalog, pg_temp;

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

-- extension/src/pattern.rs: the like, ilike, match and imatch filters, judged by Postgres.
CREATE FUNCTION realtime."match_patterns"(patterns text[], ops text[], subjects text[], asked integer[] DEFAULT NULL, budget_ms integer DEFAULT 100)
RETURNS TABLE(pattern integer, subject integer, matched boolean, error text)
VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', 'match_patterns_wrapper';
REVOKE EXECUTE ON FUNCTION realtime.match_patterns(text[], text[], text[], integer[], integer) FROM PUBLIC;
-- A sidecar's login (one that may call realtime.visible, as scripts/sidecar_login.sql
-- grants) may call it too: without it pattern filters fail with a system message.
DO $$
DECLARE
    r name;
BEGIN
    FOR r IN SELECT a.rolname FROM pg_catalog.pg_roles a
             WHERE NOT a.rolsuper
               AND pg_catalog.has_function_privilege(a.oid,
                     'realtime.visible(regclass, text[], text[], text[], integer[])', 'EXECUTE')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.match_patterns(text[], text[], text[], integer[], integer) TO %I', r);
    END LOOP;
END
$$;

-- sql/persisted.sql: relay_batch keeps a quota per topic (two more arguments). The roles
-- that could call the old one (a sidecar's login) may call the new one.
-- (Carried across the DROP in a setting of this transaction: nothing is left behind.)
SELECT pg_catalog.set_config('pg_realtime.relay_callers',
    coalesce(pg_catalog.string_agg(pg_catalog.quote_ident(a.rolname), ','), ''), true)
FROM pg_catalog.pg_roles a
WHERE NOT a.rolsuper
  AND pg_catalog.has_function_privilege(a.oid, 'realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[])', 'EXECUTE');
DROP FUNCTION realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[]);
CREATE FUNCTION realtime.relay_batch(origins bigint[], topics text[], events text[],
    privates boolean[], payloads text[], binary_payloads bytea[], ttls integer[] DEFAULT NULL,
    max_kept integer DEFAULT NULL, max_kept_bytes bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    over record;
BEGIN
    IF ttls IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(ttls) AS x(ttl) WHERE ttl IS NOT NULL) THEN
        SELECT count(realtime.relay(o, t, e, p, j::json, b)) INTO n
        FROM unnest(origins, topics, events, privates, payloads, binary_payloads) AS u(o, t, e, p, j, b);
        RETURN n;
    END IF;
    IF max_kept IS NOT NULL OR max_kept_bytes IS NOT NULL THEN
        -- One writer at a time per kept topic, whichever sidecar relays it: the count and
        -- the insert are one decision. Locks are taken in one order (no deadlock).
        PERFORM pg_advisory_xact_lock(hashtextextended('realtime.persisted_messages ' || k.p::text || ' ' || k.t, 0))
        FROM (SELECT DISTINCT t, p FROM unnest(topics, privates, ttls) AS u(t, p, ttl)
              WHERE ttl IS NOT NULL ORDER BY t, p) k;
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
    WITH m AS (
        SELECT gen_random_uuid() AS id, u.*
        FROM unnest(origins, topics, events, privates, payloads, binary_payloads, ttls)
            AS u(o, t, e, p, j, b, ttl)
    ), kept AS (
        INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, binary_payload, expires_at)
        SELECT id, t, p, e, j::json, b, clock_timestamp() + ttl * interval '1 second'
        FROM m WHERE ttl IS NOT NULL
    )
    SELECT count(realtime.relay(o, t, e, p, j::json, b, id, ttl IS NOT NULL)) INTO n FROM m;
    RETURN n;
END
$$;

REVOKE EXECUTE ON FUNCTION realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[], integer, bigint) FROM PUBLIC;
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT x FROM pg_catalog.unnest(pg_catalog.string_to_array(
                 pg_catalog.current_setting('pg_realtime.relay_callers'), ',')) x LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[], integer, bigint) TO %s', r);
    END LOOP;
END
$$;

-- sql/tables.sql: a partition is judged by its root's row security, key and grants.
CREATE OR REPLACE FUNCTION realtime.table_access(schema_name text, table_name text, roles text[])
RETURNS TABLE(oid oid, rls boolean, primary_key text[], role text, columns text[], error text)
LANGUAGE sql STABLE AS $$
    SELECT r.oid, r.relrowsecurity,
           ARRAY(SELECT a.attname::text FROM pg_catalog.pg_index i
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                 WHERE i.indrelid = r.oid AND i.indisprimary ORDER BY a.attnum),
           s.role, s.columns, s.error
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_catalog.pg_class r ON r.oid = coalesce(pg_catalog.pg_partition_root(c.oid), c.oid),
    LATERAL realtime.selectable(r.oid::regclass, roles) s
    WHERE n.nspname = schema_name AND c.relname = table_name
$$;

-- sql/subscribable.sql: match and imatch compiled at join; isdistinct.null as Supabase reads
-- it; arrays of composite elements refused (review L8).
CREATE OR REPLACE FUNCTION realtime.subscribable(bindings jsonb)
RETURNS TABLE(item integer, error text, "values" jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    b jsonb;
    f jsonb;
    n integer := 0;
    rel oid;
    relname text;
    sel record;
    col record;
    typ oid;
    category "char";
    c text;
    v text;
    rendered jsonb;
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
        IF NOT EXISTS (SELECT 1 FROM pg_publication_tables pt
                       WHERE pt.pubname = 'supabase_realtime'
                         AND pt.schemaname = b ->> 'schema' AND pt.tablename = b ->> 'table') THEN
            error := format('table %s is not in publication supabase_realtime; add it with '
                            'ALTER PUBLICATION supabase_realtime ADD TABLE %s', relname, relname);
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
                -- function, and this function runs as the extension's owner.
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
                    one := '[]';
                    FOR v IN SELECT jsonb_array_elements_text(f -> 'values') LOOP
                        BEGIN
                            -- isdistinct.null is the value 'null' of the column's type, as in
                            -- Supabase's check_equality_op (the text "null"; refused for an
                            -- integer): use is.null for NULL.
                            EXECUTE format('SELECT to_jsonb(%L::%s)', v, format_type(typ, col.atttypmod))
                                INTO rendered;
                        EXCEPTION WHEN data_exception THEN
                            error := format('filter value %L is not a valid %s: %s', v,
                                            format_type(col.atttypid, col.atttypmod), SQLERRM);
                            EXIT;
                        END;
                        one := one || jsonb_build_array(rendered);
                    END LOOP;
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

