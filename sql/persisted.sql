-- Hand-written part of the pg_realtime extension script.

-- realtime.persisted_messages: client broadcasts sent with `persist` (realtime-js's
-- channel.send on a private channel with serializer 2.0.0, or channel.httpSend with
-- persist), kept for their ttl so that Supabase's replay still finds them after the
-- queue's ring has moved on (the ring keeps messages by space, not time). The sidecar writes
-- a row in the same statement that relays the message (same id), reads the rows at a
-- replay and deletes expired ones. Only the sidecar's role is granted it.
CREATE TABLE realtime.persisted_messages (
    id uuid PRIMARY KEY,
    topic text NOT NULL,
    private boolean NOT NULL,
    event text NOT NULL,
    payload json,
    binary_payload bytea,
    -- clock_timestamp(): distinct and in order within one statement, so messages relayed
    -- together replay in their order (Supabase's now() replays them reversed, #2201).
    sent_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT persisted_messages_payload_exclusive CHECK ((payload IS NULL) <> (binary_payload IS NULL))
);
CREATE INDEX persisted_messages_topic_sent_at ON realtime.persisted_messages (topic, private, sent_at);
CREATE INDEX persisted_messages_expires_at ON realtime.persisted_messages (expires_at);
REVOKE ALL ON realtime.persisted_messages FROM PUBLIC;
