-- One batched authorization call of :n random requests (pgbench -D n=...).
SELECT count(*) FROM bench_batch(:n) b, realtime.authorize(b.roles, b.claims, b.headers, b.topics, b.extensions, b.actions);
