-- Issue 39, H4: realtime.history decoded every change it kept in one call: a table's 10,001
-- newest changes of a row whose large value compresses well (kept compressed in the queue,
-- re-captured whole by each UPDATE) were gigabytes of JSON in one backend, and as much
-- again in the sidecar. Now a call returns at most realtime.drain_max_decoded_size of
-- decoded change data (and one change more per table):
-- - with `newest` (a resume), each table asked gets an equal share, its newest changes
--   first; the older ones are left out, and a row of kind 'cut' says from which position
--   that table's history is complete;
-- - without, the rows stop after the change that passed it, and 'end' says where to go on.
CREATE TABLE hist_decoded (id int PRIMARY KEY, n int, body text);
CREATE TABLE hist_small (id int PRIMARY KEY, n int);
ALTER PUBLICATION supabase_realtime ADD TABLE hist_decoded, hist_small;
SELECT last_seq AS base FROM realtime.stats() \gset
INSERT INTO hist_decoded VALUES (1, 0, repeat('a', 100000));
INSERT INTO hist_small VALUES (1, 0);
DO $$ BEGIN FOR i IN 1..29 LOOP UPDATE hist_decoded SET n = i; UPDATE hist_small SET n = i; END LOOP; END $$;
-- Unbounded (the default 64 MB): all 30 of each, no cut.
SELECT topic, count(*) FILTER (WHERE kind = 'change') AS changes, count(*) FILTER (WHERE kind = 'cut') AS cuts
FROM realtime.history(:base, '{}', '{}', NULL, 100, true, 100000,
                      ARRAY['hist_decoded'::regclass::oid, 'hist_small'::regclass::oid])
WHERE kind IN ('change', 'cut') GROUP BY topic ORDER BY topic;
-- Under 2 MB, each table's share is 1 MB: the large one keeps its newest 11 (the one that
-- passed its share included) and says where they begin; the small one keeps all 30.
SET realtime.drain_max_decoded_size = '2MB';
CREATE TEMP TABLE h AS
SELECT seq - :base AS seq, kind, topic, (payload -> 'record' ->> 'n')::int AS n
FROM realtime.history(:base, '{}', '{}', NULL, 100, true, 100000,
                      ARRAY['hist_decoded'::regclass::oid, 'hist_small'::regclass::oid]);
SELECT topic, count(*) AS changes, min(n) AS oldest_n, max(n) AS newest_n
FROM h WHERE kind = 'change' GROUP BY topic ORDER BY topic;
SELECT topic, seq = (SELECT min(seq) FROM h WHERE kind = 'change' AND topic = c.topic) AS at_its_first_kept
FROM h c WHERE kind = 'cut';
-- Without newest: the rows stop after the change that passed 2 MB, 'end' right there; the
-- next call from it goes on, nothing twice.
CREATE TEMP TABLE got (call int, seq bigint, n int);
CREATE TEMP TABLE start AS SELECT :base::bigint AS base;
DO $$
DECLARE
    at bigint := (SELECT base FROM start);
    call int := 0;
BEGIN
    LOOP
        call := call + 1;
        INSERT INTO got
        SELECT call, d.seq, (d.payload -> 'record' ->> 'n')::int
        FROM realtime.history(at, '{}', '{}', NULL, NULL, true, 100000, ARRAY['hist_decoded'::regclass::oid]) d
        WHERE d.kind = 'change';
        EXIT WHEN call > 20 OR at = (SELECT last_seq FROM realtime.stats());
        at := (SELECT seq FROM realtime.history(at, '{}', '{}', NULL, NULL, true, 100000, ARRAY['hist_decoded'::regclass::oid])
               WHERE kind = 'end');
    END LOOP;
END
$$;
SELECT count(DISTINCT call) > 1 AS in_several_calls, count(*) AS changes, count(DISTINCT seq) AS distinct_changes,
       array_agg(n ORDER BY seq) = (SELECT array_agg(g ORDER BY g) FROM generate_series(0, 29) g) AS every_change_in_order
FROM got;
RESET realtime.drain_max_decoded_size;
ALTER PUBLICATION supabase_realtime DROP TABLE hist_decoded, hist_small;
DROP TABLE hist_decoded, hist_small;
