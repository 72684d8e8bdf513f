#!/usr/bin/env python3
"""What a writer pays for broadcasting: INSERT TPS on the same 6-column table with no trigger
and with each way of broadcasting the row, at 1, 2 and 8 clients, interleaved round by round
on one throwaway cluster (wal_level = logical for all, as the Supabase path needs it), while
each path's consumer runs: the sidecar draining our queue (no subscribers), a LISTENing
session, Centrifugo's outbox consumer, and during (d) pg_recvlogical streaming Supabase's
publication. Prints a markdown table of medians over the rounds. Run as root after
scripts/install-extension.sh and scripts/install-peers.sh."""

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
    ("t_plain", "(a) plain INSERT"),
    ("t_noop", "(a') AFTER ROW trigger doing nothing (plpgsql)"),
    ("t_changes", "(b) broadcast_changes, plpgsql trigger"),
    ("t_native", "(b') broadcast_trigger, native"),
    ("t_notify", "(c) pg_notify trigger"),
    ("t_supabase", "(d) Supabase: messages table + logical replication"),
    ("t_outbox", "(e) Centrifugo outbox trigger"),
]
SECRET = "trigger-cost-benchmark-secret-with-enough-length"


def start_consumers(psql, seconds, sql_drainer=True):
    """A session that LISTENs for the NOTIFY variant and, unless the sidecar drains, a SQL
    loop that drains our queue as a sidecar would; both run until killed or `seconds` pass."""
    run = ["runuser", "-u", "postgres", "--"] + psql
    listener = subprocess.Popen(run, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, text=True)
    listener.stdin.write("LISTEN bench;\nSELECT 1 \\watch 0.05\n")
    listener.stdin.flush()
    if not sql_drainer:
        return [listener]
    drainer = subprocess.Popen(run + ["-c", f"""
        DO $$ DECLARE pos bigint := realtime.create_consumer('bench'); r record;
        deadline timestamptz := clock_timestamp() + interval '{seconds} s';
        BEGIN WHILE clock_timestamp() < deadline LOOP
          FOR r IN SELECT seq FROM realtime.drain('bench', pos, 10000, 200, 2) LOOP pos := r.seq; END LOOP;
        END LOOP; END $$;"""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [listener, drainer]


@contextlib.contextmanager
def supabase_stream(pg, seconds):
    """Supabase's replication connection for one run of (d): a slot made at the current WAL
    position (Supabase's is TEMPORARY, made when its connection starts), pg_recvlogical
    streaming the publication with pgoutput as Supabase's server does, then the slot dropped.
    Live only during (d), so decoding does not burden the other variants. Yields a function
    that returns the WAL bytes the slot has not confirmed yet."""
    pg.psql("-c", "SELECT pg_create_logical_replication_slot('supabase_bench', 'pgoutput')")
    stream = subprocess.Popen(["runuser", "-u", "postgres", "--", "timeout", str(seconds), "pg_recvlogical",
                               *pg.conn, "-d", "postgres", "--slot", "supabase_bench", "--start", "-f", "/dev/null",
                               "-o", "proto_version=2", "-o", "publication_names=supabase_realtime_messages_publication",
                               "-o", "binary=true", "-s", "1", "-F", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield lambda: int(float(pg.psql("-c", "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) "
                                              "FROM pg_replication_slots WHERE slot_name = 'supabase_bench'")))
    finally:
        stream.terminate()
        stream.wait(timeout=30)
        # The walsender may outlive its client for a moment; the slot can be dropped once
        # it is inactive (bounded by statement_timeout).
        pg.psql("-c", "SET statement_timeout = '10s'", "-c", """DO $$ BEGIN
            PERFORM pg_terminate_backend(active_pid) FROM pg_replication_slots
              WHERE slot_name = 'supabase_bench' AND active_pid IS NOT NULL;
            WHILE EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'supabase_bench' AND active) LOOP
              PERFORM pg_sleep(0.01);
            END LOOP;
            PERFORM pg_drop_replication_slot('supabase_bench'); END $$""")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=10, help="length of each pgbench run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default="1,2,8")
    ap.add_argument("--synchronous-commit", default="on", choices=["on", "off"])
    ap.add_argument("--port", type=int, default=24330)
    ap.add_argument("--no-consumers", action="store_true",
                    help="run without any consumer (ours, LISTEN, Centrifugo, replication)")
    ap.add_argument("--drainer", choices=["sidecar", "sql"], default="sidecar",
                    help="what drains our queue: the release sidecar (no subscribers), or a SQL loop "
                         "calling realtime.drain")
    ap.add_argument("--linger-ms", type=int, default=2, help="the draining sidecar's DRAIN_LINGER_MS")
    ap.add_argument("--variants", default=",".join(t for t, _ in VARIANTS),
                    help="the tables to run, comma-separated (t_plain always runs: the ratios are against it)")
    a = ap.parse_args()
    wanted = set(a.variants.split(",")) | {"t_plain"}
    variants = [v for v in VARIANTS if v[0] in wanted]
    clients = [int(c) for c in a.clients.split(",")]
    if a.drainer == "sidecar" and not a.no_consumers:
        harness.build()

    background = []
    with harness.Cluster(a.port, f"synchronous_commit = {a.synchronous_commit}", "max_connections = 50",
                         "shared_buffers = 256MB", "max_wal_size = 4GB", "wal_level = logical",
                         "max_replication_slots = 4", "max_wal_senders = 4") as pg, contextlib.ExitStack() as stack:
        psql = ["psql", *pg.conn, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"]
        try:
            pg.psql("-f", f"{HERE}/trigger_cost_setup.sql")
            total = len(clients) * len(variants) * a.rounds * (a.seconds + 5) + 120
            if not a.no_consumers:
                background = start_consumers(psql, total, sql_drainer=a.drainer == "sql")
                if "t_outbox" in wanted:
                    stack.enter_context(harness.Centrifugo(a.port + 1, pg.dsn, SECRET))
                if a.drainer == "sidecar":
                    # No client subscribes here, and a filtering sidecar would skip every
                    # message at the drain: keep the consumer's whole work (every message
                    # drained and parsed), as a sidecar whose clients listen would do.
                    stack.enter_context(harness.Sidecar(a.port + 2, pg.dsn, "bench", SECRET,
                                                        DRAIN_LINGER_MS=str(a.linger_ms), FILTER_TOPICS="false"))
            results, slot_lag = {}, 0
            for r in range(a.rounds):
                for c in clients:
                    for table, _ in variants:
                        pg.psql("-c", "CHECKPOINT")
                        wal0 = int(pg.psql("-c", "SELECT wal_bytes FROM pg_stat_wal"))
                        cpu0, _ = harness.postgres_usage(f"{pg.dir}/pg/data")
                        with (supabase_stream(pg, a.seconds + 60) if table == "t_supabase" and not a.no_consumers
                              else contextlib.nullcontext(lambda: 0)) as lag_of_slot:
                            out = as_pg(["pgbench", *pg.conn, "-n", "-c", str(c), "-j", str(min(c, 2)),
                                         "-T", str(a.seconds), "-D", f"table={table}",
                                         "-f", f"{HERE}/insert_row.sql", "postgres"])
                            slot_lag = max(slot_lag, lag_of_slot())
                        wal1 = int(pg.psql("-c", "SELECT wal_bytes FROM pg_stat_wal"))
                        cpu1, anon = harness.postgres_usage(f"{pg.dir}/pg/data")
                        tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
                        lat = float(re.search(r"latency average = ([\d.]+) ms", out).group(1))
                        txns = int(re.search(r"actually processed: (\d+)", out).group(1))
                        results.setdefault((c, table), []).append(
                            (tps, lat, (wal1 - wal0) / max(txns, 1), 1e6 * (cpu1 - cpu0) / max(txns, 1), anon))
                        print(f"round {r + 1} clients {c} {table}: {tps:.0f} tps", file=sys.stderr)
            stats = pg.psql("-c", "SELECT messages_enqueued, messages_evicted FROM realtime.stats()").strip()
            lag = pg.psql("-c", "SELECT lost_messages FROM realtime.consumers() WHERE name = 'bench'").strip()
            # What Centrifugo's consumer left behind in its outbox.
            outbox_left = pg.psql("-c", "SELECT count(*) FROM centrifugo_outbox").strip()
        finally:
            for p in background:
                p.kill()

    print(f"Machine: {harness.machine()}; {datetime.date.today()}; PostgreSQL 15, "
          f"synchronous_commit = {a.synchronous_commit}; {a.rounds} rounds x {a.seconds} s, interleaved; "
          f"medians over rounds.\n")
    print("| clients | variant | TPS | vs (a) | latency avg (ms) | WAL bytes / txn | Postgres CPU µs / txn | Postgres private RSS |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for c in clients:
        base = statistics.median(x[0] for x in results[(c, "t_plain")])
        for table, label in variants:
            rs = results[(c, table)]
            tps = statistics.median(x[0] for x in rs)
            print(f"| {c} | {label} | {tps:,.0f} | {tps / base:.2f} | "
                  f"{statistics.median(x[1] for x in rs):.3f} | {statistics.median(x[2] for x in rs):,.0f} | "
                  f"{statistics.median(x[3] for x in rs):,.0f} | {max(x[4] for x in rs) / 1024:,.0f} MB |")
    print(f"\nQueue after the run (messages enqueued | evicted): {stats}; messages the draining consumer lost: {lag}; "
          f"rows left in Centrifugo's outbox: {outbox_left}; most WAL bytes the Supabase slot had not confirmed as a run ended: {slot_lag:,}.")


if __name__ == "__main__":
    main()
