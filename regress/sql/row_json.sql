-- The previous file's session may still be exiting with consumer "test" held.
SELECT wait_until_released('test') AS released;
-- The native trigger prints rows itself, with each column's output function looked up
-- once per table (row_json.rs): its record must be byte for byte row_to_json's, for
-- every JSON category, edge values, NULLs, and after the table or a cast changes.
CREATE TYPE rj_mood AS ENUM ('calm', 'say "hi"');
CREATE DOMAIN rj_small AS int CHECK (VALUE < 1000);
CREATE DOMAIN rj_name AS text;
CREATE TYPE rj_pair AS (a int, b text);
CREATE TABLE rj (
    id int PRIMARY KEY, i2 int2, i8 int8, f4 float4, f8 float8, n numeric, b bool,
    t text, vc varchar(10), c char(3), d date, ts timestamp, tz timestamptz,
    j json, jb jsonb, u uuid, by bytea, iv interval, ip inet, m money,
    mood rj_mood, small rj_small, nm rj_name);
CREATE TRIGGER rj_broadcast AFTER INSERT OR UPDATE ON rj
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('rj:{id}');

-- Compares each drained record with row_to_json of the row as it is now.
CREATE FUNCTION rj_same() RETURNS TABLE(id int, same boolean) LANGUAGE sql AS $$
    SELECT r.id, (d.payload -> 'record')::text = row_to_json(r)::text
    FROM realtime.drain('test', NULL, 100, 0) d
    JOIN rj r ON d.topic = 'rj:' || r.id
    ORDER BY r.id, d.seq
$$;

INSERT INTO rj VALUES
    (1, 1, 9223372036854775807, 1.5, 1e300, 12.3400, true, 'plain', 'vc', 'ab', '2026-11-24',
     '2026-11-24 10:00:00.123456', '2026-11-24 10:00:00.5+02', '{"a" : [1, 2]}', '{"b": null}',
     'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\x00ff', '1 day 2 hours', '10.0.0.1/8', 1.5,
     'say "hi"', 999, 'domain text'),
    (2, -32768, -1, 'NaN', '-Infinity', 'NaN', false, E'quote " back \\ nl \n tab \t bell \007 é',
     E'\u00e9', NULL, 'infinity', '-infinity', 'infinity', 'null', '"s"', NULL, '\x', '-1 mon',
     '::1', -0.01, 'calm', -5, ''),
    (3, NULL, NULL, 'Infinity', 1e-300, 'Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (4, 0, 0, -0.0, 0.1, -0.000001, true, '', '', '', '0044-03-15 BC', '1999-12-31 23:59:59',
     '2000-01-01 00:00:00+14', '[]', '{}', '00000000-0000-0000-0000-000000000000', NULL,
     '0', '0.0.0.0', 0, NULL, 0, NULL);
SELECT * FROM rj_same();
SELECT count(*) AS confirmed FROM take();

-- Postgres Changes print captured rows the same way when drained (change.rs): the
-- record, the key-only old_record of the default identity, and the full one.
CREATE FUNCTION rj_changes_same() RETURNS TABLE(id int, record_same boolean, old_record_same boolean)
LANGUAGE sql AS $$
    SELECT r.id, (d.payload -> 'record')::text = row_to_json(r)::text,
           (d.payload -> 'old_record')::text = CASE WHEN c.relreplident = 'f' THEN row_to_json(r)::text
               ELSE (SELECT row_to_json(k) FROM (SELECT r.id) k)::text END
    FROM realtime.drain('test', NULL, 100, 0) d
    JOIN rj r ON (d.payload -> 'record' ->> 'id')::int = r.id
    JOIN pg_class c ON c.oid = 'rj'::regclass
    WHERE d.kind = 'change'
    ORDER BY d.seq
$$;
ALTER PUBLICATION supabase_realtime ADD TABLE rj;
UPDATE rj SET t = coalesce(t, '') || '?';
SELECT * FROM rj_changes_same();
SELECT count(*) AS confirmed FROM take();
-- With the full row as identity the old row is printed too (unchanged here, so it is
-- the row as it is now).
ALTER TABLE rj REPLICA IDENTITY FULL;
UPDATE rj SET t = t;
SELECT * FROM rj_changes_same();
SELECT count(*) AS confirmed FROM take();
ALTER PUBLICATION supabase_realtime DROP TABLE rj;
ALTER TABLE rj REPLICA IDENTITY DEFAULT;

-- Columns that nest (arrays, composites): row_to_json prints those rows.
ALTER TABLE rj ADD COLUMN arr int[] DEFAULT '{1,NULL,3}', ADD COLUMN pair rj_pair;
UPDATE rj SET pair = ROW(id, 'x'), arr = CASE WHEN id = 4 THEN '{{1,2},{3,4}}' ELSE arr END
    WHERE id IN (1, 2, 4);
