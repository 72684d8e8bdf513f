-- One INSERT into the table named by pgbench's -D table=...
\set room random(1, 1000)
INSERT INTO :table (room, author, body, score, created_at)
VALUES (:room, 'author-' || :room, 'a message body of a typical chat line, about sixty bytes', 4.5, now());
