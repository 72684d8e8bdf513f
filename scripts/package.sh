#!/usr/bin/env bash
# The Debian packages a self-hoster installs, built into target/debian/:
#   postgresql-15-pg-realtime_V_amd64.deb  the extension for PostgreSQL 15 (Debian 12), with
#                                          the released versions' SQL for ALTER EXTENSION UPDATE
#   postgresql-17-pg-realtime_V_amd64.deb  the same for PostgreSQL 17 (Debian 13)
#   realtime-sidecar_V_amd64.deb           the sidecar, its systemd unit and settings file
#
#   scripts/package.sh        build them (release builds; PostgreSQL 17's from its root,
#                             scripts/install-pg17.sh)
#   scripts/package.sh test   build them, then install each into a fresh root of its
#                             release with its dependencies from Debian: the extension's
#                             regress suite (upgrade test included) runs against the installed
#                             package, the unit is checked with systemd-analyze verify, and
#                             its ExecStart runs as the unit's user with the unit's
#                             environment file until /healthz answers 200.
# As root. The roots are made once (debootstrap, about 30 s each) and kept pristine; each
# test copies one and throws the copy away. apt's downloads are kept per release
# (scripts/debian-root.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/pg17-root.sh"
. "$root/scripts/debian-root.sh"
export PATH="$HOME/.cargo/bin:$PATH"
out="$root/target/debian"
work=$(mktemp -d /tmp/pg_realtime_package.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT

version_of() { sed -n 's/^version = "\(.*\)"/\1/p' "$1" | head -1; }
ext_version=$(version_of "$root/extension/Cargo.toml")
sidecar_version=$(version_of "$root/sidecar/Cargo.toml")

# The extension for PostgreSQL $1, packaged by pgrx, the released scripts added.
build_extension() {
    local pg=$1 pg_config features=()
    case "$pg" in
    15) pg_config=/usr/bin/pg_config ;;
    17) pg_config=$PG17_PG_CONFIG; features=(--no-default-features --features pg17) ;;
    esac
    local staged="$work/pgrx-$pg"
    (cd "$root/extension" && cargo pgrx package "${features[@]}" --pg-config "$pg_config" \
        --out-dir "$staged" > "$work/pgrx-$pg.log" 2>&1) ||
        { tail -n 40 "$work/pgrx-$pg.log" >&2; exit 1; }
    # PostgreSQL 17's pg_config answers with the root's paths: what is under its usr/ is
    # what the package installs.
    local usr
    usr=$(find "$staged" -type d -path "*/usr/lib/postgresql/$pg" -printf '%h\n' | head -1)
    usr=${usr%/lib/postgresql}
    local pkg="$work/postgresql-$pg-pg-realtime"
    mkdir -p "$pkg/DEBIAN"
    cp -a "$usr" "$pkg/usr"
    install -m 644 "$root"/extension/released/pg_realtime--*.sql "$pkg/usr/share/postgresql/$pg/extension/"
    install -D -m 644 "$root/extension/README.md" "$pkg/usr/share/doc/postgresql-$pg-pg-realtime/README.md"
    cat > "$pkg/DEBIAN/control" <<CONTROL
Package: postgresql-$pg-pg-realtime
Version: $ext_version
Architecture: amd64
Maintainer: pg_realtime <pg-realtime@localhost>
Depends: postgresql-$pg, libc6 (>= 2.36)
Section: database
Priority: optional
Description: Supabase Realtime inside PostgreSQL $pg
 realtime.send, realtime.broadcast_changes, batched row-level-security authorization and
 a shared-memory queue every message enters at commit. Add pg_realtime to
 shared_preload_libraries, restart, then CREATE EXTENSION pg_realtime.
CONTROL
    dpkg-deb --root-owner-group --build "$pkg" "$out/postgresql-${pg}-pg-realtime_${ext_version}_amd64.deb" >/dev/null
}

