#!/usr/bin/env bash
# Every benchmark of pgbench/RESULTS.md at full size, one after the other (never two at
# once: they share 2 cores), from a fresh Debian 12 machine as root. Each table goes to
# target/bench/<time>/<runner>.md (with the runner's JSON lines beside it) and to stdout.
# About 50 minutes. `scripts/bench.sh peers connections` runs only the runners named.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
scripts/install-deps.sh
scripts/install-peers.sh
scripts/install-extension.sh
out="target/bench/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
only=" $* "
run() {
    local name=$1
    shift
    [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || return 0
    echo "== $name: python3 pgbench/$name.py $*"
    python3 "pgbench/$name.py" "$@" 2> "$out/$name.log" | tee "$out/$name.md"
}
run trigger_cost --seconds 10 --rounds 3
run capture_cost --seconds 10 --rounds 3
run fanout
run authorize
run visible --seconds 10
run changes
run joins
run resume
run presence
run peers --json "$out/peers.json"
run scenarios --json "$out/scenarios.json"
run routed --json "$out/routed.json"
run connections --json "$out/connections.json"
echo "tables in $out"
