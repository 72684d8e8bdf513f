-- realtime.check_privileges() on the database Supabase made: every right through which a
-- role could place code where the extension's privileged steps run it (CREATE on schema
-- realtime; ownership of, or TRIGGER on, realtime.messages and each partition; any right on
-- the extension's own tables; membership in realtime_prober), and the role that code runs
-- as. Supabase's own grants are there and stay: the design makes them harmless.
SELECT role, privilege, object, runs_as FROM realtime.check_privileges() ORDER BY 1, 3, 2;