build_sidecar() {
    (cd "$root" && cargo build --release -p realtime-sidecar > "$work/sidecar.log" 2>&1) ||
        { tail -n 40 "$work/sidecar.log" >&2; exit 1; }
    local pkg="$work/realtime-sidecar"
    mkdir -p "$pkg/DEBIAN"
    install -D -m 755 "$root/target/release/realtime-sidecar" "$pkg/usr/bin/realtime-sidecar"
    strip "$pkg/usr/bin/realtime-sidecar"
    install -D -m 644 "$root/sidecar/systemd/realtime-sidecar.service" "$pkg/lib/systemd/system/realtime-sidecar.service"
    install -D -m 640 "$root/sidecar/systemd/env" "$pkg/etc/realtime-sidecar/env"
    install -D -m 644 "$root/sidecar/README.md" "$pkg/usr/share/doc/realtime-sidecar/README.md"
    install -D -m 644 "$root/scripts/sidecar_login.sql" "$pkg/usr/share/doc/realtime-sidecar/sidecar_login.sql"
    echo /etc/realtime-sidecar/env > "$pkg/DEBIAN/conffiles"
    cat > "$pkg/DEBIAN/control" <<CONTROL
Package: realtime-sidecar
Version: $sidecar_version
Architecture: amd64
Maintainer: pg_realtime <pg-realtime@localhost>
Depends: adduser, libc6 (>= 2.36)
Recommends: ca-certificates
Section: net
Priority: optional
Description: Supabase Realtime's WebSocket protocol, served from pg_realtime
 Drains the pg_realtime queue of a PostgreSQL database and serves realtime-js and the
 other Supabase clients. Settings: /etc/realtime-sidecar/env; then
 systemctl enable --now realtime-sidecar.
CONTROL
    # The unit's user, and the settings (which hold the JWT secret) readable by it alone.
    cat > "$pkg/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    adduser --system --group --quiet --no-create-home --home /nonexistent realtime-sidecar
    chown root:realtime-sidecar /etc/realtime-sidecar/env
    chmod 640 /etc/realtime-sidecar/env
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
POSTINST
    chmod 755 "$pkg/DEBIAN/postinst"
    dpkg-deb --root-owner-group --build "$pkg" "$out/realtime-sidecar_${sidecar_version}_amd64.deb" >/dev/null
}

# Installs the packages $3... into a copy of the pristine root of release $1, for
# PostgreSQL $2, runs the regress suite against the installed extension there, and, with the
# sidecar's package, checks its unit and runs its ExecStart as the unit would.
test_in_root() {
    local release=$1 pg=$2
    shift 2
    local base=/var/lib/pg_realtime/clean-$release
    pristine "$release" "$base"
    local dir=/var/lib/pg_realtime/package-test-$release
    rm -rf --one-file-system "$dir"
    cp -a "$base" "$dir"
    mkdir -p "$dir/tmp/debs"
    cp "$@" "$dir/tmp/debs/"
    echo "== installing $(cd "$dir/tmp/debs" && echo *) into a fresh Debian $release root"
    # The packages with their dependencies from Debian; then test tools, not dependencies:
    # curl for the health check, systemd (its units, for systemd-analyze verify), and
    # pg_regress with the isolation tester, unpacked from the server's dev package without
    # the compiler it depends on (clang and LLVM: hundreds of MB no test here runs).
    in_root "$dir" sh -ec "apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            /tmp/debs/*.deb curl systemd
        cd /tmp && apt-get download -qq postgresql-server-dev-$pg
        dpkg-deb -x /tmp/postgresql-server-dev-${pg}_*.deb /" > "$work/apt-$release.log" 2>&1 ||
        { tail -n 40 "$work/apt-$release.log" >&2; exit 1; }
    in_root "$dir" dpkg-query -W -f='${Package} ${Version} ${Status}\n' "postgresql-$pg-pg-realtime" "postgresql-$pg"
    echo "== regress suite against the installed postgresql-$pg-pg-realtime"
    touch "$dir/postgresql-17.done"
    # Kept beside the packages: scripts/test.sh counts its suites from it.
    local log="$out/regress-$pg.log"
    REGRESS_ROOT=$dir "$root/scripts/regress.sh" "$pg" > "$log" 2>&1 ||
        { grep -E 'FAILED|failed' "$log" | tail -n 20 >&2; tail -n 5 "$log" >&2; return 1; }
    tail -n 1 "$log"
    if [ -e "$dir/usr/bin/realtime-sidecar" ]; then
        test_sidecar "$dir" "$pg"
    fi
    rm -rf --one-file-system "$dir"
}

