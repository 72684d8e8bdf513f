-- What a Supabase database already has and policies copied from Supabase's docs rely on:
-- the `authenticated` role with Supabase's grants on realtime, and `auth.uid()`. Plain
-- PostgreSQL lacks them; the benchmarks and the end-to-end tests load this file. Idempotent.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'authenticated') THEN
        CREATE ROLE authenticated NOLOGIN;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA realtime TO authenticated;
GRANT SELECT, INSERT ON realtime.messages TO authenticated;
CREATE SCHEMA IF NOT EXISTS auth;
GRANT USAGE ON SCHEMA auth TO authenticated;
CREATE OR REPLACE FUNCTION auth.uid() RETURNS uuid LANGUAGE sql STABLE AS $f$
    SELECT nullif(coalesce(current_setting('request.jwt.claim.sub', true),
                           current_setting('request.jwt.claims', true)::jsonb ->> 'sub'), '')::uuid $f$;
-- realtime.authorize acts only as roles granted to the sidecar's login role: the benchmarks'
-- sidecars log in as the cluster's superuser, which needs the grant like any other login.
GRANT authenticated TO CURRENT_USER;
