#!/usr/bin/env bash
# Runs the pg_regress suite, the isolation specs, the not-preloaded check and the upgrade
# test (from every released version) against
# temporary Postgres instances (as the postgres OS user: Postgres refuses to run as root).
#   scripts/regress.sh       PostgreSQL 15, the system's
#   scripts/regress.sh 17    PostgreSQL 17, in the Debian 13 root of scripts/install-pg17.sh:
#                            that server's own pg_regress runs inside the root
#   scripts/regress.sh 15 NAME...   only these files of the main suite, after
#                            create_extension (a file that uses another's fixtures, as
#                            tables uses authorize's roles, names it too: authorize tables)
#   scripts/regress.sh 15 upgrade   only the upgrade test
# Expects the extension to be installed for that version. Prints "N passed, N failed" last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${1:-15}
shift $(( $# > 0 ? 1 : 0 ))
only=("$@")

case "$version" in
15)
    bindir=$(pg_config --bindir)
    pgxs=$(dirname "$(pg_config --pgxs)")/../..
    out=$(mktemp -d /tmp/pg_realtime_regress.XXXXXX)
    host_out=$out
    inputdir="$root/regress"
    owner=postgres:
    as_postgres() {
        # pgrx adds Rust backtraces to error details when RUST_BACKTRACE is set.
        (cd "$out" && runuser -u postgres -- env -u RUST_BACKTRACE "$@")
    }
    ;;
17)
    . "$root/scripts/pg17-root.sh"
    if [ ! -e "$PG17_ROOT/postgresql-17.done" ]; then
        echo "$0: no PostgreSQL 17 at $PG17_ROOT: run scripts/install-pg17.sh first" >&2
        exit 2
    fi
    bindir=/usr/lib/postgresql/17/bin
    pgxs=/usr/lib/postgresql/17/lib/pgxs
    # Everything the server and pg_regress read or write lives inside the root: $out is
    # the path seen from inside, $host_out the same directory seen from the host.
    host_out=$(mktemp -d "$PG17_ROOT/tmp/pg_realtime_regress.XXXXXX")
    out=${host_out#"$PG17_ROOT"}
    cp -r "$root/regress" "$host_out/input"
    inputdir="$out/input"
    # The root's postgres user is not the host's: chown by its numeric ids.
    owner=$(awk -F: '$1 == "postgres" { print $3 ":" $4 }' "$PG17_ROOT/etc/passwd")
    as_postgres() {
        in_pg17_root runuser -u postgres -- \
            sh -c 'cd "$0" && exec env -u RUST_BACKTRACE "$@"' "$out" "$@"
    }
    ;;
*)
    echo "usage: $0 [15|17]" >&2
    exit 2
    ;;
esac
chmod 755 "$host_out"
chown "$owner" "$host_out"

status=0
run_suite() {
    local name=$1 tool=$2
    shift 2
    mkdir -p "$host_out/$name" && chown "$owner" "$host_out/$name"
    as_postgres "$tool" --bindir="$bindir" --inputdir="$inputdir" --outputdir="$out/$name" \
        --temp-instance="$out/$name/tmp_check" "$@" 2>&1 | tee "$host_out/$name.log"
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        status=1
        cat "$host_out/$name/regression.diffs" 2>/dev/null
    fi
}

if [ "${only[*]}" = upgrade ]; then
    run_suite upgrade "$pgxs/src/test/regress/pg_regress" \
        --temp-config="$inputdir/postgresql.conf" --schedule="$inputdir/upgrade_schedule"
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
    # ALTER EXTENSION UPDATE from every released version, in an instance of its own.
    run_suite upgrade "$pgxs/src/test/regress/pg_regress" \
        --temp-config="$inputdir/postgresql.conf" --schedule="$inputdir/upgrade_schedule"
fi

passed=$(cat "$host_out"/*.log | grep -cE '^(ok|test) .*\.\.\. ok|^ok [0-9]+ ')
failed=$(cat "$host_out"/*.log | grep -cE '\.\.\. FAILED|^not ok ')
echo "regress results (PostgreSQL $version): $host_out"
echo "regress: $passed passed, $failed failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
