-- realtime.visible(entity, roles, claims, records): which changed rows each subscriber
-- identity may see under the table's RLS, one query per identity for all the records, as
-- Supabase's apply_rls decides it with one primary-key lookup per subscriber per change.
-- Uses the roles and auth helpers of authorize.sql and pick() of authorize_property.sql.
CREATE TABLE vis_members (user_id uuid, room int);
CREATE TABLE vis_items (room int, id int, body text, hidden boolean, owner uuid, PRIMARY KEY (room, id));
ALTER TABLE vis_items ENABLE ROW LEVEL SECURITY;
GRANT SELECT ON vis_items, vis_members TO authenticated, anon;
INSERT INTO vis_members VALUES ('11111111-1111-4111-8111-111111111111', 1),
                               ('22222222-2222-4222-8222-222222222222', 2);
INSERT INTO vis_items VALUES (1, 1, 'one', false, NULL), (1, 2, 'two', true, NULL),
                             (2, 1, 'three', false, '22222222-2222-4222-8222-222222222222');
CREATE POLICY members ON vis_items FOR SELECT TO authenticated
    USING (EXISTS (SELECT 1 FROM vis_members m WHERE m.user_id = auth.uid() AND m.room = vis_items.room));
CREATE POLICY not_hidden ON vis_items AS RESTRICTIVE FOR SELECT TO authenticated USING (NOT hidden);

-- Member of room 1, member of room 2, anon (no policy: nothing), a role without SELECT.
SELECT v.identity, v.record, v.error
FROM realtime.visible('vis_items',
    ARRAY['authenticated', 'authenticated', 'anon', 'outsider'],
    ARRAY['{"sub": "11111111-1111-4111-8111-111111111111"}', '{"sub": "22222222-2222-4222-8222-222222222222"}', '{}', '{}'],
    ARRAY['{"room": 1, "id": 1, "body": "one"}', '{"room": 1, "id": 2}', '{"room": 2, "id": 1}',
          '{"room": 9, "id": 9}']) v
ORDER BY 1, 2;

-- Regression (a composite primary key read as its first column): rows are matched by the
-- whole key, so (1, 2) is not visible just because (1, 1) is.
SELECT v.record FROM realtime.visible('vis_items', ARRAY['authenticated'],
    ARRAY['{"sub": "11111111-1111-4111-8111-111111111111"}'],
    ARRAY['{"room": 1, "id": 2}', '{"room": 1, "id": 7}', '{"room": 1, "id": 1}']) v;

