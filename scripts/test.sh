#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine, as root: installs what it needs,
# checks formatting and lints, runs the Rust unit tests, installs the extension into the
# system PostgreSQL 15, and runs the pg_regress, isolation and not-preloaded suites.
# The last line is "N passed, N failed" over everything.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
log=$(mktemp -d /tmp/pg_realtime_test.XXXXXX)

scripts/install-deps.sh

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== unit tests"
cargo test --workspace 2>&1 | tee "$log/unit.log"
echo "== install the extension"
scripts/install-extension.sh
echo "== pg_regress and isolation suites"
regress_status=0
scripts/regress.sh 2>&1 | tee "$log/regress.log" || regress_status=$?

unit_passed=$(grep -oE 'test result: .* ([0-9]+) passed' "$log/unit.log" | grep -oE '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
unit_failed=$(grep -oE '[0-9]+ failed' "$log/unit.log" | awk '{s+=$1} END {print s+0}')
read -r reg_passed reg_failed < <(sed -nE 's/^regress: ([0-9]+) passed, ([0-9]+) failed$/\1 \2/p' "$log/regress.log")
passed=$((unit_passed + ${reg_passed:-0}))
failed=$((unit_failed + ${reg_failed:-1}))
[ "$regress_status" -eq 0 ] || [ "$failed" -gt 0 ] || failed=1
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
