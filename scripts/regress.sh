#!/usr/bin/env bash
# Runs the pg_regress suite, the isolation specs, the not-preloaded check, the lifecycle
# tests (upgrade from every released version, dump and restore), the suite on a database
# Supabase made and the one on a hot standby, against
# temporary Postgres instances (as the postgres OS user: Postgres refuses to run as root).
#   scripts/regress.sh       PostgreSQL 15, the system's
#   scripts/regress.sh 17    PostgreSQL 17, in the Debian 13 root of scripts/install-pg17.sh:
#                            that server's own pg_regress runs inside the root
#   REGRESS_ROOT=DIR scripts/regress.sh 15|17   in the Debian root DIR, against the extension
#                            installed there (scripts/package.sh test)
#   scripts/regress.sh 15 NAME...   only these files of the main suite, after
#                            create_extension (a file that uses another's fixtures, as
#                            tables uses authorize's roles, names it too: authorize tables)
#   scripts/regress.sh 15 lifecycle only the upgrade and dump/restore tests
#   scripts/regress.sh 15 supabase  only the suite on a database Supabase made
#   scripts/regress.sh 15 standby   only the suite on a hot standby
# Expects the extension to be installed for that version. Prints "N passed, N failed" last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${1:-15}
shift $(( $# > 0 ? 1 : 0 ))
only=("$@")

case "$version" in
15 | 17) ;;
*)
    echo "usage: $0 [15|17]" >&2
    exit 2
    ;;
esac
if [ "$version" = 15 ] && [ -z "${REGRESS_ROOT:-}" ]; then
    bindir=$(pg_config --bindir)
    pgxs=$(dirname "$(pg_config --pgxs)")/../..
    out=$(mktemp -d /tmp/pg_realtime_regress.XXXXXX)
    host_out=$out
    inputdir="$root/regress"
    host_inputdir=$inputdir
    owner=postgres:
    as_postgres() {
        # pgrx adds Rust backtraces to error details when RUST_BACKTRACE is set.
        (cd "$out" && runuser -u postgres -- env -u RUST_BACKTRACE "$@")
    }
else
    # In a Debian root: PostgreSQL 17's (scripts/install-pg17.sh), or REGRESS_ROOT, where
    # scripts/package.sh installed a package of the extension.
    . "$root/scripts/pg17-root.sh"
    PG17_ROOT=${REGRESS_ROOT:-$PG17_ROOT}
    if [ -z "${REGRESS_ROOT:-}" ] && [ ! -e "$PG17_ROOT/postgresql-17.done" ]; then
        echo "$0: no PostgreSQL 17 at $PG17_ROOT: run scripts/install-pg17.sh first" >&2
        exit 2
    fi
    bindir=/usr/lib/postgresql/$version/bin
    pgxs=/usr/lib/postgresql/$version/lib/pgxs
    # Everything the server and pg_regress read or write lives inside the root: $out is
    # the path seen from inside, $host_out the same directory seen from the host.
    host_out=$(mktemp -d "$PG17_ROOT/tmp/pg_realtime_regress.XXXXXX")
    out=${host_out#"$PG17_ROOT"}
    cp -r "$root/regress" "$host_out/input"
    inputdir="$out/input"
    host_inputdir="$host_out/input"
    # The root's postgres user is not the host's: chown by its numeric ids.
    owner=$(awk -F: '$1 == "postgres" { print $3 ":" $4 }' "$PG17_ROOT/etc/passwd")
    as_postgres() {
        in_pg17_root runuser -u postgres -- \
            sh -c 'cd "$0" && exec env -u RUST_BACKTRACE "$@"' "$out" "$@"
    }
fi
chmod 755 "$host_out"
chown "$owner" "$host_out"

status=0
run_suite() {
    local name=$1 tool=$2
    shift 2
    mkdir -p "$host_out/$name" && chown "$owner" "$host_out/$name"
    # A suite given a --host runs against that server; any other, in a temporary instance.
    local instance=(--temp-instance="$out/$name/tmp_check")
    case " $* " in *" --host="*) instance=() ;; esac
    # PG_REALTIME_BINDIR: where the tests' shell commands find pg_dump and pg_restore.
    as_postgres env PG_REALTIME_BINDIR="$bindir" "$tool" --bindir="$bindir" --inputdir="$inputdir" --outputdir="$out/$name" \
        "${instance[@]}" "$@" 2>&1 | tee "$host_out/$name.log"
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        status=1
        cat "$host_out/$name/regression.diffs" 2>/dev/null
    fi
}

