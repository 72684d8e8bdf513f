-- Overflow: writers never wait for a slow consumer. The oldest messages are dropped and the
-- consumer is told exactly which, as a gap; every sequence is either delivered or in the gap.
SELECT realtime.create_consumer('slow') AS base \gset
CREATE TABLE written (i int);
-- 1,500 transactions of ~4kB each: about 6MB through a 4MB queue.
DO $$
BEGIN
    FOR i IN 1..1500 LOOP
        INSERT INTO written VALUES (i);
        PERFORM realtime.send(jsonb_build_object('i', i, 'pad', repeat('x', 4000)), 'ev', 'o', false);
        COMMIT;
    END LOOP;
END
$$;
SELECT count(*) AS committed_writes FROM written;
CREATE TEMP TABLE got AS SELECT * FROM realtime.drain('slow', NULL, 10000, 0);
SELECT kind, count(*) > 0 AS some FROM got GROUP BY kind ORDER BY kind;
SELECT lost_first - :base AS first_lost, lost_last - lost_first + 1 > 0 AS lost_some
FROM got WHERE kind = 'gap';
SELECT (SELECT lost_last - lost_first + 1 FROM got WHERE kind = 'gap')
     + (SELECT count(*) FROM got WHERE kind = 'message') AS lost_plus_delivered;
SELECT min(seq) = (SELECT lost_last + 1 FROM got WHERE kind = 'gap') AS delivery_resumes_after_gap,
       max(seq) - :base AS last
FROM got WHERE kind = 'message';
-- The first delivered message is the one right after the gap.
SELECT (payload::jsonb->>'i')::int = (SELECT lost_last - :base + 1 FROM got WHERE kind = 'gap') AS right_message
FROM got WHERE kind = 'message' ORDER BY seq LIMIT 1;
SELECT gaps, lost_messages = (SELECT lost_last - lost_first + 1 FROM got WHERE kind = 'gap') AS lost_counted
FROM realtime.consumers() WHERE name = 'slow';
SELECT messages_evicted > 0 AS evicted FROM realtime.stats();
-- realtime.history (a client's resume) reports the same loss as a gap row, before what it
-- still holds: every sequence after the base is either returned or in the gap.
CREATE TEMP TABLE hist AS SELECT * FROM realtime.history(:base, '{o}', '{false}');
SELECT lost_first - :base AS first_lost,
       lost_last = (SELECT min(seq) - 1 FROM hist WHERE kind = 'message') AS gap_ends_before_first
FROM hist WHERE kind = 'gap';
SELECT (SELECT lost_last - lost_first + 1 FROM hist WHERE kind = 'gap')
     + (SELECT count(*) FROM hist WHERE kind = 'message') AS lost_plus_returned,
       (SELECT seq FROM hist WHERE kind = 'end') = (SELECT last_seq FROM realtime.stats()) AS through_last;
-- Draining again from the same position reports the gap again but does not count it twice.
SELECT count(*) FILTER (WHERE kind = 'gap') AS gap_rows FROM realtime.drain('slow', NULL, 1, 0);
SELECT gaps FROM realtime.consumers() WHERE name = 'slow';
SELECT realtime.drop_consumer('slow');
SELECT kind, count(*) > 0 AS some FROM take() GROUP BY kind ORDER BY kind;
