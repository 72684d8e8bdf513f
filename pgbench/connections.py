#!/usr/bin/env python3
"""Connections held: N WebSocket clients connect, join one channel each and stay 60 s while
each channel gets a message every 10 s (so every connection is shown to be alive and
joined); the criterion is that none failed. Reports the servers' memory per connection
(peak RSS during the hold minus RSS before connecting, over connections held). This
machine allows 20,000 open files per process, so the sidecar runs as several processes
sharing the port (SO_REUSEPORT) and the load generator as several processes, each from its
own 127.0.0.x source address. Centrifugo v5.4.9 (one process) is held at 15,000 in the same
run for comparison. Run as root after scripts/install-extension.sh and install-peers.sh."""

import argparse
import datetime
import json
import sys

import harness
from harness import HERE

SECRET = "connections-benchmark-secret-with-enough-length"
TOPICS = 100


def hold(url, pg, clients, seconds, protocol_flags, label):
    return harness.spread_loadgen(url, pg.dsn, SECRET, clients,
                                  ["--seconds", seconds, "--topics", TOPICS, "--rate", TOPICS / 10, "--label", label],
                                  lambda p, n: protocol_flags(p), timeout=seconds + 600)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", default="20000,50000,100000", help="connection counts to hold")
    ap.add_argument("--centrifugo-clients", type=int, default=15000, help="0 to skip the peer")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--json", help="file to write every result line to")
    ap.add_argument("--pg-port", type=int, default=24410)
    ap.add_argument("--http-port", type=int, default=24411)
    ap.add_argument("--centrifugo-port", type=int, default=24412)
    a = ap.parse_args()
    harness.build()
    rows = []
    # Up to 21 sidecars (250,000 connections), each with its drain, relay, authorizer,
    # history, presence and checker connections.
    with harness.Cluster(a.pg_port, "max_connections = 400", "realtime.max_consumers = 32") as pg:
        pg.psql("-f", f"{HERE}/scenarios_setup.sql")
        data = f"{pg.dir}/pg/data"
        for n in [int(x) for x in a.clients.split(",")]:
            sidecars = harness.processes_for(n)
            with harness.Sidecars(sidecars, a.http_port, pg.dsn, SECRET) as s:
                base = sum(harness.rss_kb(p) for p in s.pids())
                with harness.Usage(s.pids(), data) as u:
                    r = hold(f"ws://127.0.0.1:{a.http_port}", pg, n, a.seconds,
                             lambda p: ["--topic-prefix", f"c{n}p{p}-"], "pg_realtime sidecar")
            r.update(u.result, server="pg_realtime sidecar", server_processes=sidecars, base_rss_mb=base / 1024)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr)
        if a.centrifugo_clients:
            with harness.Centrifugo(a.centrifugo_port, pg.dsn, SECRET) as c:
                base = harness.rss_kb(c.process.pid)
                with harness.Usage([c.process.pid], data) as u:
                    r = hold(f"ws://127.0.0.1:{a.centrifugo_port}", pg, a.centrifugo_clients, a.seconds,
                             lambda p: ["--protocol", "centrifugo", "--publisher", "outbox",
                                        "--topic-prefix", f"bench:c{p}-"], "Centrifugo v5.4.9")
            r.update(u.result, server="Centrifugo v5.4.9", server_processes=1, base_rss_mb=base / 1024)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr)

    print(f"Machine: {harness.machine()}; {datetime.date.today()}; each client joins one of {TOPICS} channels per "
          f"load generator process, each channel gets a message every 10 s; held {a.seconds} s; at most "
          f"{harness.PER_PROCESS:,} connections per process (20,000 open files per process here).\n")
    print("| server | processes | connections asked | held to the end | failed | connects/s | joined | deliveries "
          "| lost | gaps | peak RSS | memory / connection | server CPU | Postgres CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        per = (r["server_peak_rss_mb"] - r["base_rss_mb"]) * 1024 / max(r["held_to_end"], 1)
        print(f"| {r['server']} | {r['server_processes']} server, {r['processes']} load generator | {r['clients']:,} | "
              f"{r['held_to_end']:,} | {r['failed_connections'] + r['closed_early']:,} | {r['connects_per_second']:,.0f} | "
              f"{r['joined']:,} | {r['received']:,} | {r['lost']:,} | {r['gaps']:,} | {r['server_peak_rss_mb']:,.0f} MB | "
              f"{per:.1f} KiB | {r['server_cpu_pct']:.0f}% | {r['pg_cpu_pct']:.0f}% |")
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
