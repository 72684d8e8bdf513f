-- Regression (issue 39, H1): realtime.match_patterns made each pattern's copy of the values
-- it is asked about in the call's memory, so every copy stayed until the call ended: 1,000
-- patterns over 400 values of 1 kB took the backend 1.2 GB past its start
-- (pgbench/pattern_memory.py). Each pattern's arguments are now freed after it. Here 500
-- patterns over 400 values of 1 kB (200 MB of copies) must leave the backend's peak memory
-- within 100 MB of where it started. Read by the backend itself from /proc.
SELECT substring(pg_read_file('/proc/' || pg_backend_pid() || '/status') from 'VmHWM:\s*(\d+) kB')::bigint AS hwm_before \gset
SELECT count(*) AS answers FROM realtime.match_patterns(
    (SELECT array_agg('a' || g || '%') FROM generate_series(1, 500) g),
    array_fill('like'::text, ARRAY[500]),
    (SELECT array_agg(repeat(chr(97 + g % 26), 1000)) FROM generate_series(1, 400) g));
SELECT substring(pg_read_file('/proc/' || pg_backend_pid() || '/status') from 'VmHWM:\s*(\d+) kB')::bigint - :hwm_before < 100 * 1024
    AS peak_within_100_mb;
