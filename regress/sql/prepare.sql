-- PREPARE TRANSACTION after sending is refused: the messages could not follow the prepared
-- transaction to COMMIT PREPARED.
BEGIN;
SELECT realtime.send('{"a": 1}', 'ev', 'room:1');
PREPARE TRANSACTION 'with_messages';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT * FROM take();

-- A transaction that rolled its sends back to a savepoint has nothing to lose and prepares.
BEGIN;
SAVEPOINT s;
SELECT realtime.send('{"a": 2}', 'ev', 'room:1');
ROLLBACK TO SAVEPOINT s;
PREPARE TRANSACTION 'without_messages';
COMMIT PREPARED 'without_messages';
SELECT * FROM take();
