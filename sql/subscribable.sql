-- Postgres Changes: whether a join's bindings can be served, checked once when the channel
-- joins, so that a mistake is a clear join error instead of silence afterwards (Supabase
-- checks the same in its subscription table's trigger). The sidecar sends every binding
-- of the joins waiting, as one JSON array of
--     {"role": ..., "schema": ..., "table": ..., "select": [...],
--      "filters": [{"column": ..., "op": "eq", "values": [...]}, ...]}
-- (filters: the binding's conditions, all of which must hold; table absent: a binding on a
-- whole schema, checked change by change at delivery instead), and receives, for each
-- binding (1-based `item`), its error or, per condition, its values as the column's type
-- renders them in JSON (null for like, ilike, match, imatch and is, whose value is no value
-- of the column): the sidecar compares changed records with those, so `eq.2026-01-01` matches the
-- record's "2026-01-01T00:00:00+00:00".
--
-- A filter or a select on a column the role may not SELECT is refused: a filter evaluated
-- on a hidden column would let a subscriber learn its values one question at a time.
--
-- Runs as its caller (the sidecar's login), reading only catalogs, and calls the
-- extension's functions by their exact signatures, so an overload another role adds to
-- schema realtime is never chosen. A value is rendered by realtime.render_filter_values as
-- the binding's role: the column type's input function and cast to json are the type
-- owner's code, run with the client's rights and no more.
CREATE FUNCTION realtime.subscribable(bindings jsonb)
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

REVOKE EXECUTE ON FUNCTION realtime.subscribable(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.render_filter_values(text, oid, integer, text[]) FROM PUBLIC;
