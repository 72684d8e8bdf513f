-- The authorization benchmark's policy set: a user reads (and writes) a room's topic if a
-- membership table of 100,000 rows (10,000 users x 10 rooms of 1,000) says it belongs.
CREATE EXTENSION IF NOT EXISTS pg_realtime;
\ir supabase_auth.sql
CREATE TABLE IF NOT EXISTS bench_members (user_id uuid, room text, PRIMARY KEY (user_id, room));
TRUNCATE bench_members;
-- User u is md5(u)::uuid and belongs to rooms u % 1000 + k * 100 (k = 0..9), mod 1000.
INSERT INTO bench_members
SELECT md5(u::text)::uuid, 'room:' || ((u + k * 100) % 1000) FROM generate_series(1, 10000) u, generate_series(0, 9) k;
ANALYZE bench_members;
GRANT SELECT ON bench_members TO authenticated;
DROP POLICY IF EXISTS bench_read ON realtime.messages;
SET client_min_messages = warning;
CREATE POLICY bench_read ON realtime.messages FOR SELECT TO authenticated
    USING (EXISTS (SELECT 1 FROM bench_members m WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic())));

-- Random read requests for the batched authorizer: about half are members.
CREATE OR REPLACE FUNCTION bench_batch(n int) RETURNS TABLE(roles text[], claims text[], headers text[], topics text[],
                                                            extensions text[], actions text[])
LANGUAGE sql VOLATILE AS $$
    SELECT array_agg('authenticated'::text), array_agg(format('{"sub": "%s", "role": "authenticated"}', md5(u::text)::uuid)),
           array_agg('{}'::text), array_agg('room:' || CASE WHEN random() < 0.5 THEN (u + 100 * (u % 10)) % 1000 ELSE (u * 7 + 3) % 1000 END),
           array_agg('broadcast'::text), array_agg('read'::text)
    FROM (SELECT 1 + floor(random() * 10000)::int AS u FROM generate_series(1, n)) s $$;

-- Batches made before a timed run (authorize_batched.sql), so that making the random
-- requests is not counted as authorizing them: k batches of n, numbered i = 1..k.
CREATE OR REPLACE FUNCTION bench_make_batches(n int, k int DEFAULT 20) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DROP TABLE IF EXISTS bench_batches;
    -- n + 0 * i: a call per batch, not one shared by all.
    CREATE TABLE bench_batches AS SELECT i, b.* FROM generate_series(1, k) i, LATERAL bench_batch(n + 0 * i) b;
END
$$;
