-- Regression (a consumer could be created on a hot standby, and drained there): a standby's
-- queue is its own shared memory, and the primary's commits never reach it, so a sidecar
-- connected to a standby (a connection string without target_session_attrs=read-write, say)
-- drained nothing while its clients saw no error. Creating a consumer there is an ERROR now,
-- so such a sidecar keeps reconnecting, and says why.
SELECT pg_is_in_recovery() AS standby;
SELECT realtime.create_consumer('on_standby');
-- Nothing was made: no consumer of that name to drain.
SELECT count(*) AS drained FROM realtime.drain('on_standby', NULL, 10, 0);
