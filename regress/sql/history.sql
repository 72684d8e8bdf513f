-- realtime.history: the retained messages of some topics after a position, for replay and
-- resume. One walk serves many topics; the last row (kind 'end') says through which
-- sequence everything was considered. Sequences are shown relative to :base.
SELECT last_seq AS base FROM realtime.stats() \gset
SELECT realtime.send('{"n": 1}', 'e', 'room:a', false);
SELECT realtime.send('{"n": 2}', 'e', 'room:a', true);
SELECT realtime.send('{"n": 3}', 'e', 'room:b', false);
SELECT realtime.relay(42, 'room:a', 'typing', false, '{"n": 4}', NULL);
SELECT realtime.send_binary('\x0506', 'bin', 'room:a', false);
BEGIN;
SELECT realtime.send('{"n": 6}', 'e', 'room:a', false);
ROLLBACK;
CREATE TABLE history_items (id int PRIMARY KEY);
ALTER PUBLICATION supabase_realtime ADD TABLE history_items;
-- A captured row change on a table named like a topic is never history.
INSERT INTO history_items VALUES (1);
SELECT realtime.send('{"n": 7}', 'e', 'room:a', false);

-- Public room:a after the base: the database's messages, the relayed one (with its
-- origin) and the binary one, in queue order; not the private one, not room:b, not the
-- rolled-back one, not the change.
SELECT seq - :base AS seq, kind, topic, event, (payload::jsonb - 'id')::text AS payload, binary_payload, private, origin,
       committed_at IS NOT NULL AS has_time, id IS NOT NULL AS has_id