SELECT * FROM rj_same();
SELECT count(*) AS confirmed FROM take();
ALTER TABLE rj DROP COLUMN arr, DROP COLUMN pair;
UPDATE rj SET t = t || '!' WHERE id IN (1, 2);
SELECT * FROM rj_same();
SELECT count(*) AS confirmed FROM take();

-- A table changed after its first rows: a renamed, a retyped and an added column.
ALTER TABLE rj RENAME COLUMN vc TO vc2;
ALTER TABLE rj ALTER COLUMN i2 TYPE numeric;
ALTER TABLE rj ADD COLUMN extra text DEFAULT 'added';
UPDATE rj SET b = NOT b WHERE id IN (1, 2, 4);
SELECT * FROM rj_same();
SELECT count(*) AS confirmed FROM take();

-- A cast to json created after the table's first rows changes how the enum prints.
CREATE FUNCTION rj_mood_json(rj_mood) RETURNS json LANGUAGE sql IMMUTABLE
    AS $$ SELECT json_build_object('mood', $1::text) $$;
CREATE CAST (rj_mood AS json) WITH FUNCTION rj_mood_json(rj_mood);
UPDATE rj SET mood = 'calm' WHERE id = 1;
SELECT * FROM rj_same();
SELECT d.payload -> 'record' -> 'mood' AS mood_through_the_cast
FROM realtime.drain('test', NULL, 100, 0) d;
SELECT count(*) AS confirmed FROM take();
DROP CAST (rj_mood AS json);
UPDATE rj SET mood = 'calm' WHERE id = 1;
SELECT * FROM rj_same();
SELECT count(*) AS confirmed FROM take();

-- broadcast_changes, called from plpgsql, prints its NEW and OLD the same way (payload.rs,
-- record_json): from plpgsql's expanded records (with the dropped, renamed, retyped and
-- added columns above), from a composite value a query read, from an anonymous record,
-- and one whose columns nest (printed by row_to_json).
DROP TRIGGER rj_broadcast ON rj;
CREATE FUNCTION rj_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM realtime.broadcast_changes('rj:' || NEW.id, TG_OP, TG_OP, TG_TABLE_NAME, TG_TABLE_SCHEMA, NEW, OLD);
    RETURN NULL;
END
$$;
CREATE TRIGGER rj_changes AFTER UPDATE ON rj FOR EACH ROW EXECUTE FUNCTION rj_changes();
UPDATE rj SET t = t;
SELECT r.id, (d.payload -> 'record')::text = row_to_json(r)::text AS record_same,
       (d.payload -> 'old_record')::text = row_to_json(r)::text AS old_record_same
FROM realtime.drain('test', NULL, 100, 0) d JOIN rj r ON d.topic = 'rj:' || r.id ORDER BY r.id, d.seq;
SELECT count(*) AS confirmed FROM take();
SELECT count(*) FROM (SELECT realtime.broadcast_changes('rjv:' || r.id, 'e', 'INSERT', 'rj', 'public', r, NULL) FROM rj r) s;
SELECT realtime.broadcast_changes('rjv:anon', 'e', 'INSERT', 'x', 'public', ROW(1, 'two', NULL::numeric, '0'::interval), NULL);
SELECT realtime.broadcast_changes('rjv:nested', 'e', 'INSERT', 'x', 'public', ROW(ARRAY[1, 2], ROW(1, 'x')), NULL);
SELECT d.topic, (d.payload -> 'record')::text = CASE d.topic
           WHEN 'rjv:anon' THEN row_to_json(ROW(1, 'two', NULL::numeric, '0'::interval))::text
           WHEN 'rjv:nested' THEN row_to_json(ROW(ARRAY[1, 2], ROW(1, 'x')))::text
           ELSE (SELECT row_to_json(r)::text FROM rj r WHERE 'rjv:' || r.id = d.topic) END AS same
FROM realtime.drain('test', NULL, 100, 0) d ORDER BY d.seq;
SELECT count(*) AS confirmed FROM take();
DROP TRIGGER rj_changes ON rj;
DROP FUNCTION rj_changes();
CREATE TRIGGER rj_broadcast AFTER INSERT OR UPDATE ON rj
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('rj:{id}');

-- The topic template's column, renamed or retyped after the trigger's first rows, is
-- looked up again: a renamed one is refused by name, a retyped one prints anew.
ALTER TABLE rj ALTER COLUMN id TYPE numeric(10, 2);
UPDATE rj SET t = 'retyped' WHERE id = 4;
SELECT topic FROM take();
ALTER TABLE rj RENAME COLUMN id TO ident;
UPDATE rj SET t = 'renamed' WHERE ident = 4;
SELECT * FROM take();
DROP TABLE rj;
DROP FUNCTION rj_same(), rj_changes_same();
DROP FUNCTION rj_mood_json(rj_mood);
DROP TYPE rj_mood, rj_pair;
DROP DOMAIN rj_small, rj_name;
