#!/usr/bin/env python3
"""What a writer pays for broadcasting: INSERT TPS on the same 6-column table with no trigger
and with each way of broadcasting the row, at 1, 2 and 8 clients, interleaved round by round
on one throwaway cluster, while a consumer drains our queue and a listener LISTENs. Prints a
markdown table of medians over the rounds. Run as root after scripts/install-extension.sh."""

import argparse
import datetime
import re
import statistics
import subprocess
import sys

import harness
from harness import HERE, as_pg
VARIANTS = [
    ("t_plain", "(a) plain INSERT"),
    ("t_changes", "(b) broadcast_changes, plpgsql trigger"),
    ("t_native", "(b') broadcast_trigger, native"),
    ("t_notify", "(c) pg_notify trigger"),
]


def start_consumers(psql, seconds):
    """A consumer that drains our queue, as a sidecar would, and a session that LISTENs for
    the NOTIFY variant; both run until killed or `seconds` pass."""
    run = ["runuser", "-u", "postgres", "--"] + psql
    drainer = subprocess.Popen(run + ["-c", f"""
        DO $$ DECLARE pos bigint := realtime.create_consumer('bench'); r record;
        deadline timestamptz := clock_timestamp() + interval '{seconds} s';
        BEGIN WHILE clock_timestamp() < deadline LOOP
          FOR r IN SELECT seq FROM realtime.drain('bench', pos, 10000, 200, 2) LOOP pos := r.seq; END LOOP;
        END LOOP; END $$;"""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listener = subprocess.Popen(run, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, text=True)
    listener.stdin.write("LISTEN bench;\nSELECT 1 \\watch 0.05\n")
    listener.stdin.flush()
    return [drainer, listener]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=10, help="length of each pgbench run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default="1,2,8")
    ap.add_argument("--synchronous-commit", default="on", choices=["on", "off"])
    ap.add_argument("--port", type=int, default=54330)
    ap.add_argument("--no-consumers", action="store_true",
                    help="run without the draining consumer and the LISTEN session")
    a = ap.parse_args()
    clients = [int(c) for c in a.clients.split(",")]

    background = []
    with harness.Cluster(a.port, f"synchronous_commit = {a.synchronous_commit}", "max_connections = 50",
                         "shared_buffers = 256MB", "max_wal_size = 4GB") as pg:
        psql = ["psql", *pg.conn, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"]
        try:
            pg.psql("-f", f"{HERE}/trigger_cost_setup.sql")
            total = len(clients) * len(VARIANTS) * a.rounds * (a.seconds + 5) + 120
            if not a.no_consumers:
                background = start_consumers(psql, total)
            results = {}
            for r in range(a.rounds):
                for c in clients:
                    for table, _ in VARIANTS:
                        pg.psql("-c", "CHECKPOINT")
                        wal0 = int(pg.psql("-c", "SELECT wal_bytes FROM pg_stat_wal"))
                        out = as_pg(["pgbench", *pg.conn, "-n", "-c", str(c), "-j", str(min(c, 2)),
                                     "-T", str(a.seconds), "-D", f"table={table}",
                                     "-f", f"{HERE}/insert_row.sql", "postgres"])
                        wal1 = int(pg.psql("-c", "SELECT wal_bytes FROM pg_stat_wal"))
                        tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
                        lat = float(re.search(r"latency average = ([\d.]+) ms", out).group(1))
                        txns = int(re.search(r"actually processed: (\d+)", out).group(1))
                        results.setdefault((c, table), []).append((tps, lat, (wal1 - wal0) / max(txns, 1)))
                        print(f"round {r + 1} clients {c} {table}: {tps:.0f} tps", file=sys.stderr)
            stats = pg.psql("-c", "SELECT messages_enqueued, messages_evicted FROM realtime.stats()").strip()
            lag = pg.psql("-c", "SELECT lost_messages FROM realtime.consumers() WHERE name = 'bench'").strip()
        finally:
            for p in background:
                p.kill()

    print(f"Machine: {harness.machine()}; {datetime.date.today()}; PostgreSQL 15, "
          f"synchronous_commit = {a.synchronous_commit}; {a.rounds} rounds x {a.seconds} s, interleaved; "
          f"medians over rounds.\n")
    print("| clients | variant | TPS | vs (a) | latency avg (ms) | WAL bytes / txn |")
    print("|---:|---|---:|---:|---:|---:|")
    for c in clients:
        base = statistics.median(x[0] for x in results[(c, "t_plain")])
        for table, label in VARIANTS:
            rs = results[(c, table)]
            tps = statistics.median(x[0] for x in rs)
            print(f"| {c} | {label} | {tps:,.0f} | {tps / base:.2f} | "
                  f"{statistics.median(x[1] for x in rs):.3f} | {statistics.median(x[2] for x in rs):,.0f} |")
    print(f"\nQueue after the run (messages enqueued | evicted): {stats}; messages the draining consumer lost: {lag}.")


if __name__ == "__main__":
    main()
