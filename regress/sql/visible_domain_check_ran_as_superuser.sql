-- Route (c): realtime.visible reads the key of each changed record into the table's row
-- type (jsonb_populate_record), which runs the CHECK of a domain-typed column. That CHECK
-- is the domain owner's code: it must run as the subscriber's role, not as the superuser
-- who installed the extension. Visibility itself is unchanged.
SET ROLE postgres;
CREATE FUNCTION public.key_ok(int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN public.mark('a domain CHECK on the key');
END
$$;
CREATE DOMAIN public.checked_key AS int CHECK (public.key_ok(VALUE));
CREATE TABLE public.checked (id public.checked_key PRIMARY KEY, body text);
ALTER TABLE public.checked ENABLE ROW LEVEL SECURITY;
CREATE POLICY "anon reads odd rows" ON public.checked FOR SELECT TO anon USING (id % 2 = 1);
GRANT SELECT ON public.checked TO anon;
INSERT INTO public.checked VALUES (1, 'one'), (2, 'two');
RESET ROLE;
\c - trust_sidecar
SELECT identity, record, error
FROM realtime.visible('public.checked', ARRAY['anon'], ARRAY['{"role": "anon"}'],
                      ARRAY['{"id": 1, "body": "one"}', '{"id": 2, "body": "two"}'])
ORDER BY 1, 2;
\c - supabase_admin
