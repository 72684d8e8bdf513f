-- Issue 39, H4: Supabase's max_record_bytes (MAX_RECORD_BYTES, 1 MiB) was applied only in
-- the sidecar, after a drain or realtime.history had decoded the whole row and sent it
-- over. Now it is applied where the change is decoded (realtime.max_record_bytes, which the
-- sidecar sets from its setting): a change past it keeps only its values of at most 64
-- bytes of JSON, in their order, and says "Error 413: Payload Too Large".
SELECT realtime.create_consumer('record_bytes') >= 0 AS created;
CREATE TABLE record_bytes (id int PRIMARY KEY, n numeric, body text, tags text[]);
ALTER TABLE record_bytes REPLICA IDENTITY FULL;
ALTER PUBLICATION supabase_realtime ADD TABLE record_bytes;
SELECT last_seq AS base FROM realtime.stats() \gset
INSERT INTO record_bytes VALUES (1, 12345678901234567890.5, repeat('b', 5000), ARRAY['a', 'b']);
UPDATE record_bytes SET n = 2;
INSERT INTO record_bytes VALUES (2, 1, 'small', NULL);
-- Under the default the large row is sent whole.
SELECT (payload -> 'record' ->> 'id')::int AS id, octet_length(payload -> 'record' ->> 'body') AS body_bytes,
       payload -> 'errors' AS errors
FROM realtime.drain('record_bytes', NULL, 100, 0) WHERE kind = 'change' ORDER BY seq;
-- Under 1000 bytes: the large row's body is left out of record and old_record, the
-- numeric keeps every digit, and the change says 413; the small row is whole.
SET realtime.max_record_bytes = 1000;
SELECT event, payload -> 'record' AS record, payload -> 'old_record' AS old_record, payload -> 'errors' AS errors
FROM realtime.drain('record_bytes', NULL, 100, 0) WHERE kind = 'change' ORDER BY seq;
-- realtime.history decodes the same way.
SELECT event, payload -> 'record' AS record, payload -> 'errors' AS errors
FROM realtime.history(:base, '{}', '{}', NULL, NULL, true, 100, ARRAY['record_bytes'::regclass::oid])
WHERE kind = 'change' ORDER BY seq;
RESET realtime.max_record_bytes;
SELECT realtime.drop_consumer('record_bytes') AS dropped;
ALTER PUBLICATION supabase_realtime DROP TABLE record_bytes;
DROP TABLE record_bytes;