FROM realtime.history(:base, '{room:a}', '{false}');
-- Several topics in one walk; after a later position only what follows it.
SELECT seq - :base AS seq, kind, topic, private
FROM realtime.history(:base + 1, '{room:a,room:b,room:a}', '{true,false,false}');
-- Without relayed client broadcasts (Supabase's replay replays only the database's).
SELECT seq - :base AS seq, kind, event FROM realtime.history(:base, '{room:a}', '{false}', relayed => false);
-- The newest N per topic, oldest first.
SELECT seq - :base AS seq, kind, topic
FROM realtime.history(:base, '{room:a,room:b}', '{false,false}', newest => 2);
-- Since a time: nothing committed in the future.
SELECT seq - :base AS seq, kind FROM realtime.history(0, '{room:a}', '{false}', since => now() + interval '1 hour');
-- max_messages cuts the walk short; the 'end' row says where to go on from.
SELECT seq - :base AS seq, kind FROM realtime.history(:base, '{room:a}', '{false}', max_messages => 2);
-- A position this queue never reached (another epoch's) gets nothing, and 'end' says
-- where the queue is.
SELECT seq - :base AS seq, kind FROM realtime.history(:base + 1000, '{room:a}', '{false}');
-- No topics: only the 'end' row.
SELECT seq - :base AS seq, kind FROM realtime.history(:base, '{}', '{}');

-- A position deep in the ring: the walk skips the records before it in bounded steps of
-- 16,384 (never one long hold of the queue lock) and still returns exactly what follows.
SELECT last_seq AS deep FROM realtime.stats() \gset
SELECT count(realtime.send(jsonb_build_object('i', i), 'e', 'room:deep', false)) AS sent
FROM generate_series(1, 20000) i;
SELECT count(*) FILTER (WHERE kind = 'message') AS returned,
       min(seq) FILTER (WHERE kind = 'message') - :deep AS first,
       max(seq) FILTER (WHERE kind = 'message') - :deep AS last,
       min((payload::jsonb->>'i')::int) AS first_i,
       max(seq) FILTER (WHERE kind = 'end') - :deep AS through,
       count(*) FILTER (WHERE kind = 'gap') AS gaps
FROM realtime.history(:deep + 18000, '{room:deep}', '{false}');
SELECT count(*) > 0 AS drained FROM take();

-- Bad input: a clear error each.
SELECT * FROM realtime.history(-1, '{room:a}', '{false}');
SELECT * FROM realtime.history(0, '{room:a,room:b}', '{false}');
SELECT * FROM realtime.history(0, '{NULL}', '{false}');
SELECT * FROM realtime.history(0, '{room:a}', '{false}', newest => 0);
SELECT * FROM realtime.history(0, '{room:a}', '{false}', max_messages => 0);

-- It sees every topic, private ones included: only the sidecar's role may call it.
CREATE ROLE history_nobody;
GRANT USAGE ON SCHEMA realtime TO history_nobody;
SET ROLE history_nobody;
SELECT * FROM realtime.history(0, '{room:a}', '{true}');
RESET ROLE;
REVOKE USAGE ON SCHEMA realtime FROM history_nobody;
DROP ROLE history_nobody;

-- realtime.stats() says how far back a resume reaches.
SELECT oldest_seq <= :base + 1 AS oldest_retained, oldest_committed_at <= now() AS committed_in_past
FROM realtime.stats();
-- A resuming channel's Postgres Changes: the captured changes of the tables it names
-- (`changes`), decoded as the drain decodes them, in queue order with its topic's
-- messages; another table's changes are not returned. (They are checked by the sidecar, as
-- the channel's role stands at the rejoin: nothing here decides who may read them.)
CREATE TABLE history_other (id int PRIMARY KEY);
ALTER PUBLICATION supabase_realtime ADD TABLE history_other;
SELECT last_seq AS cbase FROM realtime.stats() \gset
INSERT INTO history_items VALUES (2);
INSERT INTO history_other VALUES (1);
SELECT realtime.send('{"n": 8}', 'e', 'room:a', false);
UPDATE history_items SET id = 3 WHERE id = 2;
DELETE FROM history_items WHERE id = 3;
SELECT seq - :cbase AS seq, kind, topic, event,
       payload->>'type' AS type, payload->>'table' AS "table", payload->'record' AS record,
       payload->'old_record' AS old_record, payload->>'commit_timestamp' IS NOT NULL AS has_time
FROM realtime.history(:cbase, '{room:a}', '{false}', changes => ARRAY['history_items'::regclass::oid]);
-- Without `changes`, none (the existing callers are unchanged); with only tables, only changes.
SELECT seq - :cbase AS seq, kind FROM realtime.history(:cbase, '{room:a}', '{false}');
SELECT seq - :cbase AS seq, kind, topic
FROM realtime.history(:cbase, '{}', '{}', changes => ARRAY['history_items'::regclass::oid, 'history_other'::regclass::oid]);
-- `newest` counts per table, apart from the topics.
SELECT seq - :cbase AS seq, kind, topic
FROM realtime.history(:cbase, '{room:a}', '{false}', newest => 1,
                      changes => ARRAY['history_items'::regclass::oid, 'history_other'::regclass::oid]);
-- Decoded at the call, as the drain decodes: a change whose table was altered since (a
-- column dropped) cannot be, and says so in its errors (the sidecar tells the channel it
-- was lost, as when a drain meets it).
ALTER TABLE history_other ADD COLUMN note text;
SELECT last_seq AS cbase2 FROM realtime.stats() \gset
INSERT INTO history_other VALUES (2, 'secret');
ALTER TABLE history_other DROP COLUMN note;
SELECT seq - :cbase2 AS seq, payload->'record' AS record, payload->'errors' AS errors
FROM realtime.history(:cbase2, '{}', '{}', changes => ARRAY['history_other'::regclass::oid]) WHERE kind = 'change';
SELECT * FROM realtime.history(0, '{}', '{}', changes => ARRAY[NULL::oid]);
ALTER PUBLICATION supabase_realtime DROP TABLE history_other;
DROP TABLE history_other;
ALTER PUBLICATION supabase_realtime DROP TABLE history_items;
DROP TABLE history_items;
SELECT count(*) > 0 AS drained FROM take();
