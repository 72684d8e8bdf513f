#!/usr/bin/env bash
# Dev-time check that regress/fixtures/supabase reproduces the `realtime` schema Supabase
# Realtime's migrations leave: loads Supabase's own dump of a migrated tenant
# (priv/repo/tenant_db_dump_15.sql, and _17.sql, of the supabase/realtime repository, taken
# from a local git directory given as argument; nothing of it is kept) into one throwaway
# PostgreSQL 15 cluster and our fixture into another, and diffs a catalog description of both
# (regress/fixtures/supabase/describe.sql). Each cluster first gets 01_platform.sql, the
# roles and grants the dump presupposes. Not part of the test suite: the repository never
# depends on Supabase's files.
#   scripts/supabase-fixture-compare.sh REALTIME_GIT_DIR [COMMIT] [PORT]
# Prints the diff (dump lines '<', fixture lines '>') per dump and exits non-zero if any.
set -euo pipefail
git_dir=${1:?usage: $0 REALTIME_GIT_DIR [COMMIT] [PORT]}
commit=${2:-HEAD}
port=${3:-27001}
root=$(cd "$(dirname "$0")/.." && pwd)
fixture=$root/regress/fixtures/supabase
bindir=$(pg_config --bindir)
work=$(mktemp -d /tmp/supabase-compare.XXXXXX)
chown postgres: "$work"
as_pg() { runuser -u postgres -- "$@"; }
clusters=()
cleanup() {
    for c in "${clusters[@]}"; do as_pg "$bindir/pg_ctl" -D "$c" -m immediate stop >/dev/null 2>&1 || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# A plain cluster (no pg_realtime) whose bootstrap superuser is supabase_admin, as the image's.
start_cluster() { # NAME PORT
    local dir=$work/$1
    as_pg "$bindir/initdb" -D "$dir" -U supabase_admin --auth=trust >/dev/null
    printf "wal_level = logical\nport = %s\nlisten_addresses = ''\nunix_socket_directories = '%s'\n" "$2" "$work" >> "$dir/postgresql.conf"
    as_pg "$bindir/pg_ctl" -D "$dir" -l "$dir.log" -w start >/dev/null
    clusters+=("$dir")
}
psql_at() { # PORT DB ARGS...
    local p=$1 db=$2; shift 2
    as_pg psql -XAtq -v ON_ERROR_STOP=1 -h "$work" -p "$p" -U supabase_admin -d "$db" "$@"
}

status=0
for version in 15 17; do
    dump=$work/dump_$version.sql
    git --git-dir="$git_dir" show "$commit:priv/repo/tenant_db_dump_$version.sql" > "$dump"
    chmod a+r "$dump"
    a=$port b=$((port + 1))
    start_cluster "dump$version" "$a"
    start_cluster "fixture$version" "$b"
    for p in "$a" "$b"; do
        psql_at "$p" postgres -c 'CREATE DATABASE tenant'
        psql_at "$p" tenant -f "$fixture/01_platform.sql"
    done
    echo "== tenant_db_dump_$version.sql"
    if ! psql_at "$a" tenant -f "$dump" > "$work/load_$version.out" 2>&1; then
        echo "PostgreSQL 15 cannot load it as it is:"; grep -m1 ERROR "$work/load_$version.out"
        # Two PostgreSQL 17 syntaxes 15 lacks, neither about the schema: role memberships
        # granted WITH INHERIT FALSE (on 15 inheritance is the member's attribute, and
        # supabase_realtime_admin is NOINHERIT either way), and pg_dump 17's
        # SET transaction_timeout. Both are dropped and the dump loaded into a fresh database.
        echo "loading it without 'WITH INHERIT FALSE' and 'SET transaction_timeout'"
        sed -i -e 's/ WITH INHERIT FALSE//' -e '/^SET transaction_timeout/d' "$dump"
        psql_at "$a" postgres -c 'DROP DATABASE tenant' -c 'DROP ROLE IF EXISTS supabase_realtime_admin' -c 'CREATE DATABASE tenant'
        psql_at "$a" tenant -f "$fixture/01_platform.sql" 2>&1 | grep ERROR || true
        if ! psql_at "$a" tenant -f "$dump" > "$work/load_$version.out" 2>&1; then
            echo "nor with it removed:"; grep -m1 ERROR "$work/load_$version.out"
            status=1
            for c in "$work/dump$version" "$work/fixture$version"; do as_pg "$bindir/pg_ctl" -D "$c" -m fast stop >/dev/null; done
            clusters=(); continue
        fi
    fi
    # pg_dump leaves out an ACL equal to the owner's default, so the restore's default
    # privileges (supabase_admin's in realtime) grant postgres and dashboard_user on the
    # migration table, which the tenant migrations had revoked; revoke them again.
    psql_at "$a" tenant -c 'REVOKE ALL ON realtime.schema_migrations FROM postgres, dashboard_user'
    psql_at "$b" tenant -f "$fixture/02_realtime_schema.sql"
    psql_at "$a" tenant -f "$fixture/describe.sql" > "$work/dump_$version.txt"
    psql_at "$b" tenant -f "$fixture/describe.sql" > "$work/fixture_$version.txt"
    echo "$(wc -l < "$work/dump_$version.txt") facts from the dump, $(wc -l < "$work/fixture_$version.txt") from the fixture"
    if diff "$work/dump_$version.txt" "$work/fixture_$version.txt"; then echo "no difference"; else status=1; fi
    for c in "$work/dump$version" "$work/fixture$version"; do as_pg "$bindir/pg_ctl" -D "$c" -m fast stop >/dev/null; done
    clusters=()
done
exit $status
