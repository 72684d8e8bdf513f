-- Hand-written part of the pg_realtime extension script, run before the generated functions.
-- CREATE EXTENSION creates schema "realtime" (named in pg_realtime.control).

-- realtime.messages: the table Supabase Realtime users write authorization policies on,
-- with Supabase's columns. Here it is only the policy table: sending a message writes no
-- row and no WAL (messages travel through the extension's shared-memory queue), so it is
-- not partitioned and needs no janitor.
CREATE TABLE realtime.messages (
    topic text NOT NULL,
    extension text NOT NULL,
    payload jsonb,
    event text,
    private boolean DEFAULT false,
    updated_at timestamp without time zone NOT NULL DEFAULT now(),
    inserted_at timestamp without time zone NOT NULL DEFAULT now(),
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    binary_payload bytea,
    CONSTRAINT messages_payload_exclusive CHECK (payload IS NULL OR binary_payload IS NULL),
    CONSTRAINT messages_pkey PRIMARY KEY (id, inserted_at)
);
ALTER TABLE realtime.messages ENABLE ROW LEVEL SECURITY;

-- The channel topic being authorized, for use in policies; same definition as Supabase's.
CREATE FUNCTION realtime.topic() RETURNS text
    LANGUAGE sql STABLE
    AS $$ select nullif(current_setting('realtime.topic', true), '')::text; $$;
