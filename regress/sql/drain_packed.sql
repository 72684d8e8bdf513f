-- The previous file's session may still be exiting with consumer "test" held.
SELECT wait_until_released('test') AS released;
-- realtime.drain_packed: the same drain as realtime.drain, its batch returned as one bytea
-- (layout in extension/src/packed.rs) that the sidecar reads in place; realtime.drain_unpack
-- turns it back into realtime.drain's rows. The same batch read both ways carries the same
-- rows, for every kind a drain returns.

-- Test helpers: a batch after `after` read both ways (each row as text, json having no
-- equality), and whether they agree.
CREATE FUNCTION as_rows(consumer text, after bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT array_agg(d::text ORDER BY o) FROM realtime.drain(consumer, after, 100000, 0) WITH ORDINALITY d(seq, kind, topic, event, payload, binary_payload, private, committed_at, id, origin, lost_first, lost_last, o) $$;
CREATE FUNCTION as_packed(consumer text, after bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT array_agg(d::text ORDER BY o) FROM realtime.drain_unpack(realtime.drain_packed(consumer, after, 100000, 0)) WITH ORDINALITY d(seq, kind, topic, event, payload, binary_payload, private, committed_at, id, origin, lost_first, lost_last, o) $$;

-- Every kind in one batch: a gap (the queue overflowed before the consumer read), messages
-- JSON and binary, private and public, a relayed client broadcast (origin, id), a presence
-- diff, a row change decoded and one not decoded.
SELECT realtime.create_consumer('packed') AS base \gset
DO $$
BEGIN
    FOR i IN 1..1200 LOOP
        PERFORM realtime.send(jsonb_build_object('i', i, 'pad', repeat('x', 4000)), 'fill', 'filler', false);
        COMMIT;
    END LOOP;
END
$$;
SELECT realtime.send('{"text": "héllo \"quoted\"\n"}', 'chat', 'room:1');
SELECT realtime.send('{"n": 2}', 'chat', 'room:public', false);
SELECT realtime.send_binary('\x00ff80', 'blob', 'room:bin');
SELECT realtime.relay(7, 'room:1', 'typing', false, '{"a": 1}', NULL, '0b0c0d0e-0000-4000-8000-000000000001');
SELECT realtime.queue_presence('room:p', true, '{"joins": {}, "leaves": {}}');
CREATE TABLE packed_items (id int PRIMARY KEY, name text);
CREATE TABLE packed_other (id int PRIMARY KEY);
ALTER PUBLICATION supabase_realtime ADD TABLE packed_items, packed_other;
INSERT INTO packed_items VALUES (1, 'one');
INSERT INTO packed_other VALUES (1);

SELECT kind, count(*) FROM realtime.drain('packed', :base, 100000, 0) GROUP BY kind ORDER BY kind;
SELECT as_rows('packed', :base) = as_packed('packed', :base) AS same_rows,
       cardinality(as_packed('packed', :base)) AS rows;
-- Compared row by row where they are readable: the tail of the batch, both ways.
SELECT r.kind, r.topic, r.event, r.payload::jsonb - 'id' - 'commit_timestamp' AS payload, r.binary_payload, r.private,
       r.id IS NOT NULL AS has_id, r.origin, r.committed_at = p.committed_at AS same_time,
       r.payload::text IS NOT DISTINCT FROM p.payload::text AS same_payload
FROM realtime.drain('packed', :base, 100000, 0) WITH ORDINALITY r
JOIN realtime.drain_unpack(realtime.drain_packed('packed', :base, 100000, 0)) WITH ORDINALITY p USING (ordinality)
WHERE r.kind NOT IN ('gap') AND r.topic <> 'filler' ORDER BY ordinality;
-- A change is decoded only if its table is asked for (the decode argument), both ways.
SELECT as_rows_decoded = as_packed_decoded AS same_rows_decoding_one_table,
       (SELECT count(*) FROM unnest(as_packed_decoded) r WHERE r LIKE '%,change,%' AND r LIKE '%"type"%') AS changes_decoded
FROM (SELECT
    (SELECT array_agg(d::text ORDER BY o) FROM realtime.drain('packed', :base, 100000, 0, 0, ARRAY['packed_items'::regclass::oid]) WITH ORDINALITY d(seq, kind, topic, event, payload, binary_payload, private, committed_at, id, origin, lost_first, lost_last, o)) AS as_rows_decoded,
    (SELECT array_agg(d::text ORDER BY o) FROM realtime.drain_unpack(realtime.drain_packed('packed', :base, 100000, 0, 0, ARRAY['packed_items'::regclass::oid])) WITH ORDINALITY d(seq, kind, topic, event, payload, binary_payload, private, committed_at, id, origin, lost_first, lost_last, o)) AS as_packed_decoded) s;

-- Passing after_seq confirms it, as realtime.drain does; the next call reads after it.
SELECT realtime.drain_packed('packed', (SELECT last_seq FROM realtime.stats()), 10, 0) = '\x5254503100000000'::bytea AS empty_batch;
SELECT confirmed_seq = (SELECT last_seq FROM realtime.stats()) AS confirmed FROM realtime.consumers() WHERE name = 'packed';
SELECT realtime.drop_consumer('packed');

-- A consumer that listens to some topics: the messages after its last row were skipped, and
-- a last 'filtered' row says how far it read, both ways.
SELECT realtime.create_consumer('packed_listens') AS lbase \gset
SELECT realtime.listen('packed_listens', ARRAY['a']) AS listening;
SELECT realtime.send('{"x": 1}', 'ev', 'a', false);
SELECT realtime.send('{"x": 2}', 'ev', 'b', false);
SELECT kind, seq - :lbase AS n FROM realtime.drain_unpack(realtime.drain_packed('packed_listens', :lbase, 10, 0));
SELECT as_rows('packed_listens', :lbase) = as_packed('packed_listens', :lbase) AS same_rows;
SELECT realtime.drop_consumer('packed_listens');

-- The layout's head: "RTP1", then the number of entries (little-endian).
SELECT realtime.create_consumer('packed_head') AS hbase \gset
SELECT realtime.send('{}', 'ev', 'h', false) FROM generate_series(1, 3);
SELECT substring(v FROM 1 FOR 8) AS head FROM realtime.drain_packed('packed_head', :hbase, 10, 0) v;
SELECT realtime.drop_consumer('packed_head');

-- The drain's argument checks are the same.
SELECT realtime.drain_packed('nobody');
SELECT realtime.drain_packed('test', NULL, 0);
SELECT realtime.drain_packed('test', NULL, 10, -1);
SELECT realtime.drain_packed('test', -1);

-- A value that is not a drain's is refused with what is wrong with it.
SELECT * FROM realtime.drain_unpack('\x');
SELECT * FROM realtime.drain_unpack('\x5254503200000000');
SELECT * FROM realtime.drain_unpack('\x525450310100000001');
SELECT * FROM realtime.drain_unpack('\x52545031010000000900000000000000000000');
SELECT * FROM realtime.drain_unpack('\x525450310000000000');
SELECT * FROM realtime.drain_unpack(NULL);

-- Only roles granted them may drain or unpack (the sidecar's): unpacking reads nothing of the
-- queue, but hands back json values it never validated (drain_unpack_was_public.sql).
SELECT has_function_privilege('public', 'realtime.drain_packed(text, bigint, integer, integer, integer, oid[])', 'EXECUTE') AS public_drains,
       has_function_privilege('public', 'realtime.drain_unpack(bytea)', 'EXECUTE') AS public_unpacks;
