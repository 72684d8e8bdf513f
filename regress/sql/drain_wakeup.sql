-- A drain that is waiting wakes when a transaction commits, and a subscriber that then
-- queries sees that transaction's writes. The reader runs in a second session (dblink).
CREATE EXTENSION dblink;
CREATE TABLE wake (id int);
SELECT realtime.create_consumer('waker') >= 0 AS created;
SELECT dblink_connect('reader', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database()));
SELECT dblink_send_query('reader', $$
    SELECT d.payload::jsonb->>'row' AS row, clock_timestamp() - s.started < interval '10 s' AS woke_before_timeout
    FROM (SELECT clock_timestamp() AS started) s, realtime.drain('waker', NULL, 10, 20000) d $$);

-- Regression (a wait on pg_stat_activity saw the sessions and query texts of its first
-- reading for the whole wait, so a reader slow to start its drain under load was never
-- seen): a session that connects a moment after the wait has begun is seen. (The sleep
-- orders the two; what is asserted is that the wait sees the later state.)
SELECT dblink_connect('opener', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database()));
SELECT dblink_send_query('opener', format($$SELECT pg_sleep(0.3), dblink_connect('late', %L)$$,
    format('host=%s port=%s dbname=%s application_name=late_arrival',
           split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database())));
SELECT wait_for($$EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = 'late_arrival')$$) AS late_session_seen;
SELECT * FROM dblink_get_result('opener') AS t(slept text, connected text);
SELECT dblink_disconnect('opener');

-- Wait (bounded) until the reader sleeps in the drain, so the wake-up path is what is tested.
CREATE FUNCTION wait_until_draining(consumer text) RETURNS boolean LANGUAGE sql AS $$
    SELECT wait_for(format('EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = %L AND query LIKE %L)',
                           'Extension', format('%%realtime.drain(%L%%', consumer))) $$;
SELECT wait_until_draining('waker');
SELECT wait_event_type, wait_event FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND query LIKE '%realtime.drain(''waker''%';

-- While the reader holds the consumer, no one else may drain it.
DO $$
BEGIN
    PERFORM * FROM realtime.drain('waker', NULL, 1, 0);
EXCEPTION WHEN object_in_use THEN
    RAISE NOTICE '%', regexp_replace(SQLERRM, '\d+', 'N', 'g');
END
$$;

BEGIN;
INSERT INTO wake VALUES (7);
SELECT realtime.send('{"row": 7}', 'ev', 'wake', false);
COMMIT;
SELECT * FROM dblink_get_result('reader') AS t(row text, woke_before_timeout boolean);
SELECT * FROM dblink_get_result('reader') AS t(row text, woke_before_timeout boolean);
SELECT * FROM dblink('reader', 'SELECT count(*) FROM wake WHERE id = 7') AS t(visible bigint);

-- When the reader's session ends, its consumer is free again, and a new session gets what
-- was not confirmed once more.
SELECT dblink_disconnect('reader');
SELECT wait_until_released('waker');
SELECT dblink_connect('reader', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database()));
SELECT * FROM dblink('reader', $$ SELECT count(*) FROM realtime.drain('waker', NULL, 10, 0) $$) AS t(redelivered bigint);
SELECT * FROM dblink('reader', $$ SELECT realtime.confirm('waker', last_read_seq) FROM realtime.consumers() WHERE name = 'waker' $$) AS t(confirmed text);

-- With linger_ms, a drain woken by one commit waits that long for more and returns them
-- together: the reader gets both messages below in one call.
SELECT dblink_send_query('reader', $$
    SELECT d.payload::jsonb->>'row' AS row FROM realtime.drain('waker', NULL, 10, 20000, 3000) d $$);
SELECT wait_until_draining('waker');
SELECT realtime.send('{"row": 8}', 'ev', 'wake', false);
SELECT realtime.send('{"row": 9}', 'ev', 'wake', false);
SELECT * FROM dblink_get_result('reader') AS t(row text);
SELECT * FROM dblink_get_result('reader') AS t(row text);
SELECT dblink_disconnect('reader');
SELECT wait_until_released('waker');
SELECT * FROM realtime.drain('test', NULL, 10, 0, -1);
SELECT realtime.drop_consumer('waker');
SELECT count(*) FROM take();
