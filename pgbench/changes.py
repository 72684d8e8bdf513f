#!/usr/bin/env python3
"""Postgres Changes delivered with Supabase's authorization, end to end: USERS clients, each
a member of one of ROOMS rooms (USERS / ROOMS per room), subscribed through the sidecar to
INSERTs of a published table with RLS (Supabase's docs' membership policy through
auth.uid()) with a filter on their room; the database inserts rows at rising rates, each
row delivered to its room's members after the batched RLS check. Latency is commit to
receive (the row carries its insert time). In the same run, on the same cluster and table,
Supabase's algorithm (one primary-key lookup under the subscriber's role and claims per
subscriber per change) is driven by pgbench with 1 client, as Supabase's poller runs it (one
connection, "processed on a single thread to maintain the change order"), and with 8: its
checks per second bound the deliveries per second Supabase's design can reach on this
machine, before any of its other work. Prints a markdown table (the loadgen's JSON lines on stderr). Run as root after
scripts/install-extension.sh; builds the sidecar and the load generator (release).

`--sidecars before=BIN,after=BIN --rounds 2` compares builds in one run, on one cluster: each
rate is run once per build per round, the builds alternating in ABBA order, and each row gives the sidecar's
and Postgres' CPU per delivered change, so a change's effect is told apart from the machine's
speed, which moves about 2x between runs here."""

import argparse
import datetime
import json
import re
import sys

import harness
from harness import HERE, as_pg

SECRET = "changes-benchmark-secret-with-enough-length"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--rooms", type=int, default=10)
    ap.add_argument("--rates", default="100,300,1000,1500,2000", help="inserts per second to try")
    ap.add_argument("--vsn", default="2.0.0")
    ap.add_argument("--pg-port", type=int, default=24390)
    ap.add_argument("--http-port", type=int, default=24391)
    ap.add_argument("--sidecars", help="LABEL=BINARY,... sidecar builds to run in turn at each rate (default: this tree's)")
    ap.add_argument("--rounds", type=int, default=1, help="how many times each build runs each rate")
    a = ap.parse_args()

    harness.build()
    rows = []
    with harness.Cluster(a.pg_port, "max_connections = 50") as pg:
        pg.psql("-v", f"users={a.users}", "-v", f"rooms={a.rooms}", "-f", f"{HERE}/changes_setup.sql")
        runs = harness.abba(a.rounds, [int(r) for r in a.rates.split(",")], harness.builds(a.sidecars))
        for rnd, rate, (build, binary) in runs:
            # A fresh sidecar per run: each build starts from the same state.
            with harness.Sidecar(a.http_port, pg.dsn, "changes", SECRET, binary=binary) as sidecar:
                pid = sidecar.process.pid
                cpu0, _ = harness.proc_stats(pid)
                pg0, _ = harness.postgres_usage(f"{pg.dir}/pg/data")
                withheld0 = sidecar.metric("realtime_changes_withheld_total")
                label = f"{rate:,} inserts/s x {a.users // a.rooms} members"
                r = harness.loadgen(f"ws://127.0.0.1:{a.http_port}", pg.dsn, SECRET, "--vsn", a.vsn,
                                    "--clients", a.users, "--topics", a.rooms, "--publisher", "changes",
                                    "--postgres-changes", "--rate", rate, "--seconds", a.seconds,
                                    "--label", label, timeout=a.seconds + 400)
                cpu1, hwm = harness.proc_stats(pid)
                pg1, _ = harness.postgres_usage(f"{pg.dir}/pg/data")
                # Over the whole run, its 1,000 joins included.
                delivered = max(r["received"], 1)
                r["build"], r["round"] = build, rnd + 1
                r["sidecar_cpu_pct"] = 100 * (cpu1 - cpu0) / (a.seconds + r["connect_seconds"])
                r["sidecar_us_per_delivery"] = 1e6 * (cpu1 - cpu0) / delivered
                r["postgres_us_per_delivery"] = 1e6 * (pg1 - pg0) / delivered
                r["withheld"] = sidecar.metric("realtime_changes_withheld_total") - withheld0
                print(json.dumps(r), file=sys.stderr)
                rows.append(r)
        inserted = int(pg.psql("-c", "SELECT max(id) FROM bench_changes").strip() or 0)
        probes = {}
        for clients in (1, 8):
            out = as_pg(["pgbench", *pg.conn, "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T",
                         str(a.seconds), "-D", f"users={a.users}", "-D", f"rows={max(inserted, 1)}",
                         "-f", f"{HERE}/changes_probe.sql", "postgres"])
            probes[clients] = float(re.search(r"tps = ([\d.]+)", out).group(1))

    print(f"Machine: {harness.machine()}; {datetime.date.today()}; serializer {a.vsn}; {a.seconds} s per row; "
          f"{a.users:,} subscribers in {a.rooms} rooms; sidecar, Postgres and the load generator on the same 2 "
          f"cores. Supabase's algorithm on this cluster, same table and policy: {probes[1]:,.0f} checks/s with 1 "
          f"client (its poller's one connection), {probes[8]:,.0f} with 8: the most deliveries/s it could "
          f"authorize here.\n")
    print("| build | round | inserts/s | deliveries/s | vs Supabase's, 1 connection | vs Supabase's, 8 | lost | "
          "withheld | p50 ms | p95 ms | p99 ms | max ms | sidecar CPU | sidecar µs per delivery | "
          "Postgres µs per delivery |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['build'] or '-'} | {r['round']} | {r['sent'] / r['seconds']:,.0f} | "
              f"{r['deliveries_per_second']:,.0f} | "
              f"{r['deliveries_per_second'] / probes[1]:.1f}x | {r['deliveries_per_second'] / probes[8]:.1f}x | "
              f"{r['lost']:,} | {r['withheld']:,.0f} | {r['p50_ms']:.1f} | "
              f"{r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['sidecar_cpu_pct']:.0f}% | "
              f"{r['sidecar_us_per_delivery']:.2f} | {r['postgres_us_per_delivery']:.2f} |")


if __name__ == "__main__":
    main()
