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
    CONSTRAINT persisted_messages_payload_exclusive CHECK ((payload IS NULL) <> (binary_payload IS NULL)),
    -- Who it counts against (MAX_PERSISTED_*_PER_USER): 'user <sub>' for a token with a
    -- subject, 'address <block>' for one without (an anonymous key is public, so its
    -- holders are told apart by where they connect from); NULL for the app's backend
    -- (service_role) and for rows kept before 0.4.0, counted in the total only.
    sender text
);
CREATE INDEX persisted_messages_topic_sent_at ON realtime.persisted_messages (topic, private, sent_at);
CREATE INDEX persisted_messages_expires_at ON realtime.persisted_messages (expires_at);
REVOKE ALL ON realtime.persisted_messages FROM PUBLIC;
-- Persisted broadcasts are the app's data: pg_dump carries their rows (the table is the
-- extension's, made again by CREATE EXTENSION at a restore).
SELECT pg_catalog.pg_extension_config_dump('realtime.persisted_messages', '');

-- What every sender together keeps (MAX_PERSISTED_MESSAGES, MAX_PERSISTED_BYTES), one row,
-- and what each sender keeps (MAX_PERSISTED_*_PER_USER), a row per sender: counting a
-- sender's rows at each relay cost what it keeps (a user at its 10,000 made every one of
-- its pushes read 10,000 rows: the soak's persister took Postgres from 50% to 77% of a
-- core). relay_batch adds what it keeps, the total's row locked first, so one keeping relay
-- runs at a time; expire_persisted counts the table again under the same lock, so what any
-- committed relay added is in the counts exactly once. New messages count at their size as
-- sent, and as stored once a round has counted them; an expired one counts until the next
-- round (the bound errs on the side of refusing). Not dumped: a restore counts them again at
-- its first expiry round.
CREATE TABLE realtime.persisted_totals (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    messages bigint NOT NULL,
    bytes bigint NOT NULL
);
INSERT INTO realtime.persisted_totals VALUES (true, 0, 0);
REVOKE ALL ON realtime.persisted_totals FROM PUBLIC;
CREATE TABLE realtime.persisted_senders (
    sender text PRIMARY KEY,
    messages bigint NOT NULL,
    bytes bigint NOT NULL
);
REVOKE ALL ON realtime.persisted_senders FROM PUBLIC;

-- The sidecar's statements on the table, kept here beside it (and in the regress suite):
-- relaying a batch of client broadcasts, the persisted ones written in the same statement
-- under the id the queue gets too (a message is kept if and only if it was relayed); a
-- replay's read; expiry in bounded chunks.

