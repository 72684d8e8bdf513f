-- Regression (a batched function defined with SET search_path returned one row per call,
-- so its setting was applied and undone around every row: 17% of a 10,000-row
-- realtime.visible call): realtime.visible, realtime.authorize and realtime.match_patterns
-- now return their rows in one call (materialize mode). Wherever a set-returning function
-- may be called, they return the same rows, whole, as before. Uses the roles and auth
-- helpers of authorize.sql.
CREATE TABLE rr_items (room int, id int, PRIMARY KEY (room, id));
ALTER TABLE rr_items ENABLE ROW LEVEL SECURITY;
GRANT SELECT ON rr_items TO authenticated;
INSERT INTO rr_items VALUES (1, 1), (2, 1);
CREATE POLICY own_room ON rr_items FOR SELECT TO authenticated
    USING (room = (auth.jwt() ->> 'room')::int);

-- In FROM and in the select list, the same rows.
SELECT v.identity, v.record, v.error FROM realtime.visible('rr_items',
    ARRAY['authenticated', 'authenticated', 'nobody'],
    ARRAY['{"room": 1}', '{"room": 2}', '{}'],
    ARRAY['{"room": 1, "id": 1}', '{"room": 2, "id": 1}']) v ORDER BY 1, 2;
SELECT realtime.visible('rr_items',
    ARRAY['authenticated', 'authenticated', 'nobody'],
    ARRAY['{"room": 1}', '{"room": 2}', '{}'],
    ARRAY['{"room": 1, "id": 1}', '{"room": 2, "id": 1}']) AS v ORDER BY 1;
SELECT realtime.authorize(ARRAY['anon', 'anon'], ARRAY['{}', '{}'], ARRAY['{}', '{}'], ARRAY['t', 't'],
    ARRAY['broadcast', 'presence'], ARRAY['read', 'read']) AS verdict;
SELECT realtime.match_patterns(ARRAY['^a', 'b$'], ARRAY['match', 'match'], ARRAY['ab', 'ba']) AS m ORDER BY 1;

-- Called again for each outer row (a lateral call is rescanned): each call's own rows.
SELECT n, m.pattern, m.subject, m.matched
FROM generate_series(1, 3) n,
     LATERAL realtime.match_patterns(ARRAY['^' || n], ARRAY['match'], ARRAY['1', '2', '3']) m
WHERE m.matched ORDER BY n;

-- A LIMIT takes the first rows; the rest are not asked for.
SELECT count(*) FROM (SELECT * FROM realtime.match_patterns(ARRAY['^a'], ARRAY['match'],
    ARRAY['a', 'b', 'c']) LIMIT 2) l;

-- More rows than work_mem holds spill to disk and come back whole and in order: 200
-- patterns x 200 subjects, 40,000 rows.
SET work_mem = '64kB';
SELECT count(*) AS rows, count(*) FILTER (WHERE matched) AS matched,
       bool_and(pattern = (n - 1) / 200 + 1 AND subject = (n - 1) % 200 + 1) AS in_order
FROM (SELECT m.*, row_number() OVER () AS n
      FROM realtime.match_patterns(
          (SELECT array_agg('^' || i || '$') FROM generate_series(1, 200) i),
          array_fill('match'::text, ARRAY[200]),
          (SELECT array_agg(i::text) FROM generate_series(1, 200) i)) m) r;
RESET work_mem;

-- A call refused for its arguments ends as any statement's error does, and the next call works.
SELECT * FROM realtime.visible('rr_items', ARRAY['authenticated'], ARRAY['{}', '{}'], ARRAY['{}']);
SELECT count(*) FROM realtime.visible('rr_items', ARRAY['authenticated'],
    ARRAY['{"room": 1}'], ARRAY['{"room": 1, "id": 1}']);
DROP TABLE rr_items;
