#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine, as root: installs what it needs,
# checks formatting and lints, installs the extension into the system PostgreSQL 15 and into
# PostgreSQL 17 (the Debian 13 root of scripts/install-pg17.sh), runs the Rust unit and
# end-to-end tests, the realtime-js tests (with Chromium and behind nginx) and the
# supabase-py client tests against a throwaway PostgreSQL 15 cluster (and realtime-js against
# a database Supabase made, switched to pg_realtime), then builds the Debian packages and
# installs each into a fresh root of its release, where the pg_regress, isolation,
# not-preloaded, lifecycle (upgrade, dump and restore), Supabase and standby suites run
# against it (15 on Debian 12, 17 on Debian 13) and the sidecar's unit is checked, and
# pg_upgrade from 15 to 17 runs on a database Supabase made (scripts/pg_upgrade.sh); after the
# benchmark smokes, the lab's short form (scripts/lab.sh: hosts in network namespaces behind
# HAProxy, a PostgreSQL 15 pair under pg_auto_failover; routing, a partition, a switchover).
# The last line is "N passed, N failed" over everything.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export PATH="$HOME/.cargo/bin:$PATH"
log=$(mktemp -d /tmp/pg_realtime_test.XXXXXX)
chmod 755 "$log"
# Each section's heading carries the minutes and seconds since the start, so a run's log
# shows where its time went.
section() { printf '== [%02d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

section "what the suite needs (scripts/install-deps.sh, scripts/install-peers.sh)"
scripts/install-deps.sh
# The benchmark smokes below run Centrifugo and k6 (built from the Go module proxy).
scripts/install-peers.sh
# Debian 12's pristine root for the package tests (scripts/debian-root.sh; Debian 13's was
# made by scripts/install-pg17.sh above), made while the sections below build and test:
# debootstrap mostly waits on the network. Stopped if the run ends first.
# Its own process group, so that stopping it stops debootstrap too.
setsid bash -c 'set -euo pipefail; . scripts/debian-root.sh; pristine bookworm /var/lib/pg_realtime/clean-bookworm' \
    > "$log/roots.log" 2>&1 &
roots=$!
trap 'kill -- -"$roots" 2>/dev/null || true' EXIT

section "cargo fmt"
cargo fmt --all -- --check
section "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
section "install the extension (PostgreSQL 15 and 17)"
scripts/install-extension.sh 15 17

section "fixed ports refused inside the ephemeral range (a benchmark sidecar once failed to start on one)"
if scripts/cluster.sh start "$log/ephemeral" 54999 2>/dev/null; then
    echo "scripts/cluster.sh started a cluster on port 54999, inside the ephemeral range" >&2
    exit 1
fi
python3 -c "import sys; sys.path.insert(0, 'pgbench'); import harness
try:
    harness.fixed_port(54999)
except ValueError:
    sys.exit(0)
sys.exit('harness.fixed_port accepted 54999, inside the ephemeral range')"

section "cluster for the end-to-end tests"
cluster="$log/cluster"
port=${TEST_PG_PORT:-24350}
# Every test's sidecar keeps its consumer slot for the server's life (a test that restarts
# one resumes from it), so the slots must outnumber the suite's consumer names: 64 ran out
# on 2026-11-28 ("all 64 realtime consumer slots are in use" in postgres_restart).
scripts/cluster.sh start "$cluster" "$port" "realtime.max_consumers = 128" "max_connections = 200" "realtime.queue_size = 32MB" \
    "realtime.max_topics_per_consumer = 64"
# A second one made like Supabase's image, holding a database Supabase made, switched to
# pg_realtime (sidecar/e2e/supabase_database.test.mjs).
supabase_cluster="$log/supabase_cluster"
supabase_port=${TEST_SUPABASE_PG_PORT:-24351}
trap 'kill -- -"$roots" 2>/dev/null || true; scripts/cluster.sh stop "$cluster" >/dev/null 2>&1 || true; scripts/supabase-cluster.sh stop "$supabase_cluster" >/dev/null 2>&1 || true' EXIT
scripts/supabase-cluster.sh start "$supabase_cluster" "$supabase_port"
export PG_REALTIME_SUPABASE_DSN="host=$supabase_cluster port=$supabase_port user=supabase_admin dbname=postgres"
export PG_REALTIME_SUPABASE_SIDECAR_DSN="host=$supabase_cluster port=$supabase_port user=realtime_sidecar dbname=postgres"
runuser -u postgres -- psql -h "$cluster" -p "$port" -U postgres -X -q -v ON_ERROR_STOP=1 \
    -c "CREATE EXTENSION pg_realtime" -c "CREATE PUBLICATION supabase_realtime" -f scripts/sidecar_login.sql
# The tests' own connection (fixtures, writes) is the superuser's; every sidecar they start
# connects as the least-privilege login, so realtime.authorize's role guard is exercised.
export PG_REALTIME_TEST_DSN="host=$cluster port=$port user=postgres dbname=postgres"
export PG_REALTIME_SIDECAR_DSN="host=$cluster port=$port user=realtime_sidecar dbname=postgres"
export PG_REALTIME_TEST_PGDATA="$cluster/data"

section "Rust unit and end-to-end tests"
cargo test --workspace 2>&1 | tee "$log/cargo.log"
section "realtime-js end-to-end tests and the demo page in headless Chromium"
(cd sidecar/web && npm ci --no-audit --no-fund --loglevel=error && npm run -s build)
(cd sidecar/e2e && npm ci --no-audit --no-fund --loglevel=error)
SIDECAR_BIN="$root/target/debug/realtime-sidecar" npm --prefix sidecar/e2e test 2>&1 | tee "$log/node.log"
section "supabase-py's realtime client (sidecar/e2e/python, in the venv scripts/install-deps.sh made)"
python_status=0
(cd sidecar/e2e/python && SIDECAR_BIN="$root/target/debug/realtime-sidecar" .venv/bin/pytest -q) 2>&1 |
    tee "$log/python.log" || python_status=$?

scripts/cluster.sh stop "$cluster"
scripts/supabase-cluster.sh stop "$supabase_cluster"
trap 'kill -- -"$roots" 2>/dev/null || true' EXIT

section "benchmark smoke (seconds long, so the runners do not rot; figures not kept)"
python3 pgbench/trigger_cost.py --seconds 1 --rounds 1 --clients 2 > "$log/trigger_cost.md"
python3 pgbench/capture_cost.py --seconds 1 --rounds 1 --clients 2 > "$log/capture_cost.md"
python3 pgbench/fanout.py --seconds 2 --subscribers 20 --rates 100 > "$log/fanout.md"
python3 pgbench/authorize.py --seconds 1 --batches 1,100 > "$log/authorize.md"
python3 pgbench/authorize.py --seconds 1 --batches 100 --delivery-trigger 1 >> "$log/authorize.md"
python3 pgbench/send_cost.py --sends 1000 --rounds 1 > "$log/send_cost.md"
python3 pgbench/visible.py --seconds 1 --check-users 20 > "$log/visible.md"
python3 pgbench/pattern_memory.py --sizes 50x100x100 > "$log/pattern_memory.md"
python3 pgbench/changes.py --seconds 1 --users 100 --rates 100 > "$log/changes.md"
python3 pgbench/change_positions.py --seconds 1 --users 100 --rates 100 --rounds 1 > "$log/change_positions.md"
python3 pgbench/joins.py --clients 50 > "$log/joins.md"
python3 pgbench/resume.py --clients 200 --topics 10 --rate 200 --seconds 4 --storm-after 2 > "$log/resume.md"
python3 pgbench/resume.py --postgres-changes --clients 200 --topics 10 --rate 200 --seconds 4 --storm-after 2 > "$log/resume_changes.md"
python3 pgbench/presence.py --members 200 --observers 10 --fill-seconds 1 --churn 100:50:100 --churn-seconds 1 > "$log/presence.md"
python3 pgbench/scenarios.py --scale smoke --seconds 2 > "$log/scenarios.md"
python3 pgbench/routed.py --seconds 2 --topics 100 --clients 200 --processes 1,2 --goal-clients 0 > "$log/routed.md"
python3 pgbench/peers.py --seconds 2 --subscribers 20 --rates 100 --k6-vus 5 --k6-rate 20 > "$log/peers.md"
python3 pgbench/connections.py --clients 300 --centrifugo-clients 100 --seconds 3 > "$log/connections.md"
python3 pgbench/soak.py --seconds 3 --attackers-apart > "$log/soak.md"
python3 pgbench/soak.py --seconds 3 --pin --attackers-apart before >> "$log/soak.md"
python3 pgbench/profile.py trigger --seconds 1 --clients 2 --drainer sidecar --callgraph --callers LWLockRelease > "$log/profile.md"
python3 pgbench/profile.py fanout --seconds 1 --subscribers 20 --rate 100 >> "$log/profile.md"
python3 pgbench/profile.py kafkorama --seconds 1 --subscribers 20 --topics 10 >> "$log/profile.md"
python3 pgbench/profile.py joins --seconds 1 --clients 50 >> "$log/profile.md"
python3 pgbench/profile.py authorize --seconds 1 --batch 100 >> "$log/profile.md"
python3 pgbench/profile.py drain --messages 20000 >> "$log/profile.md"
python3 pgbench/profile.py consumers --seconds 1 --clients 2 --lingers 0,2 >> "$log/profile.md"
cat "$log"/{trigger_cost,capture_cost,fanout,authorize,send_cost,visible,pattern_memory,changes,joins,resume,presence,scenarios,routed,peers,connections,soak,profile}.md

section "the lab's short form: hosts, routing, a partition, a switchover (scripts/lab.sh test --short)"
lab_status=0
scripts/lab.sh test --short 2>&1 | tee "$log/lab.log" || lab_status=1
# Whatever happened, nothing the lab started may be left behind.
scripts/lab.sh left || lab_status=1

section "expected outputs hold no wall-clock text (the suite once passed only on Saturdays)"
if grep -n -E '\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\b' regress/expected/*.out; then
    echo "an expected output holds a date: mask it" >&2
    exit 1
fi

# The pg_regress, isolation, lifecycle, Supabase-database and standby suites run once per
# version, against the Debian packages installed into a fresh root of their release (Debian
# 12 with PostgreSQL 15, Debian 13 with 17), with the sidecar's package and unit checked
# there too. scripts/regress.sh runs the same suites against a development install.
section "Debian packages in fresh roots, and the regress suites against them (scripts/package.sh test)"
wait "$roots" || { cat "$log/roots.log"; echo "Debian 12's root could not be made" >&2; exit 1; }
trap - EXIT
regress_status=0
scripts/package.sh test 2>&1 | tee "$log/package.log" || regress_status=1
for version in 15 17; do
    cp "target/debian/regress-$version.log" "$log/regress$version.log" 2>/dev/null || true
done
section "pg_upgrade from 15 to 17 in a Debian 13 root, on a database Supabase made (scripts/pg_upgrade.sh)"
scripts/pg_upgrade.sh 2>&1 | tee "$log/pg_upgrade.log" || regress_status=1

# The numbers in the matches of $1 in file $2, added up; 0 when nothing matches (no `set -e`
# exit then: pytest's closing line names "failed" only when something failed).
sum() { grep -oE "$1" "$2" | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}' || true; }
passed=$(( $(sum '[0-9]+ passed;' "$log/cargo.log") + $(sum '^# pass [0-9]+' "$log/node.log") ))
failed=$(( $(sum '[0-9]+ failed;' "$log/cargo.log") + $(sum '^# fail [0-9]+' "$log/node.log") ))
for version in 15 17; do
    reg_passed='' reg_failed=''
    read -r reg_passed reg_failed < <(sed -nE 's/^regress: ([0-9]+) passed, ([0-9]+) failed$/\1 \2/p' \
        "$log/regress$version.log") || true
    passed=$((passed + ${reg_passed:-0}))
    # A suite that printed no count did not run: count it as a failure.
    failed=$((failed + ${reg_failed:-1}))
done
# pytest's closing line: "N passed, N failed, N error in S" (each part only when not zero).
py_summary=$(tail -n 1 "$log/python.log")
py_passed=$(sum '[0-9]+ passed' <(echo "$py_summary"))
py_failed=$(( $(sum '[0-9]+ failed' <(echo "$py_summary")) + $(sum '[0-9]+ errors?' <(echo "$py_summary")) ))
[ "$python_status" -eq 0 ] || [ "$py_failed" -gt 0 ] || py_failed=1
passed=$((passed + py_passed))
failed=$((failed + py_failed))
# The lab's checks: "lab: N of M checks passed".
read -r lab_passed lab_total < <(sed -nE 's/^lab: ([0-9]+) of ([0-9]+) checks passed.*/\1 \2/p' "$log/lab.log") || true
passed=$((passed + ${lab_passed:-0}))
failed=$((failed + ${lab_total:-1} - ${lab_passed:-0}))
[ "$lab_status" -eq 0 ] || [ "$failed" -gt 0 ] || failed=1
[ "$regress_status" -eq 0 ] || [ "$failed" -gt 0 ] || failed=1
section "done"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
