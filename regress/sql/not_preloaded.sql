-- Without shared_preload_libraries the queue cannot exist: loading is refused with a hint.
CREATE EXTENSION pg_realtime;
LOAD 'pg_realtime';
SELECT count(*) FROM pg_extension WHERE extname = 'pg_realtime';
