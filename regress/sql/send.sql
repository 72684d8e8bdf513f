-- realtime.send: delivered if and only if the transaction commits.
BEGIN;
SELECT realtime.send('{"a": 1}', 'ev', 'room:1', false);
COMMIT;
SELECT * FROM take();

BEGIN;
SELECT realtime.send('{"a": 2}', 'ev', 'room:1');
ROLLBACK;
SELECT * FROM take();

-- Autocommit statements work; private defaults to true, as in Supabase.
SELECT realtime.send('{"a": 3}', 'ev', 'room:1');
SELECT realtime.send(payload => '{"a": 4}', event => 'other', topic => 'room:2', private => false);
SELECT * FROM take();

-- The message id is injected into the payload as "id" (Supabase's behaviour), first key,
-- with the rest in jsonb's text form; a payload that has an id keeps it.
SELECT realtime.send('{"b": [1, 2], "a": {"z": null}}', 'ev', 'room:1');
SELECT realtime.send('{"id": "mine", "x": 1}', 'ev', 'room:1');
SELECT regexp_replace(d.payload::text, '[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}', 'UUID') AS payload,
       d.payload::jsonb->>'id' = d.id::text AS id_is_message_id,
       d.committed_at <= clock_timestamp() AND d.committed_at > now() - interval '1 minute' AS committed_recently
FROM realtime.drain('test', NULL, 10, 0) d;
SELECT * FROM take();

-- Messages that cannot be sent: NULLs, non-object payloads, an empty topic. Each is a WARNING
-- (Supabase's WarnSendingBroadcastMessage) and the transaction goes on; where the topic is
-- usable a 'dropped' record takes the message's place (send_dropped has the rest).
SELECT realtime.send(NULL, 'ev', 'room:1');
SELECT realtime.send('{}', NULL, 'room:1');
SELECT realtime.send('{}', 'ev', NULL);
SELECT realtime.send('[1, 2]', 'ev', 'room:1');
SELECT realtime.send('"text"', 'ev', 'room:1');
SELECT realtime.send('{}', 'ev', '');
SELECT * FROM take();

-- A failing statement after a send aborts the transaction: nothing is delivered.
BEGIN;
SELECT realtime.send('{"a": 5}', 'ev', 'room:1');
SELECT 1 / 0;
COMMIT;
SELECT * FROM take();
