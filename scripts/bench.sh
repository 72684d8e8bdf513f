#!/usr/bin/env bash
# Every benchmark of pgbench/README.md at full size, one after the other (never two at
# once: they share 2 cores), from a fresh Debian 12 machine as root. Each table goes to
# target/bench/<time>/<label>.md (with the runner's JSON lines beside it) and to stdout.
# One run gives every row of pgbench/README.md's goal table (its tables go to
# pgbench/results/<date>.md). About an hour (57 minutes on 2026-11-24).
# `scripts/bench.sh peers connections` runs only the runners named (a label such as
# fanout:pinned names one run of a runner; the runner's name selects all of its runs).
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
    local label=$1 name=${1%%:*}
    shift
    [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || [[ "$only" == *" $label "* ]] || return 0
    local file=${label//:/-}
    echo "== $label: python3 pgbench/$name.py $*"
    python3 "pgbench/$name.py" "$@" 2> "$out/$file.log" | tee "$out/$file.md"
}
run trigger_cost --seconds 10 --rounds 3
# The same without any consumer: how much of the writer's loss is the trigger's own.
run trigger_cost:no-consumers --seconds 10 --rounds 3 --clients 1,8 --no-consumers
run capture_cost --seconds 10 --rounds 3
run fanout
# Issue 14 asks for the fan-out with the sidecar and the load generator on cores of their own.
run fanout:pinned --pin --rates 500,1000
run authorize
# The delivery trigger of realtime.messages against the read probes' rows: on and off in turn.
run authorize:delivery-trigger --seconds 10 --batches 100,1000 --delivery-trigger 3
run send_cost
run visible --seconds 10
run changes
run change_positions
run joins
run resume
run resume:changes --postgres-changes
# Where the CPU goes: the drain backend's and the sidecar's per message while pgbench writes
# through a trigger (beside trigger_cost's ratios), and the sidecar's per delivery at a
# fan-out rung (beside peers' CPU per delivery).
run profile:consumers consumers --seconds 10 --clients 8 --lingers 2,5
run profile:fanout fanout --seconds 10 --subscribers 1000 --rate 500
run presence
# Up to rungs both servers miss, so the ratio of the highest rungs met is in the table.
run peers --rates 25,100,300,500,1000,1500,2000,3000 --json "$out/peers.json"
run scenarios --json "$out/scenarios.json"
run routed --json "$out/routed.json"
# The most clients this box keeps at p50 <= 5 ms on 8 routed processes, and one step larger.
run routed:60k --ways routed --processes 8 --clients 30000 --goal-clients 60000 --goal-processes 8 \
    --json "$out/routed-60k.json"
# 100,000 (the design's goal), 250,000 (issue 14's) and one step larger.
run connections --clients 100000,250000,300000 --json "$out/connections.json"
# Twenty attackers beside a thousand ordinary subscribers, against the same without them, and
# the floor: the same attackers on a sidecar of their own (what the machine alone costs).
run soak --seconds 60 --attackers-apart
# The same with every load generator off the sidecar's core: the box's contention apart from
# the sidecar's own cost of refusing the attackers.
run soak:pinned --seconds 60 --pin --attackers-apart --pg-port 24398 --http-port 24399
echo "tables in $out"
