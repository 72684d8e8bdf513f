-- Every consumer receives every message.
SELECT realtime.create_consumer('a') AS base_a \gset
SELECT realtime.create_consumer('b') AS base_b \gset
SELECT :base_a = :base_b AS same_start;
SELECT realtime.create_consumer('a') = :base_a AS create_is_idempotent;
SELECT realtime.send(jsonb_build_object('i', 1), 'ev', 'c', false);
SELECT realtime.send(jsonb_build_object('i', 2), 'ev', 'c', false);
SELECT seq - :base_a AS n, payload::jsonb - 'id' AS payload FROM realtime.drain('a', NULL, 10, 0);
SELECT seq - :base_b AS n, payload::jsonb - 'id' AS payload FROM realtime.drain('b', NULL, 10, 0);

-- A consumer resumes from its confirmed position after reconnecting: what it confirmed is
-- not delivered again, what it did not confirm is, and nothing sent meanwhile is lost.
SELECT realtime.confirm('a', :base_a + 1);
\c
SELECT realtime.send(jsonb_build_object('i', 3), 'ev', 'c', false);
SELECT wait_until_released('a');
SELECT realtime.create_consumer('a') - :base_a AS resumes_after;
SELECT seq - :base_a AS n, payload::jsonb - 'id' AS payload FROM realtime.drain('a', NULL, 10, 0);
SELECT name, confirmed_seq - :base_a AS confirmed, lag, gaps, lost_messages, delivered, active_pid = pg_backend_pid() AS mine
FROM realtime.consumers() WHERE name IN ('a', 'b') ORDER BY name;

-- A new consumer starts after the last message.
SELECT realtime.create_consumer('late') - :base_a AS late_starts_at;
SELECT count(*) FROM realtime.drain('late', NULL, 10, 0);

-- realtime.max_consumers slots (8 by default): the ninth is refused.
SELECT count(realtime.create_consumer('extra' || i)) FROM generate_series(1, 4) i;
SELECT count(*) AS in_use FROM realtime.consumers();
SELECT realtime.create_consumer('one_too_many');
SELECT realtime.drop_consumer('extra' || i) FROM generate_series(1, 4) i;
SELECT realtime.drop_consumer('a'), realtime.drop_consumer('b'), realtime.drop_consumer('late');
SELECT realtime.drop_consumer('a') AS dropped_twice;
SELECT name FROM realtime.consumers();
SELECT count(*) FROM take();
