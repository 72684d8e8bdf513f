-- The previous file's session may still be exiting with consumer "test" held.
SELECT wait_until_released('test') AS released;
-- Draining an empty queue waits for about the timeout, then returns nothing.
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS rows FROM realtime.drain('test', NULL, 10, 300);
SELECT extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) BETWEEN 0.25 AND 5 AS waited_about_the_timeout;

-- The wait honours statement_timeout (and so query cancel).
SET statement_timeout = '200ms';
SELECT count(*) FROM realtime.drain('test', NULL, 10, 60000);
RESET statement_timeout;

-- Batches: max_messages caps a call. Without after_seq a drain reads after the confirmed
-- position, so what was not confirmed comes again (a consumer that dies mid-batch loses
-- nothing); passing after_seq confirms it and reads after it.
SELECT realtime.create_consumer('batch') AS base \gset
SELECT count(*) FROM (SELECT realtime.send(jsonb_build_object('i', i), 'ev', 'b', false) FROM generate_series(1, 25) i) s;
SELECT array_agg(seq - :base) FROM realtime.drain('batch', NULL, 10, 0);
SELECT array_agg(seq - :base) FROM realtime.drain('batch', :base + 10, 10, 0);
SELECT array_agg(seq - :base) FROM realtime.drain('batch', :base + 20, 10, 0);
SELECT confirmed_seq - :base AS confirmed FROM realtime.consumers() WHERE name = 'batch';
SELECT realtime.drop_consumer('batch');
SELECT count(*) FROM take();

-- One call returns at least 10,000 messages.
SELECT count(*) FROM (SELECT realtime.send('{}', 'ev', 'b', false) FROM generate_series(1, 10000)) s;
SELECT count(*) AS drained, max(n) AS last FROM take();

-- Bad calls.
SELECT * FROM realtime.drain('nobody');
SELECT * FROM realtime.drain('test', NULL, 0);
SELECT * FROM realtime.drain('test', NULL, 10, -1);
SELECT * FROM realtime.drain('test', -1);
-- The error names when the queue started (its epoch). That is wall-clock text, so it is
-- masked, and checked instead to be the epoch realtime.stats() reports.
DO $$
BEGIN
    PERFORM * FROM realtime.drain('test', (SELECT last_seq + 100 FROM realtime.stats()), 10, 0);
EXCEPTION WHEN invalid_parameter_value THEN
    RAISE NOTICE '% (names the epoch: %)',
        regexp_replace(regexp_replace(SQLERRM, 'started at .*$', 'started at <epoch>'), '\d+', 'N', 'g'),
        SQLERRM LIKE '%the queue started at ' || (SELECT epoch FROM realtime.stats())::text;
END
$$;
DO $$
BEGIN
    PERFORM realtime.confirm('test', (SELECT last_seq + 1 FROM realtime.stats()));
EXCEPTION WHEN invalid_parameter_value THEN
    RAISE NOTICE '%', regexp_replace(SQLERRM, '\d+', 'N', 'g');
END
$$;
SELECT realtime.create_consumer('');
SELECT realtime.create_consumer(repeat('c', 64));
