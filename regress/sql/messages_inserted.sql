-- The previous file's session may still be exiting with consumer "test" held.
SELECT wait_until_released('test') AS released;
-- Rows the app inserts into realtime.messages are delivered at commit, as Supabase's server
-- delivers each row it decodes (extension/src/inserted.rs): a row with an event and a payload
-- (or binary_payload) is a broadcast to its topic, with the row's id as the message's id, in
-- call order with the transaction's other messages; the read probes' rows (no event) are not.
-- The INSERT policies are the check: RLS lets a row in or refuses it. Rows go after
-- Supabase's 72 hours, deleted as the table's owner (extension/src/messages_expiry.rs).

-- The trigger: internal (never dumped: dump_restore and supabase_dump restore with
-- --exit-on-error), on the table, with the WHEN clause that leaves out probes.
SELECT tgisinternal, tgname ~ '^realtime_deliver_[0-9]+$' AS named,
       regexp_replace(pg_get_triggerdef(oid), 'realtime_deliver_[0-9]+', 'realtime_deliver_N') AS definition
FROM pg_trigger WHERE tgrelid = 'realtime.messages'::regclass AND tgfoid = 'realtime.deliver_inserted()'::regprocedure;

-- Delivered, with the row's id; payload as inserted (Supabase injects no id into it).
INSERT INTO realtime.messages (topic, extension, event, payload, private, id)
VALUES ('room:1', 'broadcast', 'inserted', '{"a": 1}', false, '11111111-1111-4111-8111-111111111111');
SELECT d.kind, d.topic, d.event, d.payload, d.private, d.id
FROM realtime.drain('test', NULL, 10, 0) d;
SELECT count(*) AS confirmed FROM take();

-- A probe's row (no event), a row without a payload, and a rolled-back row: nothing.
INSERT INTO realtime.messages (topic, extension) VALUES ('room:1', 'broadcast');
INSERT INTO realtime.messages (topic, extension, event) VALUES ('room:1', 'broadcast', 'no_payload');
BEGIN;
INSERT INTO realtime.messages (topic, extension, event, payload) VALUES ('room:1', 'broadcast', 'rolled_back', '{}');
ROLLBACK;
SELECT * FROM take();

-- In call order with send's, in one transaction; private as the row says, binary too; a
-- multi-row INSERT in its rows' order.
BEGIN;
SELECT realtime.send('{"n": 1}', 'sent', 'room:1', false);
INSERT INTO realtime.messages (topic, extension, event, payload, private)
VALUES ('room:1', 'broadcast', 'row', '{"n": 2}', true), ('room:1', 'broadcast', 'row', '{"n": 3}', false);
INSERT INTO realtime.messages (topic, extension, event, binary_payload, private)
VALUES ('room:2', 'broadcast', 'bytes', '\x0102', false);
SELECT realtime.send('{"n": 4}', 'sent', 'room:1', false);
COMMIT;
SELECT n, kind, topic, event, payload, private FROM take();

-- What cannot be sent is dropped as send's is: the WARNING, the row stays, a dropped record
-- tells the topic. A NULL private is neither topic: counted and warned only.
SELECT count(*) AS rows_before FROM realtime.messages \gset
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:1', 'broadcast', 'array', '[1]', false);
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:1', 'broadcast', 'null_private', '{}', NULL);
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('', 'broadcast', 'empty_topic', '{}', false);
SELECT count(*) - :rows_before AS rows_kept FROM realtime.messages;
SELECT n, kind, topic, event, payload - 'size' AS payload FROM take();
-- realtime.strict_send makes it the ERROR, and the INSERT fails.
SET realtime.strict_send = on;
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:1', 'broadcast', 'array', '[1]', false);
RESET realtime.strict_send;

-- The INSERT policies decide, as for Supabase: a role allowed to insert for the topic
-- delivers; a refused one inserts nothing and so sends nothing.
CREATE ROLE inserting_user NOLOGIN;
GRANT USAGE ON SCHEMA realtime TO inserting_user;
GRANT INSERT ON realtime.messages TO inserting_user;
CREATE POLICY insert_room_3 ON realtime.messages FOR INSERT TO inserting_user WITH CHECK (topic = 'room:3');
SET ROLE inserting_user;
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:3', 'broadcast', 'allowed', '{}', true);
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:4', 'broadcast', 'refused', '{}', true);
RESET ROLE;
SELECT n, kind, topic, event FROM take();

