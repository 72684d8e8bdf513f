#!/usr/bin/env bash
# The main job: a throwaway PostgreSQL 15 cluster with pg_realtime preloaded, the sidecar, a
# chat table whose trigger broadcasts every change, a published task list whose changes
# travel as Postgres Changes, a writer changing both, and a web page (served by the sidecar,
# using the official @supabase/realtime-js) that shows rows arriving live with their
# commit-to-page latency. The terminal shows the same feed. Halfway the sidecar is killed and
# started again: page and terminal resume after their last message and say nothing was
# lost. Runs DEMO_SECONDS (default 120), then stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=${DEMO_SECONDS:-120}
pg_port=${DEMO_PG_PORT:-24329}
http_port=${DEMO_HTTP_PORT:-4000}
secret=demo-secret-$(date +%s)-with-enough-length
export PATH="$HOME/.cargo/bin:$PATH"

scripts/install-deps.sh
scripts/install-extension.sh
cargo build --release -q -p realtime-sidecar
(cd sidecar/web && npm ci --no-audit --no-fund --loglevel=error && npm run -s build)

dir=$(mktemp -d /tmp/pg_realtime_demo.XXXXXX)
chmod 755 "$dir"
scripts/cluster.sh start "$dir/pg" "$pg_port"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    scripts/cluster.sh stop "$dir/pg" || true
    echo "demo stopped; logs left in $dir"
}
trap cleanup EXIT

psql=(runuser -u postgres -- psql -h "$dir/pg" -p "$pg_port" -U postgres -X -q -v ON_ERROR_STOP=1)
# sidecar_login.sql creates the client roles demo.sql could not grant to yet.
"${psql[@]}" -f "$root/scripts/demo.sql" -f "$root/scripts/sidecar_login.sql" -c "GRANT SELECT ON demo_tasks TO anon"

apikey=$(node sidecar/web/anon-key.mjs "$secret")
mkdir -p "$dir/web"
cp sidecar/web/dist/* "$dir/web/"
printf '{"apikey": "%s", "rooms": ["lobby", "den", "garden"]}\n' "$apikey" > "$dir/web/config.json"

start_sidecar() {
    PORT=$http_port API_JWT_SECRET=$secret CONSUMER_NAME=demo WEB_ROOT="$dir/web" \
        DATABASE_URL="host=$dir/pg port=$pg_port user=realtime_sidecar dbname=postgres" \
        target/release/realtime-sidecar >> "$dir/sidecar.log" 2>&1 &
    sidecar=$!
    pids+=($sidecar)
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$http_port") 2>/dev/null && break
        sleep 0.1
    done
}
start_sidecar

# The writer: a row every 200 ms into one of three rooms, and now and then an edit; a task
# every second, one ticked off every 1.4 s, and finished ones deleted now and then.
"${psql[@]}" -c "
DO \$\$
BEGIN
    FOR i IN 1..$((seconds * 5)) LOOP
        INSERT INTO chat_messages (room_id, author, body)
        VALUES ((ARRAY['lobby', 'den', 'garden'])[1 + i % 3], 'writer', 'message ' || i);
        IF i % 10 = 0 THEN
            UPDATE chat_messages SET body = body || ' (edited)', updated_at = clock_timestamp() WHERE id = i - 5;
        END IF;
        IF i % 5 = 0 THEN
            INSERT INTO demo_tasks (title) VALUES ('task ' || i / 5);
        END IF;
        IF i % 7 = 0 THEN
            UPDATE demo_tasks SET done = true, updated_at = clock_timestamp()
            WHERE id = (SELECT min(id) FROM demo_tasks WHERE NOT done);
        END IF;
        IF i % 25 = 0 THEN
            DELETE FROM demo_tasks WHERE id = (SELECT min(id) FROM demo_tasks WHERE done);
        END IF;
        COMMIT;
        PERFORM pg_sleep(0.2);
    END LOOP;
END
\$\$;" &
pids+=($!)

echo
echo "pg_realtime demo: open http://127.0.0.1:$http_port/ to watch rows arrive (for ${seconds}s)."
echo "The same feed, received here by realtime-js through the sidecar:"
node sidecar/web/watch.mjs "ws://127.0.0.1:$http_port" "$apikey" "$seconds" lobby den garden &
watch=$!
pids+=($watch)
# Halfway, the sidecar is killed (SIGKILL: no goodbye to anyone) and started again a second
# later. The page and the terminal feed rejoin with their last position and say that no
# row was missed, though rows were committed while it was away; the page says the same of
# its task list (its channel keeps its Postgres Changes position).
sleep $((seconds / 2))
echo "  -- killing the sidecar (SIGKILL) and starting it again in a second --"
# Reaped here, so the shell does not report the kill as a job that died.
{ kill -KILL "$sidecar" && wait "$sidecar"; } 2>/dev/null || true
sleep 1
start_sidecar
wait "$watch"
