-- The Postgres Changes delivery benchmark (changes.py): a published chat table whose policy
-- admits the members of a row's room through auth.uid(), as Supabase's docs write it.
-- Member u (uuid as pgbench/loadgen's member_uuid) belongs to room (u - 1) % :rooms, the
-- room whose filter (`k=eq.<room>`) the load generator's client u - 1 subscribes with.
CREATE EXTENSION IF NOT EXISTS pg_realtime;
-- A Supabase project has it; the extension does not make it.
DO $$ BEGIN CREATE PUBLICATION supabase_realtime; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
\ir supabase_auth.sql
CREATE TABLE change_members (user_id uuid, k int, PRIMARY KEY (user_id, k));
INSERT INTO change_members
SELECT format('%s-0000-4000-8000-%s', lpad(to_hex(u), 8, '0'), lpad(to_hex(u), 12, '0'))::uuid, (u - 1) % :rooms
FROM generate_series(1, :users) u;
CREATE TABLE bench_changes (id bigserial PRIMARY KEY, k int NOT NULL, n int8 NOT NULL, t int8 NOT NULL, body text);
ALTER TABLE bench_changes ENABLE ROW LEVEL SECURITY;
GRANT SELECT ON change_members, bench_changes TO authenticated;
CREATE POLICY members_read ON bench_changes FOR SELECT TO authenticated
    USING (EXISTS (SELECT 1 FROM change_members m WHERE m.user_id = auth.uid() AND m.k = bench_changes.k));
ANALYZE change_members;
ALTER PUBLICATION supabase_realtime ADD TABLE bench_changes;

-- Supabase's algorithm (reference: supabase-realtime section 6.2), for the same table and
-- policy: per change, per subscriber whose filter it passes, as that subscriber's role
-- with its claims, a primary-key lookup under RLS.
CREATE FUNCTION supabase_visible(p_sub uuid, p_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    seen boolean;
BEGIN
    PERFORM set_config('role', 'authenticated', true),
            set_config('request.jwt.claims', format('{"sub": "%s", "role": "authenticated"}', p_sub), true),
            set_config('request.jwt.claim.sub', p_sub::text, true);
    seen := EXISTS (SELECT 1 FROM bench_changes WHERE id = p_id);
    PERFORM set_config('role', 'none', true);
    RETURN seen;
END
$$;