-- A held send's policy check inserts a row of its own: it is a check, not a message, so
-- the send is delivered once.
CREATE POLICY insert_room_5 ON realtime.messages FOR INSERT TO inserting_user WITH CHECK (topic = 'room:5');
GRANT EXECUTE ON FUNCTION realtime.send(jsonb, text, text, boolean) TO inserting_user;
SET ROLE inserting_user;
SELECT realtime.send('{"once": true}', 'held', 'room:5', false);
RESET ROLE;
SELECT n, kind, topic, event, payload FROM take();
DROP POLICY insert_room_3 ON realtime.messages;
DROP POLICY insert_room_5 ON realtime.messages;

-- pg_upgrade carries no internal trigger (its dump leaves them out, as pg_dump's does), nor
-- the extension's recorded dependencies on the app's objects: the sidecar's login asks
-- realtime.sync_app_objects() at each connection, and it makes both again, as the installer
-- (SECURITY DEFINER) on behalf of a login that is no superuser.
SELECT tgname AS delivery_trigger FROM pg_trigger
WHERE tgrelid = 'realtime.messages'::regclass AND tgfoid = 'realtime.deliver_inserted()'::regprocedure \gset
DROP TRIGGER :"delivery_trigger" ON realtime.messages;
DELETE FROM pg_depend WHERE classid = 'pg_extension'::regclass
  AND objid = (SELECT oid FROM pg_extension WHERE extname = 'pg_realtime')
  AND refobjid IN ('realtime.messages'::regclass, 'realtime.topic()'::regprocedure);
SELECT count(*) AS dependencies_left FROM pg_depend WHERE classid = 'pg_extension'::regclass
  AND refobjid IN ('realtime.messages'::regclass, 'realtime.topic()'::regprocedure);
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:6', 'broadcast', 'lost', '{}', false);
SELECT * FROM take();
GRANT EXECUTE ON FUNCTION realtime.sync_app_objects() TO inserting_user;
SET ROLE inserting_user;
SELECT realtime.sync_app_objects();
RESET ROLE;
SELECT count(*) AS delivery_triggers FROM pg_trigger
WHERE tgrelid = 'realtime.messages'::regclass AND tgisinternal AND tgfoid = 'realtime.deliver_inserted()'::regprocedure;
SELECT pg_describe_object(refclassid, refobjid, refobjsubid) AS depends_on, deptype FROM pg_depend
WHERE classid = 'pg_extension'::regclass AND refobjid IN ('realtime.messages'::regclass, 'realtime.topic()'::regprocedure)
ORDER BY 1;
INSERT INTO realtime.messages (topic, extension, event, payload, private) VALUES ('room:6', 'broadcast', 'back', '{}', false);
SELECT n, kind, topic, event FROM take();

-- It runs nothing a lesser role controls. The table's owner, a role that is no superuser,
-- plants a trigger on it and look-alikes, in public, of the functions and the operator the
-- function calls; its caller puts public first in its search_path. Each plant records that
-- it ran, and as whom. The function makes the trigger again and no plant runs; then the
-- caller's own statements (its path, an INSERT) run them, so the plants would have told.
CREATE ROLE planter NOLOGIN;
CREATE TABLE public.planted_ran (who text, what text);
GRANT INSERT ON public.planted_ran TO PUBLIC;
GRANT CREATE ON SCHEMA public TO planter;
GRANT USAGE ON SCHEMA realtime TO planter;
ALTER TABLE realtime.messages OWNER TO planter;
SET ROLE planter;
CREATE FUNCTION public.plant(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.planted_ran VALUES (current_user, what);
    RETURN true;
END
$$;
CREATE FUNCTION public.to_regclass(text) RETURNS regclass LANGUAGE sql
AS $$ SELECT CASE WHEN public.plant('to_regclass') THEN pg_catalog.to_regclass($1) END $$;
CREATE FUNCTION public.pg_partition_tree(regclass)
RETURNS TABLE (relid regclass, parentrelid regclass, isleaf boolean, level integer) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.plant('pg_partition_tree');
    RETURN QUERY SELECT * FROM pg_catalog.pg_partition_tree($1);
END
$$;
CREATE FUNCTION public.plant_oideq(oid, oid) RETURNS boolean LANGUAGE sql
AS $$ SELECT public.plant('=') AND pg_catalog.oideq($1, $2) $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.plant_oideq);
CREATE FUNCTION public.plant_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.plant('trigger');
    RETURN NEW;
END
$$;
CREATE TRIGGER planted BEFORE INSERT ON realtime.messages FOR EACH ROW EXECUTE FUNCTION public.plant_trigger();
RESET ROLE;
SELECT tgname AS delivery_trigger FROM pg_trigger
WHERE tgrelid = 'realtime.messages'::regclass AND tgfoid = 'realtime.deliver_inserted()'::regprocedure \gset
DROP TRIGGER :"delivery_trigger" ON realtime.messages;
SET ROLE inserting_user;
SET search_path = public, pg_catalog;
SELECT realtime.sync_app_objects();
RESET search_path;
RESET ROLE;
SELECT count(*) AS delivery_triggers FROM pg_trigger
WHERE tgrelid = 'realtime.messages'::regclass AND tgisinternal AND tgfoid = 'realtime.deliver_inserted()'::regprocedure;
SELECT count(*) AS plants_run_by_sync FROM public.planted_ran;
SET ROLE inserting_user;
SET search_path = public, pg_catalog;
SELECT to_regclass('realtime.messages') AS found, 1::oid = 1::oid AS equal,
       (SELECT count(*) FROM pg_partition_tree('realtime.messages')) AS tree;
RESET search_path;
RESET ROLE;
INSERT INTO realtime.messages (topic, extension) VALUES ('planted', 'broadcast');
SELECT who, what FROM public.planted_ran ORDER BY what;
DELETE FROM realtime.messages WHERE topic = 'planted';
DROP TRIGGER planted ON realtime.messages;
ALTER TABLE realtime.messages OWNER TO CURRENT_USER;
DROP OPERATOR public.= (oid, oid);
DROP FUNCTION public.plant_oideq(oid, oid), public.pg_partition_tree(regclass), public.to_regclass(text),
    public.plant_trigger(), public.plant(text);
REVOKE CREATE ON SCHEMA public FROM planter;
REVOKE USAGE ON SCHEMA realtime FROM planter;
DROP TABLE public.planted_ran;
DROP ROLE planter;

-- Expiry: rows older than 72 hours go, newer ones stay, deleted as the table's owner, never
-- as the caller or the installer, in replica mode: a trigger someone granted TRIGGER put
-- there does not fire (its code would run with the owner's rights); one the owner made
-- ALWAYS does, and records who ran it.
CREATE ROLE messages_owner NOLOGIN;
GRANT USAGE ON SCHEMA realtime TO messages_owner;
CREATE TABLE public.expired_by (who text, topic text);
GRANT INSERT ON public.expired_by TO messages_owner;
CREATE FUNCTION public.record_expiry() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.expired_by VALUES (current_user, OLD.topic);
    RETURN OLD;
END
$$;
CREATE TRIGGER record_expiry AFTER DELETE ON realtime.messages FOR EACH ROW EXECUTE FUNCTION public.record_expiry();
ALTER TABLE realtime.messages OWNER TO messages_owner;
INSERT INTO realtime.messages (topic, extension, inserted_at) VALUES
    ('expired:1', 'broadcast', now() - interval '73 hours'),
    ('expired:2', 'broadcast', now() - interval '80 hours'),
    ('expired:3', 'broadcast', now() - interval '100 hours'),
    ('kept', 'broadcast', now() - interval '71 hours');
SELECT realtime.expire_messages(1) AS first;
SELECT count(*) AS fired_in_replica_mode FROM public.expired_by;
ALTER TABLE realtime.messages ENABLE ALWAYS TRIGGER record_expiry;
-- In bounded chunks: 1 (above), then 1, then 1, then none.
SELECT realtime.expire_messages(1) AS second, realtime.expire_messages(1) AS third, realtime.expire_messages(1) AS fourth;
SELECT who, count(*) AS rows_deleted FROM public.expired_by GROUP BY who;
SELECT current_setting('session_replication_role') AS replication_role_after;
SELECT topic FROM realtime.messages WHERE topic IN ('expired:1', 'expired:2', 'expired:3', 'kept');
SELECT realtime.expire_messages(0);
DROP TRIGGER record_expiry ON realtime.messages;
ALTER TABLE realtime.messages OWNER TO CURRENT_USER;
DELETE FROM realtime.messages;

-- Granted to no one by default.
SELECT has_function_privilege('public', 'realtime.expire_messages(integer)', 'EXECUTE') AS public_expires,
       has_function_privilege('public', 'realtime.add_delivery_trigger(oid)', 'EXECUTE') AS public_adds,
       has_function_privilege('public', 'realtime.sync_app_objects()', 'EXECUTE') AS public_syncs;
SET ROLE inserting_user;
SELECT realtime.add_delivery_trigger('realtime.messages'::regclass);
RESET ROLE;
DROP OWNED BY inserting_user, messages_owner;
DROP ROLE inserting_user;
DROP ROLE messages_owner;
DROP TABLE public.expired_by;
DROP FUNCTION public.record_expiry();
