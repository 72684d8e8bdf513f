-- The sidecar needs no superuser: a login role granted EXECUTE on the consumer, relay and
-- authorize functions (and nothing else) can run everything the sidecar does.
CREATE ROLE sidecar_role LOGIN;
GRANT USAGE ON SCHEMA realtime TO sidecar_role;
GRANT EXECUTE ON FUNCTION realtime.create_consumer(text), realtime.drain(text, bigint, integer, integer, integer, oid[]),
    realtime.drain_packed(text, bigint, integer, integer, integer, oid[]),
    realtime.confirm(text, bigint), realtime.relay(bigint, text, text, boolean, json, bytea, uuid, boolean, boolean),
    realtime.authorize(text[], text[], text[], text[], text[], text[]) TO sidecar_role;
SET ROLE sidecar_role;
SELECT realtime.create_consumer('as_sidecar') >= 0 AS created;
SELECT realtime.relay(7, 'room:r', 'typing', false, '{"a": 1}', NULL);
SELECT topic, event, payload, origin FROM realtime.drain('as_sidecar', NULL, 10, 0);
SELECT realtime.confirm('as_sidecar', (SELECT last_seq FROM realtime.stats()));
-- authorize runs as its owner, so the probe rows bypass RLS as Supabase's admin's do.
SELECT ordinality, allowed, error FROM realtime.authorize(ARRAY['anon', 'nobody'], ARRAY['{}', '{}'], ARRAY['{}', '{}'],
    ARRAY['lobby', 'lobby'], ARRAY['broadcast', 'broadcast'], ARRAY['read', 'read']);
-- Without the grants a role can do none of it, even with USAGE on the schema.
RESET ROLE;
CREATE ROLE stranger_role LOGIN;
GRANT USAGE ON SCHEMA realtime TO stranger_role;
SET ROLE stranger_role;
SELECT realtime.create_consumer('nope');
SELECT * FROM realtime.authorize(ARRAY['anon'], ARRAY['{}'], ARRAY['{}'], ARRAY['lobby'], ARRAY['broadcast'], ARRAY['read']);
RESET ROLE;
SELECT realtime.drop_consumer('as_sidecar');
SELECT count(*) FROM take();
