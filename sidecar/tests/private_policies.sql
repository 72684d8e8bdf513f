-- Test fixture for private channels, shared by the Rust and realtime-js end-to-end tests:
-- the authenticated role, Supabase's auth.uid(), a membership table and RLS policies as
-- Supabase's docs write them (members read their rooms; those with can_write also send).
-- Idempotent; the tests add their own memberships.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'authenticated') THEN
        CREATE ROLE authenticated NOLOGIN;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA realtime TO authenticated;
GRANT SELECT, INSERT ON realtime.messages TO authenticated;
CREATE SCHEMA IF NOT EXISTS auth;
GRANT USAGE ON SCHEMA auth TO authenticated;
CREATE OR REPLACE FUNCTION auth.uid() RETURNS uuid LANGUAGE sql STABLE AS $f$
    SELECT nullif(coalesce(current_setting('request.jwt.claim.sub', true),
                           current_setting('request.jwt.claims', true)::jsonb ->> 'sub'), '')::uuid $f$;
CREATE TABLE IF NOT EXISTS private_members (user_id uuid, room text, can_write boolean);
GRANT SELECT ON private_members TO authenticated;
DROP POLICY IF EXISTS members_read ON realtime.messages;
DROP POLICY IF EXISTS members_write ON realtime.messages;
CREATE POLICY members_read ON realtime.messages FOR SELECT TO authenticated
    USING (EXISTS (SELECT 1 FROM private_members m WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic())));
CREATE POLICY members_write ON realtime.messages FOR INSERT TO authenticated
    WITH CHECK (EXISTS (SELECT 1 FROM private_members m
                        WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic()) AND m.can_write));
