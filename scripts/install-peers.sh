#!/usr/bin/env bash
# Builds the peers the benchmarks compare against, from the Go module proxy, into
# target/peers/: Centrifugo v5.4.9 (through a wrapper module: the proxy refuses a plain
# `go install` of it) and k6 v1.8.1. Idempotent: a binary of the right version is kept.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/target/peers"
CENTRIFUGO_VERSION=v5.4.9
K6_VERSION=v1.8.1
mkdir -p "$OUT"

if ! command -v go >/dev/null; then
    if [ -x /usr/local/go/bin/go ]; then
        export PATH="/usr/local/go/bin:$PATH"
    else
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go
    fi
fi

# Built this way the binary reports v0.0.0 (the release sets its version at link time), so
# a marker file records which version was built.
if [ "$(cat "$OUT/centrifugo.version" 2>/dev/null)" != "$CENTRIFUGO_VERSION" ] || [ ! -x "$OUT/centrifugo" ]; then
    echo "building Centrifugo $CENTRIFUGO_VERSION (about 2 minutes)"
    rm -rf "$OUT/centrifugo-wrapper" && mkdir -p "$OUT/centrifugo-wrapper"
    (cd "$OUT/centrifugo-wrapper" && go mod init w >/dev/null 2>&1 &&
        go mod edit -require=github.com/centrifugal/centrifugo/v5@$CENTRIFUGO_VERSION &&
        CGO_ENABLED=0 go build -mod=mod -o "$OUT/centrifugo" github.com/centrifugal/centrifugo/v5)
    echo "$CENTRIFUGO_VERSION" > "$OUT/centrifugo.version"
fi

if ! "$OUT/k6" version 2>/dev/null | grep -q "${K6_VERSION}"; then
    echo "building k6 $K6_VERSION (about 3 minutes)"
    GOBIN="$OUT" go install "go.k6.io/k6@$K6_VERSION"
fi
echo "centrifugo $(cat "$OUT/centrifugo.version"), $("$OUT/k6" version | head -1)"
