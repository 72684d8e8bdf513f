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
SELECT has_function_privilege('public', 'realtime.relay(bigint,text,text,boolean,json,bytea)', 'EXECUTE') AS public_can_relay;
