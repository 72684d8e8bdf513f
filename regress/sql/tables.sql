-- realtime.table_oids and realtime.table_access: the catalog lookups of Postgres Changes
-- that the sidecar makes through these functions (it writes no catalog SQL itself).
-- Uses the roles of authorize.sql.
CREATE SCHEMA tbl_app;
CREATE TABLE tbl_app.notes (room int, id int, body text, secret text, PRIMARY KEY (room, id));
CREATE TABLE tbl_app.open_notes (id int PRIMARY KEY, body text);
CREATE TABLE tbl_app.keyless (body text);
ALTER TABLE tbl_app.notes ENABLE ROW LEVEL SECURITY;
GRANT USAGE ON SCHEMA tbl_app TO authenticated, anon;
GRANT SELECT (room, id, body) ON tbl_app.notes TO authenticated;
GRANT SELECT ON tbl_app.open_notes, tbl_app.keyless TO anon;

-- Names to oids: tables that exist, in any order; names of nothing are left out.
SELECT array_length(o, 1) AS found,
       'tbl_app.notes'::regclass::oid = ANY (o) AS has_notes,
       'tbl_app.open_notes'::regclass::oid = ANY (o) AS has_open_notes
FROM realtime.table_oids(ARRAY['tbl_app', 'tbl_app', 'tbl_app', 'nowhere'],
                         ARRAY['open_notes', 'notes', 'missing', 'notes']) AS o;
SELECT realtime.table_oids('{}', '{}') AS none;

-- As a binding on a whole schema (NULL table) or on every schema ('*') names them, for a
-- resume's changes: the schema's tables, or the table of that name in any schema but the
-- system's; never a view, never a system catalog.
CREATE VIEW tbl_app.a_view AS SELECT 1 AS one;
SELECT array_length(o, 1) AS found,
       'tbl_app.keyless'::regclass::oid = ANY (o) AS has_keyless,
       'tbl_app.a_view'::regclass::oid = ANY (o) AS has_view
FROM realtime.table_oids(ARRAY['tbl_app'], ARRAY[NULL]) AS o;
SELECT o = ARRAY['tbl_app.keyless'::regclass::oid] AS only_keyless
FROM realtime.table_oids(ARRAY['*'], ARRAY['keyless']) AS o;
SELECT 'tbl_app.open_notes'::regclass::oid = ANY (o) AS has_open_notes,
       NOT EXISTS (SELECT FROM unnest(o) AS x(oid)
                   JOIN pg_class c ON c.oid = x.oid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname IN ('pg_catalog', 'information_schema')
                      OR n.nspname LIKE 'pg\_toast%') AS no_system_table
FROM realtime.table_oids(ARRAY['*'], ARRAY[NULL]) AS o;

-- A table's facts per role: row security, the primary key in its order, and the columns
-- each role may read (or why none).
SELECT oid = 'tbl_app.notes'::regclass::oid AS same_oid, rls, primary_key, role, columns, error
FROM realtime.table_access('tbl_app', 'notes', ARRAY['authenticated', 'anon'])
ORDER BY role;
SELECT rls, primary_key, role, columns FROM realtime.table_access('tbl_app', 'open_notes', ARRAY['anon']);
SELECT rls, primary_key, role, columns FROM realtime.table_access('tbl_app', 'keyless', ARRAY['anon']);
-- A table that does not exist: no row.
SELECT count(*) AS rows FROM realtime.table_access('tbl_app', 'missing', ARRAY['anon']);

-- A partition is checked as its root: the root's row security, key and grants, whatever
-- the leaf has (a leaf without RLS, readable by anon, must not let the root's rows out).
CREATE TABLE tbl_app.msgs (id int, room int, body text, PRIMARY KEY (id, room)) PARTITION BY LIST (room);
CREATE TABLE tbl_app.msgs_1 PARTITION OF tbl_app.msgs FOR VALUES IN (1);
ALTER TABLE tbl_app.msgs ENABLE ROW LEVEL SECURITY;
GRANT SELECT (id, room) ON tbl_app.msgs TO authenticated;
GRANT SELECT ON tbl_app.msgs_1 TO anon, authenticated;
SELECT oid = 'tbl_app.msgs'::regclass::oid AS root_oid, rls, primary_key, role, columns, error
FROM realtime.table_access('tbl_app', 'msgs_1', ARRAY['authenticated', 'anon'])
ORDER BY role;

-- Both are the sidecar's, not PUBLIC's.
SELECT has_function_privilege('public', 'realtime.table_oids(text[],text[])', 'EXECUTE') AS public_oids,
       has_function_privilege('public', 'realtime.table_access(text,text,text[])', 'EXECUTE') AS public_access;
DROP SCHEMA tbl_app CASCADE;
