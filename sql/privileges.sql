-- Hand-written part of the pg_realtime extension script, run after the generated functions.

-- Grants on realtime.messages and the schema: sql/schema.sql, on what it creates.

-- Draining moves a consumer's position and sees every message, private or not; relaying
-- speaks for a client connection: only roles granted these functions (the sidecar's) may
-- call them.
REVOKE EXECUTE ON FUNCTION realtime.create_consumer(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.drop_consumer(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.confirm(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.drain(text, bigint, integer, integer, integer, oid[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.drain_packed(text, bigint, integer, integer, integer, oid[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.listen(text, text[], text[], boolean, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.unlisten(text, text[], text[], boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.listen_all(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.history(bigint, text[], boolean[], timestamptz, integer, boolean, integer, oid[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.relay(bigint, text, text, boolean, json, bytea, uuid, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.authorize(text[], text[], text[], text[], text[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.visible(regclass, text[], text[], text[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.selectable(regclass, text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.match_patterns(text[], text[], text[], integer[], integer) FROM PUBLIC;
