-- Persisted client broadcasts: realtime.relay_batch relays a batch and keeps the messages
-- sent with a ttl under the id the queue gets too; realtime.persisted_history reads what a
-- replay adds; realtime.expire_persisted deletes expired rows in bounded chunks.
SELECT realtime.create_consumer('persisted') >= 0 AS created;
SELECT last_seq AS base FROM realtime.stats() \gset

-- Without ttls nothing is kept; the messages are relayed in order with their origins.
SELECT realtime.relay_batch(ARRAY[7, 8], ARRAY['room:a', 'room:a'], ARRAY['e1', 'e2'],
    ARRAY[false, false], ARRAY['{"n": 1}', NULL], ARRAY[NULL, '\x01']::bytea[]) AS relayed;
SELECT seq - :base AS seq, topic, event, payload::text, binary_payload, origin
FROM realtime.drain('persisted', :base, 10, 0) ORDER BY seq;
SELECT count(*) AS kept FROM realtime.persisted_messages;

-- With ttls: the kept ones are written with the queue's id, the others not.
SELECT last_seq AS base FROM realtime.stats() \gset
SELECT realtime.relay_batch(ARRAY[7, 7, 7], ARRAY['room:k', 'room:k', 'room:k'], ARRAY['kept', 'fleeting', 'kept2'],
    ARRAY[true, true, true], ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}'], ARRAY[NULL, NULL, NULL]::bytea[],
    ARRAY[3600, NULL, 3600]) AS relayed;
SELECT seq - :base AS seq, d.event, p.id IS NOT NULL AS kept_with_its_id
FROM realtime.drain('persisted', :base, 10, 0) d
LEFT JOIN realtime.persisted_messages p ON p.id = d.id
ORDER BY seq;

-- A message the queue refuses fails the batch whole: nothing relayed, nothing kept.
SELECT last_seq AS base FROM realtime.stats() \gset
\set VERBOSITY terse
SELECT realtime.relay_batch(ARRAY[7, 7], ARRAY['room:k', 'room:k'], ARRAY['ok', 'bad'],
    ARRAY[true, true], ARRAY['{}', 'not json'], ARRAY[NULL, NULL]::bytea[], ARRAY[60, 60]);
\set VERBOSITY default
SELECT count(*) AS relayed FROM realtime.drain('persisted', :base, 10, 0);
SELECT count(*) AS kept FROM realtime.persisted_messages;

-- The quota: a topic keeps at most max_kept unexpired messages and max_kept_bytes; a batch
-- that would pass it fails whole (program_limit_exceeded), with the limits' names. Expired
-- rows do not count; a batch of messages not kept is never refused by it.
DELETE FROM realtime.persisted_messages;
SELECT realtime.relay_batch(ARRAY[7, 7], ARRAY['room:q', 'room:q'], ARRAY['q1', 'q2'],
    ARRAY[true, true], ARRAY['{"n": 1}', '{"n": 2}'], ARRAY[NULL, NULL]::bytea[], ARRAY[60, 60], 3, 1000) AS relayed;
\set VERBOSITY terse
SELECT realtime.relay_batch(ARRAY[7, 7], ARRAY['room:q', 'room:q'], ARRAY['q3', 'q4'],
    ARRAY[true, true], ARRAY['{"n": 3}', '{"n": 4}'], ARRAY[NULL, NULL]::bytea[], ARRAY[60, 60], 3, 1000);
SELECT realtime.relay_batch(ARRAY[7], ARRAY['room:b'], ARRAY['big'],
    ARRAY[true], ARRAY[NULL], ARRAY[decode(repeat('ab', 1200), 'hex')], ARRAY[60], 3, 1000);
\set VERBOSITY default
SELECT realtime.relay_batch(ARRAY[7, 7], ARRAY['room:q', 'room:other'], ARRAY['q3', 'o1'],
    ARRAY[true, true], ARRAY['{"n": 3}', '{"n": 1}'], ARRAY[NULL, NULL]::bytea[], ARRAY[60, 60], 3, 1000) AS relayed;
SELECT realtime.relay_batch(ARRAY[7, 7], ARRAY['room:q', 'room:q'], ARRAY['not kept', 'not kept'],
    ARRAY[true, true], ARRAY['{}', '{}'], ARRAY[NULL, NULL]::bytea[], ARRAY[NULL, NULL]::integer[], 3, 1000) AS relayed;
UPDATE realtime.persisted_messages SET expires_at = now() - interval '1 second' WHERE event = 'q1';
SELECT realtime.relay_batch(ARRAY[7], ARRAY['room:q'], ARRAY['q4'],
    ARRAY[true], ARRAY['{"n": 4}'], ARRAY[NULL]::bytea[], ARRAY[60], 3, 1000) AS relayed_after_one_expired;
SELECT topic, string_agg(event, ',' ORDER BY sent_at) FROM realtime.persisted_messages
WHERE expires_at > now() GROUP BY topic ORDER BY topic;
DELETE FROM realtime.persisted_messages;

-- A replay's read: the newest per (topic, private) since a time, oldest first, not expired.
INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, sent_at, expires_at)
SELECT gen_random_uuid(), 'room:h', true, 'h' || g, '{}', '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 minute',
       '2999-01-01'::timestamptz
FROM generate_series(1, 5) g;
INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, sent_at, expires_at)
VALUES (gen_random_uuid(), 'room:h', false, 'public twin', '{}', '2026-01-01 00:10:00+00', '2999-01-01'),
       (gen_random_uuid(), 'room:h', true, 'expired', '{}', '2026-01-01 00:20:00+00', '2000-01-01');
SELECT topic, private, event FROM realtime.persisted_history(ARRAY['room:h'], ARRAY[true], '2026-01-01 00:02:00+00', 2);
SELECT topic, private, event FROM realtime.persisted_history(ARRAY['room:h', 'room:h'], ARRAY[true, false], '2026-01-01 00:00:00+00', 1);

-- Expiry in chunks: at most max_rows a call, until none is left.
INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, expires_at)
SELECT gen_random_uuid(), 'room:x', true, 'old', '{}', '2000-01-01'::timestamptz + g * interval '1 second'
FROM generate_series(1, 25) g;
SELECT realtime.expire_persisted(10) AS first, realtime.expire_persisted(10) AS second,
       realtime.expire_persisted(10) AS third, realtime.expire_persisted(10) AS fourth;
SELECT count(*) FILTER (WHERE expires_at < now()) AS expired_left, count(*) AS left
FROM realtime.persisted_messages;

-- The sidecar's, not PUBLIC's.
SELECT has_function_privilege('public', 'realtime.relay_batch(bigint[],text[],text[],boolean[],text[],bytea[],integer[],integer,bigint,text[],integer,bigint,bigint,bigint,uuid[])', 'EXECUTE') AS public_relays,
       has_function_privilege('public', 'realtime.persisted_history(text[],boolean[],timestamptz,integer)', 'EXECUTE') AS public_reads,
       has_function_privilege('public', 'realtime.expire_persisted(integer)', 'EXECUTE') AS public_expires;
DELETE FROM realtime.persisted_messages;
SELECT realtime.drop_consumer('persisted');
SELECT count(*) AS relayed_here FROM take();
