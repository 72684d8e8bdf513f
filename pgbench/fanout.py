#!/usr/bin/env python3
"""Commit-to-receive latency and fan-out through the sidecar, on one throwaway cluster:
one subscriber at 1,000 msg/s, then 1,000 subscribers of one topic at rising message rates.
Prints a markdown table (and the loadgen's JSON lines on stderr). Run as root after
scripts/install-extension.sh; builds the sidecar and the load generator (release).

`--sidecars before=BIN,after=BIN --rounds 2` compares builds in one run: each scenario runs
once per build per round, the builds alternating, each on a fresh sidecar, in ABBA order, and each row gives
the sidecar's CPU per delivery."""

import argparse
import datetime
import json
import subprocess
import sys

import harness
SECRET = "fanout-benchmark-secret-with-enough-length"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--subscribers", type=int, default=1000)
    ap.add_argument("--rates", default="100,300,500,1000", help="fan-out message rates to try")
    ap.add_argument("--vsn", default="2.0.0")
    ap.add_argument("--pin", action="store_true",
                    help="the sidecar on CPU 0 and the load generator on CPU 1 (Postgres on either)")
    ap.add_argument("--pg-port", type=int, default=24360)
    ap.add_argument("--http-port", type=int, default=24361)
    ap.add_argument("--sidecars", help="LABEL=BINARY,... sidecar builds to run in turn (default: this tree's)")
    ap.add_argument("--rounds", type=int, default=1, help="how many times each build runs each scenario")
    a = ap.parse_args()

    harness.build()
    rows = []
    with harness.Cluster(a.pg_port) as pg:
        pg.psql("-c", "CREATE EXTENSION pg_realtime")
        scenarios = [("latency, 1 subscriber", 1, 1000)] + [
            (f"fan-out, {a.subscribers} subscribers", a.subscribers, int(r)) for r in a.rates.split(",")]
        runs = harness.abba(a.rounds, scenarios, harness.builds(a.sidecars))
        for rnd, (label, subs, rate), (build, binary) in runs:
            with harness.Sidecar(a.http_port, pg.dsn, "fanout", SECRET, binary=binary) as sidecar:
                if a.pin:
                    subprocess.run(["taskset", "-a", "-pc", "0", str(sidecar.process.pid)], check=True,
                                   stdout=subprocess.DEVNULL)
                pid = sidecar.process.pid
                cpu0, _ = harness.proc_stats(pid)
                r = harness.loadgen(f"ws://127.0.0.1:{a.http_port}", pg.dsn, SECRET, "--vsn", a.vsn, "--clients", subs,
                                    "--rate", rate, "--seconds", a.seconds,
                                    "--topic-prefix", f"t{subs}x{rate}r{rnd}{build}-",
                                    "--label", label, timeout=a.seconds + 400, cpus="1" if a.pin else None)
                cpu1, hwm = harness.proc_stats(pid)
                r["build"], r["round"] = build, rnd + 1
                r["sidecar_cpu_pct"] = 100 * (cpu1 - cpu0) / (a.seconds + r["connect_seconds"])
                # Over the whole run, its connections and joins included.
                r["sidecar_us_per_delivery"] = 1e6 * (cpu1 - cpu0) / max(r["received"], 1)
                r["sidecar_peak_rss_mb"] = hwm / 1024
                print(json.dumps(r), file=sys.stderr)
                rows.append(r)

    print(f"Machine: {harness.machine()}; {datetime.date.today()}; serializer {a.vsn}; "
          f"{a.seconds} s per row; "
          + ("the sidecar pinned to CPU 0, the load generator to CPU 1, Postgres on either.\n" if a.pin else
             "sidecar, Postgres and the load generator on the same 2 cores.\n"))
    print("| build | round | scenario | msg/s sent | subscribers | deliveries/s | lost | failed conns | p50 ms | p95 ms "
          "| p99 ms | max ms | sidecar CPU | sidecar µs per delivery | sidecar peak RSS |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['build'] or '-'} | {r['round']} | {r['label']} | {r['sent'] / r['seconds']:,.0f} | {r['clients']:,} | "
              f"{r['deliveries_per_second']:,.0f} | "
              f"{r['lost']:,} | {r['failed_connections']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['max_ms']:.1f} | {r['sidecar_cpu_pct']:.0f}% | {r['sidecar_us_per_delivery']:.2f} | "
              f"{r['sidecar_peak_rss_mb']:.0f} MB |")


if __name__ == "__main__":
    main()
