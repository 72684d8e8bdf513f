-- Issue 39, H4: a drain read its batch by the queue's bytes and decoded every change in it.
-- Cheap UPDATEs of a row whose large value compresses well (kept compressed in the queue,
-- re-captured whole by each UPDATE) decode to a hundred times what they take there, so one
-- call's result grew past what a call can return, every call, and the drain never moved.
-- Now a call returns at most realtime.drain_max_decoded_size of decoded change data (and
-- the one change that passed it); the next call reads on: nothing lost, nothing twice.
SELECT realtime.create_consumer('decoded') >= 0 AS created;
CREATE TABLE decoded (id int PRIMARY KEY, n int, body text);
ALTER PUBLICATION supabase_realtime ADD TABLE decoded;
INSERT INTO decoded VALUES (1, 0, repeat('a', 100000));
DO $$ BEGIN FOR i IN 1..29 LOOP UPDATE decoded SET n = i; END LOOP; END $$;
-- 30 changes of about 100 kB each once decoded.
SELECT count(*) AS changes, sum(octet_length(payload::text)) > 3000000 AS decoded_over_3mb
FROM realtime.drain('decoded', NULL, 10000, 0) WHERE kind = 'change';
-- Again from the start, under a bound of 1 MB a call: each call stops after the change
-- that passed it, and the calls together return every change once, in order.
SET realtime.drain_max_decoded_size = '1MB';
CREATE TEMP TABLE got (call int, seq bigint, n int);
DO $$
DECLARE
    at bigint := (SELECT confirmed_seq FROM realtime.consumers() WHERE name = 'decoded');
    call int := 0;
    rows int;
BEGIN
    LOOP
        call := call + 1;
        INSERT INTO got
        SELECT call, d.seq, (d.payload -> 'record' ->> 'n')::int
        FROM realtime.drain('decoded', at, 10000, 0) d WHERE d.kind = 'change';
        GET DIAGNOSTICS rows = ROW_COUNT;
        EXIT WHEN rows = 0 OR call > 20;
        at := (SELECT max(seq) FROM got);
    END LOOP;
END
$$;
SELECT count(DISTINCT call) AS calls, count(*) AS changes, count(DISTINCT seq) AS distinct_changes,
       max(per_call) AS most_in_one_call
FROM got, LATERAL (SELECT count(*) AS per_call FROM got g2 WHERE g2.call = got.call) c;
SELECT array_agg(n ORDER BY seq) = (SELECT array_agg(g ORDER BY g) FROM generate_series(0, 29) g) AS every_change_in_order
FROM got;
RESET realtime.drain_max_decoded_size;
SELECT realtime.drop_consumer('decoded') AS dropped;
ALTER PUBLICATION supabase_realtime DROP TABLE decoded;
DROP TABLE decoded;
