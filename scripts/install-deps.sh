#!/usr/bin/env bash
# Installs what building and testing pg_realtime needs on Debian 12, as root, for
# PostgreSQL 15 and 17. Idempotent: each step is skipped when its result is already there.
set -euo pipefail

PGRX_VERSION=0.18.1
packages=(postgresql-15 postgresql-server-dev-15 libclang-dev clang pkg-config build-essential sudo)
# The realtime-js end-to-end tests and the demo page run on Node (this machine kind ships
# Node 20 and npm); the demo page is tested in headless Chromium.
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
packages+=(chromium)
# pgbench/profile.py samples with perf (cpu-clock: this VM has no hardware counters).
packages+=(linux-perf)
# The supabase-py client tests run in a venv of Debian's Python; the TLS proxy test puts
# Debian's nginx in front of the sidecar, with a certificate openssl makes.
packages+=(python3-venv nginx openssl)
# pgbench/joins.py makes the P-256 key of its ES256 joins with Debian's cryptography.
packages+=(python3-cryptography)
# The docker-compose service definition's healthcheck is a curl command, run as written.
packages+=(curl)

. "$(dirname "$0")/apt.sh"
apt_install "${packages[@]}" || true

export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
    echo "installing cargo-pgrx $PGRX_VERSION (several minutes on a fresh machine)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi
if ! grep -q '^pg15 *= *"/usr/bin/pg_config"' "$HOME/.pgrx/config.toml" 2>/dev/null; then
    cargo pgrx init --pg15 /usr/bin/pg_config
fi
# PostgreSQL 17 (a Debian 13 root; about 75 s the first time), registered with pgrx.
"$(dirname "$0")/install-pg17.sh"

# The supabase-py client tests' venv, with every package pinned in its requirements file;
# installed again only when that file changed since the last install.
venv=sidecar/e2e/python/.venv
requirements=sidecar/e2e/python/requirements.txt
cd "$(dirname "$0")/.."
if ! cmp -s "$requirements" "$venv/installed-requirements.txt"; then
    echo "installing the Python client tests' packages into $venv"
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$requirements"
    "$venv/bin/pip" check
    cp "$requirements" "$venv/installed-requirements.txt"
fi
