#!/usr/bin/env bash
# Builds pg_realtime (release) and installs it, for each PostgreSQL version given:
#   scripts/install-extension.sh          15: the system PostgreSQL 15 (/usr/bin/pg_config)
#   scripts/install-extension.sh 15 17    and 17: by default the Debian 13 root of
#                                         scripts/install-pg17.sh; set PG17_PG_CONFIG to
#                                         another PostgreSQL 17's pg_config to install there
# Stop any cluster that preloads it first: replacing a loaded library can crash it.
set -euo pipefail
scripts=$(cd "$(dirname "$0")" && pwd)
. "$scripts/pg17-root.sh"
cd "$scripts/../extension"
export PATH="$HOME/.cargo/bin:$PATH"
for version in "${@:-15}"; do
    case "$version" in
    # pg15 is the crate's default feature.
    15) cargo pgrx install --release --pg-config /usr/bin/pg_config ;;
    17) cargo pgrx install --release --no-default-features --features pg17 \
            --pg-config "$PG17_PG_CONFIG" ;;
    *) echo "usage: $0 [15] [17]" >&2; exit 2 ;;
    esac
done