# The Supabase suite runs against a cluster made like Supabase's image (bootstrap superuser
# supabase_admin, `postgres` an ordinary role the fixture demotes), which pg_regress's temp
# instance (bootstrap superuser postgres) cannot be: it is made here, sockets only.
run_supabase_suite() {
    local dir=$out/supabase_cluster port=5432
    mkdir -p "$host_out/supabase_cluster" && chown "$owner" "$host_out/supabase_cluster"
    as_postgres "$bindir/initdb" -D "$dir/data" -U supabase_admin --auth=trust --no-sync >/dev/null
    {
        cat "$host_inputdir/postgresql.conf"
        printf "listen_addresses = ''\nport = %s\nunix_socket_directories = '%s'\n" "$port" "$dir"
    } >> "$host_out/supabase_cluster/data/postgresql.conf"
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    run_suite supabase "$pgxs/src/test/regress/pg_regress" --host="$dir" --port="$port" \
        --user=supabase_admin --dbname=supabase_regression --schedule="$inputdir/supabase_schedule"
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -m fast stop >/dev/null
}

# The producers on a hot standby: a primary with the extension, a standby made from it by
# pg_basebackup, and the standby schedule run there against the replicated database
# (--use-existing: a standby cannot create one).
run_standby_suite() {
    local dir=$out/standby_cluster
    mkdir -p "$host_out/standby_cluster" && chown "$owner" "$host_out/standby_cluster"
    as_postgres "$bindir/initdb" -D "$dir/primary" --auth=trust --no-sync >/dev/null
    {
        cat "$host_inputdir/postgresql.conf"
        printf "listen_addresses = ''\nport = 5433\nunix_socket_directories = '%s'\n" "$dir"
    } >> "$host_out/standby_cluster/primary/postgresql.conf"
    as_postgres "$bindir/pg_ctl" -D "$dir/primary" -l "$dir/primary.log" -w start >/dev/null
    as_postgres "$bindir/psql" -h "$dir" -p 5433 -d postgres -qX \
        -c "CREATE DATABASE standby_regression" \
        -c "\\c standby_regression" -c "CREATE EXTENSION pg_realtime" >/dev/null
    # A fast checkpoint: the default spread one held the backup for about 95 s of a
    # 3-minute run. No fsyncs, here or in initdb: these clusters die with the run.
    as_postgres "$bindir/pg_basebackup" -h "$dir" -p 5433 -D "$dir/standby" -R -X stream \
        --checkpoint=fast --no-sync
    sed -i 's/^port = 5433$/port = 5434/' "$host_out/standby_cluster/standby/postgresql.conf"
    as_postgres "$bindir/pg_ctl" -D "$dir/standby" -l "$dir/standby.log" -w start >/dev/null
    run_suite standby "$pgxs/src/test/regress/pg_regress" --host="$dir" --port=5434 \
        --use-existing --dbname=standby_regression --schedule="$inputdir/standby_schedule"
    as_postgres "$bindir/pg_ctl" -D "$dir/standby" -m fast stop >/dev/null
    as_postgres "$bindir/pg_ctl" -D "$dir/primary" -m fast stop >/dev/null
}

if [ "${only[*]}" = lifecycle ]; then
    run_suite lifecycle "$pgxs/src/test/regress/pg_regress" \
        --temp-config="$inputdir/postgresql.conf" --schedule="$inputdir/lifecycle_schedule"
elif [ "${only[*]}" = supabase ]; then
    run_supabase_suite
elif [ "${only[*]}" = standby ]; then
    run_standby_suite
elif [ ${#only[@]} -gt 0 ]; then
    run_suite main "$pgxs/src/test/regress/pg_regress" \
        --temp-config="$inputdir/postgresql.conf" create_extension "${only[@]}"
else
    run_suite main "$pgxs/src/test/regress/pg_regress" \
        --temp-config="$inputdir/postgresql.conf" --schedule="$inputdir/schedule"
    run_suite isolation "$pgxs/src/test/isolation/pg_isolation_regress" \
        --temp-config="$inputdir/postgresql.conf" --schedule="$inputdir/isolation_schedule"
    run_suite not_preloaded "$pgxs/src/test/regress/pg_regress" \
        --schedule="$inputdir/not_preloaded_schedule"
    # ALTER EXTENSION UPDATE from every released version, dump and restore.
    run_suite lifecycle "$pgxs/src/test/regress/pg_regress" \
        --temp-config="$inputdir/postgresql.conf" --schedule="$inputdir/lifecycle_schedule"
    run_supabase_suite
    run_standby_suite
fi

passed=$(cat "$host_out"/*.log | grep -cE '^(ok|test) .*\.\.\. ok|^ok [0-9]+ ')
failed=$(cat "$host_out"/*.log | grep -cE '\.\.\. FAILED|^not ok ')
echo "regress results (PostgreSQL $version): $host_out"
echo "regress: $passed passed, $failed failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