-- A policy that raises fails its identity only; a superuser or unknown role is refused by
-- the role guard; a table without a primary key is Supabase's 400.
CREATE FUNCTION vis_explode(room int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('request.jwt.claims', true)::jsonb ->> 'boom' = 'yes' THEN
        RAISE EXCEPTION 'policy exploded in room %', room;
    END IF;
    RETURN true;
END
$$;
CREATE POLICY explosive ON vis_items AS RESTRICTIVE FOR SELECT TO authenticated USING (vis_explode(room));
SELECT v.identity, v.record, v.error
FROM realtime.visible('vis_items', ARRAY['authenticated', 'authenticated', 'postgres', 'nobody'],
    ARRAY['{"sub": "11111111-1111-4111-8111-111111111111", "boom": "yes"}', '{"sub": "11111111-1111-4111-8111-111111111111"}', '{}', '{}'],
    ARRAY['{"room": 1, "id": 1}']) v
ORDER BY 1, 2;
DROP POLICY explosive ON vis_items;
CREATE TABLE vis_no_pk (a int);
SELECT * FROM realtime.visible('vis_no_pk', ARRAY['anon'], ARRAY['{}'], ARRAY['{"a": 1}']);

-- realtime.selectable: the columns each role may SELECT (the others are left out of the
-- record it receives); a role that may not select the primary key is Supabase's 401.
CREATE TABLE vis_cols (id int PRIMARY KEY, "Note" text, secret text);
GRANT SELECT (id, "Note") ON vis_cols TO authenticated;
GRANT SELECT ("Note") ON vis_cols TO anon;
SELECT * FROM realtime.selectable('vis_cols', ARRAY['authenticated', 'anon', 'service_role', 'postgres']);
SELECT * FROM realtime.selectable('vis_no_pk', ARRAY['anon']);
SELECT has_function_privilege('public', 'realtime.selectable(regclass,text[])', 'EXECUTE') AS public_can_call;
-- A key column whose name needs quotes is matched.
CREATE TABLE vis_quoted ("Key" int PRIMARY KEY);
GRANT SELECT ON vis_quoted TO anon;
INSERT INTO vis_quoted VALUES (1);
SELECT v.record FROM realtime.visible('vis_quoted', ARRAY['anon'], ARRAY['{}'], ARRAY['{"Key": 1}', '{"Key": 2}']) v;

-- Asked only some pairs (those the subscribers' filters let through): each identity is
-- asked about its records alone, and an identity asked nothing is not asked at all.
SELECT v.identity, v.record, v.error
FROM realtime.visible('vis_items', ARRAY['authenticated', 'authenticated', 'nobody'],
    ARRAY['{"sub": "11111111-1111-4111-8111-111111111111"}', '{"sub": "22222222-2222-4222-8222-222222222222"}', '{}'],
    ARRAY['{"room": 1, "id": 1}', '{"room": 2, "id": 1}'], ARRAY[1, 2, 2, 2, 2, 1]) v
ORDER BY 1, 2;
SELECT * FROM realtime.visible('vis_items', ARRAY['anon'], ARRAY['{}'], ARRAY['{"room": 1, "id": 1}'], ARRAY[1]);
SELECT * FROM realtime.visible('vis_items', ARRAY['anon'], ARRAY['{}'], ARRAY['{"room": 1, "id": 1}'], ARRAY[1, 2]);

-- Nothing survives the call; only the sidecar's role may call it; bad calls are refused.
SELECT current_user = session_user AS same_user, coalesce(current_setting('request.jwt.claims', true), '') = '' AS no_claims;
SELECT has_function_privilege('public', 'realtime.visible(regclass,text[],text[],text[],integer[])', 'EXECUTE') AS public_can_call;
SELECT * FROM realtime.visible('vis_items', ARRAY['anon', 'anon'], ARRAY['{}'], ARRAY['{}']);
SELECT * FROM realtime.visible('vis_items', ARRAY[NULL], ARRAY['{}'], ARRAY['{}']);

-- Property test: random policy sets, identities and changed rows; every answer of the
-- batched call must equal Supabase's algorithm run as plain SQL, one primary-key lookup per
-- (identity, row) under that identity. 50 rounds of 10 identities x 20 rows, asked whole
-- and asked a random half of the pairs: 20,000 draws.
-- Seeded, so a failure reproduces.
CREATE FUNCTION vis_supabase_probe(p_role text, p_claims text, p_room int, p_id int)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    verdict boolean;
BEGIN
    BEGIN
        PERFORM set_config('role', p_role, true), set_config('request.jwt.claims', p_claims, true),
                set_config('request.jwt.claim.sub', coalesce(p_claims::jsonb ->> 'sub', ''), true),
                set_config('request.jwt.claim.role', p_role, true), set_config('request.headers', '{}', true);
        verdict := EXISTS (SELECT 1 FROM vis_items WHERE room = p_room AND id = p_id);
        RAISE EXCEPTION USING ERRCODE = 'P0004', MESSAGE = verdict::text;
    EXCEPTION
        WHEN SQLSTATE 'P0004' THEN RETURN SQLERRM::boolean;
        WHEN OTHERS THEN RETURN false;
    END;
END
$$;
CREATE FUNCTION vis_policies(round int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    p record;
    n int := 0;
    templates text[] := ARRAY[
        'FOR SELECT TO authenticated USING (EXISTS (SELECT 1 FROM vis_members m WHERE m.user_id = auth.uid() AND m.room = vis_items.room))',
        'FOR SELECT TO authenticated USING (owner = auth.uid())',
        'FOR SELECT TO anon USING (room = %s)',
        'AS RESTRICTIVE FOR SELECT TO authenticated USING (NOT hidden)',
        'FOR SELECT TO authenticated USING (auth.jwt() ->> ''tier'' = %L)',
        'AS RESTRICTIVE FOR SELECT TO authenticated, anon USING (id <> %s)',
        'AS RESTRICTIVE FOR SELECT TO authenticated USING (vis_explode(room))',
        'FOR ALL TO authenticated USING (room > %s)'];
    params text[] := ARRAY['1', '2', '3', 'gold', 'silver'];
BEGIN
    FOR p IN SELECT policyname FROM pg_policies WHERE tablename = 'vis_items' LOOP
        EXECUTE format('DROP POLICY %I ON vis_items', p.policyname);
    END LOOP;
    FOR t IN 1..array_length(templates, 1) LOOP
        IF random() < 0.5 THEN
            EXECUTE format('CREATE POLICY %I ON vis_items ', 'v' || round || '_' || t)
                 || format(templates[t], CASE WHEN position('%L' in templates[t]) > 0 THEN pick(params[4:5])
                                              ELSE pick(params[1:3]) END);
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;
SELECT setseed(0.5151);
CREATE TEMP TABLE vis_who (i int, role text, claims text);
CREATE TEMP TABLE vis_rows (j int, room int, id int);
CREATE TEMP TABLE vis_asked (i int, j int);
CREATE TEMP TABLE vis_got (how text, identity int, record int);
CREATE TEMP TABLE vis_results (round int, policies int, draws int, visible int, mismatches int);
DO $$
DECLARE
    policies int;
BEGIN
    FOR round IN 1..50 LOOP
        policies := vis_policies(round);
        DELETE FROM vis_members;
        INSERT INTO vis_members
        SELECT format('%s1111111-1111-4111-8111-111111111111', u)::uuid, 1 + floor(random() * 3)::int
        FROM generate_series(1, 5) u, generate_series(1, 2) k;
        DELETE FROM vis_items;
        INSERT INTO vis_items
        SELECT r, i, 'body', random() < 0.3,
               format('%s1111111-1111-4111-8111-111111111111', 1 + floor(random() * 6)::int)::uuid
        FROM generate_series(1, 3) r, generate_series(1, 6) i WHERE random() < 0.8;
        DELETE FROM vis_who;
        INSERT INTO vis_who
        SELECT i, r.role,
               json_build_object('role', r.role, 'sub', format('%s1111111-1111-4111-8111-111111111111', 1 + floor(random() * 6)::int),
                                 'tier', pick(ARRAY['gold', 'silver']),
                                 'boom', CASE WHEN random() < 0.1 THEN 'yes' ELSE 'no' END)::text
        FROM generate_series(1, 10) i,
             LATERAL (SELECT pick(ARRAY['authenticated', 'authenticated', 'authenticated', 'anon', 'service_role', 'outsider']) || '' AS role
                      WHERE i > 0) r;
        DELETE FROM vis_rows;
        INSERT INTO vis_rows SELECT j, 1 + floor(random() * 3)::int, 1 + floor(random() * 7)::int
        FROM generate_series(1, 20) j;
        DELETE FROM vis_asked;
        INSERT INTO vis_asked SELECT w.i, r.j FROM vis_who w, vis_rows r WHERE random() < 0.5;
        -- Each call's answers are kept first: joined in place, the planner called it again
        -- for every (identity, row) it compared, which was most of the test's time.
        DELETE FROM vis_got;
        INSERT INTO vis_got SELECT 'asked', v.identity, v.record
        FROM (SELECT array_agg(role ORDER BY i) AS roles, array_agg(claims ORDER BY i) AS claims FROM vis_who) a,
             (SELECT array_agg(json_build_object('room', room, 'id', id, 'body', 'x')::text ORDER BY j) AS recs FROM vis_rows) b,
             (SELECT coalesce(array_agg(x ORDER BY q.i, q.j, u.n), '{}') AS pairs
              FROM vis_asked q, LATERAL unnest(ARRAY[q.i, q.j]) WITH ORDINALITY AS u(x, n)) c,
             realtime.visible('vis_items', a.roles, a.claims, b.recs, c.pairs) v
        WHERE v.record IS NOT NULL;
        INSERT INTO vis_got SELECT 'whole', v.identity, v.record
        FROM (SELECT array_agg(role ORDER BY i) AS roles, array_agg(claims ORDER BY i) AS claims FROM vis_who) a,
             (SELECT array_agg(json_build_object('room', room, 'id', id, 'body', 'x')::text ORDER BY j) AS recs FROM vis_rows) b,
             realtime.visible('vis_items', a.roles, a.claims, b.recs) v
        WHERE v.record IS NOT NULL;
        INSERT INTO vis_results
        SELECT round, policies, count(*), count(*) FILTER (WHERE v.identity IS NOT NULL),
               count(*) FILTER (WHERE (q.i IS NOT NULL AND vis_supabase_probe(w.role, w.claims, r.room, r.id))
                                      IS DISTINCT FROM (v.identity IS NOT NULL))
        FROM vis_who w CROSS JOIN vis_rows r
        LEFT JOIN vis_asked q ON q.i = w.i AND q.j = r.j
        LEFT JOIN vis_got v ON v.how = 'asked' AND v.identity = w.i AND v.record = r.j;
        INSERT INTO vis_results
        SELECT round, policies, count(*), count(*) FILTER (WHERE v.identity IS NOT NULL),
               count(*) FILTER (WHERE vis_supabase_probe(w.role, w.claims, r.room, r.id) IS DISTINCT FROM (v.identity IS NOT NULL))
        FROM vis_who w CROSS JOIN vis_rows r
        LEFT JOIN vis_got v ON v.how = 'whole' AND v.identity = w.i AND v.record = r.j;
    END LOOP;
END
$$;
-- The draws cover visible and hidden rows alike, so agreement is not vacuous.
SELECT sum(draws) AS draws, sum(mismatches) AS mismatches, count(DISTINCT round) AS rounds,
       sum(visible) BETWEEN 2000 AND 18000 AS mixed_answers,
       min(policies) AS fewest_policies, max(policies) AS most_policies FROM vis_results;

DROP TABLE vis_items, vis_members, vis_no_pk, vis_cols, vis_quoted;
