-- Property test: random policy sets, identities, headers and topics; every verdict of the
-- batched realtime.authorize must equal the one Supabase's per-request probe gives, run as
-- plain SQL (supabase_probe and the raising explode() come from authorize.sql). 50 rounds of
-- 200 requests: 10,000 draws. Seeded, so a failure reproduces.
CREATE ROLE prop_outsider NOLOGIN;
CREATE TABLE prop_members (user_id uuid, room text, can_write boolean);
GRANT SELECT ON prop_members TO authenticated, anon;

CREATE FUNCTION pick(options text[]) RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT options[1 + floor(random() * array_length(options, 1))::int] $$;

-- Policy templates; each round creates a random subset with random parameters.
CREATE FUNCTION prop_policies(round int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    p record;
    n int := 0;
    templates text[] := ARRAY[
        'FOR SELECT TO authenticated USING ((SELECT realtime.topic()) = %L)',
        'FOR SELECT TO authenticated USING (EXISTS (SELECT 1 FROM prop_members m WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic())))',
        'FOR SELECT TO anon USING ((SELECT realtime.topic()) LIKE %L)',
        'AS RESTRICTIVE FOR SELECT TO authenticated USING ((SELECT realtime.topic()) <> %L)',
        'FOR SELECT TO authenticated USING (auth.jwt() ->> ''tier'' = %L)',
        'AS RESTRICTIVE FOR SELECT TO authenticated, anon USING (realtime.messages.extension = %L)',
        'FOR INSERT TO authenticated WITH CHECK (EXISTS (SELECT 1 FROM prop_members m WHERE m.user_id = auth.uid() AND m.room = (SELECT realtime.topic()) AND m.can_write))',
        'FOR INSERT TO anon WITH CHECK ((SELECT realtime.topic()) LIKE %L AND realtime.messages.extension = ''broadcast'')',
        'AS RESTRICTIVE FOR ALL TO authenticated USING (explode((SELECT realtime.topic()))) WITH CHECK (explode((SELECT realtime.topic())))',
        'FOR SELECT TO authenticated USING (current_setting(''request.headers'', true)::jsonb ->> ''x-team'' = %L)',
        'FOR INSERT TO authenticated WITH CHECK (auth.jwt() ->> ''tier'' = %L AND (SELECT realtime.topic()) <> %L)',
        -- Forms whose value changes with the topic inside one executor run (rerun.rs): a
        -- direct call, an uncorrelated EXISTS (an initplan), a hashed IN whose rows
        -- depend on the topic, and a materialized CTE.
        'FOR SELECT TO authenticated USING (realtime.topic() = %L)',
        'FOR SELECT TO authenticated USING (EXISTS (SELECT 1 FROM prop_members m WHERE m.room = realtime.topic() AND m.user_id = auth.uid()))',
        'FOR SELECT TO authenticated USING (auth.uid() IN (SELECT m.user_id FROM prop_members m WHERE m.room = realtime.topic()))',
        'AS RESTRICTIVE FOR SELECT TO authenticated USING (EXISTS (WITH t AS MATERIALIZED (SELECT realtime.topic() AS topic) SELECT 1 FROM t WHERE t.topic <> %L))'];
    params text[] := ARRAY['room:1', 'room:2', 'pub:%', 'gold', 'broadcast', 'presence', 'red', 'blue', 'room:boom'];
BEGIN
    FOR p IN SELECT policyname FROM pg_policies WHERE schemaname = 'realtime' AND tablename = 'messages' LOOP
        EXECUTE format('DROP POLICY %I ON realtime.messages', p.policyname);
    END LOOP;
    FOR t IN 1..array_length(templates, 1) LOOP
        IF random() < 0.5 THEN
            EXECUTE format('CREATE POLICY %I ON realtime.messages ', 'p' || round || '_' || t)
                 || format(templates[t], pick(params), pick(params));
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;

SELECT setseed(0.4242);
CREATE TEMP TABLE prop_asks (i int, role text, claims text, headers text, topic text, extension text, action text);
CREATE TEMP TABLE prop_results (round int, policies int, draws int, allowed int, mismatches int);
DO $$
DECLARE
    policies int;
BEGIN
    FOR round IN 1..50 LOOP
        policies := prop_policies(round);
        DELETE FROM prop_members;
        INSERT INTO prop_members
        SELECT format('%s1111111-1111-4111-8111-111111111111', u)::uuid, pick(ARRAY['room:1', 'room:2', 'room:3', 'room:boom']), random() < 0.5
        FROM generate_series(1, 5) u, generate_series(1, 2) k;
        DELETE FROM prop_asks;
        INSERT INTO prop_asks
        SELECT i, r.role,
               -- Half the rounds with few users, so that each asks for many topics.
               json_build_object('role', r.role, 'sub', format('%s1111111-1111-4111-8111-111111111111',
                                                             1 + floor(random() * CASE WHEN round > 25 THEN 2 ELSE 6 END)::int),
                                 'tier', pick(ARRAY['gold', 'silver']))::text,
               json_build_object('x-team', pick(ARRAY['red', 'blue']))::text,
               pick(ARRAY['room:1', 'room:2', 'room:3', 'room:boom', 'pub:a', 'pub:b', 'elsewhere']),
               pick(ARRAY['broadcast', 'presence']), pick(ARRAY['read', 'write'])
        FROM generate_series(1, 200) i,
             LATERAL (SELECT pick(ARRAY['authenticated', 'authenticated', 'anon', 'service_role', 'prop_outsider', 'nobody']) || '' AS role
                      WHERE i > 0) r;
        INSERT INTO prop_results
        SELECT round, policies, count(*), count(*) FILTER (WHERE v.allowed),
               count(*) FILTER (WHERE supabase_probe(a.role, a.claims, a.headers, a.topic, a.extension, a.action) IS DISTINCT FROM v.allowed)
        FROM (SELECT array_agg(role ORDER BY i) AS roles, array_agg(claims ORDER BY i) AS claims,
                     array_agg(headers ORDER BY i) AS headers, array_agg(topic ORDER BY i) AS topics,
                     array_agg(extension ORDER BY i) AS extensions, array_agg(action ORDER BY i) AS actions
              FROM prop_asks) x,
             realtime.authorize(x.roles, x.claims, x.headers, x.topics, x.extensions, x.actions) v
        JOIN prop_asks a ON a.i = v.ordinality;
    END LOOP;
END
$$;
-- The draws cover allowed and denied verdicts alike, so agreement is not vacuous.
SELECT sum(draws) AS draws, sum(mismatches) AS mismatches, count(*) AS rounds,
       sum(allowed) BETWEEN 1000 AND 9000 AS mixed_verdicts,
       min(policies) AS fewest_policies, max(policies) AS most_policies FROM prop_results;

DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT policyname FROM pg_policies WHERE schemaname = 'realtime' AND tablename = 'messages' LOOP
        EXECUTE format('DROP POLICY %I ON realtime.messages', p.policyname);
    END LOOP;
END
$$;
