#!/usr/bin/env bash
# Builds pg_realtime (release) and installs it into the system PostgreSQL 15.
# Stop any cluster that preloads it first: replacing a loaded library can crash it.
set -euo pipefail
cd "$(dirname "$0")/../extension"
export PATH="$HOME/.cargo/bin:$PATH"
cargo pgrx install --release --pg-config /usr/bin/pg_config
