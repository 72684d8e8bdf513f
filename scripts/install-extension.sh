#!/usr/bin/env bash
# Builds pg_realtime (release) and installs it, for each PostgreSQL version given:
#   scripts/install-extension.sh          15: the system PostgreSQL 15 (/usr/bin/pg_config)
#   scripts/install-extension.sh 15 17    and 17: by default the Debian 13 root of
#                                         scripts/install-pg17.sh; set PG17_PG_CONFIG to
#                                         another PostgreSQL 17's pg_config to install there
# Stop any cluster that preloads it first: replacing a loaded library can crash it.
# Besides the current version's script and the upgrade scripts (extension/sql/, which pgrx
# installs), it installs the frozen full script of every released version
# (extension/released/), so CREATE EXTENSION pg_realtime VERSION 'OLD' works on this library.
set -euo pipefail
scripts=$(cd "$(dirname "$0")" && pwd)
. "$scripts/pg17-root.sh"
cd "$scripts/../extension"
export PATH="$HOME/.cargo/bin:$PATH"
for version in "${@:-15}"; do
    case "$version" in
    # pg15 is the crate's default feature; named as scripts/package.sh names it, so that the
    # package's build is this one's (a different feature list rebuilt the crate, 30 s).
    15) pg_config=/usr/bin/pg_config
        cargo pgrx install --release --no-default-features --features pg15 --pg-config "$pg_config" ;;
    17) pg_config=$PG17_PG_CONFIG
        cargo pgrx install --release --no-default-features --features pg17 \
            --pg-config "$pg_config" ;;
    *) echo "usage: $0 [15] [17]" >&2; exit 2 ;;
    esac
    install -m 644 released/pg_realtime--*.sql "$("$pg_config" --sharedir)/extension/"
done
