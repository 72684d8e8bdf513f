-- Postgres Changes capture: the tables of publication supabase_realtime, and only they,
-- put their committed row changes into the queue, in commit order, decoded when drained
-- into Supabase's `data` (schema, table, commit_timestamp, type, columns, record,
-- old_record, errors).

-- Test helper: the change rows drained since the last call, the commit timestamp checked
-- against the row's committed_at instead of shown.
CREATE FUNCTION take_changes() RETURNS TABLE(n bigint, kind text, topic text, event text,
                                              data jsonb, timestamp_ok boolean)
LANGUAGE sql AS $$
    SELECT n, kind, topic, event, payload - 'commit_timestamp',
           payload->>'commit_timestamp' IS NULL OR payload->>'commit_timestamp' ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$'
    FROM take()
$$;

CREATE TABLE items (id int PRIMARY KEY, name text, price numeric, tags text[], meta jsonb,
                    at timestamptz, big bigint, done boolean);

-- Not published: nothing is captured, and the table has no trigger.
INSERT INTO items VALUES (1, 'a', 1.5, '{x}', '{"k": 1}', '2026-01-02 03:04:05.678+00', 1, true);
SELECT * FROM take_changes();
SELECT count(*) AS capture_triggers FROM pg_trigger WHERE tgname = 'realtime_capture';

-- Published: the extension's event trigger adds the capture trigger at once.
ALTER PUBLICATION supabase_realtime ADD TABLE items;
SELECT tgrelid::regclass AS captured FROM pg_trigger WHERE tgname = 'realtime_capture';
INSERT INTO items VALUES (2, 'b', 2.25, '{y,z}', '{"k": [1, 2]}', '2026-01-02 03:04:05.678+00', 9007199254740993, false);
UPDATE items SET name = 'b2', price = 3 WHERE id = 2;
DELETE FROM items WHERE id = 2;
SELECT * FROM take_changes();

