-- Subtransactions: ROLLBACK TO SAVEPOINT drops exactly what the savepoint (and anything
-- nested in it) sent; RELEASE keeps it.
BEGIN;
SELECT realtime.send('{"n": 1}', 'ev', 't', false);
SAVEPOINT a;
SELECT realtime.send('{"n": 2}', 'ev', 't', false);
ROLLBACK TO SAVEPOINT a;
SELECT realtime.send('{"n": 3}', 'ev', 't', false);
SAVEPOINT b;
SELECT realtime.send('{"n": 4}', 'ev', 't', false);
RELEASE SAVEPOINT b;
SAVEPOINT c;
SAVEPOINT d;
SELECT realtime.send('{"n": 5}', 'ev', 't', false);
RELEASE SAVEPOINT d;
ROLLBACK TO SAVEPOINT c;
SAVEPOINT e;
SELECT realtime.send('{"n": 6}', 'ev', 't', false);
ROLLBACK TO SAVEPOINT e;
SELECT realtime.send('{"n": 7}', 'ev', 't', false);
COMMIT;
SELECT * FROM take();

-- A plpgsql exception block is a subtransaction: its sends are dropped with it.
DO $$
BEGIN
    PERFORM realtime.send('{"n": 8}', 'ev', 't', false);
    BEGIN
        PERFORM realtime.send('{"n": 9}', 'ev', 't', false);
        RAISE EXCEPTION 'boom';
    EXCEPTION WHEN OTHERS THEN
        PERFORM realtime.send('{"n": 10}', 'ev', 't', false);
    END;
END
$$;
SELECT * FROM take();

-- Several messages in one transaction arrive contiguously, in call order, numbered gaplessly.
SELECT count(*) FROM (SELECT realtime.send(jsonb_build_object('i', i), 'ev', 't', false) FROM generate_series(1, 5) i) s;
SELECT * FROM take();

-- Transaction control inside a procedure body: each transaction is judged on its own.
DO $$
BEGIN
    PERFORM realtime.send('{"n": 11}', 'ev', 't', false);
    COMMIT;
    PERFORM realtime.send('{"n": 12}', 'ev', 't', false);
    ROLLBACK;
    PERFORM realtime.send('{"n": 13}', 'ev', 't', false);
END
$$;
SELECT * FROM take();

-- Sending writes no table row and no WAL: the transaction gets no transaction id.
BEGIN;
SELECT realtime.send('{"n": 14}', 'ev', 't', false);
SELECT txid_current_if_assigned() IS NULL AS no_xid_assigned;
COMMIT;
SELECT count(*) AS rows_in_messages FROM realtime.messages;
SELECT * FROM take();
