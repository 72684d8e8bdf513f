-- Issue 39, L9, decided (sidecar/README.md, "What a hostile client can still cost"): while a change is
-- decoded, a column whose type has a cast to json is rendered by that cast, as Supabase's
-- to_jsonb renders it, in the drain's own call: so as the role that drains, the sidecar's
-- login. Whoever may publish a table of such a type runs code as that login; this holds
-- what is promised: never as a superuser, and the value as the cast renders it.
SET ROLE postgres;
CREATE TYPE public.tone AS ENUM ('low', 'high');
CREATE FUNCTION public.tone_json(public.tone) RETURNS json LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.mark('a cast to json of a published column''s type');
    RETURN json_build_object('tone', $1::text);
END
$$;
CREATE CAST (public.tone AS json) WITH FUNCTION public.tone_json(public.tone);
CREATE TABLE public.tones (id int PRIMARY KEY, t public.tone);
RESET ROLE;
ALTER PUBLICATION supabase_realtime ADD TABLE public.tones;
GRANT EXECUTE ON FUNCTION realtime.create_consumer(text), realtime.drop_consumer(text),
    realtime.drain(text, bigint, integer, integer, integer, oid[]) TO trust_sidecar;
\c - trust_sidecar
SELECT realtime.create_consumer('trust_cast') > 0 AS made;
\c - supabase_admin
INSERT INTO public.tones VALUES (1, 'high');
\c - trust_sidecar
SELECT d.payload::jsonb -> 'record' AS record
FROM realtime.drain('trust_cast', NULL, 100, 0) d
WHERE d.payload::jsonb ->> 'table' = 'tones';
SELECT realtime.drop_consumer('trust_cast') AS dropped;
\c - supabase_admin
REVOKE EXECUTE ON FUNCTION realtime.create_consumer(text), realtime.drop_consumer(text),
    realtime.drain(text, bigint, integer, integer, integer, oid[]) FROM trust_sidecar;
ALTER PUBLICATION supabase_realtime DROP TABLE public.tones;
DROP TABLE public.tones;
DROP CAST (public.tone AS json);
DROP FUNCTION public.tone_json(public.tone);
DROP TYPE public.tone;
