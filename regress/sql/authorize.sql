-- realtime.authorize: Supabase's per-join RLS probe, for many requests in one call. Read =
-- a realtime.messages row with that topic and extension is visible to SELECT under RLS;
-- write = inserting one passes RLS WITH CHECK; evaluated as the JWT's role with its claims.
CREATE ROLE anon NOLOGIN;
CREATE ROLE authenticated NOLOGIN;
CREATE ROLE service_role NOLOGIN BYPASSRLS;
CREATE ROLE outsider NOLOGIN;
GRANT USAGE ON SCHEMA realtime TO anon, authenticated, service_role;
GRANT SELECT, INSERT ON realtime.messages TO anon, authenticated, service_role;
-- The sidecar may act only as roles granted to its login role (authorize_role_guard.sql): in
-- these tests that login role is the session's own.
GRANT anon, authenticated, service_role, outsider TO CURRENT_USER;

-- Supabase's auth helpers, which policies copied from its docs call.
CREATE SCHEMA auth;
GRANT USAGE ON SCHEMA auth TO anon, authenticated, service_role;
CREATE FUNCTION auth.uid() RETURNS uuid LANGUAGE sql STABLE AS $$
    SELECT nullif(coalesce(current_setting('request.jwt.claim.sub', true),
                           current_setting('request.jwt.claims', true)::jsonb ->> 'sub'), '')::uuid $$;
CREATE FUNCTION auth.jwt() RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('request.jwt.claim', true), ''),
                    nullif(current_setting('request.jwt.claims', true), ''))::jsonb $$;

CREATE TABLE room_members (user_id uuid, room text);
GRANT SELECT ON room_members TO authenticated;
INSERT INTO room_members VALUES
    ('11111111-1111-4111-8111-111111111111', 'room:1'),
    ('11111111-1111-4111-8111-111111111111', 'room:banned'),
    ('11111111-1111-4111-8111-111111111111', 'room:boom'),
    ('22222222-2222-4222-8222-222222222222', 'room:2');

-- Policies as Supabase's docs write them.
CREATE POLICY members_read ON realtime.messages FOR SELECT TO authenticated
    USING (EXISTS (SELECT 1 FROM room_members m WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic()))
           AND realtime.messages.extension IN ('broadcast', 'presence'));
CREATE POLICY members_write ON realtime.messages FOR INSERT TO authenticated
    WITH CHECK (EXISTS (SELECT 1 FROM room_members m WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic()))
                AND realtime.messages.extension = 'broadcast');
CREATE POLICY lobby_read ON realtime.messages FOR SELECT TO anon USING ((SELECT realtime.topic()) = 'lobby');
CREATE POLICY vip_claim ON realtime.messages FOR SELECT TO authenticated
    USING ((SELECT realtime.topic()) = 'vip' AND auth.jwt() ->> 'tier' = 'gold');
CREATE POLICY not_banned ON realtime.messages AS RESTRICTIVE FOR SELECT TO authenticated
    USING ((SELECT realtime.topic()) <> 'room:banned');
