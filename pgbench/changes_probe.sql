-- Supabase's per-subscriber check (changes_setup.sql): one (subscriber, changed row) per
-- transaction, a random member and one of the rows the delivery runs inserted.
\set u random(1, :users)
\set id random(1, :rows)
BEGIN;
SELECT supabase_visible(format('%s-0000-4000-8000-%s', lpad(to_hex(:u), 8, '0'), lpad(to_hex(:u), 12, '0'))::uuid, :id);
ROLLBACK;
