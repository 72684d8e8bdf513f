#!/usr/bin/env python3
"""What a writer pays for Postgres Changes: INSERT TPS on the same 6-column table
(a) unpublished, (b) in publication supabase_realtime, captured at commit into our queue
while the release sidecar drains it (the drain decodes each change), and (c) in a publication
streamed by logical decoding (pg_recvlogical with pgoutput, the path Supabase's server reads
changes through), at 1, 2 and 8 clients, interleaved round by round on one throwaway cluster
(wal_level = logical for all, as (c) needs it). Prints a markdown table of medians over the
rounds, with WAL bytes and Postgres CPU per transaction. Run as root after
scripts/install-extension.sh."""

import argparse
import contextlib
import datetime
import re
import statistics
import subprocess
import sys

import harness
from harness import HERE, as_pg

VARIANTS = [
    ("c_plain", "(a) plain INSERT, table not published"),
    ("c_captured", "(b) published: captured at commit into our queue"),
    ("c_logical", "(c) published: logical decoding streamed by pg_recvlogical"),
]
SECRET = "capture-cost-benchmark-secret-with-enough-length"
SETUP = """
CREATE EXTENSION pg_realtime;
CREATE TABLE c_plain (id bigserial PRIMARY KEY, room int, author text, body text, score numeric, created_at timestamptz);
CREATE TABLE c_captured (LIKE c_plain INCLUDING ALL);
CREATE TABLE c_logical (LIKE c_plain INCLUDING ALL);
CREATE PUBLICATION supabase_realtime;
ALTER PUBLICATION supabase_realtime ADD TABLE c_captured;
CREATE PUBLICATION bench_logical FOR TABLE c_logical;
"""


@contextlib.contextmanager
def logical_stream(pg, seconds):
    """pg_recvlogical streaming publication bench_logical for the whole run (bounded by
    `seconds`), stopped by PID on exit."""
    stream = subprocess.Popen(["runuser", "-u", "postgres", "--", "timeout", str(seconds), "pg_recvlogical",
                               *pg.conn, "-d", "postgres", "--slot", "bench_logical", "--start", "-f", "/dev/null",
                               "-o", "proto_version=2", "-o", "publication_names=bench_logical",
                               "-s", "1", "-F", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        stream.terminate()
        stream.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=10, help="length of each pgbench run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default="1,2,8")
    ap.add_argument("--port", type=int, default=24340)
    ap.add_argument("--no-consumer", action="store_true",
                    help="no sidecar draining: what the writer alone pays (the queue then fills and "
                         "evicts, which costs nothing to writers)")
    ap.add_argument("--linger-ms", type=int, default=2, help="the draining sidecar's DRAIN_LINGER_MS")
    a = ap.parse_args()
    clients = [int(c) for c in a.clients.split(",")]
    harness.build()
    total = len(clients) * len(VARIANTS) * a.rounds * (a.seconds + 5) + 120
    with harness.Cluster(a.port, "max_connections = 50", "shared_buffers = 256MB", "max_wal_size = 4GB",
                         "wal_level = logical", "max_replication_slots = 4", "max_wal_senders = 4") as pg, \
            contextlib.ExitStack() as stack:
        pg.psql("-c", SETUP)
        # Not in SETUP: a slot cannot be made in a transaction that has written.
        pg.psql("-c", "SELECT pg_create_logical_replication_slot('bench_logical', 'pgoutput')")
        if not a.no_consumer:
            # No client subscribes here, and a filtering sidecar would skip every change at
            # the drain: keep the consumer's whole work, as a sidecar whose clients listen
            # would do.
            stack.enter_context(harness.Sidecar(a.port + 2, pg.dsn, "bench", SECRET, DRAIN_LINGER_MS=str(a.linger_ms),
                                                FILTER_TOPICS="false"))
        stack.enter_context(logical_stream(pg, total))
        results = {}
        for r in range(a.rounds):
            for c in clients:
                for table, _ in VARIANTS:
                    pg.psql("-c", "CHECKPOINT")
                    wal0 = int(pg.psql("-c", "SELECT wal_bytes FROM pg_stat_wal"))
                    cpu0, _ = harness.postgres_usage(f"{pg.dir}/pg/data")
                    out = as_pg(["pgbench", *pg.conn, "-n", "-c", str(c), "-j", str(min(c, 2)),
                                 "-T", str(a.seconds), "-D", f"table={table}",
                                 "-f", f"{HERE}/insert_row.sql", "postgres"])
                    wal1 = int(pg.psql("-c", "SELECT wal_bytes FROM pg_stat_wal"))
                    cpu1, _ = harness.postgres_usage(f"{pg.dir}/pg/data")
                    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
                    txns = int(re.search(r"actually processed: (\d+)", out).group(1))
                    results.setdefault((c, table), []).append(
                        (tps, (wal1 - wal0) / max(txns, 1), 1e6 * (cpu1 - cpu0) / max(txns, 1)))
                    print(f"round {r + 1} clients {c} {table}: {tps:.0f} tps", file=sys.stderr)
        captured = pg.psql("-c", "SELECT count(*) FROM c_captured").strip()
        stats = pg.psql("-c", "SELECT messages_enqueued, messages_evicted FROM realtime.stats()").strip()
        lost = pg.psql("-c", "SELECT coalesce(sum(lost_messages), 0) FROM realtime.consumers() "
                             "WHERE name = 'bench'").strip()

    consumer = "no consumer of our queue" if a.no_consumer else "the release sidecar draining our queue"
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; PostgreSQL 15; {consumer}; "
          f"{a.rounds} rounds x {a.seconds} s, interleaved; medians over rounds.\n")
    print("| clients | variant | TPS | vs (a) | WAL bytes / txn | Postgres CPU µs / txn |")
    print("|---:|---|---:|---:|---:|---:|")
    for c in clients:
        base = statistics.median(x[0] for x in results[(c, "c_plain")])
        for table, label in VARIANTS:
            rs = results[(c, table)]
            tps = statistics.median(x[0] for x in rs)
            print(f"| {c} | {label} | {tps:,.0f} | {tps / base:.2f} | "
                  f"{statistics.median(x[1] for x in rs):,.0f} | {statistics.median(x[2] for x in rs):,.0f} |")
    print(f"\nRows captured: {captured}; queue after the run (messages enqueued | evicted): {stats}; "
          f"messages the draining sidecar lost: {lost}.")


if __name__ == "__main__":
    main()
