-- One batched authorization call of :n random requests (pgbench -D n=... -D generate=0|1).
-- generate=0: one of the 20 batches bench_make_batches(n) prepared before the run, so the
-- timed call only authorizes; generate=1: the requests are made inside the timed call
-- (md5, format and random per request, as this benchmark measured until 2026-11-24).
\set i random(1, 20)
\if :generate
SELECT count(*) FROM bench_batch(:n) b, realtime.authorize(b.roles, b.claims, b.headers, b.topics, b.extensions, b.actions);
\else
SELECT count(*) FROM bench_batches b, realtime.authorize(b.roles, b.claims, b.headers, b.topics, b.extensions, b.actions)
WHERE b.i = :i;
\endif
