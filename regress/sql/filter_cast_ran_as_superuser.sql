-- Route (b): realtime.subscribable renders a client's filter value as the column's type
-- renders it in JSON, and to_jsonb calls a cast to json that the type's owner made. That
-- cast must run as the client's role, not as the superuser who installed the extension;
-- and an enum-column filter still joins, its value rendered as the cast renders it.
SET ROLE postgres;
CREATE TYPE public.mood AS ENUM ('calm', 'loud');
CREATE FUNCTION public.mood_json(public.mood) RETURNS json LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.mark('a cast to json of the filter''s type');
    RETURN to_json($1::text);
END
$$;
CREATE CAST (public.mood AS json) WITH FUNCTION public.mood_json(public.mood);
CREATE TABLE public.moods (id int PRIMARY KEY, m public.mood);
GRANT SELECT ON public.moods TO anon;
RESET ROLE;
ALTER PUBLICATION supabase_realtime ADD TABLE public.moods;
\c - trust_sidecar
SELECT item, error, "values"
FROM realtime.subscribable('[{"role": "anon", "schema": "public", "table": "moods",
                              "filters": [{"column": "m", "op": "eq", "values": ["calm"]},
                                          {"column": "m", "op": "in", "values": ["calm", "loud"]}]}]');
-- A value the type does not take is still a clear refusal.
SELECT item, error, "values"
FROM realtime.subscribable('[{"role": "anon", "schema": "public", "table": "moods",
                              "filters": [{"column": "m", "op": "eq", "values": ["angry"]}]}]');
\c - supabase_admin
ALTER PUBLICATION supabase_realtime DROP TABLE public.moods;
