#!/usr/bin/env python3
"""Sidecars that carry only their share. The kafkorama shape (10,000 topics each updated once
a second by realtime.send, 512-byte payloads, each client on one random topic) on 1, 2, 4 and
8 sidecar processes, in the same run in two ways:
  routed      each sidecar on a port of its own; the load generator connects each client to
              the sidecar its topic's name hashes to (FNV-1a modulo the count: what a
              topic-aware proxy, or a client choosing by topic hash, does), and each sidecar's
              drain returns only the topics its clients joined (realtime.listen, the default);
  everything  the sidecars share one port (SO_REUSEPORT: clients land at random, as behind
              an ordinary load balancer) and drain every message (FILTER_TOPICS=false): each
              process pays for every topic, as before the topic filter.
Then the goal row: --goal-clients (125,000) on 8 routed processes, and one step larger.
CPU is taken over the sending window only (the load generators' own clock bounds), for the
sidecars and for Postgres; "CPU per delivery" is both over the deliveries of that window.
Prints markdown tables; --json writes every result line. Run as root after
scripts/install-extension.sh; builds the sidecar and the load generator (release)."""

import argparse
import datetime
import json
import sys

import harness
from harness import HERE

SECRET = "routed-benchmark-secret-with-enough-length"
P50_GOAL_MS = 5

HEADER = ("| way | sidecar processes | clients | msg/s sent | deliveries/s | lost | failed conns | p50 ms | p99 ms | "
          "sidecar CPU | Postgres CPU | CPU µs per delivery (sidecars + Postgres) | sidecar peak RSS |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(r):
    return (f"| {r['way']} | {r['sidecars']} | {r['clients']:,} | {r['sent'] / max(r['send_seconds'], 1e-9):,.0f} | "
            f"{r['deliveries_per_second']:,.0f} | {r['lost']:,} | {r['failed_connections'] + r['closed_early']:,} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['server_cpu_pct']:.0f}% | {r['pg_cpu_pct']:.0f}% | "
            f"{r['cpu_us_per_delivery']:.1f} | {r['server_peak_rss_mb']:.0f} MB |")


def run_one(a, pg, way, sidecars, clients):
    routed = way == "routed"
    env = {} if routed else {"FILTER_TOPICS": "false"}

    with harness.Sidecars(sidecars, a.http_port, pg.dsn, SECRET, routed=routed, **env) as s:
        with harness.Usage(s.pids(), f"{pg.dir}/pg/data") as u:
            r = harness.spread_loadgen(s.urls(), pg.dsn, SECRET, clients,
                                       ["--seconds", a.seconds, "--publisher", "send", "--assign", "random",
                                        "--pad", 480, "--label", f"{way} x{sidecars}"],
                                       harness.topic_share(a.topics, "kaf"))
    w = u.window(r["send_started_unix"], r["send_ended_unix"])
    r.update(u.result, way=way, sidecars=sidecars)
    if w:
        r.update(w)
    delivered = r["deliveries_per_second"] * r.get("window_seconds", r["send_seconds"])
    r["cpu_us_per_delivery"] = 1e6 * (r.get("server_cpu_s", 0) + r.get("pg_cpu_s", 0)) / max(delivered, 1)
    print(json.dumps(r), file=sys.stderr)
    print(row(r), flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=15, help="sending window of each row")
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=15_000, help="clients of the 1/2/4/8-process rows")
    ap.add_argument("--processes", default="1,2,4,8")
    ap.add_argument("--ways", default="routed,everything")
    ap.add_argument("--goal-clients", type=int, default=125_000, help="0: no goal rows")
    ap.add_argument("--goal-processes", type=int, default=8)
    ap.add_argument("--json", help="file to write every result line to")
    ap.add_argument("--pg-port", type=int, default=24392)
    ap.add_argument("--http-port", type=int, default=24400)
    a = ap.parse_args()
    harness.build()
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; serializer 2.0.0; {a.topics:,} topics, "
          f"each sent once a second; {a.seconds} s of sending per row; sidecars, Postgres and the load generators "
          "on the same 2 cores. Latency: commit to receive, the worst load generator process's quantile.")
    results = []
    with harness.Cluster(a.pg_port, "max_connections = 200", "realtime.max_consumers = 24") as pg:
        pg.psql("-f", f"{HERE}/scenarios_setup.sql")
        print(f"\n### {a.clients:,} clients on {a.processes} sidecar processes\n")
        print(HEADER)
        for n in map(int, a.processes.split(",")):
            for way in a.ways.split(","):
                results.append(run_one(a, pg, way, n, a.clients))
        if a.goal_clients:
            print(f"\n### {a.goal_clients:,} clients on {a.goal_processes} routed sidecar processes "
                  f"(goal: p50 ≤ {P50_GOAL_MS} ms), and one step larger\n")
            print(HEADER)
            for clients, n in [(a.goal_clients, a.goal_processes),
                               (a.goal_clients * 6 // 5, a.goal_processes + 2)]:
                results.append(run_one(a, pg, "routed", n, clients))
    if a.json:
        with open(a.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
