#!/usr/bin/env bash
# The main job: a throwaway PostgreSQL 15 cluster with pg_realtime preloaded, a chat table
# whose trigger broadcasts every change, a writer inserting rows, and a live view of the
# messages as a consumer drains them, with commit-to-receive latency. Runs DEMO_SECONDS
# (default 60), then stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=${DEMO_SECONDS:-60}
port=${DEMO_PORT:-54329}

scripts/install-deps.sh
scripts/install-extension.sh

dir=$(mktemp -d /tmp/pg_realtime_demo.XXXXXX)
scripts/cluster.sh start "$dir" "$port"
writer=""
cleanup() {
    [ -n "$writer" ] && kill "$writer" 2>/dev/null || true
    scripts/cluster.sh stop "$dir" || true
    echo "demo stopped; cluster and logs left in $dir"
}
trap cleanup EXIT

as_pg() { runuser -u postgres -- "$@"; }
psql=(as_pg psql -h "$dir" -p "$port" -U postgres -X -q -v ON_ERROR_STOP=1)
"${psql[@]}" -f "$root/scripts/demo.sql"

# The writer: a row every 200 ms into one of three rooms, and now and then an edit.
"${psql[@]}" -c "
DO \$\$
BEGIN
    FOR i IN 1..$((seconds * 5)) LOOP
        INSERT INTO chat_messages (room_id, author, body)
        VALUES ((ARRAY['lobby', 'den', 'garden'])[1 + i % 3], 'writer', 'message ' || i);
        IF i % 10 = 0 THEN
            UPDATE chat_messages SET body = body || ' (edited)' WHERE id = i - 5;
        END IF;
        COMMIT;
        PERFORM pg_sleep(0.2);
    END LOOP;
END
\$\$;" &
writer=$!

echo "pg_realtime demo: PostgreSQL on 127.0.0.1:$port, draining consumer 'demo' for ${seconds}s"
echo "  seq | topic | event | commit-to-receive | payload"
# The live view: one session drains, confirms as it goes, and prints each message.
"${psql[@]}" -c "
DO \$\$
DECLARE
    r record;
    pos bigint := realtime.create_consumer('demo');
    deadline timestamptz := clock_timestamp() + interval '$seconds seconds';
BEGIN
    WHILE clock_timestamp() < deadline LOOP
        FOR r IN SELECT * FROM realtime.drain('demo', pos, 1000, 500) LOOP
            RAISE NOTICE '% | % | % | % ms | %', r.seq, r.topic, r.event,
                round(extract(epoch FROM clock_timestamp() - r.committed_at)::numeric * 1000, 2), r.payload;
            pos := r.seq;
        END LOOP;
    END LOOP;
END
\$\$;" 2>&1 | sed -u 's/^NOTICE:  /  /'
"${psql[@]}" -c "SELECT messages_enqueued, transactions, messages_evicted, last_seq FROM realtime.stats();"
