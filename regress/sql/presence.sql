-- The previous file's session may still be exiting with consumer "test" held.
SELECT wait_until_released('test') AS released;
-- Presence held by the database: members leased to a sidecar session, every change queued
-- as a Phoenix presence_diff (drained as kind 'presence', never history), tombstones for
-- the refs that left, and a reaper for sessions whose lease expired. Refs come from a
-- sequence: shown as p# (their order is what matters, and it is checked).
CREATE FUNCTION diffs() RETURNS TABLE(topic text, private boolean, diff text)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    SELECT d.topic, d.private, regexp_replace(d.payload::text, '"p[0-9]+"', '"p#"', 'g')
    FROM realtime.drain('test', NULL, 10000, 0) d WHERE d.kind = 'presence' ORDER BY d.seq;
    PERFORM realtime.confirm('test', c.last_read_seq) FROM realtime.consumers() c WHERE c.name = 'test';
END
$$;
SELECT count(*) >= 0 AS drained FROM take();
SELECT last_seq AS base FROM realtime.stats() \gset

-- A first lease: the session held none before. (An hour long, so that no step of this file
-- depends on how fast the machine runs it.)
SELECT realtime.presence_renew('s1', '1 hour') AS held_before;
SELECT realtime.presence_renew('s1', '1 hour') AS held_before;

-- Track: a join. Re-track with the same meta: nothing changes, nothing is sent. Re-track
-- with another meta: one diff, the join (with phx_ref_prev) and the leave of the old ref.
SELECT realtime.presence_track('s1', 'room:a', false, 'ann', '{"typing": false}') AS r1 \gset
SELECT realtime.presence_track('s1', 'room:a', false, 'ann', '{"typing": false}', :'r1') IS NULL AS unchanged;
SELECT realtime.presence_track('s1', 'room:a', false, 'ann', '{"typing": true}', :'r1') AS r2 \gset
SELECT :'r2' > :'r1' AS new_ref, length(:'r2') > 1 AS made_here;
SELECT * FROM diffs();
-- A private topic is another topic.
SELECT realtime.presence_track('s1', 'room:a', true, 'bob', '{}') IS NOT NULL AS tracked;
SELECT * FROM diffs();

-- The state: present members and the refs that already left.
SELECT topic, private, key, ref = :'r2' AS is_r2, meta, live
FROM realtime.presence_state('{room:a,room:a}', '{false,true}');

-- Untrack: a leave; untracking again, or another session's member, does nothing.
SELECT realtime.presence_untrack('s1', :'r2') AS was_present;
SELECT realtime.presence_untrack('s1', :'r2') AS was_present;
SELECT realtime.presence_untrack('s2', (SELECT ref FROM realtime.presences WHERE key = 'bob')) AS others;
SELECT * FROM diffs();

