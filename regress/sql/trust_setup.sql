-- The trust tests (issue: "no role gains a superuser's rights through the extension"), on the
-- database Supabase made, `postgres` demoted (supabase_fixture.sql). Each route test plants
-- code as a role that is no superuser, makes the extension run it as a client or the sidecar
-- would, and reads the mark the code leaves: a NOTICE naming the role it ran as and whether
-- that role is a superuser. No rollback removes a NOTICE, so a route taken inside a
-- rolled-back probe still shows.
--
-- Here: pg_realtime installed again (supabase_dump.sql ended with the way back), the mark,
-- and a login that calls the extension as the sidecar's does (scripts/sidecar_login.sql's
-- grants, on the roles this database has).
CREATE EXTENSION pg_realtime;
CREATE FUNCTION public.mark(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE '% ran as % (superuser: %)', what, current_user,
        (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);
    RETURN true;
END
$$;
ALTER FUNCTION public.mark(text) OWNER TO postgres;
GRANT EXECUTE ON FUNCTION public.mark(text) TO PUBLIC;
CREATE ROLE trust_sidecar LOGIN;
GRANT anon, authenticated, service_role TO trust_sidecar;
GRANT USAGE ON SCHEMA realtime TO trust_sidecar;
GRANT EXECUTE ON FUNCTION realtime.authorize(text[], text[], text[], text[], text[], text[]),
    realtime.visible(regclass, text[], text[], text[], integer[]),
    realtime.selectable(regclass, text[]), realtime.subscribable(jsonb),
    realtime.render_filter_values(text, oid, integer, text[]) TO trust_sidecar;
