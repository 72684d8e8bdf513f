-- pg_realtime 0.2.0 -> 0.3.0. Every change of the extension's SQL since 0.2.0 (frozen in
-- extension/released/pg_realtime--0.2.0.sql) is written here as well, in the order the
-- changes landed; regress/sql/upgrade.sql proves the result equals a fresh install.

-- A drained batch as one packed value (extension/src/packed.rs), and back into rows.
CREATE FUNCTION realtime."drain_packed"(consumer text, after_seq bigint DEFAULT NULL, max_messages integer DEFAULT 10000, timeout_ms integer DEFAULT 1000, linger_ms integer DEFAULT 0, decode oid[] DEFAULT NULL)
RETURNS bytea
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'drain_packed_wrapper';
REVOKE EXECUTE ON FUNCTION realtime.drain_packed(text, bigint, integer, integer, integer, oid[]) FROM PUBLIC;
CREATE FUNCTION realtime."drain_unpack"(packed bytea)
RETURNS TABLE(seq bigint, kind text, topic text, event text, payload json, binary_payload bytea, private boolean, committed_at timestamptz, id uuid, origin bigint, lost_first bigint, lost_last bigint)
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'drain_unpack_wrapper';
