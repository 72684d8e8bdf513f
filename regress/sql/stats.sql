-- realtime.stats() counts what was enqueued, and realtime.consumers() how far behind each is.
CREATE TEMP TABLE before AS SELECT * FROM realtime.stats();
SELECT realtime.create_consumer('watcher') >= 0 AS created;
BEGIN;
SELECT realtime.send('{"a": 1}', 'ev', 's', false);
SELECT realtime.send('{"a": 2}', 'ev', 's', false);
COMMIT;
SELECT realtime.send('{"a": 3}', 'ev', 's', false);
BEGIN;
SELECT realtime.send('{"a": 4}', 'ev', 's', false);
ROLLBACK;
-- oversize_rejections counts the ERRORs of realtime.strict_send (a drop is counted by reason,
-- send_dropped).
SET realtime.max_message_size = '1kB';
SET realtime.strict_send = on;
SELECT realtime.send(jsonb_build_object('s', repeat('x', 2000)), 'ev', 's', false);
RESET realtime.strict_send;
RESET realtime.max_message_size;
SELECT s.messages_enqueued - b.messages_enqueued AS messages,
       s.transactions - b.transactions AS transactions,
       s.bytes_enqueued - b.bytes_enqueued > 3 * 48 AS counted_bytes,
       s.last_seq - b.last_seq AS seqs,
       s.oversize_rejections - b.oversize_rejections AS oversize,
       s.capacity_bytes, s.used_bytes BETWEEN 1 AND s.capacity_bytes AS used_within_capacity,
       s.epoch = b.epoch AS same_epoch, s.epoch <= now() AS epoch_in_past,
       s.consumers - b.consumers AS new_consumers
FROM realtime.stats() s, before b;
SELECT name, lag FROM realtime.consumers() WHERE name = 'watcher';
SELECT realtime.drop_consumer('watcher');
SELECT count(*) FROM take();
