-- Fixed bug: a statement_timeout (or cancel) that fired inside one request's probe was
-- caught like a raising policy and became a "no" for that request, so the call went on and
-- its caller never saw the timeout. It now ends the whole call with the timeout's error.
CREATE FUNCTION slow_policy(topic text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF topic = 'slow' THEN
        PERFORM pg_sleep(30);
    END IF;
    RETURN true;
END
$$;
CREATE POLICY slow ON realtime.messages FOR SELECT TO authenticated
    USING (slow_policy((SELECT realtime.topic())));
SET statement_timeout = '200ms';
SELECT * FROM realtime.authorize(ARRAY['authenticated', 'authenticated'], ARRAY['{}', '{}'], ARRAY['{}', '{}'],
                                 ARRAY['room:1', 'slow'], ARRAY['broadcast', 'broadcast'], ARRAY['read', 'read']);
RESET statement_timeout;
-- Without the slow topic the same call answers.
SELECT * FROM realtime.authorize(ARRAY['authenticated'], ARRAY['{}'], ARRAY['{}'], ARRAY['room:1'], ARRAY['broadcast'], ARRAY['read']);
-- The session is intact: no role, setting or probe row survives the cancelled call.
SELECT current_user = session_user AS same_user, realtime.topic() IS NULL AS no_topic,
       coalesce(current_setting('request.jwt.claims', true), '') = '' AS no_claims,
       (SELECT count(*) FROM realtime.messages) AS rows_left;
DROP POLICY slow ON realtime.messages;
DROP FUNCTION slow_policy(text);