-- A session that stops renewing (a sidecar killed, hung or cut off): once its lease is
-- over, the reaper (any sidecar's) makes its members leave, one diff per topic, and ends it.
SELECT realtime.presence_renew('s2', '-1 second') AS held_before;
SELECT realtime.presence_track('s2', 'room:b', false, 'cy', '{"n": 1}') IS NOT NULL AS tracked,
       realtime.presence_track('s2', 'room:b', false, 'cy', '{"n": 2}') IS NOT NULL AS second_tab,
       realtime.presence_track('s2', 'room:c', false, 'di', '{}') IS NOT NULL AS tracked_c;
SELECT count(*) AS joins FROM diffs();
SELECT realtime.presence_reap() AS left;
SELECT * FROM diffs();
SELECT count(*) AS sessions_left FROM realtime.presence_sessions WHERE session = 's2';
-- s1's lease holds: its member stays. Renewing s2 now says its members are gone.
SELECT realtime.presence_reap() AS left;
SELECT realtime.presence_renew('s2') AS held_before;
SELECT key, live FROM realtime.presence_state('{room:a,room:b}', '{true,false}') ORDER BY key, live;

-- A sidecar killed outright: the backend that renewed its lease is gone (no backend has
-- pid 0). Its members leave at the next reap, however long the lease still runs.
SELECT realtime.presence_renew('s3', '1 hour') AS held_before;
SELECT realtime.presence_track('s3', 'room:d', false, 'ed', '{}') IS NOT NULL AS tracked;
SELECT count(*) AS joins FROM diffs();
SELECT realtime.presence_reap() AS left;
UPDATE realtime.presence_sessions SET pid = 0 WHERE session = 's3';
SELECT realtime.presence_reap() AS left;
SELECT * FROM diffs();
-- Whether a session's backend runs is asked of the proc array (realtime.backend_alive), not
-- of pg_stat_activity, which copies every backend's status: this backend runs; pid 1 (init)
-- and pid 0 are no server process.
SELECT realtime.backend_alive(pg_backend_pid()) AS this_backend, realtime.backend_alive(1) AS init,
       realtime.backend_alive(0) AS zero, realtime.backend_alive(NULL) AS unknown;
SELECT has_function_privilege('public', 'realtime.backend_alive(integer)', 'EXECUTE') AS public_may;
-- Whether a reap should go ahead: once for the first caller in each interval, in each
-- database, so that every sidecar asking each second makes about one reap a second there.
SELECT realtime.presence_reap_due(3600000) AS first, realtime.presence_reap_due(3600000) AS second,
       realtime.presence_reap_due(0) AS at_once;
-- Another database's sidecars reap their own members: its first reap is due.
CREATE DATABASE presence_other;
\c presence_other
CREATE EXTENSION pg_realtime;
SELECT realtime.presence_reap_due(3600000) AS other_first, realtime.presence_reap_due(3600000) AS other_second;
\c regression
DROP DATABASE presence_other;
SELECT realtime.presence_reap_due(-1);
SELECT realtime.presence_reap_due(3600001);
SELECT has_function_privilege('public', 'realtime.presence_reap_due(integer)', 'EXECUTE') AS public_may;
-- The sessions' backends are recorded as they renew.
SELECT session, pid = pg_backend_pid() AS this_backend FROM realtime.presence_sessions ORDER BY session;
-- A renewal writes nothing to the WAL (no WAL line below), so it neither flushes it nor waits
-- for the synchronous standbys: the sessions are unlogged, as a lease lives no longer than
-- its server.
-- (Session 'wal' has no members, and its lease is over: the next reap ends it unseen.)
SELECT realtime.presence_renew('wal', '-1 second') AS held_before;
EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT realtime.presence_renew('wal', '-1 second');
SELECT relpersistence FROM pg_class WHERE oid = 'realtime.presence_sessions'::regclass;
-- A member whose session does not exist (tracked while its session was being reaped)
-- leaves too: no member outlives its session.
SELECT realtime.presence_track('nobody', 'room:d', false, 'fay', '{}') IS NOT NULL AS tracked;
SELECT count(*) AS joins FROM diffs();
SELECT realtime.presence_reap() AS left;
SELECT * FROM diffs();

-- A clean stop ends the session at once.
SELECT realtime.presence_end('s1') AS left;
SELECT * FROM diffs();
-- Tombstones are purged after a while (a minute by default; here at once). They guard a
-- sidecar loading a topic's state against diffs it drains after, for as long as its drain
-- may lag, so the state returns only those younger than that (a churning room would
-- otherwise pile them up).
SELECT count(*) AS recent_tombstones FROM realtime.presence_state('{room:b}', '{false}', '0 seconds');
SELECT count(*) AS recent_tombstones FROM realtime.presence_state('{room:b}', '{false}');
SELECT realtime.presence_reap('0 seconds') AS left;
SELECT count(*) AS rows_left FROM realtime.presences;

-- Bad input: a meta that is not an object, Phoenix's error.
SELECT realtime.presence_track('s2', 'room:a', false, 'x', '[1]');
-- Presence diffs are not history: a joining channel gets the state instead.
SELECT count(*) FILTER (WHERE kind <> 'end') AS history_rows
FROM realtime.history(:base, '{room:a,room:b,room:c}', '{false,false,false}');

-- Only the sidecar's role: not PUBLIC.
SELECT has_function_privilege('public', 'realtime.presence_track(text,text,boolean,text,jsonb,text)', 'EXECUTE') AS public_tracks,
       has_function_privilege('public', 'realtime.queue_presence(text,boolean,text)', 'EXECUTE') AS public_queues,
       has_table_privilege('public', 'realtime.presences', 'SELECT') AS public_reads;
SELECT realtime.presence_end('s2') AS left;
SELECT count(*) >= 0 AS drained FROM take();
