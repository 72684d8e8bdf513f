#!/usr/bin/env python3
"""The load generator's scenarios, named after the seeds' benchmarks, against our sidecar on
one throwaway cluster (sidecar, Postgres and load generator on the same 2 cores):
  db-broadcast      Supabase "Broadcast: using the database": rows inserted at a fixed rate
                    into a table whose plpgsql trigger calls realtime.broadcast_changes;
                    100 subscribers per channel, 2 private channels per client; the insert
                    rate rises until p99 exceeds 50 ms.
  kafkorama         10,000 topics each updated once a second, 512-byte payloads, each client
                    on one random topic; client counts rise (several sidecar processes on one
                    port and several load generator processes, 20,000 open files each).
  client-broadcast  SignalR's echo / broadcast / small group (10) / big group: clients send
                    through the sidecar (relayed through the database) to themselves, all,
                    groups.
  payload-size      1 KB, 10 KB and 50 KB payloads to 100 subscribers.
Prints a markdown table per scenario; --json writes every result line. Run as root after
scripts/install-extension.sh; builds the sidecar and the load generator (release)."""

import argparse
import datetime
import json
import math
import sys

import harness
from harness import HERE

SECRET = "scenarios-benchmark-secret-with-enough-length"
P99_GOAL_MS = 50


def fmt_row(label, r):
    return (f"| {label} | {r['clients']:,} | {r['sent'] / max(r['send_seconds'], 1e-9):,.0f} | "
            f"{r['deliveries_per_second']:,.0f} | {r['lost']:,} | {r['gaps']:,} | {r['failed_connections'] + r['closed_early']} | "
            f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | "
            f"{r['server_cpu_pct']:.0f}% | {r['server_peak_rss_mb']:.0f} MB | {r['pg_cpu_pct']:.0f}% | {r['push_refused']:,} |")


HEADER = ("| run | clients | msg/s sent | deliveries/s | lost | gaps | failed conns | p50 ms | p95 ms | p99 ms | "
          "max ms | sidecar CPU | sidecar peak RSS | Postgres CPU | refused |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


class Run:
    def __init__(self, a, pg):
        self.a, self.pg, self.results = a, pg, []

    def go(self, label, clients, flags, sidecars=1, per_process_flags=lambda p, n: []):
        """One row: `sidecars` sidecar processes on one port and the load generator spread
        over processes (harness.spread_loadgen)."""
        url = f"ws://127.0.0.1:{self.a.http_port}"
        with harness.Sidecars(sidecars, self.a.http_port, self.pg.dsn, SECRET) as s:
            with harness.Usage(s.pids(), f"{self.pg.dir}/pg/data") as u:
                r = harness.spread_loadgen(url, self.pg.dsn, SECRET, clients,
                                           ["--seconds", self.a.seconds, "--label", label, *flags], per_process_flags)
        r.update(u.result, label=label, sidecars=sidecars)
        print(json.dumps(r), file=sys.stderr)
        self.results.append(r)
        return r


def meets(r):
    return r["p99_ms"] <= P99_GOAL_MS and r["lost"] == 0 and r["failed_connections"] + r["closed_early"] == 0


def db_broadcast(run, scale):
    clients = 1000 if scale == "full" else 100
    topics = clients * 2 // 100
    print(f"\n### db-broadcast: {clients:,} clients, 2 private channels each, 100 subscribers per channel "
          f"({topics} channels); rows inserted into a table whose plpgsql trigger calls realtime.broadcast_changes\n")
    print(HEADER)
    best = None
    for rate in ([100, 300, 1000, 2000, 4000, 6000, 8000, 12000] if scale == "full" else [50]):
        r = run.go(f"{rate:,} rows/s", clients, ["--publisher", "table", "--private", "--topics", topics,
                                                 "--topic-prefix", "room:", "--channels-per-client", 2, "--rate", rate])
        print(fmt_row(r["label"], r), flush=True)
        if not meets(r):
            break
        best = r
    if best:
        print(f"\nHighest insert rate with p99 ≤ {P99_GOAL_MS} ms and nothing lost: {best['label']} "
              f"({best['deliveries_per_second']:,.0f} deliveries/s).")


def kafkorama(run, scale):
    topics = 10_000 if scale == "full" else 100
    ladder = [10_000, 20_000, 30_000, 45_000, 60_000] if scale == "full" else [200]
    print(f"\n### kafkorama: {topics:,} topics each updated once a second, 512-byte payloads, "
          "each client on one random topic\n")
    print(HEADER)
    for clients in ladder:
        procs = sidecars = harness.processes_for(clients)

        r = run.go(f"{clients:,} clients ({procs} load generator, {sidecars} sidecar process{'es' if sidecars > 1 else ''})", clients,
                   ["--publisher", "send", "--assign", "random", "--pad", 480, "--progress"],
                   sidecars=sidecars, per_process_flags=harness.topic_share(topics, "kaf"))
        print(fmt_row(r["label"], r), flush=True)
        if not meets(r):
            break


def client_broadcast(run, scale):
    k = 1 if scale == "full" else 10
    print("\n### client-broadcast (SignalR's echo / broadcast / groups): each client sends at the given rate "
          "through the sidecar (relayed through the database, so every sidecar sees one order); "
          "latency is send-to-receive, both stamped by the load generator\n")
    print(HEADER)
    for kind, clients, group, rate in [("echo", 1000, 1, 10), ("broadcast", 100, 100, 1),
                                       ("small groups", 1000, 10, 1), ("big group", 1000, 1000, 0.1)]:
        clients //= k
        group = max(1, min(group, clients))
        label = f"{kind}: groups of {group:,}, each client sends {rate:g} msg/s"
        r = run.go(label, clients, ["--publisher", "clients", "--assign", "group", "--group-size", group,
                                    "--topics", math.ceil(clients / group), "--topic-prefix", "group", "--rate", rate])
        print(fmt_row(r["label"], r), flush=True)


def payload_size(run, scale):
    subs = 100 if scale == "full" else 10
    print(f"\n### payload-size: {subs} subscribers of one topic, 100 msg/s, realtime.send\n")
    print(HEADER)
    for size in (1_000, 10_000, 50_000):
        r = run.go(f"{size // 1000} KB", subs, ["--publisher", "send", "--rate", 100, "--pad", size,
                                                 "--topic-prefix", f"size{size}-"])
        print(fmt_row(r["label"], r), flush=True)


SCENARIOS = {"db-broadcast": db_broadcast, "kafkorama": kafkorama, "client-broadcast": client_broadcast,
             "payload-size": payload_size}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenario names")
    ap.add_argument("--seconds", type=int, default=15, help="sending window of each row")
    ap.add_argument("--scale", default="full", choices=["full", "smoke"])
    ap.add_argument("--json", help="file to write every result line to")
    ap.add_argument("--pg-port", type=int, default=24390)
    ap.add_argument("--http-port", type=int, default=24391)
    a = ap.parse_args()
    harness.build()
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; serializer 2.0.0; {a.seconds} s of sending per row; "
          f"sidecar, Postgres and the load generator on the same 2 cores; a row meets the goal when p99 ≤ "
          f"{P99_GOAL_MS} ms with nothing lost. Latency quantiles of rows run by several load generator "
          "processes are the worst process's.")
    with harness.Cluster(a.pg_port, "max_connections = 100", "realtime.max_consumers = 16") as pg:
        pg.psql("-f", f"{HERE}/scenarios_setup.sql")
        run = Run(a, pg)
        for name in a.only.split(","):
            SCENARIOS[name](run, a.scale)
    if a.json:
        with open(a.json, "w") as f:
            for r in run.results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
