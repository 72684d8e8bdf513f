-- Test fixture for private channels, shared by the Rust and realtime-js end-to-end tests,
-- loaded after pgbench/supabase_auth.sql: a membership table and RLS policies as Supabase's
-- docs write them (members read their rooms; those with can_write also send). Idempotent;
-- the tests add their own memberships.
CREATE TABLE IF NOT EXISTS private_members (user_id uuid, room text, can_write boolean);
GRANT SELECT ON private_members TO authenticated;
DROP POLICY IF EXISTS members_read ON realtime.messages;
DROP POLICY IF EXISTS members_write ON realtime.messages;
CREATE POLICY members_read ON realtime.messages FOR SELECT TO authenticated
    USING (EXISTS (SELECT 1 FROM private_members m WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic())));
CREATE POLICY members_write ON realtime.messages FOR INSERT TO authenticated
    WITH CHECK (EXISTS (SELECT 1 FROM private_members m
                        WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic()) AND m.can_write));
-- A topic whose policy lets authenticated read presence only (not broadcast).
DROP POLICY IF EXISTS presence_only_read ON realtime.messages;
CREATE POLICY presence_only_read ON realtime.messages FOR SELECT TO authenticated
    USING ((SELECT realtime.topic()) = 'presence-only' AND realtime.messages.extension = 'presence');
