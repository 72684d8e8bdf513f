-- realtime.check_privileges() on a plain install: nothing but the installer holds a right
-- through which code could be placed where the extension's privileged steps run it. Then
-- each kind of right, granted to a role of its own, is listed with the role its code would
-- run as, and goes when revoked.
SELECT count(*) AS rights FROM realtime.check_privileges();
CREATE ROLE cp_creator;
CREATE ROLE cp_trigger;
CREATE ROLE cp_member;
CREATE ROLE cp_writer;
GRANT CREATE ON SCHEMA realtime TO cp_creator;
GRANT TRIGGER ON realtime.messages TO cp_trigger;
GRANT realtime_prober TO cp_member;
GRANT INSERT ON realtime.persisted_messages TO cp_writer;
-- A sidecar's login writes the extension's tables itself (scripts/sidecar_login.sql grants it
-- that) and may drain every message: its own grants there are not listed.
CREATE ROLE cp_sidecar;
GRANT EXECUTE ON FUNCTION realtime.drain(text, bigint, integer, integer, integer, oid[]) TO cp_sidecar;
GRANT INSERT, DELETE ON realtime.persisted_messages TO cp_sidecar;
SELECT role, privilege, object, runs_as FROM realtime.check_privileges() ORDER BY 1, 3, 2;
REVOKE CREATE ON SCHEMA realtime FROM cp_creator;
REVOKE TRIGGER ON realtime.messages FROM cp_trigger;
REVOKE realtime_prober FROM cp_member;
REVOKE INSERT ON realtime.persisted_messages FROM cp_writer;
REVOKE ALL ON FUNCTION realtime.drain(text, bigint, integer, integer, integer, oid[]) FROM cp_sidecar;
REVOKE ALL ON realtime.persisted_messages FROM cp_sidecar;
SELECT count(*) AS rights FROM realtime.check_privileges();
DROP ROLE cp_creator, cp_trigger, cp_member, cp_writer, cp_sidecar;
-- The role the read probe runs as: no superuser, no login, nothing but BYPASSRLS.
SELECT rolname, rolsuper, rolcanlogin, rolbypassrls, rolcreaterole, rolcreatedb, rolreplication, rolinherit
FROM pg_roles WHERE rolname = 'realtime_prober';
SELECT c.oid::regclass AS on_table, a.privilege_type
FROM pg_class c, aclexplode(c.relacl) a
WHERE a.grantee = 'realtime_prober'::regrole ORDER BY c.oid::regclass::text, 2;
SELECT has_schema_privilege('realtime_prober', 'realtime', 'USAGE') AS uses_schema,
       has_schema_privilege('realtime_prober', 'realtime', 'CREATE') AS creates_in_schema;
