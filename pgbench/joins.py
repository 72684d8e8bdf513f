#!/usr/bin/env python3
"""Channel joins per second through the sidecar, public, private (authorized by RLS in
batched realtime.authorize calls; with HS256 tokens, and with ES256 tokens verified against
a JWKS) and Postgres Changes (bindings checked in batched
realtime.subscribable calls, then the table listened to), in one run: N WebSocket clients connect; once all are
connected they send their joins at once; joins/s = joined / time from the go to the last
reply (connecting is timed apart). Prints a markdown table, with the time the database spent
in the authorize calls and the longest it sat idle between two of them (from the server log).
Run as root after scripts/install-extension.sh."""

import argparse
import datetime
import os
import sys
import re

import harness
from harness import HERE
SECRET = "joins-benchmark-secret-with-enough-length"
CALL = re.compile(r"^(\S+ \S+) \S+ LOG:  duration: ([\d.]+) ms  execute [^:]*: SELECT ordinality, allowed, error "
                  r"FROM realtime\.authorize")


def calls_in(log):
    """The realtime.authorize calls logged in `log` (log_min_duration_statement = 0):
    database time in them, and the longest time between one's end and the next's start."""
    spans = []
    for line in log.splitlines():
        m = CALL.match(line)
        if m:
            end = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp() * 1000
            spans.append((end - float(m.group(2)), end))
    busy = sum(e - s for s, e in spans)
    gap = max((b[0] - a[1] for a, b in zip(spans, spans[1:])), default=0.0)
    return busy, max(gap, 0.0)


def read_from(path, offset):
    """What was written to `path` after its first `offset` bytes (this round's log lines)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=15000)
    ap.add_argument("--pg-port", type=int, default=24380)
    ap.add_argument("--http-port", type=int, default=24381)
    ap.add_argument("--sidecars", help="LABEL=BINARY,... sidecar builds to run in turn, each on a fresh sidecar, in ABBA order "
                    "with its own warm-up (default: this tree's)")
    ap.add_argument("--rounds", type=int, default=1, help="how many times each build runs every kind of join")
    ap.add_argument("--es256", action=argparse.BooleanOptionalAction, default=True,
                    help="also the private joins with ES256 tokens (--no-es256 for a build that has no API_JWT_JWKS)")
    a = ap.parse_args()
    harness.build()
    rows = []
    # Every statement's duration is logged, so the authorize calls' timeline can be read.
    with harness.Cluster(a.pg_port, "log_min_duration_statement = 0", "log_line_prefix = '%m '") as pg:
        pg.psql("-f", f"{HERE}/joins_setup.sql")
        # Postgres Changes joins: client i binds INSERTs of bench_changes, filter k=eq.<room>.
        pg.psql("-v", f"users={a.clients}", "-v", "rooms=1000", "-f", f"{HERE}/changes_setup.sql")
        server_log = f"{pg.dir}/pg/server.log"
        # The ES256 joins' key: the same private joins, with tokens as asymmetric projects sign them.
        pem, jwks = harness.ec_signing_key(pg.dir, "bench-ec")
        es256 = ["--jwt-ec-pem", pem, "--jwt-kid", "bench-ec"]
        for rnd, _, (build, binary) in harness.abba(a.rounds, [None], harness.builds(a.sidecars)):
            # 15,000 clients connect at once: past the default MAX_CONNECTIONS less its
            # backend reserve (14,745) and MAX_HTTP_CONNECTIONS (8,192 mid-upgrade).
            with harness.Sidecar(a.http_port, pg.dsn, "joins", SECRET, binary=binary,
                                 MAX_JOINS_PER_SECOND="100000", MAX_CONNECTIONS="19000",
                                 MAX_HTTP_CONNECTIONS="19000", API_JWT_JWKS=jwks) as sidecar:
                # The first round warms the sidecar up (its first thousands of tasks and buffers)
                # and is not reported.
                public = ["--topic-prefix", "joins"]
                for label, extra in [("warm-up", public), ("public", public),
                                     ("private (RLS)", ["--private", "--topics", 1000, "--topic-prefix", "room:"]),
                                     # Every client's apikey and join token ES256 (verified with
                                     # the JWKS's P-256 key), against the HS256 row above.
                                     *([("private (RLS), ES256", ["--private", "--topics", 1000,
                                                                 "--topic-prefix", "room:", *es256])]
                                       if a.es256 else []),
                                     # Each join's bindings are checked (realtime.subscribable), and
                                     # only then is its table listened to: one more upload round
                                     # when the table is new to the sidecar (here, the first joins').
                                     ("postgres changes", ["--postgres-changes", "--topics", 1000,
                                                           "--topic-prefix", "pc:"])]:
                    log_from = os.path.getsize(server_log)
                    b0 = sidecar.metric("realtime_auth_batches_total")
                    r0 = sidecar.metric("realtime_auth_requests_total")
                    r = harness.loadgen(f"ws://127.0.0.1:{a.http_port}", pg.dsn, SECRET, "--clients", a.clients,
                                        "--rate", 0, "--seconds", 0, "--label", label, *extra,
                                        timeout=300)
                    r["auth_calls"] = sidecar.metric("realtime_auth_batches_total") - b0
                    r["auth_verdicts"] = sidecar.metric("realtime_auth_requests_total") - r0
                    r["auth_busy_ms"], r["auth_gap_ms"] = calls_in(read_from(server_log, log_from))
                    r["build"], r["round"] = build, rnd + 1
                    # A refused join measures the refusal, not a join: the table would lie.
                    if r["failed_connections"] or r["join_errors"] or r["joined"] != a.clients:
                        sys.exit(f"{label}: {r['joined']:,} of {a.clients:,} joined, {r['join_errors']:,} refused, "
                                 f"{r['failed_connections']:,} connections failed")
                    if label != "warm-up":
                        rows.append(r)
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; {a.clients:,} clients connecting and "
          f"joining at once; 100,000 memberships; sidecar, Postgres and the load generator on the same 2 cores.\n")
    print("| build | round | channels | joined | refused | failed conns | connecting (s) | joining (s) | joins/s | "
          "authorize calls | verdicts | database time in the calls (ms) | longest gap between calls (ms) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['build'] or '-'} | {r['round']} | {r['label']} | {r['joined']:,} | {r['join_errors']:,} | {r['failed_connections']} | {r['connect_seconds']:.2f} | "
              f"{r['join_seconds']:.2f} | {r['joins_per_second']:,.0f} | {r['auth_calls']:,.0f} | {r['auth_verdicts']:,.0f} | "
              f"{r['auth_busy_ms']:,.0f} | {r['auth_gap_ms']:,.0f} |")


if __name__ == "__main__":
    main()
