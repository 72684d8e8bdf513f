-- Route (e): pg_realtime 0.3.0 kept Supabase's send, send_binary and broadcast_changes as
-- SQL text in realtime.replaced_functions, which Supabase's default privileges let postgres
-- edit, and realtime.restore_replaced_functions() executed that text as the superuser who
-- called it. Now the functions themselves are kept (renamed), and nothing is executed from
-- a table.

-- A current install keeps Supabase's functions under other names, owned and granted as
-- Supabase left them: postgres cannot change them.
SELECT p.oid::regprocedure AS kept, p.proowner::regrole AS owner, l.lanname
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = 'realtime'::regnamespace AND p.proname LIKE 'supabase\_%' ORDER BY p.proname;
SET ROLE postgres;
CREATE OR REPLACE FUNCTION realtime.supabase_send(payload jsonb, event text, topic text, private boolean DEFAULT true)
RETURNS void LANGUAGE plpgsql AS $$ BEGIN PERFORM public.mark('a redefined send'); END $$;
RESET ROLE;
DROP EXTENSION pg_realtime CASCADE;
SELECT realtime.restore_replaced_functions() AS restored;
-- Supabase's send is back, its own body.
SELECT p.proowner::regrole AS owner, p.prosrc LIKE '%realtime.messages%' AS supabase_body
FROM pg_proc p WHERE p.oid = 'realtime.send(jsonb, text, text, boolean)'::regprocedure;

-- A 0.3.0 install, the SQL text edited by postgres, then updated.
CREATE EXTENSION pg_realtime VERSION '0.3.0';
SET ROLE postgres;
UPDATE realtime.replaced_functions
SET definition = 'SELECT public.mark(''the saved definition of send''); ' || definition
WHERE signature LIKE 'realtime.send(%';
RESET ROLE;
ALTER EXTENSION pg_realtime UPDATE;
-- After the update postgres may not edit the table any more.
SET ROLE postgres;
UPDATE realtime.replaced_functions SET definition = definition WHERE signature LIKE 'realtime.send(%';
RESET ROLE;
DROP EXTENSION pg_realtime CASCADE;
-- The saved text is not executed: the way back names what to review instead.
SELECT realtime.restore_replaced_functions() AS restored;
SELECT to_regprocedure('realtime.send(jsonb, text, text, boolean)') AS send_after;
