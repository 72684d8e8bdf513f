-- A consumer that listens gets only its topics' messages and its tables' changes
-- (interest.rs); what it skips is still read through, and a last 'filtered' row says how far.
SELECT realtime.create_consumer('l') AS base \gset
CREATE FUNCTION take_l(timeout_ms int DEFAULT 0)
RETURNS TABLE(n bigint, kind text, topic text, event text, payload jsonb) LANGUAGE plpgsql AS $$
DECLARE
    base bigint;
BEGIN
    SELECT c.confirmed_seq INTO base FROM realtime.consumers() c WHERE c.name = 'l';
    RETURN QUERY
        SELECT d.seq - base, d.kind, d.topic, d.event, d.payload::jsonb - 'id'
        FROM realtime.drain('l', NULL, 100, timeout_ms) d;
    -- Confirmed as the sidecar confirms: the last row's sequence, 'filtered' included.
    PERFORM realtime.confirm('l', c.last_read_seq) FROM realtime.consumers() c WHERE c.name = 'l';
END
$$;
CREATE FUNCTION send_to(VARIADIC topics text[]) RETURNS void LANGUAGE sql AS $$
    SELECT realtime.send(jsonb_build_object('to', t), 'ev', t, false) FROM unnest(topics) t $$;

-- A new consumer listens to nothing in particular: it receives everything.
SELECT listening FROM realtime.consumers() WHERE name = 'l';
SELECT send_to('a', 'b');
SELECT n, kind, topic FROM take_l();

-- Listening to 'a': 'b' is skipped; the last row ('filtered') carries the position read
-- through, past the skipped 'b'.
SELECT realtime.listen('l', ARRAY['a']) AS listening;
SELECT listening FROM realtime.consumers() WHERE name = 'l';
SELECT send_to('a', 'b', 'a', 'b');
SELECT n, kind, topic, payload FROM take_l();
-- Confirmed through the 'filtered' row: nothing comes twice.
SELECT count(*) AS again FROM take_l();

-- Only skipped messages: one 'filtered' row, so the position still moves on.
SELECT send_to('b', 'c');
SELECT n, kind, topic FROM take_l();

-- Skipped messages do not end the wait, and a commit of a topic the consumer does not listen
-- to does not even wake it (src/wake.rs): a drain (in a second session) waiting for 'a' sleeps
-- through 'b', unread, and returns when 'a' comes, having read 'b' and skipped it.
SELECT dblink_connect('lreader', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database()));
SELECT realtime.create_consumer('lw') >= 0 AS created;
SELECT realtime.listen('lw', ARRAY['a']) AS listening;
SELECT dblink_send_query('lreader', $$ SELECT kind, topic FROM realtime.drain('lw', NULL, 10, 20000) $$);
SELECT wait_until_draining('lw');
SELECT send_to('b');
SELECT last_seq AS b_seq FROM realtime.stats() \gset
SELECT last_read_seq < :b_seq AS b_unread FROM realtime.consumers() WHERE name = 'lw';
SELECT dblink_is_busy('lreader') AS still_waiting;
SELECT send_to('a');
SELECT * FROM dblink_get_result('lreader') AS t(kind text, topic text);
SELECT * FROM dblink_get_result('lreader') AS t(kind text, topic text);
SELECT dblink_disconnect('lreader');
SELECT wait_until_released('lw');
SELECT realtime.drop_consumer('lw');
SELECT count(*) FROM take_l();

-- Presence diffs follow their topic like broadcasts.
SELECT realtime.queue_presence('b', false, '{"joins":{},"leaves":{}}');
SELECT realtime.queue_presence('a', false, '{"joins":{},"leaves":{}}');
SELECT n, kind, topic FROM take_l();

-- Each listen is undone by one unlisten: listened twice, 'a' stays after one unlisten.
SELECT realtime.listen('l', ARRAY['a', 'x']) AS listening;
SELECT realtime.unlisten('l', ARRAY['a']) AS listening;
SELECT send_to('a');
SELECT n, kind, topic FROM take_l();
SELECT realtime.unlisten('l', ARRAY['a', 'a', 'never-listened']) AS listening;
SELECT send_to('a', 'x');
SELECT n, kind, topic FROM take_l();

-- Topics whose keys share a bucket of the interest table's summary (interest_table.rs:
-- room:31 and room:180 do): the bucket stays marked while either is listened to, and an
-- unlisten of one leaves the other wanted and the one gone skipped.
SELECT realtime.listen('l', ARRAY['room:31', 'room:180']) AS listening;
SELECT realtime.unlisten('l', ARRAY['room:31']) AS listening;
SELECT send_to('room:31', 'room:180');
SELECT n, kind, topic FROM take_l();
SELECT realtime.unlisten('l', ARRAY['room:180']) AS listening;
SELECT send_to('room:31', 'room:180');
SELECT n, kind, topic FROM take_l();

-- Listening to nothing still filters: everything is skipped.
SELECT realtime.unlisten('l', ARRAY['x']) AS listening;
SELECT listening FROM realtime.consumers() WHERE name = 'l';
SELECT send_to('a', 'x');
SELECT n, kind, topic FROM take_l();

