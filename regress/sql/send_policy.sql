-- realtime.send from a role without BYPASSRLS is held to the INSERT policies of
-- realtime.messages, as Supabase's send (an INSERT as its caller) is (extension/src/
-- send_policy.rs); a refusal is Supabase's WARNING, counted, and no record at all reaches the
-- topic: a role that may not send there must not put even a notice before its subscribers.
CREATE ROLE policy_sender NOLOGIN;
CREATE ROLE policy_no_grant NOLOGIN;
CREATE ROLE policy_bypass NOLOGIN BYPASSRLS;
GRANT USAGE ON SCHEMA realtime TO policy_sender, policy_no_grant, policy_bypass;
GRANT INSERT ON realtime.messages TO policy_sender, policy_bypass;
CREATE POLICY send_allowed ON realtime.messages FOR INSERT TO policy_sender
    WITH CHECK ((SELECT realtime.topic()) LIKE 'allowed:%' AND extension = 'broadcast'
                AND coalesce(nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'sub', '') <> 'blocked');
CREATE POLICY send_boom ON realtime.messages AS RESTRICTIVE FOR INSERT TO policy_sender
    WITH CHECK (CASE WHEN (SELECT realtime.topic()) = 'allowed:boom'
                     THEN 1 / (octet_length(topic) - octet_length(topic)) = 1 ELSE true END);
CREATE TEMP TABLE before AS SELECT * FROM realtime.stats();
SELECT count(*) AS rows_before FROM realtime.messages \gset

SET ROLE policy_sender;
SELECT realtime.send('{"n": 1}', 'ev', 'allowed:1', false);
SELECT realtime.send('{"n": 2}', 'ev', 'denied:1', false);
SELECT realtime.send('{"n": 3}', 'ev', 'allowed:boom', false);
SELECT realtime.send_binary('\x01', 'ev', 'denied:1', false);
SELECT realtime.broadcast_changes('denied:1', 'ev', 'INSERT', 't', 'public', NULL, NULL);
-- The claims of the moment are the policy's, as they are for Supabase's INSERT.
SELECT set_config('request.jwt.claims', '{"sub": "blocked"}', false);
SELECT realtime.send('{"n": 4}', 'ev', 'allowed:1', false);
SELECT set_config('request.jwt.claims', '', false);
-- realtime.topic is the caller's again after each check.
SELECT current_setting('realtime.topic', true) AS topic_after;
RESET ROLE;
SELECT * FROM take();
SELECT count(*) = :rows_before AS no_row_kept FROM realtime.messages;
SELECT s.dropped_unauthorized - b.dropped_unauthorized AS unauthorized FROM realtime.stats() s, before b;

-- Without INSERT on the table: Supabase's "permission denied".
SET ROLE policy_no_grant;
SELECT realtime.send('{"n": 5}', 'ev', 'allowed:1', false);
RESET ROLE;
-- BYPASSRLS, and superusers, are not held (no policy allows policy_bypass anything).
SET ROLE policy_bypass;
SELECT realtime.send('{"n": 6}', 'ev', 'denied:2', false);
RESET ROLE;
SELECT realtime.send('{"n": 7}', 'ev', 'denied:3', false);
SELECT n, kind, topic, payload FROM take();

-- A trigger runs as the role whose write fires it, so the app's INSERT is held too, and
-- commits whatever its message's fate.
CREATE TABLE policy_posts (id int, room text);
GRANT INSERT ON policy_posts TO policy_sender;
CREATE FUNCTION policy_posts_broadcast() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM realtime.send(jsonb_build_object('id', NEW.id), 'post', NEW.room, false);
    RETURN NEW;
END
$$;
CREATE TRIGGER policy_posts_broadcast AFTER INSERT ON policy_posts FOR EACH ROW EXECUTE FUNCTION policy_posts_broadcast();
CREATE TRIGGER policy_posts_native AFTER INSERT ON policy_posts
    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('{room}', 'native', 'false');
SET ROLE policy_sender;
INSERT INTO policy_posts VALUES (1, 'allowed:posts'), (2, 'denied:posts');
RESET ROLE;
SELECT count(*) AS committed FROM policy_posts;
SELECT n, kind, topic, event FROM take();

-- realtime.strict_send makes the refusal an ERROR.
SET ROLE policy_sender;
SET realtime.strict_send = on;
SELECT realtime.send('{"n": 8}', 'ev', 'denied:1', false);
RESET realtime.strict_send;
RESET ROLE;

DROP TABLE policy_posts;
DROP FUNCTION policy_posts_broadcast();
DROP POLICY send_allowed ON realtime.messages;
DROP POLICY send_boom ON realtime.messages;
REVOKE ALL ON realtime.messages FROM policy_sender, policy_bypass;
REVOKE ALL ON SCHEMA realtime FROM policy_sender, policy_no_grant, policy_bypass;
DROP ROLE policy_sender, policy_no_grant, policy_bypass;
