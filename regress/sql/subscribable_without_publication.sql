-- A join's Postgres Changes binding when publication supabase_realtime does not exist at all
-- (a database set up without it, as Supabase's own projects never are). The refusal used to
-- say only "add it with ALTER PUBLICATION supabase_realtime ADD TABLE", which fails too when
-- there is no publication to alter: it names what is missing and how to create it. Uses the
-- roles of authorize.sql.
CREATE TABLE nopub_todos (id int PRIMARY KEY, title text);
GRANT SELECT ON nopub_todos TO authenticated;

BEGIN;
DROP PUBLICATION supabase_realtime;
SELECT * FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "nopub_todos"},
  {"role": "authenticated", "schema": "public"}
]$$);
ROLLBACK;

-- With the publication back (the rollback), the table not in it gets the ALTER hint.
SELECT * FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "nopub_todos"}
]$$);

DROP TABLE nopub_todos;
