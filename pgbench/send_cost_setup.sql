-- pgbench/send_cost.py: a role held to the INSERT policies of realtime.messages, and a
-- stand-in for Supabase's send written from its documented behaviour (an INSERT of the
-- message's row into realtime.messages as the caller, with realtime.topic set local, in an
-- exception block that turns any error into a WARNING). The stand-in writes into a copy of
-- the table with the same policy (bench.messages), so that it pays Supabase's costs and not
-- ours: realtime.messages carries pg_realtime's delivery trigger, which Supabase's does not.
CREATE EXTENSION pg_realtime;
CREATE ROLE held NOLOGIN;
GRANT USAGE ON SCHEMA realtime TO held;
GRANT INSERT ON realtime.messages TO held;
CREATE POLICY bench_send ON realtime.messages FOR INSERT TO held
    WITH CHECK ((SELECT realtime.topic()) LIKE 'bench:%');

CREATE SCHEMA bench;
GRANT USAGE ON SCHEMA bench TO held;
CREATE TABLE bench.messages (LIKE realtime.messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE bench.messages ENABLE ROW LEVEL SECURITY;
GRANT INSERT ON bench.messages TO held;
CREATE POLICY bench_send ON bench.messages FOR INSERT TO held
    WITH CHECK ((SELECT realtime.topic()) LIKE 'bench:%');
CREATE FUNCTION bench.send(payload jsonb, event text, topic text, private boolean DEFAULT true)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        PERFORM set_config('realtime.topic', topic, true);
        INSERT INTO bench.messages (payload, event, topic, private, extension)
        VALUES (payload || jsonb_build_object('id', gen_random_uuid()), event, topic, private, 'broadcast');
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'ErrorSendingBroadcastMessage: %', SQLERRM;
    END;
END
$$;
GRANT EXECUTE ON FUNCTION bench.send(jsonb, text, text, boolean) TO held;

-- One round's statement per sender: n sends to ten topics in one statement, its time read
-- with clock_timestamp() around it (in microseconds).
CREATE FUNCTION bench.time_sends(how text, n integer) RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    IF how = 'ours' THEN
        PERFORM count(realtime.send('{"n": 1}', 'ev', 'bench:' || (g % 10), false)) FROM generate_series(1, n) g;
    ELSE
        PERFORM count(bench.send('{"n": 1}', 'ev', 'bench:' || (g % 10), false)) FROM generate_series(1, n) g;
    END IF;
    RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6;
END
$$;
GRANT EXECUTE ON FUNCTION bench.time_sends(text, integer) TO held;
