-- Issue 39, M4: the persist quota was per topic only, so one user with a write policy on a
-- prefix (room:<uid>-*) kept a topic's quota in as many topics as it named, and nothing
-- bounded the table. realtime.relay_batch now also bounds each sender (senders, in step
-- with the messages) and everyone together (realtime.persisted_totals), each refusal naming
-- its settings; a backend's messages (no sender) count in the total only.
DELETE FROM realtime.persisted_messages;
SELECT realtime.expire_persisted() AS expired;
SELECT messages, bytes FROM realtime.persisted_totals;

-- One sender, a new topic each time: two messages fit its quota of 2, the third is refused
-- though its topic keeps none.
SELECT realtime.relay_batch(ARRAY[7], ARRAY['room:u1-' || n], ARRAY['e'], ARRAY[true],
    ARRAY['{"n": 1}'], ARRAY[NULL]::bytea[], ARRAY[60], 100, 100000,
    ARRAY['user u1'], 2, 100000, NULL, NULL) AS relayed
FROM generate_series(1, 2) n;
\set VERBOSITY terse
SELECT realtime.relay_batch(ARRAY[7], ARRAY['room:u1-3'], ARRAY['e'], ARRAY[true],
    ARRAY['{"n": 1}'], ARRAY[NULL]::bytea[], ARRAY[60], 100, 100000,
    ARRAY['user u1'], 2, 100000, NULL, NULL);
-- Bytes too: a sender's 30-byte quota.
SELECT realtime.relay_batch(ARRAY[7], ARRAY['room:u2'], ARRAY['e'], ARRAY[true],
    ARRAY['"' || repeat('x', 31) || '"'], ARRAY[NULL]::bytea[], ARRAY[60], 100, 100000,
    ARRAY['address 2001:db8::/64'], 100, 30, NULL, NULL);
\set VERBOSITY default
-- Another sender, and a backend (no sender), are not refused by u1's quota.
SELECT realtime.relay_batch(ARRAY[7, 7], ARRAY['room:u1-3', 'room:u1-4'], ARRAY['e', 'e'], ARRAY[true, true],
    ARRAY['{"n": 1}', '{"n": 1}'], ARRAY[NULL, NULL]::bytea[], ARRAY[60, 60], 100, 100000,
    ARRAY['user u2', NULL], 2, 100000, NULL, NULL) AS relayed;
SELECT sender, count(*) FROM realtime.persisted_messages GROUP BY sender ORDER BY sender;

-- The total: 4 kept, counted as they were kept; a batch that would pass 5 fails whole.
SELECT messages FROM realtime.persisted_totals;
\set VERBOSITY terse
SELECT realtime.relay_batch(ARRAY[7, 7], ARRAY['room:t1', 'room:t2'], ARRAY['e', 'e'], ARRAY[true, true],
    ARRAY['{}', '{}'], ARRAY[NULL, NULL]::bytea[], ARRAY[60, 60], 100, 100000,
    ARRAY['user u3', 'user u4'], 100, 100000, 5, 1000000);
\set VERBOSITY default
SELECT messages FROM realtime.persisted_totals;
SELECT realtime.relay_batch(ARRAY[7], ARRAY['room:t1'], ARRAY['e'], ARRAY[true],
    ARRAY['{}'], ARRAY[NULL]::bytea[], ARRAY[60], 100, 100000,
    ARRAY['user u3'], 100, 100000, 5, NULL) AS relayed_to_the_total;
-- Messages not kept are never refused by it.
SELECT realtime.relay_batch(ARRAY[7], ARRAY['room:t1'], ARRAY['e'], ARRAY[true],
    ARRAY['{}'], ARRAY[NULL]::bytea[], ARRAY[NULL]::integer[], 100, 100000,
    ARRAY['user u3'], 100, 100000, 5, 1) AS relayed_not_kept;

-- Expiry makes room: the expired no longer count once a round has counted the table again,
-- and rows written by hand (a restore) are counted then too.
UPDATE realtime.persisted_messages SET expires_at = now() - interval '1 second' WHERE topic LIKE 'room:u1-%';
INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, expires_at)
VALUES (gen_random_uuid(), 'room:restored', true, 'e', '{}', now() + interval '1 hour');
SELECT realtime.expire_persisted() AS expired;
SELECT messages, bytes > 0 AS has_bytes FROM realtime.persisted_totals;
-- Each sender's count too (kept, not counted at each relay); the restored row has none.
SELECT sender, messages, bytes > 0 AS has_bytes FROM realtime.persisted_senders ORDER BY sender;
SELECT realtime.relay_batch(ARRAY[7], ARRAY['room:u1-5'], ARRAY['e'], ARRAY[true],
    ARRAY['{"n": 1}'], ARRAY[NULL]::bytea[], ARRAY[60], 100, 100000,
    ARRAY['user u1'], 2, 100000, 5, NULL) AS relayed_after_expiry;

-- The totals are the extension's: nobody but its owner (and the sidecar's login, granted
-- by scripts/sidecar_login.sql) reads or writes them.
SELECT has_table_privilege('public', 'realtime.persisted_totals', 'SELECT') AS public_reads,
       has_table_privilege('public', 'realtime.persisted_totals', 'UPDATE') AS public_writes,
       has_table_privilege('public', 'realtime.persisted_senders', 'SELECT') AS public_reads_senders,
       has_table_privilege('public', 'realtime.persisted_senders', 'INSERT') AS public_writes_senders;
DELETE FROM realtime.persisted_messages;
SELECT realtime.expire_persisted() AS expired;
-- What this file relayed, taken from the suite's consumer.
SELECT count(*) AS relayed_here FROM take();
