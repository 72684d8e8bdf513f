-- The soak (soak.py): what the attackers of pgbench/loadgen/src/bin/attackers.rs aim at,
-- beside changes_setup.sql's table of the ordinary Postgres Changes subscribers.
-- Supabase's anon role, which the anonymous attackers' bindings are checked as.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'anon') THEN
        CREATE ROLE anon NOLOGIN;
    END IF;
END
$$;
GRANT anon TO CURRENT_USER;
GRANT SELECT ON bench_changes TO anon;
-- The bulk writer's table: published, with a SELECT policy that costs about 2 ms a row.
CREATE FUNCTION soak_slow_visible() RETURNS boolean LANGUAGE sql VOLATILE AS
    $$ SELECT pg_sleep(0.002) IS NOT NULL $$;
CREATE TABLE soak_costly (id bigserial PRIMARY KEY, n int NOT NULL);
ALTER TABLE soak_costly ENABLE ROW LEVEL SECURITY;
GRANT SELECT ON soak_costly TO authenticated;
CREATE POLICY slow_read ON soak_costly FOR SELECT TO authenticated USING (soak_slow_visible());
ALTER PUBLICATION supabase_realtime ADD TABLE soak_costly;
-- The persisting user may read and write its private topics (a prefix, as apps write
-- 'room:' || auth.uid() || '%').
CREATE POLICY soak_persist_read ON realtime.messages FOR SELECT TO authenticated
    USING ((SELECT realtime.topic()) LIKE 'soak-persist-%');
CREATE POLICY soak_persist_write ON realtime.messages FOR INSERT TO authenticated
    WITH CHECK ((SELECT realtime.topic()) LIKE 'soak-persist-%');
-- A long retained history for the resumes from seq 0: 20,000 messages of about 1 KB.
SELECT realtime.send(jsonb_build_object('i', g, 'pad', repeat('h', 1000)), 'h', 'soak-history', false)
FROM generate_series(1, 20000) g;
-- The slow resumer of large messages (issue 39, H2): 200 retained messages of about 100 KB.
SELECT realtime.send(jsonb_build_object('i', g, 'pad', repeat('L', 100000)), 'h', 'soak-history-large', false)
FROM generate_series(1, 200) g;
-- The decode flood (issue 39, H4): one row whose 100 KB value compresses to a fraction of
-- that and is captured whole by every UPDATE, published, readable by anon.
CREATE TABLE soak_wide (id int PRIMARY KEY, n int NOT NULL, body text);
GRANT SELECT ON soak_wide TO anon;
ALTER PUBLICATION supabase_realtime ADD TABLE soak_wide;
INSERT INTO soak_wide VALUES (1, 0, repeat('w', 100000));
