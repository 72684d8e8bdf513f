-- Supabase Realtime's database-broadcast path, rebuilt in schema `supa` from the facts in
-- shared/reference/supabase-realtime.md §1.2, §1.3, §1.5 and §3.1 (our extension owns the
-- `realtime` schema): a messages table partitioned by day, a plpgsql send that inserts into
-- it, broadcast_changes on top, and the publication a logical-replication consumer streams.
CREATE SCHEMA supa;
CREATE TABLE supa.messages (
    topic text NOT NULL,
    extension text NOT NULL,
    payload jsonb,
    event text,
    private boolean DEFAULT false,
    updated_at timestamp NOT NULL DEFAULT now(),
    inserted_at timestamp NOT NULL DEFAULT now(),
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    binary_payload bytea,
    PRIMARY KEY (id, inserted_at)
) PARTITION BY RANGE (inserted_at);
ALTER TABLE supa.messages ADD CONSTRAINT messages_payload_exclusive
    CHECK (payload IS NULL OR binary_payload IS NULL) NOT VALID;
CREATE INDEX messages_inserted_at_topic_index ON supa.messages (inserted_at DESC, topic)
    WHERE extension = 'broadcast' AND private IS TRUE;
ALTER TABLE supa.messages ENABLE ROW LEVEL SECURITY;
-- Yesterday through today + 3, as the server's partition maintenance creates them.
DO $$
DECLARE d date;
BEGIN
    FOR d IN SELECT generate_series(current_date - 1, current_date + 3, interval '1 day')::date LOOP
        EXECUTE format('CREATE TABLE supa.%I PARTITION OF supa.messages FOR VALUES FROM (%L) TO (%L)',
                       'messages_' || to_char(d, 'YYYY_MM_DD'), d, d + 1);
    END LOOP;
END
$$;

CREATE FUNCTION supa.send(payload jsonb, event text, topic text, private boolean DEFAULT true)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    generated_id uuid := gen_random_uuid();
    final_payload jsonb := CASE WHEN payload ? 'id' THEN payload
                                ELSE jsonb_set(payload, '{id}', to_jsonb(generated_id)) END;
BEGIN
    BEGIN
        EXECUTE format('SET LOCAL realtime.topic TO %L', topic);
        INSERT INTO supa.messages (id, payload, event, topic, private, extension)
        VALUES (generated_id, final_payload, event, topic, private, 'broadcast');
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'WarnSendingBroadcastMessage: %', SQLERRM;
    END;
END
$$;

CREATE FUNCTION supa.broadcast_changes(topic_name text, event_name text, operation text, table_name text,
                                       table_schema text, new record, old record, level text DEFAULT 'ROW')
RETURNS void LANGUAGE plpgsql AS $$
DECLARE row_data jsonb;
BEGIN
    IF level = 'STATEMENT' THEN
        RAISE EXCEPTION 'function can only be triggered for each row, not for each statement';
    END IF;
    IF operation IN ('INSERT', 'UPDATE', 'DELETE') THEN
        row_data := jsonb_build_object('old_record', old, 'record', new, 'operation', operation,
                                       'table', table_name, 'schema', table_schema);
        PERFORM supa.send(row_data, event_name, topic_name);
    ELSE
        RAISE EXCEPTION 'Unexpected operation type: %', operation;
    END IF;
EXCEPTION WHEN OTHERS THEN
    RAISE EXCEPTION 'Failed to process the row: %', SQLERRM;
END
$$;

CREATE PUBLICATION supabase_realtime_messages_publication FOR TABLE supa.messages;