-- Every value is rendered as Supabase renders it (to_jsonb of the row).
INSERT INTO items VALUES (3, 'c', 0.1, '{}', 'null', '2026-06-30 23:59:59.999999-07', -5, NULL);
SELECT (d.payload::jsonb->'record') = to_jsonb(i) AS record_equals_to_jsonb,
       d.payload::jsonb->'columns' AS columns,
       d.payload::jsonb->>'commit_timestamp' = to_char(d.committed_at AT TIME ZONE 'UTC',
           'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS commit_timestamp_is_the_commit
FROM realtime.drain('test', NULL, 10, 0) d, items i WHERE i.id = 3;
SELECT count(*) AS confirmed FROM take();

-- Only committed changes: a rolled-back transaction and a rolled-back savepoint leave
-- nothing; what the transaction kept arrives in call order with its broadcasts.
BEGIN;
INSERT INTO items (id, name) VALUES (10, 'rolled back');
ROLLBACK;
BEGIN;
INSERT INTO items (id, name) VALUES (11, 'kept');
SAVEPOINT s;
INSERT INTO items (id, name) VALUES (12, 'undone');
ROLLBACK TO SAVEPOINT s;
SELECT realtime.send('{"between": true}', 'ev', 'room:1', false);
UPDATE items SET name = 'kept, then updated' WHERE id = 11;
COMMIT;
SELECT n, kind, topic, event, data->'record'->>'id' AS id, data->'record'->>'name' AS name
FROM take_changes();

-- old_record follows REPLICA IDENTITY as it was when the change was made, as in
-- Supabase: the primary key by default, the whole row with FULL. (With NOTHING, Postgres
-- itself refuses to update or delete rows of a published table.)
UPDATE items SET name = 'x' WHERE id = 11;
ALTER TABLE items REPLICA IDENTITY FULL;
UPDATE items SET name = 'y' WHERE id = 11;
ALTER TABLE items REPLICA IDENTITY DEFAULT;
DELETE FROM items WHERE id = 11;
ALTER TABLE items REPLICA IDENTITY NOTHING;
DELETE FROM items WHERE id = 11;
ALTER TABLE items REPLICA IDENTITY DEFAULT;
SELECT n, event, data->'old_record' AS old_record FROM take_changes();

-- A table without a primary key: Supabase's error, and the row still described.
CREATE TABLE no_pk (a int, b text);
ALTER PUBLICATION supabase_realtime ADD TABLE no_pk;
INSERT INTO no_pk VALUES (1, 'one');
SELECT n, event, data->'record' AS record, data->'errors' AS errors FROM take_changes();

-- A value stored out of line is copied at capture: it is delivered even when the row and
-- its TOAST data are gone by the time the change is drained.
ALTER TABLE items ALTER COLUMN name SET STORAGE EXTERNAL;
INSERT INTO items (id, name) VALUES (20, repeat('long ', 2000));
DELETE FROM items WHERE id = 20;
VACUUM items;
SELECT n, event, length(data->'record'->>'name') AS name_length,
       data->'old_record' AS old_record
FROM take_changes();

-- A change whose table was altered in a way that changes what its stored row means, or
-- dropped, before it was drained is reported, never misread.
INSERT INTO items (id, big) VALUES (30, 30);
ALTER TABLE items ALTER COLUMN big TYPE text;
INSERT INTO no_pk VALUES (2, 'two');
DROP TABLE no_pk;
SELECT n, kind, topic, event, data FROM take_changes();
-- A renamed column or an added one still reads the rows captured before it.
INSERT INTO items (id, name) VALUES (31, 'before rename');
ALTER TABLE items RENAME COLUMN name TO title;
SELECT n, event, data->'record'->>'title' AS title FROM take_changes();
ALTER TABLE items RENAME COLUMN title TO name;

-- A consumer may have only some tables' changes decoded (those its clients listen to): the
-- others come with a NULL payload, in their place in the order.
CREATE TABLE other_items (id int PRIMARY KEY);
ALTER PUBLICATION supabase_realtime ADD TABLE other_items;
INSERT INTO other_items VALUES (1);
INSERT INTO items (id) VALUES (50);
INSERT INTO other_items VALUES (2);
SELECT d.seq - c.confirmed_seq AS n, d.kind, d.topic, d.event, d.payload IS NULL AS undecoded,
       d.payload::jsonb->'record' AS record
FROM realtime.consumers() c, realtime.drain('test', NULL, 100, 0, 0, ARRAY['items'::regclass::oid]) d
WHERE c.name = 'test';
DO $$ BEGIN PERFORM realtime.confirm('test', c.last_read_seq) FROM realtime.consumers() c WHERE c.name = 'test'; END $$;
ALTER PUBLICATION supabase_realtime DROP TABLE other_items;
DROP TABLE other_items;

-- PREPARE TRANSACTION after a captured change is refused, as after a broadcast.
BEGIN;
INSERT INTO items (id) VALUES (40);
PREPARE TRANSACTION 'captured';
SELECT count(*) AS prepared FROM pg_prepared_xacts;

-- Taken out of the publication: the trigger goes, nothing more is captured.
ALTER PUBLICATION supabase_realtime DROP TABLE items;
SELECT count(*) AS capture_triggers FROM pg_trigger WHERE tgname = 'realtime_capture';
INSERT INTO items (id) VALUES (41);
SELECT * FROM take_changes();

-- The trigger function refuses to be used any other way.
SELECT realtime.capture();
CREATE TABLE misuse (id int PRIMARY KEY);
CREATE TRIGGER by_hand BEFORE INSERT ON misuse FOR EACH ROW EXECUTE FUNCTION realtime.capture();
INSERT INTO misuse VALUES (1);
DROP TABLE misuse;
-- Only the extension's owner syncs the triggers.
CREATE ROLE capture_outsider NOLOGIN;
GRANT USAGE ON SCHEMA realtime TO capture_outsider;
SET ROLE capture_outsider;
SELECT realtime.sync_capture();
RESET ROLE;
REVOKE USAGE ON SCHEMA realtime FROM capture_outsider;
DROP ROLE capture_outsider;
DROP TABLE items;
