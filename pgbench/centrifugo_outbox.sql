-- Centrifugo v5's PostgreSQL outbox, as its documentation sets it up: the consumer reads
-- rows of a partition in id order, dispatches them (method 'publish', payload
-- {"channel", "data"}) and deletes them; a NOTIFY per row wakes it before its poll interval.
CREATE TABLE centrifugo_outbox (
    id bigserial PRIMARY KEY,
    method text NOT NULL,
    payload jsonb NOT NULL,
    partition integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE FUNCTION centrifugo_notify_partition_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('centrifugo_partition_change', NEW.partition::text);
    RETURN NEW;
END
$$;
CREATE TRIGGER centrifugo_notify_partition_trigger AFTER INSERT ON centrifugo_outbox
    FOR EACH ROW EXECUTE FUNCTION centrifugo_notify_partition_change();
