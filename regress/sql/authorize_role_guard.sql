-- Fixed bug: a JWT whose `role` named a superuser (postgres) made realtime.authorize run the
-- probe as that superuser, and every private topic opened. As PostgREST's authenticator, the
-- sidecar may act only as roles granted to its login role (session_user, not the function's
-- owner), never as a superuser; anything else is a "no" whose error names the role.
CREATE ROLE guard_sidecar LOGIN;
GRANT USAGE ON SCHEMA realtime TO guard_sidecar;
GRANT EXECUTE ON FUNCTION realtime.authorize(text[], text[], text[], text[], text[], text[]) TO guard_sidecar;
GRANT authenticated TO guard_sidecar;
-- A role reached through a chain of grants counts (guard_sidecar -> authenticated -> guard_team).
CREATE ROLE guard_team NOLOGIN;
GRANT guard_team TO authenticated;
GRANT USAGE ON SCHEMA realtime TO guard_team;
GRANT SELECT, INSERT ON realtime.messages TO guard_team;
CREATE POLICY guard_team_read ON realtime.messages FOR SELECT TO guard_team USING ((SELECT realtime.topic()) = 'team-room');
CREATE POLICY guard_open_read ON realtime.messages FOR SELECT USING ((SELECT realtime.topic()) = 'open-to-all');
-- A superuser role is refused even when it was granted.
CREATE ROLE guard_admin NOLOGIN SUPERUSER;
GRANT guard_admin TO guard_sidecar;

SET SESSION AUTHORIZATION guard_sidecar;
SELECT session_user, current_user;
SELECT v.ordinality, r.role, r.topic, v.allowed, v.error
FROM (VALUES (1, 'authenticated', 'open-to-all'), (2, 'postgres', 'room:1'), (3, 'guard_admin', 'room:1'),
             (4, 'anon', 'lobby'), (5, 'service_role', 'room:2'), (6, 'guard_team', 'team-room'),
             (7, 'guard_team', 'room:1'), (8, 'postgres', 'open-to-all')) AS r(i, role, topic),
     LATERAL (SELECT array_agg(role ORDER BY i) AS roles, array_agg(topic ORDER BY i) AS topics
              FROM (VALUES (1, 'authenticated', 'open-to-all'), (2, 'postgres', 'room:1'), (3, 'guard_admin', 'room:1'),
                           (4, 'anon', 'lobby'), (5, 'service_role', 'room:2'), (6, 'guard_team', 'team-room'),
                           (7, 'guard_team', 'room:1'), (8, 'postgres', 'open-to-all')) x(i, role, topic)) a,
     realtime.authorize(a.roles, array_fill('{"sub": "11111111-1111-4111-8111-111111111111"}'::text, ARRAY[8]),
                        array_fill('{}'::text, ARRAY[8]), a.topics, array_fill('broadcast'::text, ARRAY[8]),
                        array_fill('read'::text, ARRAY[8])) v
WHERE v.ordinality = r.i ORDER BY v.ordinality;
-- Writes follow the same rule.
SELECT allowed, error FROM realtime.authorize(ARRAY['postgres'], ARRAY['{}'], ARRAY['{}'], ARRAY['room:1'],
                                              ARRAY['broadcast'], ARRAY['write']);
RESET SESSION AUTHORIZATION;

-- A superuser login gets no shortcut: it too acts only as roles granted to it.
SELECT rolsuper FROM pg_roles WHERE rolname = session_user;
SELECT allowed, error FROM realtime.authorize(ARRAY['postgres', 'guard_team'], ARRAY['{}', '{}'], ARRAY['{}', '{}'],
                                              ARRAY['open-to-all', 'team-room'], ARRAY['broadcast', 'broadcast'],
                                              ARRAY['read', 'read']) ORDER BY ordinality;

DROP POLICY guard_team_read ON realtime.messages;
DROP POLICY guard_open_read ON realtime.messages;
