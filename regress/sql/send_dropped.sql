-- A message that cannot be sent does not fail the caller's transaction (extension/src/
-- dropped.rs): Supabase's WARNING, a count in realtime.stats() by reason, and a 'dropped'
-- record in its place (topic, event, reason, size) for the topic's subscribers.
CREATE TEMP TABLE before AS SELECT * FROM realtime.stats();

-- A trigger whose message is too large leaves the app's INSERT committed, and the
-- subscribers told.
CREATE TABLE posts (id int PRIMARY KEY, body text);
CREATE FUNCTION posts_broadcast() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM realtime.send(jsonb_build_object('body', NEW.body), 'new_post', 'posts:' || NEW.id, false);
    RETURN NEW;
END
$$;
CREATE TRIGGER posts_broadcast AFTER INSERT ON posts FOR EACH ROW EXECUTE FUNCTION posts_broadcast();
SET realtime.max_message_size = '1kB';
INSERT INTO posts VALUES (1, repeat('x', 2000)), (2, 'short');
SELECT id, length(body) FROM posts ORDER BY id;
SELECT * FROM take();

-- Each reason counted; a message without a usable topic is counted and warned only.
SELECT realtime.send('{}', 'ev', NULL, false);
SELECT realtime.send('{}', 'ev', repeat('t', 300), false);
SELECT realtime.send('{}', '', 'room:1', false);
SELECT realtime.send('[]', 'ev', 'room:1', false);
SELECT * FROM take();
SELECT s.dropped_invalid - b.dropped_invalid AS invalid,
       s.dropped_too_large - b.dropped_too_large AS too_large,
       s.dropped_queue_full - b.dropped_queue_full AS queue_full,
       s.oversize_rejections - b.oversize_rejections AS errors
FROM realtime.stats() s, before b;

-- A dropped record keeps its place among the transaction's messages, and a rolled-back
-- subtransaction takes its dropped records with it.
BEGIN;
SELECT realtime.send('{"n": 1}', 'ev', 'room:1', false);
SAVEPOINT s;
SELECT realtime.send(jsonb_build_object('s', repeat('x', 2000)), 'gone', 'room:1', false);
ROLLBACK TO s;
SELECT realtime.send(jsonb_build_object('s', repeat('x', 2000)), 'kept', 'room:1', false);
SELECT realtime.send('{"n": 3}', 'ev', 'room:1', false);
COMMIT;
SELECT n, kind, event, payload FROM take();
RESET realtime.max_message_size;

-- A transaction's messages are dropped together or not at all (the queue is 4MB here):
-- those sent before the one that overflows it and those after go too.
CREATE TEMP TABLE mid AS SELECT * FROM realtime.stats();
BEGIN;
SELECT realtime.send('{"first": true}', 'small', 'room:2', false);
SELECT realtime.send_binary(decode(repeat('ab', 1000000), 'hex'), 'big', 'room:2', false) FROM generate_series(1, 5);
SELECT realtime.send('{"last": true}', 'small', 'room:2', false);
COMMIT;
SELECT n, kind, event, payload FROM take();
SELECT s.dropped_queue_full - m.dropped_queue_full AS queue_full FROM realtime.stats() s, mid m;

-- A captured change too large to send is dropped too: the app's write commits, and the
-- change's subscribers get its table's error in its place.
CREATE TABLE big_rows (id int PRIMARY KEY, body text);
ALTER PUBLICATION supabase_realtime ADD TABLE big_rows;
SET realtime.max_message_size = '1kB';
INSERT INTO big_rows SELECT 1, string_agg(md5(i::text), '') FROM generate_series(1, 100) i;
RESET realtime.max_message_size;
SELECT count(*) AS committed FROM big_rows;
SELECT d.kind, d.topic, d.event, d.payload::jsonb->'errors' AS errors
FROM realtime.drain('test', NULL, 10, 0) d;
SELECT count(*) AS confirmed FROM take();
ALTER PUBLICATION supabase_realtime DROP TABLE big_rows;

-- realtime.strict_send restores the ERRORs (any role may set it for its own transactions).
SET realtime.strict_send = on;
SELECT realtime.send(NULL, 'ev', 'room:1');
SELECT realtime.send('{}', 'ev', '');
SELECT realtime.send('[]', 'ev', 'room:1');
SET realtime.max_message_size = '1kB';
INSERT INTO posts VALUES (3, repeat('x', 2000));
RESET realtime.max_message_size;
BEGIN;
SELECT realtime.send_binary(decode(repeat('ab', 1000000), 'hex'), 'big', 'room:2', false) FROM generate_series(1, 5);
ROLLBACK;
SELECT count(*) AS posts FROM posts;
SELECT * FROM take();
CREATE ROLE plain_sender NOLOGIN;
SET ROLE plain_sender;
SET realtime.strict_send = off;
SHOW realtime.strict_send;
RESET ROLE;
DROP ROLE plain_sender;
RESET realtime.strict_send;

-- The sidecar's producers always raise: it checked the client's input at its edge and answers
-- the client with the error.
SET realtime.max_message_size = '1kB';
SELECT realtime.relay(7, 'room:1', 'ev', false, json_build_object('s', repeat('x', 2000)), NULL);
RESET realtime.max_message_size;

DROP TABLE posts, big_rows;
DROP FUNCTION posts_broadcast();
