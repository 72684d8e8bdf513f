#!/usr/bin/env bash
# Installs PostgreSQL 17 for building and testing pg_realtime on Debian 12, as root, and
# registers it with pgrx. Debian 12 ships only 15 and Debian 13's postgresql-17 needs
# Debian 13's libc, so it goes into a minimal Debian 13 root (scripts/pg17-root.sh says
# where). Idempotent: a second run checks and skips (well under a second); the first takes
# about 75 s, and PostgreSQL 17 adds about 2 minutes to a first scripts/test.sh (the root
# 40-80 s, the second build about 30 s, its suites about 35 s) and about 45 s to a later one.
set -euo pipefail
scripts=$(cd "$(dirname "$0")" && pwd)
. "$scripts/pg17-root.sh"
. "$scripts/debian-root.sh"
export PATH="$HOME/.cargo/bin:$PATH"

# Markers written after each step succeeds say which steps are done.
root_done="$PG17_ROOT/debootstrap.done"
pg_done="$PG17_ROOT/postgresql-17.done"

if [ ! -e "$root_done" ]; then
    dpkg-query -W -f='${Status}' debootstrap 2>/dev/null | grep -q "ok installed" || {
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
    }
    echo "making a Debian 13 root at $PG17_ROOT (about 30 s)"
    # A copy of the pristine Debian 13 root the package and pg_upgrade tests copy too
    # (scripts/debian-root.sh): one debootstrap for all of them. Packages there do not start
    # services, and postgresql-common makes no main cluster: clusters of the root are
    # temporary ones that the tests make and stop. A root left half-made by an interrupted
    # run is made again from nothing; mounts into it only ever exist in private namespaces,
    # so none can be under it (--one-file-system refuses to cross one all the same).
    pristine trixie /var/lib/pg_realtime/clean-trixie
    rm -rf --one-file-system "$PG17_ROOT"
    cp -a /var/lib/pg_realtime/clean-trixie "$PG17_ROOT"
    touch "$root_done"
fi

if [ ! -e "$pg_done" ]; then
    echo "installing postgresql-17 and postgresql-server-dev-17 into $PG17_ROOT (about 45 s)"
    in_root "$PG17_ROOT" sh -ec 'apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            postgresql-17 postgresql-server-dev-17' > "$(dirname "$PG17_ROOT")/pg17-apt.log" 2>&1 ||
        { tail -n 40 "$(dirname "$PG17_ROOT")/pg17-apt.log" >&2; exit 1; }
    touch "$pg_done"
fi

# The root's binaries need its libc, so its pg_config runs inside it; every path it prints
# is a path inside the root, and pgrx (running on the host) needs it from the host.
mkdir -p "$(dirname "$PG17_PG_CONFIG")"
wrapper=$(cat <<EOF
#!/bin/sh
# pg_config of PostgreSQL 17 in the Debian 13 root $PG17_ROOT, answering with host paths.
# Written by scripts/install-pg17.sh.
chroot $PG17_ROOT /usr/lib/postgresql/17/bin/pg_config "\$@" |
    sed -e 's|^/|$PG17_ROOT/|' -e 's|= /|= $PG17_ROOT/|' -e 's|-I/|-I$PG17_ROOT/|g'
EOF
)
if [ "$(cat "$PG17_PG_CONFIG" 2>/dev/null)" != "$wrapper" ]; then
    printf '%s\n' "$wrapper" > "$PG17_PG_CONFIG"
    chmod +x "$PG17_PG_CONFIG"
fi

if ! grep -q "^pg17 *= *\"$PG17_PG_CONFIG\"" "$HOME/.pgrx/config.toml" 2>/dev/null; then
    cargo pgrx init --pg15 /usr/bin/pg_config --pg17 "$PG17_PG_CONFIG"
fi
