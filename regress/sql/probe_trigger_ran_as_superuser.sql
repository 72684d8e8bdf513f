-- Route (a): realtime.authorize inserts its read-probe rows into realtime.messages. A
-- trigger on that table (or on the partition the row lands in) fires for every probe. It
-- must run with no more rights than a role that may only insert probe rows: never as the
-- superuser who installed the extension. Supabase's default privileges give the demoted
-- postgres TRIGGER on realtime.messages and on every partition supabase_admin makes (the
-- DEFAULT partition pg_realtime adds keeps no such grant, so a row trigger, which the
-- partitioned table hands down to every partition, is refused now; a statement trigger on
-- the partitioned table is not).
SET ROLE postgres;
CREATE FUNCTION public.probe_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.mark('a trigger on the probe row');
    RETURN NULL;
END
$$;
CREATE TRIGGER probe_row_trigger BEFORE INSERT ON realtime.messages
    FOR EACH ROW EXECUTE FUNCTION public.probe_trigger();
CREATE TRIGGER probe_trigger BEFORE INSERT ON realtime.messages
    FOR EACH STATEMENT EXECUTE FUNCTION public.probe_trigger();
RESET ROLE;
-- An anonymous private join, asked as the sidecar asks.
\c - trust_sidecar
SELECT ordinality, allowed, error
FROM realtime.authorize(ARRAY['anon'], ARRAY['{"role": "anon"}'], ARRAY['{}'], ARRAY['room:probe'],
                        ARRAY['broadcast'], ARRAY['read']);
\c - supabase_admin
-- The probe row was rolled back: nothing stays in realtime.messages.
SELECT count(*) AS probe_rows_left FROM realtime.messages WHERE topic = 'room:probe';
DROP TRIGGER probe_trigger ON realtime.messages;
