-- The Postgres Changes RLS benchmark (visible.py): a chat table whose policy admits members
-- of a message's room through auth.uid(); 1,000 users, 100 per room (10 rooms); 100 changed
-- rows spread over the rooms.
CREATE EXTENSION IF NOT EXISTS pg_realtime;
\ir supabase_auth.sql
CREATE TABLE vis_members (user_id uuid, room int, PRIMARY KEY (user_id, room));
INSERT INTO vis_members SELECT md5(u::text)::uuid, u % 10 FROM generate_series(1, 1000) u;
CREATE TABLE vis_messages (id bigint PRIMARY KEY, room int, body text);
INSERT INTO vis_messages SELECT i, i % 10, 'a message body of a typical chat line' FROM generate_series(1, 100) i;
ANALYZE vis_members, vis_messages;
ALTER TABLE vis_messages ENABLE ROW LEVEL SECURITY;
GRANT SELECT ON vis_members, vis_messages TO authenticated;
CREATE POLICY members_read ON vis_messages FOR SELECT TO authenticated
    USING (EXISTS (SELECT 1 FROM vis_members m WHERE m.user_id = auth.uid() AND m.room = vis_messages.room));
-- The batched call's arguments: every user, every changed row (as the drain renders them).
CREATE TABLE vis_batch AS
SELECT (SELECT array_agg('authenticated'::text) FROM generate_series(1, 1000)) AS roles,
       (SELECT array_agg(format('{"sub": "%s", "role": "authenticated"}', md5(u::text)::uuid) ORDER BY u)
        FROM generate_series(1, 1000) u) AS claims,
       (SELECT array_agg(row_to_json(m)::text ORDER BY id) FROM vis_messages m) AS records,
       -- The pairs a filter on the room lets through: each user, its room's rows (10 of 100).
       (SELECT array_agg(x ORDER BY u, m.id, k) FROM generate_series(1, 1000) u
        JOIN vis_messages m ON m.room = u % 10, LATERAL unnest(ARRAY[u, m.id::int]) WITH ORDINALITY AS p(x, k)) AS asked;
-- Supabase's algorithm (reference: supabase-realtime section 6.2): per change, per
-- subscriber, as that subscriber's role with its claims, a primary-key lookup under RLS.
CREATE FUNCTION supabase_visible(p_sub uuid, p_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    seen boolean;
BEGIN
    PERFORM set_config('role', 'authenticated', true),
            set_config('request.jwt.claims', format('{"sub": "%s", "role": "authenticated"}', p_sub), true),
            set_config('request.jwt.claim.sub', p_sub::text, true);
    seen := EXISTS (SELECT 1 FROM vis_messages WHERE id = p_id);
    PERFORM set_config('role', 'none', true);
    RETURN seen;
END
$$;
