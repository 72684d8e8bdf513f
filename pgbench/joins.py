#!/usr/bin/env python3
"""Channel joins per second through the sidecar, public and private (authorized by RLS in
batched realtime.authorize calls), in one run: N WebSocket clients connect; once all are
connected they send their joins at once; joins/s = joined / time from the go to the last
reply (connecting is timed apart). Prints a markdown table.
Run as root after scripts/install-extension.sh."""

import argparse
import datetime

import harness
from harness import HERE
SECRET = "joins-benchmark-secret-with-enough-length"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=15000)
    ap.add_argument("--pg-port", type=int, default=24380)
    ap.add_argument("--http-port", type=int, default=24381)
    a = ap.parse_args()
    harness.build()
    rows = []
    with harness.Cluster(a.pg_port) as pg:
        pg.psql("-f", f"{HERE}/joins_setup.sql")
        with harness.Sidecar(a.http_port, pg.dsn, "joins", SECRET, MAX_JOINS_PER_SECOND="100000") as sidecar:
            # The first round warms the sidecar up (its first thousands of tasks and buffers)
            # and is not reported.
            public = ["--topic-prefix", "joins"]
            for label, extra in [("warm-up", public), ("public", public),
                                 ("private (RLS)", ["--private", "--topics", 1000, "--topic-prefix", "room:"])]:
                b0 = sidecar.metric("realtime_auth_batches_total")
                r0 = sidecar.metric("realtime_auth_requests_total")
                r = harness.loadgen(f"ws://127.0.0.1:{a.http_port}", pg.dsn, SECRET, "--clients", a.clients,
                                    "--rate", 0, "--seconds", 0, "--label", label, *extra,
                                    timeout=300)
                r["auth_calls"] = sidecar.metric("realtime_auth_batches_total") - b0
                r["auth_verdicts"] = sidecar.metric("realtime_auth_requests_total") - r0
                if label != "warm-up":
                    rows.append(r)
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; {a.clients:,} clients connecting and "
          f"joining at once; 100,000 memberships; sidecar, Postgres and the load generator on the same 2 cores.\n")
    print("| channels | joined | refused | failed conns | connecting (s) | joining (s) | joins/s | authorize calls | verdicts |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['label']} | {r['joined']:,} | {r['join_errors']:,} | {r['failed_connections']} | {r['connect_seconds']:.2f} | "
              f"{r['join_seconds']:.2f} | {r['joins_per_second']:,.0f} | {r['auth_calls']:,.0f} | {r['auth_verdicts']:,.0f} |")


if __name__ == "__main__":
    main()
