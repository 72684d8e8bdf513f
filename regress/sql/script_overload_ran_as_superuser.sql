-- Regression (CREATE EXTENSION's and ALTER EXTENSION ... UPDATE's scripts ran a lesser
-- role's code as the installer): PostgreSQL runs an extension's script with search_path set
-- to the extension's schema, realtime. A role that may create there (Supabase grants
-- supabase_realtime_admin CREATE on it) made a function or operator matching one of the
-- scripts' unqualified calls better than pg_catalog's, realtime.format(text, text) against
-- format(text, VARIADIC "any"), and the superuser running the script ran it. The scripts now
-- resolve names in pg_catalog alone while they run. Here a role that is no superuser plants
-- such overloads before a fresh CREATE EXTENSION into its schema, and before ALTER
-- EXTENSION ... UPDATE from every released version; each plant records who ran it.
CREATE DATABASE script_overload;
\c script_overload
CREATE ROLE planter NOLOGIN;
CREATE TABLE public.ran (what text, who name, superuser boolean);
GRANT INSERT ON public.ran TO PUBLIC;

-- Overloads of what the scripts call unqualified: format with text arguments (the grant
-- loops, the privileges warning) and the comparisons of oid columns with regclass and
-- regnamespace values. Each records its caller, then answers as
-- pg_catalog's would, so a script that runs one goes on.
CREATE FUNCTION plant() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    SET ROLE planter;
    CREATE FUNCTION realtime.format(text, text) RETURNS text LANGUAGE sql AS $f$
        INSERT INTO public.ran SELECT 'format(text, text)', current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
        SELECT pg_catalog.format($1, $2) $f$;
    CREATE FUNCTION realtime.format(text, text, text, text, text) RETURNS text LANGUAGE sql AS $f$
        INSERT INTO public.ran SELECT 'format(text, text, text, text, text)', current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
        SELECT pg_catalog.format($1, $2, $3, $4, $5) $f$;
    CREATE FUNCTION realtime.planted_eq(oid, regclass) RETURNS boolean LANGUAGE sql AS $f$
        INSERT INTO public.ran SELECT 'oid = regclass', current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
        SELECT $1 OPERATOR(pg_catalog.=) $2::oid $f$;
    CREATE OPERATOR realtime.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = realtime.planted_eq);
    CREATE FUNCTION realtime.planted_eq(oid, regnamespace) RETURNS boolean LANGUAGE sql AS $f$
        INSERT INTO public.ran SELECT 'oid = regnamespace', current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
        SELECT $1 OPERATOR(pg_catalog.=) $2::oid $f$;
    CREATE OPERATOR realtime.= (LEFTARG = oid, RIGHTARG = regnamespace, FUNCTION = realtime.planted_eq);
    RESET ROLE;
END
$$;

-- The plants work: called unqualified with realtime first in the path, as a script calls,
-- they record (then the record is cleared).
CREATE SCHEMA realtime;
GRANT USAGE, CREATE ON SCHEMA realtime TO planter;
SELECT plant();
SET search_path = realtime;
SELECT format('%s', 'x'::text) AS formatted, 0::oid = 'pg_class'::regclass AS compared;
RESET search_path;
SELECT what, who FROM public.ran ORDER BY what;
TRUNCATE public.ran;
DROP SCHEMA realtime CASCADE;

-- (The scripts' WARNING lists planter's CREATE on the schema: not what is tested here.)
SET client_min_messages = error;
-- A fresh install into a schema a lesser role may create in (as in a database Supabase made).
CREATE SCHEMA realtime;
GRANT USAGE, CREATE ON SCHEMA realtime TO planter;
SELECT plant();
CREATE EXTENSION pg_realtime;
DROP EXTENSION pg_realtime CASCADE;
DROP SCHEMA realtime CASCADE;
-- An update from every released version, the plants made between CREATE and UPDATE.
CREATE TABLE updated (version text);
DO $$
DECLARE
    v text;
BEGIN
    FOR v IN SELECT version FROM pg_available_extension_versions
             WHERE name = 'pg_realtime'
               AND version <> (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_realtime') LOOP
        EXECUTE pg_catalog.format('CREATE EXTENSION pg_realtime VERSION %L', v);
        GRANT USAGE, CREATE ON SCHEMA realtime TO planter;
        PERFORM plant();
        ALTER EXTENSION pg_realtime UPDATE;
        INSERT INTO updated VALUES (v);
        DROP EXTENSION pg_realtime CASCADE;
        DROP SCHEMA realtime CASCADE;
        DROP PUBLICATION IF EXISTS supabase_realtime;
    END LOOP;
END
$$;
RESET client_min_messages;
SELECT count(*) > 0 AS some_released_version_updated FROM updated;
-- No plant ran during a script.
SELECT what, who, superuser, count(*) > 0 AS ran FROM public.ran GROUP BY 1, 2, 3 ORDER BY 1, 2;

\c regression
DROP DATABASE script_overload;
DROP ROLE planter;
