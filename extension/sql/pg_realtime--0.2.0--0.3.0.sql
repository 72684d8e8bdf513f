-- pg_realtime 0.2.0 -> 0.3.0. Every change of the extension's SQL since 0.2.0 (frozen in
-- extension/released/pg_realtime--0.2.0.sql) is written here as well, in the order the
-- changes landed; regress/sql/upgrade.sql proves the result equals a fresh install.

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
