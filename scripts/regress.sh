#!/usr/bin/env bash
# Runs the pg_regress suite, the isolation specs and the not-preloaded check against
# temporary Postgres instances (as the postgres OS user: Postgres refuses to run as root).
# Expects the extension to be installed. Prints "N passed, N failed" last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bindir=$(pg_config --bindir)
pgxs=$(dirname "$(pg_config --pgxs)")/../..
out=$(mktemp -d /tmp/pg_realtime_regress.XXXXXX)
chown postgres: "$out"

as_postgres() {
    # pgrx adds Rust backtraces to error details when RUST_BACKTRACE is set.
    (cd "$out" && runuser -u postgres -- env -u RUST_BACKTRACE "$@")
}

status=0
run_suite() {
    local name=$1 tool=$2
    shift 2
    mkdir -p "$out/$name" && chown postgres: "$out/$name"
    as_postgres "$tool" --bindir="$bindir" --inputdir="$root/regress" --outputdir="$out/$name" \
        --temp-instance="$out/$name/tmp_check" "$@" 2>&1 | tee "$out/$name.log"
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        status=1
        cat "$out/$name/regression.diffs" 2>/dev/null
    fi
}

run_suite main "$pgxs/src/test/regress/pg_regress" \
    --temp-config="$root/regress/postgresql.conf" --schedule="$root/regress/schedule"
run_suite isolation "$pgxs/src/test/isolation/pg_isolation_regress" \
    --temp-config="$root/regress/postgresql.conf" --schedule="$root/regress/isolation_schedule"
run_suite not_preloaded "$pgxs/src/test/regress/pg_regress" \
    --schedule="$root/regress/not_preloaded_schedule"

passed=$(cat "$out"/*.log | grep -cE '^(ok|test) .*\.\.\. ok|^ok [0-9]+ ')
failed=$(cat "$out"/*.log | grep -cE '\.\.\. FAILED|^not ok ')
echo "regress results: $out"
echo "regress: $passed passed, $failed failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
