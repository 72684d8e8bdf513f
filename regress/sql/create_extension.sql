-- The extension installs the Supabase-compatible SQL surface in schema realtime.
CREATE EXTENSION pg_realtime;

-- It makes no publication (a restore of a dump would meet it; see sql/capture.sql): the app
-- creates supabase_realtime once, as a Supabase project has it.
SELECT count(*) AS publications FROM pg_publication;
CREATE PUBLICATION supabase_realtime;

SELECT p.oid::regprocedure AS function, p.prorettype::regtype AS returns
FROM pg_proc p WHERE p.pronamespace = 'realtime'::regnamespace ORDER BY p.proname;

SELECT pg_get_function_arguments('realtime.send'::regproc) AS send_args;
SELECT pg_get_function_arguments('realtime.send_binary'::regproc) AS send_binary_args;
SELECT pg_get_function_arguments('realtime.broadcast_changes'::regproc) AS broadcast_changes_args;

-- realtime.messages has Supabase's columns and RLS enabled; it is the policy table only.
\d realtime.messages
SELECT relrowsecurity FROM pg_class WHERE oid = 'realtime.messages'::regclass;

-- realtime.topic() reads the realtime.topic setting, as Supabase's does.
SELECT realtime.topic() IS NULL AS unset;
SET realtime.topic = 'room:1';
SELECT realtime.topic();
RESET realtime.topic;

SELECT name, setting, unit, context FROM pg_settings WHERE name LIKE 'realtime.%' ORDER BY name;

-- The consumer API is not for PUBLIC.
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_can_execute
FROM pg_proc p WHERE p.pronamespace = 'realtime'::regnamespace ORDER BY 1;

-- Test helper used by the following files: drains consumer "test", numbering messages
-- from 1 after its position (so gaplessness and order show), and confirms what it read.
-- It first waits until no other live session holds the consumer: the previous file's
-- session may still be exiting (under load, limits.sql once found it "in use").
SELECT realtime.create_consumer('test') >= 0 AS created;
CREATE FUNCTION take(timeout_ms int DEFAULT 0, max_messages int DEFAULT 10000)
RETURNS TABLE(n bigint, kind text, topic text, event text, payload jsonb, private boolean,
              id_in_payload boolean, lost bigint)
LANGUAGE plpgsql AS $$
DECLARE
    base bigint;
BEGIN
    PERFORM wait_until_released('test');
    SELECT c.confirmed_seq INTO base FROM realtime.consumers() c WHERE c.name = 'test';
    RETURN QUERY
        SELECT d.seq - base, d.kind, d.topic, d.event, d.payload::jsonb - 'id', d.private,
               d.payload::jsonb->>'id' = d.id::text, d.lost_last - d.lost_first + 1
        FROM realtime.drain('test', NULL, max_messages, timeout_ms) d;
    PERFORM realtime.confirm('test', c.last_read_seq) FROM realtime.consumers() c WHERE c.name = 'test';
END
$$;

-- Test helper: waits until the boolean SQL expression `condition` holds, checking every
-- 25 ms for at most 10 s (then false): the suite waits for conditions, never for time.
CREATE FUNCTION wait_for(condition text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    holds boolean;
BEGIN
    FOR i IN 1..400 LOOP
        -- pg_stat_activity's sessions and their query texts are read once per transaction
        -- unless told otherwise: without this, a condition on them would see its first
        -- reading for the whole wait (drain_wakeup.sql's regression case).
        PERFORM pg_stat_clear_snapshot();
        EXECUTE 'SELECT ' || condition INTO holds;
        IF holds THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.025);
    END LOOP;
    RETURN false;
END
$$;
-- Until no live session holds the consumer, as after a reconnect, when the previous
-- session's backend may still be exiting.
CREATE FUNCTION wait_until_released(consumer text) RETURNS boolean LANGUAGE sql AS $$
    SELECT wait_for(format('NOT EXISTS (SELECT 1 FROM realtime.consumers() c JOIN pg_stat_activity a ON a.pid = c.active_pid
                            WHERE c.name = %L AND c.active_pid <> pg_backend_pid())', consumer)) $$;
SELECT * FROM take();
