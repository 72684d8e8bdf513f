-- Private joins benchmark: member u (uuid as pgbench/loadgen's member_uuid) belongs to
-- room:((u - 1) % 1000), the room the load generator's client u - 1 joins with --private
-- --topics 1000; the policy is Supabase's docs' membership check.
CREATE EXTENSION IF NOT EXISTS pg_realtime;
\ir supabase_auth.sql
CREATE TABLE join_members (user_id uuid, room text, PRIMARY KEY (user_id, room));
INSERT INTO join_members
SELECT format('%s-0000-4000-8000-%s', lpad(to_hex(u), 8, '0'), lpad(to_hex(u), 12, '0'))::uuid, 'room:' || ((u - 1) % 1000)
FROM generate_series(1, 100000) u;
ANALYZE join_members;
GRANT SELECT ON join_members TO authenticated;
CREATE POLICY join_read ON realtime.messages FOR SELECT TO authenticated
    USING (EXISTS (SELECT 1 FROM join_members m WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic())));
