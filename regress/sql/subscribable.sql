-- realtime.subscribable(bindings): whether a join's Postgres Changes bindings can be served,
-- each binding's error (or its filter values as the column's type renders them) checked
-- once at join. Uses the roles of authorize.sql.
CREATE DOMAIN sub_positive AS int CHECK (VALUE > 0);
CREATE TYPE sub_pair AS (a int, b int);
CREATE TABLE sub_todos (id bigint PRIMARY KEY, title text, done boolean, due timestamptz,
                        day date, score numeric, owner uuid, secret text, n sub_positive,
                        pair sub_pair, tags text[], "Mixed Case" int);
GRANT SELECT (id, title, done, due, day, score, owner, n, pair, tags, "Mixed Case") ON sub_todos TO authenticated;
GRANT SELECT (title) ON sub_todos TO anon;
CREATE TABLE sub_unpublished (id int PRIMARY KEY);
CREATE TABLE sub_no_pk (a int);
GRANT SELECT ON sub_unpublished, sub_no_pk TO authenticated;
ALTER PUBLICATION supabase_realtime ADD TABLE sub_todos, sub_no_pk;

-- Bindings that can be served: with no filter, with filters whose values are rendered as
-- the column's type renders them in a change's record (timestamps in UTC), on a whole
-- schema, and with a select of readable columns.
SELECT * FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "sub_todos"},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "id", "op": "eq", "values": ["5"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "due", "op": "eq", "values": ["2026-01-02 03:04:05+02"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "done", "op": "eq", "values": ["t"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "score", "op": "in", "values": ["1.50", "2"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "title", "op": "in", "values": ["a,b", "say \"hi\""]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "Mixed Case", "op": "eq", "values": ["1"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "n", "op": "eq", "values": ["-1"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "select": ["id", "title"]},
  {"role": "authenticated", "schema": "public"},
  {"role": "authenticated", "schema": "*", "table": "sub_todos"}
]$$);

-- Bindings refused, each with its reason: no such table, a table not published, no primary
-- key, a role that may not select the key (401), a superuser and an unknown role (the role
-- guard), an unknown filter column, a value of the wrong type, a filter or a select on a
-- column the role may not read, a composite column.
SELECT * FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "nope"},
  {"role": "authenticated", "schema": "nope", "table": "sub_todos"},
  {"role": "authenticated", "schema": "public", "table": "sub_unpublished"},
  {"role": "authenticated", "schema": "public", "table": "sub_no_pk"},
  {"role": "anon", "schema": "public", "table": "sub_todos"},
  {"role": "postgres", "schema": "public", "table": "sub_todos"},
  {"role": "nobody", "schema": "public", "table": "sub_todos"},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "missing", "op": "eq", "values": ["1"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "id", "op": "eq", "values": ["1", "x"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "owner", "op": "eq", "values": ["not-a-uuid"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "secret", "op": "eq", "values": ["a"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "select": ["id", "secret"]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "select": ["nope"]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "pair", "op": "eq", "values": ["(1,2)"]}]}
]$$);

-- Several conditions (all must hold) and the 2026 operators: like and ilike on text, is on
-- booleans (is.null on any column), isdistinct (its value one of the column's type: null is
-- the text "null", and no integer, as in Supabase's check_equality_op), each of which may be
-- negated by the sidecar; refused where they do not apply.
SELECT * FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [
     {"column": "title", "op": "like", "values": ["%a%"]}, {"column": "done", "op": "is", "values": ["true"]},
     {"column": "id", "op": "isdistinct", "values": ["3"]}, {"column": "title", "op": "isdistinct", "values": ["null"]},
     {"column": "score", "op": "in", "values": ["1", "2.5"]},
     {"column": "owner", "op": "is", "values": ["null"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "id", "op": "ilike", "values": ["1%"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "id", "op": "isdistinct", "values": ["null"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "title", "op": "is", "values": ["true"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [
     {"column": "id", "op": "eq", "values": ["1"]}, {"column": "secret", "op": "eq", "values": ["x"]}]}
]$$);

-- match and imatch: Postgres's regular expressions (~ and ~*) on text, compiled here by the
-- engine that evaluates them at delivery, so an invalid one refuses the join with
-- Supabase's text instead of failing every change; refused on a non-text column as like is.
SELECT * FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "title", "op": "match", "values": ["^post-(\\d+)$"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "title", "op": "imatch", "values": ["^(ab)\\1$"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "title", "op": "match", "values": ["(unclosed"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "title", "op": "imatch", "values": ["a{2,1}"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "id", "op": "match", "values": ["1"]}]},
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "secret", "op": "match", "values": ["."]}]}
]$$);

-- Regression guard: a domain's CHECK is not run when a filter value is read (this function
-- runs as the extension's owner, and the check may call any function): -1 was accepted
-- above for a positive-only domain. An array column's values are read as arrays.
SELECT * FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "sub_todos", "filters": [{"column": "tags", "op": "eq", "values": ["{a,b}"]}]}
]$$);

-- A partitioned table, published: its rows' changes are captured on its partitions and
-- named after them, so a binding on its own name would never match one and is refused with
-- that reason (it was refused as missing from the publication); its partition is served.
CREATE TABLE sub_parted (id int, room int, PRIMARY KEY (id, room)) PARTITION BY LIST (room);
CREATE TABLE sub_parted_1 PARTITION OF sub_parted FOR VALUES IN (1);
GRANT SELECT ON sub_parted, sub_parted_1 TO authenticated;
ALTER PUBLICATION supabase_realtime ADD TABLE sub_parted;
SELECT * FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "sub_parted"},
  {"role": "authenticated", "schema": "public", "table": "sub_parted_1"}
]$$);
ALTER PUBLICATION supabase_realtime DROP TABLE sub_parted;
DROP TABLE sub_parted;

SELECT * FROM realtime.subscribable('{"not": "a list"}');
SELECT has_function_privilege('public', 'realtime.subscribable(jsonb)', 'EXECUTE') AS public_can_call;
ALTER PUBLICATION supabase_realtime DROP TABLE sub_todos, sub_no_pk;
DROP TABLE sub_todos, sub_unpublished, sub_no_pk;
DROP TYPE sub_pair;
DROP DOMAIN sub_positive;
