-- Regression (issue 39, L6): realtime.drain_unpack was executable by PUBLIC, unlike every
-- other consumer function, and hands back json values it never validated, so any role
-- could make invalid json datums with it. Only roles granted it (the sidecar's) may call it.
SELECT has_function_privilege('public', 'realtime.drain_unpack(bytea)', 'EXECUTE') AS public_can_call;
CREATE ROLE du_nobody;
GRANT USAGE ON SCHEMA realtime TO du_nobody;
SET ROLE du_nobody;
SELECT * FROM realtime.drain_unpack('\x00'::bytea);
RESET ROLE;
REVOKE USAGE ON SCHEMA realtime FROM du_nobody;
DROP ROLE du_nobody;