-- Relays a batch of client broadcasts (realtime.relay), arrays in step; ttls (seconds;
-- NULL for a message not kept) may be NULL when none is kept; ids (in step, NULL when no
-- message has one) are the ids senders named (REST's `id`), delivered as `meta.id`
-- (realtime.relay's show_id). Returns how many were relayed.
-- A message the queue refuses fails the whole batch: nothing of it is relayed or kept.
-- The quotas, each checked only when given (NULL: no bound), payloads counted as stored
-- (a topic's) or as counted (a sender's, the total's; see persisted_totals), the new ones at
-- their size as sent:
--   a (topic, private) keeps at most max_kept unexpired messages and max_kept_bytes;
--   a sender (senders, in step; NULL: none counted) at most max_kept_per_sender and
--   max_kept_bytes_per_sender: a topic's quota alone let one user with a write policy on a
--   prefix keep max_kept_bytes in as many topics as it names;
--   everyone together at most max_kept_total and max_kept_bytes_total.
-- A batch that would go past one fails whole with program_limit_exceeded naming its
-- settings (the sidecar splits it down to the messages that do not fit, and refuses those
-- with this text).
CREATE FUNCTION realtime.relay_batch(origins bigint[], topics text[], events text[],
    privates boolean[], payloads text[], binary_payloads bytea[], ttls integer[] DEFAULT NULL,
    max_kept integer DEFAULT NULL, max_kept_bytes bigint DEFAULT NULL,
    senders text[] DEFAULT NULL, max_kept_per_sender integer DEFAULT NULL,
    max_kept_bytes_per_sender bigint DEFAULT NULL, max_kept_total bigint DEFAULT NULL,
    max_kept_bytes_total bigint DEFAULT NULL, ids uuid[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
    over record;
BEGIN
    IF ttls IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(ttls) AS x(ttl) WHERE ttl IS NOT NULL) THEN
        SELECT count(realtime.relay(o, t, e, p, j::json, b, i, false, i IS NOT NULL)) INTO n
        FROM unnest(origins, topics, events, privates, payloads, binary_payloads, ids) AS u(o, t, e, p, j, b, i);
        RETURN n;
    END IF;
    IF senders IS NULL THEN
        senders := array_fill(NULL::text, ARRAY[cardinality(topics)]);
    END IF;
    -- The total first: its row's lock, held to commit, makes this the one keeping relay
    -- running, whichever sidecar relays it, so each count and its insert are one decision.
    UPDATE realtime.persisted_totals t
    SET messages = t.messages + k.n, bytes = t.bytes + k.size
    FROM (SELECT count(*) AS n, coalesce(sum(coalesce(octet_length(j), 0) + coalesce(octet_length(b), 0)), 0) AS size
          FROM unnest(payloads, binary_payloads, ttls) AS u(j, b, ttl) WHERE ttl IS NOT NULL) k
    RETURNING t.messages, t.bytes INTO over;
    IF over.messages > coalesce(max_kept_total, over.messages)
       OR over.bytes > coalesce(max_kept_bytes_total, over.bytes) THEN
        RAISE EXCEPTION 'PersistQuotaExceeded: this database keeps at most % persisted messages and % bytes (MAX_PERSISTED_MESSAGES, MAX_PERSISTED_BYTES) until some expire',
            max_kept_total, max_kept_bytes_total
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF max_kept IS NOT NULL OR max_kept_bytes IS NOT NULL THEN
        SELECT k.t, k.p, k.n + held.n AS n, k.bytes + held.bytes AS bytes INTO over
        FROM (SELECT t, p, count(*) AS n,
                     sum(coalesce(octet_length(j), 0) + coalesce(octet_length(b), 0)) AS bytes
              FROM unnest(topics, privates, payloads, binary_payloads, ttls) AS u(t, p, j, b, ttl)
              WHERE ttl IS NOT NULL GROUP BY t, p) k
        CROSS JOIN LATERAL (
            SELECT count(*) AS n,
                   coalesce(sum(coalesce(pg_column_size(m.payload), 0)
                                + coalesce(pg_column_size(m.binary_payload), 0)), 0) AS bytes
            FROM realtime.persisted_messages m
            WHERE m.topic = k.t AND m.private = k.p AND m.expires_at > now()) held
        WHERE k.n + held.n > coalesce(max_kept, k.n + held.n)
           OR k.bytes + held.bytes > coalesce(max_kept_bytes, k.bytes + held.bytes)
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'PersistQuotaExceeded: topic % keeps at most % persisted messages and % bytes (MAX_PERSISTED_MESSAGES_PER_TOPIC, MAX_PERSISTED_BYTES_PER_TOPIC) until some expire',
                over.t, max_kept, max_kept_bytes
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END IF;
    -- Each sender's count, added to (a row per sender, in one order).
    INSERT INTO realtime.persisted_senders AS c (sender, messages, bytes)
    SELECT s, count(*), sum(coalesce(octet_length(j), 0) + coalesce(octet_length(b), 0))
    FROM unnest(senders, payloads, binary_payloads, ttls) AS u(s, j, b, ttl)
    WHERE ttl IS NOT NULL AND s IS NOT NULL GROUP BY s ORDER BY s
    ON CONFLICT (sender) DO UPDATE
    SET messages = c.messages + excluded.messages, bytes = c.bytes + excluded.bytes;
    IF max_kept_per_sender IS NOT NULL OR max_kept_bytes_per_sender IS NOT NULL THEN
        SELECT c.sender INTO over FROM realtime.persisted_senders c
        WHERE c.sender IN (SELECT s FROM unnest(senders, ttls) AS u(s, ttl) WHERE ttl IS NOT NULL)
          AND (c.messages > coalesce(max_kept_per_sender, c.messages)
               OR c.bytes > coalesce(max_kept_bytes_per_sender, c.bytes))
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'PersistQuotaExceeded: % keeps at most % persisted messages and % bytes (MAX_PERSISTED_MESSAGES_PER_USER, MAX_PERSISTED_BYTES_PER_USER) until some expire',
                over.sender, max_kept_per_sender, max_kept_bytes_per_sender
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END IF;
    WITH m AS (
        SELECT coalesce(u.i, gen_random_uuid()) AS id, u.*
        FROM unnest(origins, topics, events, privates, payloads, binary_payloads, ttls, senders, ids)
            AS u(o, t, e, p, j, b, ttl, s, i)
    ), kept AS (
        INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, binary_payload, expires_at, sender)
        SELECT id, t, p, e, j::json, b, clock_timestamp() + ttl * interval '1 second', s
        FROM m WHERE ttl IS NOT NULL
    )
    SELECT count(realtime.relay(o, t, e, p, j::json, b, id, ttl IS NOT NULL, i IS NOT NULL)) INTO n FROM m;
    RETURN n;
END
$$;

-- What a replay adds from the table: per (topic, private) pair asked, its newest `newest`
-- persisted messages sent at or after `since`, not expired.
CREATE FUNCTION realtime.persisted_history(topics text[], privates boolean[],
    since timestamptz, newest integer)
RETURNS TABLE(id uuid, topic text, private boolean, event text, payload json,
    binary_payload bytea, sent_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT x.id, x.topic, x.private, x.event, x.payload, x.binary_payload, x.sent_at FROM (
        SELECT m.*, row_number() OVER (PARTITION BY m.topic, m.private ORDER BY m.sent_at DESC) AS r
        FROM realtime.persisted_messages m
        JOIN unnest(topics, privates) AS k(t, p) ON m.topic = k.t AND m.private = k.p
        WHERE m.sent_at >= since AND m.expires_at > now()
    ) x
    WHERE x.r <= newest
    ORDER BY x.sent_at
$$;

-- Deletes at most `max_rows` expired messages, oldest expiry first, and says how many: a
-- caller repeats while a chunk was full, so a mass expiry never becomes one statement that
-- outlives its timeout and rolls back every time. A chunk that was not full ends the round:
-- then the totals and each sender's count are counted again from the table, under the
-- total's row lock.
CREATE FUNCTION realtime.expire_persisted(max_rows integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gone integer;
BEGIN
    WITH g AS (
        DELETE FROM realtime.persisted_messages
        WHERE id IN (SELECT id FROM realtime.persisted_messages
                     WHERE expires_at < now() ORDER BY expires_at LIMIT max_rows)
        RETURNING 1
    )
    SELECT count(*)::integer INTO gone FROM g;
    IF gone < max_rows THEN
        -- No keeping relay runs while this holds the total's lock (they take it first).
        PERFORM 1 FROM realtime.persisted_totals FOR UPDATE;
        UPDATE realtime.persisted_totals t
        SET messages = c.n, bytes = c.bytes
        FROM (SELECT count(*) AS n,
                     coalesce(sum(coalesce(pg_column_size(m.payload), 0)
                                  + coalesce(pg_column_size(m.binary_payload), 0)), 0) AS bytes
              FROM realtime.persisted_messages m WHERE m.expires_at > now()) c;
        DELETE FROM realtime.persisted_senders;
        INSERT INTO realtime.persisted_senders (sender, messages, bytes)
        SELECT m.sender, count(*), sum(coalesce(pg_column_size(m.payload), 0)
                                       + coalesce(pg_column_size(m.binary_payload), 0))
        FROM realtime.persisted_messages m
        WHERE m.sender IS NOT NULL AND m.expires_at > now()
        GROUP BY m.sender;
    END IF;
    RETURN gone;
END
$$;

REVOKE EXECUTE ON FUNCTION realtime.relay_batch(bigint[], text[], text[], boolean[], text[], bytea[], integer[], integer, bigint, text[], integer, bigint, bigint, bigint, uuid[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.persisted_history(text[], boolean[], timestamptz, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION realtime.expire_persisted(integer) FROM PUBLIC;
