-- Hand-written part of the pg_realtime extension script.

-- What the sidecar needs to know of the tables of Postgres Changes, read from the catalogs
-- here so that the sidecar calls only realtime.* functions (and this SQL is in the regress
-- suite): which oids the drain should decode changes of, and how a changed table is
-- checked at delivery (its row security, its primary key, and the columns each role may
-- read). Granted to the sidecar's login, not to PUBLIC.

-- The tables named by (schema, table) pairs, as the oids realtime.drain and realtime.history
-- decode changes of. A schema of '*' names every schema but the system's, and a NULL table
-- every table of its schema: a binding on a whole schema, or on every schema. Names that are
-- no table are left out (a channel may name a table created later). A partitioned table's
-- changes are captured on the leaf written to, under the leaf's name, and a binding matches
-- a change by that name, so a root's name adds no leaf here.
CREATE FUNCTION realtime.table_oids(schemas text[], tables text[])
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

-- One table's delivery facts, a row per role asked: its oid, whether row security is
-- enabled, its primary key's columns in order (what realtime.visible looks rows up by),
-- and what realtime.selectable says of the role (the columns it may read, or why none).
-- No row when the table does not exist. A partition's changes are captured on the leaf
-- it was written to, but the app reads the partitioned table: its root's row security,
-- key and grants decide (and realtime.visible asks through the root), never the leaf's,
-- which apply only to direct access to the partition.
CREATE FUNCTION realtime.table_access(schema_name text, table_name text, roles text[])
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

REVOKE EXECUTE ON FUNCTION realtime.table_oids(text[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.table_access(text, text, text[]) FROM PUBLIC;