-- Postgres Changes: a table's changes come when the table is listened to, by name (decoded,
-- with no decode list), other tables' are skipped; all_tables takes every table's.
CREATE TABLE watched (id int PRIMARY KEY, note text);
CREATE TABLE unwatched (id int PRIMARY KEY);
ALTER PUBLICATION supabase_realtime ADD TABLE watched, unwatched;
SELECT realtime.listen('l', tables => ARRAY['watched']) AS listening;
INSERT INTO unwatched VALUES (1);
INSERT INTO watched VALUES (1, 'one');
INSERT INTO unwatched VALUES (2);
SELECT n, kind, topic, event, payload->'record' AS record FROM take_l();
SELECT realtime.listen('l', all_tables => true) AS listening;
INSERT INTO unwatched VALUES (3);
SELECT n, kind, topic, event, payload->'record' AS record FROM take_l();
SELECT realtime.unlisten('l', tables => ARRAY['watched'], all_tables => true) AS listening;
INSERT INTO watched VALUES (2, 'two');
SELECT n, kind, topic FROM take_l();
ALTER PUBLICATION supabase_realtime DROP TABLE watched, unwatched;
DROP TABLE watched, unwatched;

-- reset replaces what was listened to in one step.
SELECT realtime.listen('l', ARRAY['a', 'b']) AS listening;
SELECT realtime.listen('l', ARRAY['c'], reset => true) AS listening;
SELECT send_to('a', 'b', 'c');
SELECT n, kind, topic FROM take_l();

-- realtime.max_topics_per_consumer (32 in this suite): a listen that would pass it is
-- refused whole, and what was listened to before stays.
SELECT realtime.listen('l', array_agg('many-' || i)) AS listening FROM generate_series(1, 31) i;
SELECT realtime.listen('l', ARRAY['many-32']);
SELECT realtime.listen('l', array_agg('many-' || i), reset => true) FROM generate_series(1, 33) i;
SELECT listening FROM realtime.consumers() WHERE name = 'l';
-- Listening again to what it listens to needs no room.
SELECT realtime.listen('l', ARRAY['many-1', 'c']) AS listening;
SELECT send_to('c', 'many-31', 'many-32');
SELECT n, kind, topic FROM take_l();
SELECT realtime.listen('l', ARRAY['c'], reset => true) AS listening;

-- Topics that come and go leave removed entries behind; the table is rebuilt before they
-- fill it, and what stays listened to keeps arriving (2,000 listens on a 64-entry table).
DO $$
BEGIN
    FOR i IN 1..2000 LOOP
        PERFORM realtime.listen('l', ARRAY['passing-' || i]);
        PERFORM realtime.unlisten('l', ARRAY['passing-' || i]);
    END LOOP;
END
$$;
SELECT listening FROM realtime.consumers() WHERE name = 'l';
SELECT send_to('c', 'passing-7', 'many-3');
SELECT n, kind, topic FROM take_l();

-- listen_all: everything again.
SELECT realtime.listen_all('l');
SELECT listening FROM realtime.consumers() WHERE name = 'l';
SELECT send_to('a', 'z');
SELECT n, kind, topic FROM take_l();

-- A key is wanted from when it was first listened to: a message of 'late' committed before
-- 'late' was listened to and read only after (the drain slept through its commit) is
-- skipped; one committed after is returned. Listened to again in a reset, a key keeps when
-- it was first listened to, so nothing of it is skipped.
SELECT realtime.listen('l', ARRAY['early'], reset => true) AS listening;
SELECT send_to('late', 'early');
SELECT realtime.listen('l', ARRAY['late']) AS listening;
SELECT send_to('late');
SELECT n, kind, topic, payload FROM take_l();
SELECT send_to('early', 'late');
SELECT realtime.listen('l', ARRAY['early', 'late'], reset => true) AS listening;
SELECT n, kind, topic, payload FROM take_l();

-- A dropped and re-created consumer forgets what its predecessor listened to.
SELECT realtime.listen('l', ARRAY['a']) AS listening;
SELECT realtime.drop_consumer('l');
SELECT realtime.create_consumer('l') >= 0 AS created;
SELECT listening FROM realtime.consumers() WHERE name = 'l';

-- Bad calls.
SELECT realtime.listen('nobody', ARRAY['a']);
SELECT realtime.unlisten('nobody', ARRAY['a']);
SELECT realtime.listen_all('nobody');
SELECT realtime.listen('l', ARRAY['a', NULL]);
SELECT realtime.listen('l', tables => ARRAY[NULL]::text[]);
SELECT realtime.listen('l', NULL) IS NULL AS strict;
SELECT listening FROM realtime.consumers() WHERE name = 'l';

SELECT realtime.drop_consumer('l');
DROP FUNCTION take_l(int), send_to(text[]);
-- Consumer "test" (create_extension.sql's helper) saw everything sent here: take it, so the
-- next file starts from an empty queue.
SELECT count(*) AS sent_here FROM take();
