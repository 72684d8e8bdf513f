-- realtime.max_message_size caps topic + event + payload; over it, a WARNING names the limit
-- and a 'dropped' record takes the message's place.
SET realtime.max_message_size = '1kB';
SELECT realtime.send(jsonb_build_object('s', repeat('x', 2000)), 'ev', 'room:1');
SELECT realtime.send_binary(decode(repeat('00', 1025), 'hex'), 'ev', 'room:1');
SELECT realtime.send(jsonb_build_object('s', repeat('x', 900)), 'ev', 'room:1');
RESET realtime.max_message_size;
SELECT n, kind, length(payload->>'s') FROM take();

-- Topic and event lengths that a realtime client could not join or match.
SELECT realtime.send('{}', 'ev', repeat('t', 247));
SELECT realtime.send('{}', repeat('e', 256), 'room:1');
SELECT realtime.send('{}', repeat('e', 255), repeat('t', 246));
SELECT n, kind, length(topic), length(event) FROM take();

-- One transaction's messages must fit in the queue (4MB in this suite): from the send that
-- would overflow it, every message of the transaction is dropped, those before it too.
BEGIN;
SELECT realtime.send_binary(decode(repeat('ab', 1000000), 'hex'), 'big', 'room:1') FROM generate_series(1, 5);
COMMIT;
SELECT * FROM take();
