-- Regression (issue 42): a commit whose wait for the synchronous standbys is cancelled, or
-- ended by a terminate (as a failover manager's demotion ends every backend's), finishes
-- locally, and its messages were published at once: a sidecar still draining an isolated
-- old primary delivered messages whose transactions the promoted standby never had. Now
-- such a commit's messages, and everything queued after them, wait until the synchronous
-- standbys have its commit record (here no standby ever connects), or until there are no
-- synchronous standbys.
SELECT realtime.create_consumer('cancelled') AS base \gset
SELECT realtime.create_consumer('asleep') >= 0 AS created;
CREATE TABLE cancelled_rows (n int);
-- This session's own commits must not wait for the missing standby.
SET synchronous_commit = local;
ALTER SYSTEM SET synchronous_standby_names = 'standby_that_never_comes';
SELECT pg_reload_conf();
SELECT dblink_connect('waiter', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database()));
-- Wait (bounded) until the writer's session and the checkpointer have the setting.
SELECT wait_for($$(SELECT s FROM dblink('waiter', 'SHOW synchronous_standby_names') AS t(s text)) <> ''$$);
CHECKPOINT;
-- A drain of another consumer (a second session) asleep for up to 30 s: a commit that ends
-- held must wake it, or it would not look again before its timeout, long after the
-- standbys have it.
SELECT dblink_connect('asleep', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database()));
SELECT dblink_send_query('asleep', $$ SELECT payload::jsonb ->> 'n' FROM realtime.drain('asleep', NULL, 10, 30000) $$);
SELECT wait_until_draining('asleep');
-- The writer's transaction writes a row (a commit record to wait for) and sends a message.
SELECT dblink_send_query('waiter', $$
    WITH w AS (INSERT INTO cancelled_rows VALUES (1) RETURNING n) SELECT realtime.send(jsonb_build_object('n', n), 'ev', 'cancelled', false) FROM w $$);
SELECT wait_for($$EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep')$$);
-- The wait is cancelled: the commit finishes locally, "but might not have been replicated".
SELECT pg_cancel_backend(pid) AS cancelled FROM pg_stat_activity WHERE wait_event = 'SyncRep';
SELECT count(*) AS answered FROM dblink_get_result('waiter') AS t(r text);
SELECT count(*) AS committed_locally FROM cancelled_rows;
-- Its message is not readable, nor one committed after it (this session's: it writes
-- nothing, so it has no commit record of its own to wait for).
SELECT realtime.send('{"n": 2}', 'ev', 'cancelled', false);
SELECT count(*) AS readable FROM realtime.drain('cancelled', NULL, 10, 200);
SELECT pending_bytes > 0 AS held, last_seq - :base AS published FROM realtime.stats();
-- Without synchronous standbys (replication is then asynchronous: the operator's choice),
-- nothing is held: both arrive, in queue order.
ALTER SYSTEM RESET synchronous_standby_names;
SELECT pg_reload_conf();
CHECKPOINT;
-- The sleeping drain was woken when the commit ended held, and has looked again since: it
-- publishes them itself (nothing else does here) and returns them.
SELECT wait_for($$dblink_is_busy('asleep') = 0$$) AS asleep_drain_returned;
SELECT * FROM dblink_get_result('asleep') AS t(n text);
SELECT dblink_disconnect('asleep');
SELECT array_agg(payload::jsonb ->> 'n' ORDER BY seq) FROM realtime.drain('cancelled', NULL, 10, 5000);
SELECT pending_bytes FROM realtime.stats();
SELECT dblink_disconnect('waiter');
RESET synchronous_commit;
SELECT realtime.drop_consumer('cancelled');
SELECT wait_until_released('asleep');
SELECT realtime.drop_consumer('asleep');
DROP TABLE cancelled_rows;
SELECT count(*) FROM take();
