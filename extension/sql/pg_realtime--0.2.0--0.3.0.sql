-- pg_realtime 0.2.0 -> 0.3.0. Every change of the extension's SQL since 0.2.0 (frozen in
-- extension/released/pg_realtime--0.2.0.sql) is written here as well, in the order the
-- changes landed; regress/sql/upgrade.sql proves the result equals a fresh install.

-- Runs as the installer: unqualified names resolve in pg_catalog alone (extension/README.md,
-- "Who runs what": roles that are no superuser may create in schema realtime).
SET LOCAL search_path = pg_catalog, pg_temp;

-- extension/src/history.rs: realtime.history returns the captured changes of the tables a
-- resuming channel's Postgres Changes bindings name (`changes`). The roles that could call
-- the old signature (a sidecar's login) may call the new one.
SELECT pg_catalog.set_config('pg_realtime.history_callers',
    coalesce(pg_catalog.string_agg(pg_catalog.quote_ident(a.rolname), ','), ''), true)
FROM pg_catalog.pg_roles a
WHERE NOT a.rolsuper
  AND pg_catalog.has_function_privilege(a.oid, 'realtime.history(bigint, text[], boolean[], timestamptz, integer, boolean, integer)', 'EXECUTE');
DROP FUNCTION realtime.history(bigint, text[], boolean[], timestamptz, integer, boolean, integer);
CREATE FUNCTION realtime."history"(after_seq bigint, topics text[], private boolean[], since timestamptz DEFAULT NULL, newest integer DEFAULT NULL, relayed boolean DEFAULT true, max_messages integer DEFAULT 100000, changes oid[] DEFAULT NULL)
RETURNS TABLE(seq bigint, kind text, topic text, event text, payload json, binary_payload bytea, private boolean, committed_at timestamptz, id uuid, origin bigint, lost_first bigint, lost_last bigint)
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'history_wrapper';
REVOKE EXECUTE ON FUNCTION realtime.history(bigint, text[], boolean[], timestamptz, integer, boolean, integer, oid[]) FROM PUBLIC;
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT x FROM pg_catalog.unnest(pg_catalog.string_to_array(
                 pg_catalog.current_setting('pg_realtime.history_callers'), ',')) x LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.history(bigint, text[], boolean[], timestamptz, integer, boolean, integer, oid[]) TO %s', r);
    END LOOP;
END
$$;

-- A drained batch as one packed value (extension/src/packed.rs), and back into rows.
CREATE FUNCTION realtime."drain_packed"(consumer text, after_seq bigint DEFAULT NULL, max_messages integer DEFAULT 10000, timeout_ms integer DEFAULT 1000, linger_ms integer DEFAULT 0, decode oid[] DEFAULT NULL)
RETURNS bytea
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'drain_packed_wrapper';
REVOKE EXECUTE ON FUNCTION realtime.drain_packed(text, bigint, integer, integer, integer, oid[]) FROM PUBLIC;
CREATE FUNCTION realtime."drain_unpack"(packed bytea)
RETURNS TABLE(seq bigint, kind text, topic text, event text, payload json, binary_payload bytea, private boolean, committed_at timestamptz, id uuid, origin bigint, lost_first bigint, lost_last bigint)
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'drain_unpack_wrapper';
-- The roles that may drain (a sidecar's login) may drain packed too: a sidecar upgraded with
-- the extension reads the packed form without a new grant.
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT pg_catalog.quote_ident(a.rolname) FROM pg_catalog.pg_roles a
             WHERE NOT a.rolsuper
               AND pg_catalog.has_function_privilege(a.oid, 'realtime.drain(text, bigint, integer, integer, integer, oid[])', 'EXECUTE') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION realtime.drain_packed(text, bigint, integer, integer, integer, oid[]) TO %s', r);
    END LOOP;
END
$$;

-- sql/tables.sql: realtime.table_oids takes the wildcards of a binding on a whole schema
-- ('*', a NULL table), so realtime.history's callers look a resume's tables up through it
-- (the sidecar writes no catalog SQL), and names tables only, never views.
CREATE OR REPLACE FUNCTION realtime.table_oids(schemas text[], tables text[])
RETURNS oid[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT c.oid), '{}')
    FROM unnest(schemas, tables) AS u(s, t)
    JOIN pg_catalog.pg_namespace n
      ON n.nspname = u.s
      OR (u.s = '*' AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp\_%')
    JOIN pg_catalog.pg_class c
      ON c.relnamespace = n.oid AND (u.t IS NULL OR c.relname = u.t)
    WHERE c.relkind IN ('r', 'p')
$$;

-- sql/subscribable.sql: a binding on a partitioned table's own name is refused with the
-- reason (its rows' changes are named after their partitions), not as missing from the
-- publication; and a binding when publication supabase_realtime does not exist at all says
-- so and how to create it, instead of a hint to ALTER a publication that is not there.
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