# The unit verified as systemd would load it, then its ExecStart run as its User= with its
# EnvironmentFile= against a cluster of the root, until /healthz says the drain is up.
test_sidecar() {
    local dir=$1 pg=$2
    echo "== systemd-analyze verify realtime-sidecar.service"
    # The root's own systemd (a test tool installed there): the host needs none.
    in_root "$dir" systemd-analyze verify /lib/systemd/system/realtime-sidecar.service
    local unit="$dir/lib/systemd/system/realtime-sidecar.service"
    local user env exec
    user=$(sed -n 's/^User=//p' "$unit")
    env=$(sed -n 's/^EnvironmentFile=//p' "$unit")
    exec=$(sed -n 's/^ExecStart=//p' "$unit")
    local port=25432 http=24999
    in_root "$dir" sh -ec "
        runuser -u postgres -- /usr/lib/postgresql/$pg/bin/initdb -D /tmp/cluster --auth=trust >/dev/null
        printf \"shared_preload_libraries = 'pg_realtime'\nport = $port\nlisten_addresses = ''\nunix_socket_directories = '/tmp'\n\" >> /tmp/cluster/postgresql.conf
        runuser -u postgres -- /usr/lib/postgresql/$pg/bin/pg_ctl -D /tmp/cluster -l /tmp/cluster.log -w start >/dev/null
        psql -h /tmp -p $port -U postgres -qX -c 'CREATE EXTENSION pg_realtime' -f /usr/share/doc/realtime-sidecar/sidecar_login.sql >/dev/null
    "
    # The settings file as the package installed it, then what this machine needs.
    {
        echo "PORT=$http"
        echo "DATABASE_URL=host=/tmp port=$port user=realtime_sidecar dbname=postgres"
        echo "API_JWT_SECRET=package-test-secret-with-32-characters"
    } >> "$dir$env"
    echo "== $exec as $user with $env"
    in_root "$dir" sh -ec "
        # As systemd reads EnvironmentFile=: KEY=value lines, comments and blanks skipped;
        # a later line wins.
        set --
        while IFS= read -r line; do
            case \$line in ''|'#'*) continue ;; esac
            set -- \"\$@\" \"\$line\"
        done < $env
        runuser -u $user -- env -i \"\$@\" $exec > /tmp/sidecar.log 2>&1 &
        pid=\$!
        ok=
        for i in \$(seq 1 100); do
            if curl -sf http://127.0.0.1:$http/healthz >/dev/null; then ok=1; break; fi
            sleep 0.1
        done
        kill \$pid; wait \$pid || true
        runuser -u postgres -- /usr/lib/postgresql/$pg/bin/pg_ctl -D /tmp/cluster -m fast stop >/dev/null
        [ -n \"\$ok\" ] || { cat /tmp/sidecar.log; exit 1; }
        echo 'served: /healthz answered 200'
    "
}

mkdir -p "$out"
# A suite's log of an earlier run must never be read as this one's.
rm -f "$out"/regress-*.log
build_extension 15
build_extension 17
build_sidecar
ls -1 "$out"
if [ "${1:-}" = test ]; then
    # The two roots are tested at once, each telling its own log: much of each is waiting
    # (debootstrap, apt, one server's fsyncs), and they share nothing: each cluster's sockets
    # are in its own root, listening on no TCP port but the bookworm sidecar's.
    test_in_root bookworm 15 "$out/postgresql-15-pg-realtime_${ext_version}_amd64.deb" \
        "$out/realtime-sidecar_${sidecar_version}_amd64.deb" > "$work/test-bookworm.log" 2>&1 &
    bookworm=$!
    test_in_root trixie 17 "$out/postgresql-17-pg-realtime_${ext_version}_amd64.deb" \
        > "$work/test-trixie.log" 2>&1 &
    trixie=$!
    status=0
    wait "$bookworm" || status=1
    wait "$trixie" || status=1
    cat "$work/test-bookworm.log" "$work/test-trixie.log"
    exit "$status"
fi
