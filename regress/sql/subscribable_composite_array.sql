-- Regression (review L8): realtime.subscribable read a filter value on an array of a
-- composite type by the composite's input, which runs its fields' domain CHECKs as the
-- extension's owner with the client's text. Such columns are refused like domains'
-- arrays, and no CHECK runs. Uses the roles of authorize.sql.
CREATE TABLE l8_calls (n int);
CREATE FUNCTION l8_check(v int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO l8_calls VALUES (v);
    RETURN true;
END
$$;
CREATE DOMAIN l8_checked AS int CHECK (l8_check(VALUE));
CREATE TYPE l8_pair AS (a l8_checked, b int);
CREATE TABLE l8_rows (id int PRIMARY KEY, pairs l8_pair[], plain int[]);
GRANT SELECT ON l8_rows TO authenticated;
ALTER PUBLICATION supabase_realtime ADD TABLE l8_rows;
SELECT item, error, "values" FROM realtime.subscribable($$[
  {"role": "authenticated", "schema": "public", "table": "l8_rows", "filters": [{"column": "pairs", "op": "eq", "values": ["{\"(7,1)\"}"]}]},
  {"role": "authenticated", "schema": "public", "table": "l8_rows", "filters": [{"column": "plain", "op": "eq", "values": ["{1,2}"]}]}
]$$);
SELECT count(*) AS checks_run FROM l8_calls;
ALTER PUBLICATION supabase_realtime DROP TABLE l8_rows;
DROP TABLE l8_rows, l8_calls;
DROP TYPE l8_pair;
DROP DOMAIN l8_checked;
DROP FUNCTION l8_check(int);
