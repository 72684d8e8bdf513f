#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster made like Supabase's image, holding a database Supabase
# made (regress/fixtures/supabase) with pg_realtime installed into it the documented way
# (extension/README.md, "Moving a Supabase project to pg_realtime"): the end-to-end tests of
# sidecar/e2e/supabase_database.test.mjs run realtime-js against it.
#   scripts/supabase-cluster.sh start DIR PORT   initdb as supabase_admin, start, load the
#                                                fixture into database postgres, install
#   scripts/supabase-cluster.sh stop DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bindir=$(pg_config --bindir)
as_pg() { runuser -u postgres -- env -u RUST_BACKTRACE "$@"; }

case "${1:-}" in
start)
    dir=$2 port=$3
    mkdir -p "$dir" && chown postgres: "$dir"
    # Supabase's image: the bootstrap superuser is supabase_admin; the fixture demotes postgres.
    as_pg "$bindir/initdb" -D "$dir/data" -U supabase_admin --auth=trust >/dev/null
    {
        echo "shared_preload_libraries = 'pg_realtime'"
        echo "wal_level = logical"
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$dir'"
    } >> "$dir/data/postgresql.conf"
    as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    psql_admin() { as_pg psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U supabase_admin -d postgres "$@"; }
    for f in 01_platform 02_realtime_schema 03_realtime_runtime 04_tutorial_app; do
        psql_admin -f "$root/regress/fixtures/supabase/$f.sql" >/dev/null
    done
    # The switch: the extension, as supabase_admin; the sidecar's login.
    psql_admin -c "CREATE EXTENSION pg_realtime" -f "$root/scripts/sidecar_login.sql" >/dev/null
    ;;
stop)
    as_pg "$bindir/pg_ctl" -D "$2/data" -m fast stop >/dev/null
    ;;
*)
    echo "usage: $0 start DIR PORT | stop DIR" >&2
    exit 2
    ;;
esac
