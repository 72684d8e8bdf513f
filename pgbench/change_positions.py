#!/usr/bin/env python3
"""What the Postgres Changes positions cost: the setup of pgbench/changes.py (USERS clients
in ROOMS rooms, each subscribed to the INSERTs of its room on a table with RLS), run at each
rate twice on the same sidecar and cluster, interleaved, for ROUNDS rounds: once as today's
apps join, once with `config.broadcast.resume = {changes: true}`, which adds a `system`
message with the channel's position after each drained batch that sent it a change
(`sidecar/src/postgres_changes/position.rs`). Prints a markdown table: deliveries/s, p50 and
p99 commit-to-receive, the sidecar's CPU over the whole run (connecting included) per
change delivered to a subscriber, the position messages sent per delivery, and the ratios with/without (medians over the rounds). Run as root
after scripts/install-extension.sh; builds the sidecar and the load generator (release)."""

import argparse
import datetime
import json
import statistics
import sys

import harness
from harness import HERE

SECRET = "changes-benchmark-secret-with-enough-length"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--rooms", type=int, default=10)
    ap.add_argument("--rates", default="100,300,1000", help="inserts per second to try")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--vsn", default="2.0.0")
    ap.add_argument("--pg-port", type=int, default=24430)
    ap.add_argument("--http-port", type=int, default=24431)
    a = ap.parse_args()

    harness.build()
    runs = {}
    with harness.Cluster(a.pg_port, "max_connections = 50") as pg:
        pg.psql("-v", f"users={a.users}", "-v", f"rooms={a.rooms}", "-f", f"{HERE}/changes_setup.sql")
        with harness.Sidecar(a.http_port, pg.dsn, "changes", SECRET) as sidecar:
            for rnd in range(a.rounds):
                for rate in map(int, a.rates.split(",")):
                    # Alternate which goes first, so neither always runs on a warmer cache.
                    modes = (False, True) if rnd % 2 == 0 else (True, False)
                    for positions in modes:
                        pid = sidecar.process.pid
                        cpu0, _ = harness.proc_stats(pid)
                        sent0 = sidecar.metric("realtime_change_positions_total")
                        flags = ["--vsn", a.vsn, "--clients", a.users, "--topics", a.rooms,
                                 "--publisher", "changes", "--postgres-changes", "--rate", rate,
                                 "--seconds", a.seconds,
                                 "--label", f"{rate} inserts/s positions={positions}"]
                        if positions:
                            flags.append("--change-positions")
                        r = harness.loadgen(f"ws://127.0.0.1:{a.http_port}", pg.dsn, SECRET, *flags,
                                            timeout=a.seconds + 400)
                        cpu1, _ = harness.proc_stats(pid)
                        r["positions"] = sidecar.metric("realtime_change_positions_total") - sent0
                        delivered = max(r["deliveries_per_second"] * r["seconds"], 1)
                        # CPU seconds over the whole run (connecting included) per change delivered to a client.
                        r["cpu_us_per_delivery"] = 1e6 * (cpu1 - cpu0) / delivered
                        r["positions_per_delivery"] = r["positions"] / delivered
                        print(json.dumps(r), file=sys.stderr)
                        runs.setdefault((rate, positions), []).append(r)

    med = lambda rate, positions, k: statistics.median(r[k] for r in runs[(rate, positions)])
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; serializer {a.vsn}; {a.seconds} s per run; "
          f"{a.users:,} subscribers in {a.rooms} rooms (RLS, filter per room); {a.rounds} interleaved rounds, "
          f"medians; sidecar, Postgres and the load generator on the same 2 cores.\n")
    print("| inserts/s | positions | deliveries/s | lost | p50 ms | p99 ms | sidecar CPU µs per delivery | positions per delivery | p50 ratio | p99 ratio | CPU ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rate in map(int, a.rates.split(",")):
        for positions in (False, True):
            ratio = lambda k: med(rate, True, k) / max(med(rate, False, k), 1e-9)
            ratios = (f"{ratio('p50_ms'):.2f} | {ratio('p99_ms'):.2f} | {ratio('cpu_us_per_delivery'):.2f}"
                      if positions else " | | ")
            lost = sum(r["lost"] for r in runs[(rate, positions)])
            print(f"| {rate:,} | {'yes' if positions else 'no'} | {med(rate, positions, 'deliveries_per_second'):,.0f} | "
                  f"{lost:,} | {med(rate, positions, 'p50_ms'):.1f} | {med(rate, positions, 'p99_ms'):.1f} | "
                  f"{med(rate, positions, 'cpu_us_per_delivery'):.2f} | {med(rate, positions, 'positions_per_delivery'):.3f} | "
                  f"{ratios} |")


if __name__ == "__main__":
    main()
