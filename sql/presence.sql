-- Hand-written part of the pg_realtime extension script.

-- Presence (realtime-js's track and untrack, presenceState, sync, join and leave), held by
-- the database so that every sidecar has the same view. Members live in realtime.presences,
-- each leased to the sidecar session that tracked it (realtime.presence_sessions); every
-- change queues its diff (realtime.queue_presence, extension/src/presence.rs) in the same
-- transaction, so diffs reach every sidecar in the queue's one order, and only if the
-- change committed. A member that leaves is not deleted at once but tombstoned (`left_at`):
-- a sidecar that loads a topic's state also learns which refs already left, so a join it
-- drains late cannot bring a ghost back. A sidecar that dies (or hangs, or loses its
-- network) stops renewing its lease; any sidecar's reaper then makes its members leave.
-- A session also names the backend that renews it: a sidecar killed outright closes that
-- backend's socket, and its members leave at the next reap instead of when the lease runs
-- out. Only the sidecar's role may use any of it.

-- Phoenix's phx_ref of each member: made here, so the same on every sidecar, and never
-- reused (a sequence survives restarts).
CREATE SEQUENCE realtime.presence_refs;

-- Unlogged: a lease lives no longer than the server it was taken on (a session is renewed
-- from one backend, and a sidecar takes a new session when it connects again), so nothing of
-- it needs the WAL. Each sidecar renews every second; a logged renewal made every idle
-- sidecar flush the WAL and wait for the synchronous standbys once a second (about 0.3 ms of
-- the primary's CPU each), and let a standby's absence expire every lease. After a crash or a
-- promotion the table is empty, so the members of its sessions leave at the first reap, as
-- they would anyway: their backends are gone. (realtime.presences, the members, is logged:
-- presence survives a failover.)
CREATE UNLOGGED TABLE realtime.presence_sessions (
    session text PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    -- The backend that renews the lease (the sidecar's presence connection).
    pid integer
);

CREATE TABLE realtime.presences (
    ref text PRIMARY KEY,
    topic text NOT NULL,
    private boolean NOT NULL,
    key text NOT NULL,
    meta jsonb NOT NULL,
    session text NOT NULL,
    joined_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    left_at timestamptz
);
CREATE INDEX presences_topic ON realtime.presences (topic, private);
CREATE INDEX presences_live_by_session ON realtime.presences (session) WHERE left_at IS NULL;
CREATE INDEX presences_left_at ON realtime.presences (left_at) WHERE left_at IS NOT NULL;
REVOKE ALL ON realtime.presence_sessions, realtime.presences FROM PUBLIC;
REVOKE ALL ON SEQUENCE realtime.presence_refs FROM PUBLIC;

-- Phoenix's shape of one presence in a diff or a state: {key: {metas: [meta + phx_ref]}}.
CREATE FUNCTION realtime.presence_entry(member_key text, member_meta jsonb, member_ref text,
                                        previous_ref text DEFAULT NULL) RETURNS jsonb
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(member_key, jsonb_build_object('metas', jsonb_build_array(
        member_meta || jsonb_build_object('phx_ref', member_ref)
            || CASE WHEN previous_ref IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('phx_ref_prev', previous_ref) END)))
$$;

-- Takes or renews a sidecar session's lease. Returns whether the session still held one:
-- false the first time, and after its members were reaped (the sidecar must track its
-- clients' presences again).
CREATE FUNCTION realtime.presence_renew(session_id text, lease interval DEFAULT '3 seconds')
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held boolean;
BEGIN
    SELECT s.expires_at >= clock_timestamp() INTO held
    FROM realtime.presence_sessions s WHERE s.session = session_id FOR UPDATE;
    -- A session is renewed from one connection only (a sidecar takes a new session when it
    -- connects again), so this backend's pid names it for as long as the session lives.
    INSERT INTO realtime.presence_sessions AS s (session, expires_at, pid)
    VALUES (session_id, clock_timestamp() + lease, pg_backend_pid())
    ON CONFLICT (session) DO UPDATE SET expires_at = excluded.expires_at, pid = excluded.pid;
    RETURN coalesce(held, false);
END
$$;

-- Tracks a member of `topic_name` for the session, or updates one: `previous_ref` is the
-- ref the same channel's presence had. Returns the new ref, or NULL when the meta is
-- unchanged (then nothing is sent, as Phoenix sends nothing). An update is a join and the
-- leave of the previous ref in one diff, the join carrying phx_ref_prev, as
-- Phoenix.Presence sends it.
CREATE FUNCTION realtime.presence_track(session_id text, topic_name text, is_private boolean,
                                        member_key text, member_meta jsonb,
                                        previous_ref text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    old realtime.presences;
    new_ref text;
    leaves jsonb := '{}';
BEGIN
    IF member_meta IS NULL OR jsonb_typeof(member_meta) <> 'object' THEN
        RAISE EXCEPTION 'Presence track payload must be a map' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF previous_ref IS NOT NULL THEN
        SELECT * INTO old FROM realtime.presences p
        WHERE p.ref = previous_ref AND p.session = session_id AND p.left_at IS NULL FOR UPDATE;
        IF FOUND AND old.meta = member_meta AND old.key = member_key
           AND old.topic = topic_name AND old.private = is_private THEN
            RETURN NULL;
        END IF;
    END IF;
    new_ref := 'p' || nextval('realtime.presence_refs');
    INSERT INTO realtime.presences (ref, topic, private, key, meta, session)
    VALUES (new_ref, topic_name, is_private, member_key, member_meta, session_id);
    IF old.ref IS NOT NULL THEN
        UPDATE realtime.presences p SET left_at = clock_timestamp() WHERE p.ref = old.ref;
        leaves := realtime.presence_entry(old.key, old.meta, old.ref);
    END IF;
    PERFORM realtime.queue_presence(topic_name, is_private, jsonb_build_object(
        'joins', realtime.presence_entry(member_key, member_meta, new_ref, old.ref),
        'leaves', leaves)::text);
    RETURN new_ref;
END
$$;

-- Untracks the session's member `member_ref`: it leaves. Returns whether it was present.
CREATE FUNCTION realtime.presence_untrack(session_id text, member_ref text)
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gone realtime.presences;
BEGIN
    UPDATE realtime.presences p SET left_at = clock_timestamp()
    WHERE p.ref = member_ref AND p.session = session_id AND p.left_at IS NULL
    RETURNING * INTO gone;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM realtime.queue_presence(gone.topic, gone.private, jsonb_build_object(
        'joins', '{}'::jsonb, 'leaves', realtime.presence_entry(gone.key, gone.meta, gone.ref))::text);
    RETURN true;
END
$$;

-- The members of every ended session leave (one diff per topic), those sessions end, and
-- tombstones older than `keep_left` are purged (they only have to outlive a sidecar's drain
-- lag; a churning room would pile them up). A session has ended when its lease expired or
-- the backend that renewed it is gone (its sidecar was killed, or lost its connection); a
-- member whose session is missing altogether (tracked while it was being reaped) leaves
-- too, so no member outlives its session. Any sidecar may call it, all of them every second,
-- each first asking realtime.presence_reap_due, so that about one a second goes ahead; one
-- reaps at a time and the others return 0 at once. Returns how many members left.
CREATE FUNCTION realtime.presence_reap(keep_left interval DEFAULT '1 minute')
RETURNS integer LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('realtime.presence_reap')) THEN
        RETURN 0;
    END IF;
    FOR t IN
        WITH ended AS (
            DELETE FROM realtime.presence_sessions s
            WHERE s.expires_at < clock_timestamp()
               OR (s.pid IS NOT NULL AND NOT realtime.backend_alive(s.pid))
            RETURNING s.session),
        gone AS (
            UPDATE realtime.presences p SET left_at = clock_timestamp()
            WHERE p.left_at IS NULL
              AND (p.session IN (SELECT e.session FROM ended e)
                   OR NOT EXISTS (SELECT 1 FROM realtime.presence_sessions s WHERE s.session = p.session))
            RETURNING p.topic, p.private, p.key, p.meta, p.ref)
        SELECT g.topic, g.private, sum(g.c)::integer AS members,
               jsonb_object_agg(g.key, g.metas) AS leaves
        FROM (SELECT topic, private, key, count(*) AS c,
                     jsonb_build_object('metas', jsonb_agg(meta || jsonb_build_object('phx_ref', ref) ORDER BY ref)) AS metas
              FROM gone GROUP BY topic, private, key) g
        GROUP BY g.topic, g.private
    LOOP
        PERFORM realtime.queue_presence(t.topic, t.private,
            jsonb_build_object('joins', '{}'::jsonb, 'leaves', t.leaves)::text);
        n := n + t.members;
    END LOOP;
    DELETE FROM realtime.presences p WHERE p.left_at < clock_timestamp() - keep_left;
    RETURN n;
END
$$;

-- Ends a session at once (a sidecar stopping cleanly): its members leave now. It waits for
-- a reaper that is running (advisory locks are reentrant, so the reap below then proceeds).
CREATE FUNCTION realtime.presence_end(session_id text) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('realtime.presence_reap'));
    UPDATE realtime.presence_sessions s SET expires_at = '-infinity' WHERE s.session = session_id;
    RETURN realtime.presence_reap();
END
$$;

-- The members of some topics, present (`live`) and left within `left_within`
-- (tombstones), for a sidecar building its view of them.
CREATE FUNCTION realtime.presence_state(topic_names text[], privates boolean[],
                                        left_within interval DEFAULT '1 minute')
RETURNS TABLE(topic text, private boolean, key text, ref text, meta jsonb, live boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p.topic, p.private, p.key, p.ref, p.meta, p.left_at IS NULL
    FROM realtime.presences p
    JOIN unnest(topic_names, privates) AS t(topic, private)
      ON p.topic = t.topic AND p.private = t.private
    WHERE p.left_at IS NULL OR p.left_at >= clock_timestamp() - left_within
    ORDER BY p.topic, p.private, p.key, p.ref
$$;

REVOKE EXECUTE ON FUNCTION realtime.queue_presence(text, boolean, text),
    realtime.backend_alive(integer), realtime.presence_reap_due(integer),
    realtime.presence_renew(text, interval),
    realtime.presence_track(text, text, boolean, text, jsonb, text),
    realtime.presence_untrack(text, text),
    realtime.presence_reap(interval),
    realtime.presence_end(text),
    realtime.presence_state(text[], boolean[], interval) FROM PUBLIC;
