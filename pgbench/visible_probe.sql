-- Supabase's per-subscriber probe: one (subscriber, changed row) per transaction.
\set u random(1, 1000)
\set i random(1, 100)
BEGIN;
SELECT supabase_visible(md5(:u::text)::uuid, :i);
ROLLBACK;