CREATE FUNCTION explode(topic text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF topic = 'room:boom' THEN
        RAISE EXCEPTION 'policy exploded on %', topic;
    END IF;
    RETURN true;
END
$$;
CREATE POLICY explosive ON realtime.messages AS RESTRICTIVE FOR SELECT TO authenticated
    USING (explode((SELECT realtime.topic())));

-- One mixed batch: allowed, denied and erroring requests each get their own verdict (the
-- error among user 1111's reads makes that identity's reads run again one by one).
CREATE TEMP TABLE asks (i serial, role text, claims text, topic text, extension text, action text);
INSERT INTO asks (role, claims, topic, extension, action) VALUES
    ('authenticated', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', 'room:1', 'broadcast', 'read'),
    ('authenticated', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', 'room:2', 'broadcast', 'read'),
    ('authenticated', '{"sub": "22222222-2222-4222-8222-222222222222", "role": "authenticated"}', 'room:2', 'broadcast', 'read'),
    ('authenticated', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', 'room:1', 'presence', 'read'),
    ('authenticated', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', 'room:1', 'broadcast', 'write'),
    ('authenticated', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', 'room:1', 'presence', 'write'),
    ('authenticated', '{"sub": "22222222-2222-4222-8222-222222222222", "role": "authenticated"}', 'room:1', 'broadcast', 'write'),
    ('authenticated', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', 'room:banned', 'broadcast', 'read'),
    ('authenticated', '{"sub": "11111111-1111-4111-8111-111111111111", "role": "authenticated"}', 'room:boom', 'broadcast', 'read'),
    ('authenticated', '{"sub": "33333333-3333-4333-8333-333333333333", "role": "authenticated", "tier": "gold"}', 'vip', 'broadcast', 'read'),
    ('authenticated', '{"sub": "33333333-3333-4333-8333-333333333333", "role": "authenticated", "tier": "tin"}', 'vip', 'broadcast', 'read'),
    ('anon', '{"role": "anon"}', 'lobby', 'broadcast', 'read'),
    ('anon', '{"role": "anon"}', 'room:1', 'broadcast', 'read'),
    ('anon', '{"role": "anon"}', 'lobby', 'broadcast', 'write'),
    ('service_role', '{"role": "service_role"}', 'room:2', 'broadcast', 'read'),
    ('outsider', '{"role": "outsider"}', 'lobby', 'broadcast', 'read'),
    ('nobody', '{"role": "nobody"}', 'lobby', 'broadcast', 'read');
CREATE TEMP VIEW ask_arrays AS
SELECT array_agg(role ORDER BY i) AS roles, array_agg(claims ORDER BY i) AS claims,
       array_agg('{}'::text ORDER BY i) AS headers, array_agg(topic ORDER BY i) AS topics,
       array_agg(extension ORDER BY i) AS extensions, array_agg(action ORDER BY i) AS actions
FROM asks;
SELECT a.i, a.role, a.claims::jsonb ->> 'sub' AS sub, a.topic, a.extension, a.action, v.allowed, v.error
FROM ask_arrays x, realtime.authorize(x.roles, x.claims, x.headers, x.topics, x.extensions, x.actions) v
JOIN asks a ON a.i = v.ordinality ORDER BY a.i;

-- The same verdicts as Supabase's probe, run request by request as plain SQL (a rolled-back
-- block per request: probe row as admin, set_config of role and claims, select or insert).
-- authorize_property.sql uses this function too.
CREATE FUNCTION supabase_probe(p_role text, p_claims text, p_headers text, p_topic text, p_ext text, p_action text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    probe uuid := gen_random_uuid();
    verdict boolean;
BEGIN
    BEGIN
        INSERT INTO realtime.messages (topic, extension, id) VALUES (p_topic, p_ext, probe);
        PERFORM set_config('role', p_role, true), set_config('realtime.topic', p_topic, true),
                set_config('request.jwt.claims', p_claims, true),
                set_config('request.jwt.claim.sub', coalesce(p_claims::jsonb ->> 'sub', ''), true),
                set_config('request.jwt.claim.role', p_role, true), set_config('request.headers', p_headers, true);
        IF p_action = 'read' THEN
            verdict := EXISTS (SELECT 1 FROM realtime.messages WHERE id = probe);
        ELSE
            INSERT INTO realtime.messages (topic, extension) VALUES (p_topic, p_ext);
            verdict := true;
        END IF;
        -- Leave through the exception handler so that everything above is rolled back.
        RAISE EXCEPTION USING ERRCODE = 'P0004', MESSAGE = verdict::text;
    EXCEPTION
        WHEN SQLSTATE 'P0004' THEN RETURN SQLERRM::boolean;
        WHEN OTHERS THEN RETURN false;
    END;
END
$$;
SELECT count(*) AS requests,
       count(*) FILTER (WHERE supabase_probe(a.role, a.claims, '{}', a.topic, a.extension, a.action) IS DISTINCT FROM v.allowed) AS mismatches
FROM ask_arrays x, realtime.authorize(x.roles, x.claims, x.headers, x.topics, x.extensions, x.actions) v
JOIN asks a ON a.i = v.ordinality;

-- Nothing survives the call: no row, no role, no setting.
SELECT current_user = session_user AS same_user, current_setting('request.jwt.claims', true) IS NULL AS no_claims,
       realtime.topic() IS NULL AS no_topic, (SELECT count(*) FROM realtime.messages) AS rows_left;

-- Bad calls are refused as a whole.
SELECT * FROM realtime.authorize(ARRAY['anon'], ARRAY['{}'], ARRAY['{}'], ARRAY['t'], ARRAY['broadcast'], ARRAY['delete']);
SELECT * FROM realtime.authorize(ARRAY['anon'], ARRAY['{}'], ARRAY['{}'], ARRAY['t'], ARRAY['chat'], ARRAY['read']);
SELECT * FROM realtime.authorize(ARRAY['anon', 'anon'], ARRAY['{}'], ARRAY['{}'], ARRAY['t'], ARRAY['broadcast'], ARRAY['read']);
SELECT * FROM realtime.authorize(ARRAY[NULL], ARRAY['{}'], ARRAY['{}'], ARRAY['t'], ARRAY['broadcast'], ARRAY['read']);
SELECT count(*) FROM realtime.authorize('{}', '{}', '{}', '{}', '{}', '{}');

-- Only the sidecar's role may call it.
SELECT has_function_privilege('public', 'realtime.authorize(text[],text[],text[],text[],text[],text[])', 'EXECUTE') AS public_can_authorize;

-- Later files run without these policies.
DROP POLICY members_read ON realtime.messages;
DROP POLICY members_write ON realtime.messages;
DROP POLICY lobby_read ON realtime.messages;
DROP POLICY vip_claim ON realtime.messages;
DROP POLICY not_banned ON realtime.messages;
DROP POLICY explosive ON realtime.messages;
