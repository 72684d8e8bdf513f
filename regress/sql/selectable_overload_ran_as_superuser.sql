-- Route (d): realtime.subscribable asks realtime.selectable about a table it holds as an
-- oid. A role with CREATE on schema realtime (on Supabase, supabase_realtime_admin) could
-- add realtime.selectable(oid, text[]), an exact match for that call, and have it run as
-- the superuser who installed the extension. The call must reach only the extension's own
-- function.
SET ROLE supabase_realtime_admin;
CREATE FUNCTION realtime.selectable(entity oid, roles text[])
RETURNS TABLE(role text, columns text[], error text) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.mark('an overload of realtime.selectable');
    RETURN QUERY SELECT r, ARRAY['id', 'room_topic', 'user_id', 'content', 'created_at'], NULL::text
                 FROM unnest(roles) r;
END
$$;
GRANT EXECUTE ON FUNCTION realtime.selectable(oid, text[]) TO PUBLIC;
RESET ROLE;
\c - trust_sidecar
SELECT item, error, "values"
FROM realtime.subscribable('[{"role": "authenticated", "schema": "public", "table": "messages",
                              "filters": [{"column": "room_topic", "op": "eq", "values": ["room:lobby"]}]}]');
\c - supabase_admin
DROP FUNCTION realtime.selectable(oid, text[]);
