-- A transaction stuck between pre-commit and commit (here: waiting for a synchronous standby
-- that does not exist) holds back every message queued after it, to keep commit order.
-- realtime.stats() shows how many bytes wait and since when, so an operator sees why.
SELECT realtime.create_consumer('held') AS base \gset
CREATE TABLE held_rows (n int);
SELECT pending_bytes, oldest_pending_since IS NULL AS nothing_pending FROM realtime.stats();
-- This session's own commits must not wait for the missing standby.
SET synchronous_commit = local;
ALTER SYSTEM SET synchronous_standby_names = 'standby_that_never_comes';
SELECT pg_reload_conf();
SELECT dblink_connect('stuck', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database()));
-- Wait (bounded) until the sender's session has loaded the setting (reloads are asynchronous).
SELECT wait_for($$(SELECT s FROM dblink('stuck', 'SHOW synchronous_standby_names') AS t(s text)) <> ''$$);
-- Commits wait for a standby once the checkpointer has applied the setting too: a checkpoint
-- makes it handle the pending reload first.
CHECKPOINT;
-- The sender writes a row too: a transaction that writes nothing has no commit record to wait for.
SELECT dblink_send_query('stuck', $$
    WITH w AS (INSERT INTO held_rows VALUES (1) RETURNING n) SELECT realtime.send(jsonb_build_object('n', n), 'ev', 'held', false) FROM w $$);
-- Wait (bounded) until the sender's commit waits for the standby.
SELECT wait_for($$EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep')$$);
-- A later transaction (this session's, which does not wait for the standby) commits, but
-- its message is held behind the stuck one.
SELECT realtime.send('{"n": 2}', 'ev', 'held', false);
SELECT pending_bytes > 0 AS bytes_pending, oldest_pending_since <= clock_timestamp() AS pending_since_known,
       last_seq - :base AS published FROM realtime.stats();
SELECT count(*) AS readable FROM realtime.drain('held', NULL, 10, 0);
-- Without a synchronous standby the stuck commit finishes, and both arrive in queue order.
ALTER SYSTEM RESET synchronous_standby_names;
SELECT pg_reload_conf();
SET statement_timeout = '60s';
SELECT count(*) FROM dblink_get_result('stuck') AS t(r text);
RESET statement_timeout;
SELECT dblink_disconnect('stuck');
SELECT array_agg(payload::jsonb ->> 'n' ORDER BY seq) FROM realtime.drain('held', NULL, 10, 2000);
SELECT pending_bytes, oldest_pending_since IS NULL AS nothing_pending FROM realtime.stats();
RESET synchronous_commit;
SELECT realtime.drop_consumer('held');
SELECT count(*) FROM take();
