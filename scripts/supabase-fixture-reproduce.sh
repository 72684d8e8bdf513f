#!/usr/bin/env bash
# Reproduced, with pg_realtime 0.1.0, the two failures of a Supabase user's first steps (from
# 0.2.0 on each step succeeds: regress/sql/supabase_install.sql, dump_restore.sql and
# supabase_dump.sql test it): (1) CREATE EXTENSION pg_realtime in a database Supabase made
# (regress/fixtures/supabase), as the superuser and as the demoted `postgres`; (2) a backup
# of a pg_realtime database (a policy on realtime.messages, one persisted message) taken with
# pg_dump -Fc and restored with pg_restore into a new database of a cluster that preloads
# the extension. Prints each step's outcome and the server's exact errors; it checks nothing
# and exits 0 if it ran to the end: this is evidence, not a test.
#   scripts/supabase-fixture-reproduce.sh [PORT]
set -euo pipefail
port=${1:-27020}
root=$(cd "$(dirname "$0")/.." && pwd)
fixture=$root/regress/fixtures/supabase
bindir=$(pg_config --bindir)
work=$(mktemp -d /tmp/supabase-reproduce.XXXXXX)
chown postgres: "$work"
as_pg() { runuser -u postgres -- "$@"; }
cleanup() {
    as_pg "$bindir/pg_ctl" -D "$work/data" -m fast stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# Like Supabase's image: bootstrap superuser supabase_admin, the library preloaded.
as_pg "$bindir/initdb" -D "$work/data" -U supabase_admin --auth=trust >/dev/null
printf "shared_preload_libraries = 'pg_realtime'\nwal_level = logical\nport = %s\nlisten_addresses = ''\nunix_socket_directories = '%s'\n" \
    "$port" "$work" >> "$work/data/postgresql.conf"
as_pg "$bindir/pg_ctl" -D "$work/data" -l "$work/server.log" -w start >/dev/null
run() { # USER DB ARGS... : psql that shows errors and goes on
    local user=$1 db=$2; shift 2
    as_pg psql -Xq -h "$work" -p "$port" -U "$user" -d "$db" "$@" 2>&1 | grep -v 'wal_level\|^HINT:  Set wal_level' || true
}
load_fixture() { # DB
    for f in 01_platform 02_realtime_schema 03_realtime_runtime 04_tutorial_app; do
        as_pg psql -XAq -v ON_ERROR_STOP=1 -h "$work" -p "$port" -U supabase_admin -d "$1" -f "$fixture/$f.sql" 2>&1 \
            | grep -v 'wal_level' || true
    done
}

echo "== 1a. CREATE EXTENSION pg_realtime as supabase_admin (superuser) in the fixture"
run supabase_admin postgres -c 'CREATE DATABASE supabase'
load_fixture supabase
run supabase_admin supabase -c 'CREATE EXTENSION pg_realtime'
echo "== 1b. the same as postgres (demoted, as on the image; no supautils here)"
run postgres supabase -c 'CREATE EXTENSION pg_realtime'

echo "== 2. pg_dump -Fc / pg_restore of a database with pg_realtime"
run supabase_admin postgres -c 'CREATE DATABASE app'
run supabase_admin app <<'SQL'
-- (the cluster already has the role: the fixture above created it)
CREATE EXTENSION pg_realtime;
CREATE POLICY members_read ON realtime.messages FOR SELECT TO authenticated USING (realtime.topic() = 'room:1');
-- What the sidecar writes for a client broadcast sent with persist.
INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, expires_at)
VALUES (gen_random_uuid(), 'room:1', true, 'chat', '{"text": "kept"}', now() + interval '1 day');
SELECT 'before: policies=' || (SELECT count(*) FROM pg_policies WHERE schemaname = 'realtime')
    || ' persisted=' || (SELECT count(*) FROM realtime.persisted_messages) AS source;
SQL
as_pg "$bindir/pg_dump" -Fc -h "$work" -p "$port" -U supabase_admin -f "$work/app.dump" app
echo "-- pg_restore (default: goes on after errors)"
run supabase_admin postgres -c 'CREATE DATABASE restored'
as_pg "$bindir/pg_restore" -h "$work" -p "$port" -U supabase_admin -d restored "$work/app.dump" 2>&1 || true
run supabase_admin restored -Atc "SELECT 'after: policies=' || (SELECT count(*) FROM pg_policies WHERE schemaname = 'realtime') || ' persisted=' || (SELECT count(*) FROM realtime.persisted_messages)"
echo "-- pg_restore --exit-on-error"
run supabase_admin postgres -c 'CREATE DATABASE restored_strict'
as_pg "$bindir/pg_restore" --exit-on-error -h "$work" -p "$port" -U supabase_admin -d restored_strict "$work/app.dump" 2>&1 || echo "(pg_restore exit status $?)"
echo "-- what the archive holds about realtime"
as_pg "$bindir/pg_restore" -l "$work/app.dump" | grep -i 'realtime\|PUBLICATION\|POLICY\|EXTENSION' || true
