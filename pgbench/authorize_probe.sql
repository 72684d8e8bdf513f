-- Supabase's per-join read probe, one transaction per verdict (reference: supabase-realtime
-- section 2.2): insert the probe row as admin, set role and claims, select it back under RLS,
-- roll back.
\set u random(1, 10000)
\set r random(0, 999)
BEGIN;
INSERT INTO realtime.messages (topic, extension, id) VALUES ('room:' || :r, 'broadcast', md5(:u::text || ':' || :r)::uuid);
SELECT set_config('role', 'authenticated', true), set_config('realtime.topic', 'room:' || :r, true),
       set_config('request.jwt.claims', format('{"sub": "%s", "role": "authenticated"}', md5(:u::text)::uuid), true),
       set_config('request.jwt.claim.sub', md5(:u::text)::uuid::text, true),
       set_config('request.jwt.claim.role', 'authenticated', true), set_config('request.headers', '{}', true);
SELECT id FROM realtime.messages WHERE id = md5(:u::text || ':' || :r)::uuid;
ROLLBACK;
