-- A producer called on a standby is an ERROR whatever realtime.strict_send says: a message
-- queued there is never delivered to the primary's subscribers (misuse, not data).
SELECT pg_is_in_recovery() AS standby;
SHOW realtime.strict_send;
SELECT realtime.send('{"a": 1}', 'ev', 'room:1');
SELECT realtime.send(NULL, 'ev', 'room:1');
SELECT realtime.send_binary('\x00', 'ev', 'room:1');
SELECT realtime.broadcast_changes('room:1', 'ev', 'INSERT', 't', 'public', NULL, NULL);
SELECT realtime.relay(7, 'room:1', 'ev', false, '{}', NULL);
