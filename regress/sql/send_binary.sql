-- The previous file's session may still be exiting with consumer "test" held.
SELECT wait_until_released('test') AS released;
-- realtime.send_binary: bytes round-trip unchanged, NUL bytes included; no id injection.
SELECT realtime.send_binary('\x00ff10'::bytea, 'bin', 'room:1');
SELECT realtime.send_binary(convert_to('plain', 'UTF8'), 'bin', 'room:1', false);
SELECT realtime.send_binary(''::bytea, 'empty', 'room:1');
SELECT d.event, d.binary_payload, d.payload IS NULL AS no_json_payload, d.private, d.id IS NOT NULL AS has_id
FROM realtime.drain('test', NULL, 10, 0) d;
SELECT count(*) AS confirmed FROM take();

SELECT realtime.send_binary(NULL, 'bin', 'room:1');
BEGIN;
SELECT realtime.send_binary('\x01', 'bin', 'room:1');
ROLLBACK;
SELECT * FROM take();
