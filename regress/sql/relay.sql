-- The previous file's session may still be exiting with consumer "test" held.
SELECT wait_until_released('test') AS released;
-- realtime.relay: how a sidecar publishes a client's broadcast through the queue, so that
-- every sidecar sees it in the one order. The origin (the sending connection) travels with
-- the message; the payload passes through as the client sent it, with no id injected.
SELECT realtime.relay(42, 'room:1', 'typing', false, '{"who": "ann"}', NULL);
SELECT realtime.relay(43, 'room:1', 'blob', true, NULL, '\x0102');
SELECT d.topic, d.event, d.payload::text, d.binary_payload, d.private, d.origin
FROM realtime.drain('test', NULL, 10, 0) d;
SELECT count(*) AS confirmed FROM take();

-- Messages from the database carry no origin.
SELECT realtime.send('{}', 'e', 'room:1', false);
SELECT origin IS NULL AS no_origin FROM realtime.drain('test', NULL, 10, 0);
SELECT count(*) AS confirmed FROM take();

-- Refusals: no origin, no payload or two, invalid JSON. Nothing is sent.
SELECT realtime.relay(0, 'room:1', 'e', false, '{}', NULL);
SELECT realtime.relay(NULL, 'room:1', 'e', false, '{}', NULL);
SELECT realtime.relay(42, 'room:1', 'e', false, NULL, NULL);
SELECT realtime.relay(42, 'room:1', 'e', false, '{}', '\x00');
SELECT realtime.relay(42, 'room:1', 'e', false, 'not json', NULL);
SELECT * FROM take();

-- Relaying speaks for a client connection: not for PUBLIC.
SELECT has_function_privilege('public', 'realtime.relay(bigint,text,text,boolean,json,bytea,uuid,boolean,boolean)', 'EXECUTE') AS public_can_relay;

-- A sidecar may choose the id (a persisted message's row shares it) and mark the message
-- persisted: Supabase's replay (realtime.history with relayed => false) includes it, and
-- leaves the other client broadcasts out.
SELECT last_seq AS base FROM realtime.stats() \gset
SELECT realtime.relay(42, 'room:p', 'kept', true, '{"k": 1}', NULL, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', true);
SELECT realtime.relay(42, 'room:p', 'fleeting', true, '{"k": 2}', NULL);
SELECT seq - :base AS seq, event, id = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11' AS chosen_id, origin FROM realtime.drain('test', NULL, 10, 0) ORDER BY seq;
SELECT count(*) AS confirmed FROM take();
SELECT seq - :base AS seq, kind, event FROM realtime.history(:base, '{room:p}', '{true}', relayed => false);
SELECT seq - :base AS seq, kind, event FROM realtime.history(:base, '{room:p}', '{true}');
-- The table persisted messages are kept in is the sidecar's alone.
SELECT has_table_privilege('public', 'realtime.persisted_messages', 'SELECT') AS public_can_read_persisted;

-- A message whose id its sender named (REST's `id`, relay_batch's ids) shows it: readers
-- report it with no origin, as a database message, so the sidecar delivers the id as
-- `meta.id` live and at a resume (the drain's rows and packed batches, realtime.history).
-- It stays a relayed message: Supabase's replay leaves it out.
SELECT last_seq AS base FROM realtime.stats() \gset
SELECT realtime.relay_batch(ARRAY[42, 42], ARRAY['room:n', 'room:n'], ARRAY['named', 'plain'], ARRAY[false, false],
    ARRAY['{"n": 1}', '{"n": 2}'], ARRAY[NULL, NULL]::bytea[],
    ids => ARRAY['0b0c0d0e-0000-4000-8000-0000000000aa', NULL]::uuid[]) AS relayed;
SELECT seq - :base AS seq, event, CASE WHEN origin IS NULL THEN id END AS shown_id, origin FROM realtime.drain('test', NULL, 10, 0) ORDER BY seq;
SELECT seq - :base AS seq, event, CASE WHEN origin IS NULL THEN id END AS shown_id, origin
FROM realtime.drain_unpack(realtime.drain_packed('test', NULL, 10, 0)) WHERE kind = 'message' ORDER BY seq;
SELECT count(*) AS confirmed FROM take();
SELECT seq - :base AS seq, event, CASE WHEN origin IS NULL THEN id END AS shown_id, origin FROM realtime.history(:base, '{room:n}', '{false}') WHERE kind = 'message';
SELECT seq - :base AS seq, kind, event FROM realtime.history(:base, '{room:n}', '{false}', relayed => false);
