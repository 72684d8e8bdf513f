#!/usr/bin/env python3
"""Authorization throughput: verdicts per second of the batched `realtime.authorize` at batch
sizes 1, 100, 1,000 and 10,000 (one client, as the sidecar's authorizer uses one
connection), against Supabase's per-join probe transaction driven by pgbench with 8
clients; same policy set (membership table of 100,000 rows), same cluster, same run. Prints a
markdown table. Run as root after scripts/install-extension.sh."""

import argparse
import datetime
import re
import statistics

import harness
from harness import HERE, as_pg


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--batches", default="1,100,1000,10000")
    ap.add_argument("--port", type=int, default=24370)
    ap.add_argument("--delivery-trigger", type=int, metavar="ROUNDS", default=0,
                    help="instead: the batched calls with the delivery trigger of realtime.messages "
                         "(extension/src/inserted.rs) on and off, in turn for ROUNDS rounds")
    a = ap.parse_args()
    if a.delivery_trigger:
        return delivery_trigger(a)
    rows = []
    with harness.Cluster(a.port, "max_connections = 50") as pg:
        pg.psql("-f", f"{HERE}/authorize_setup.sql")
        sizes = [int(x) for x in a.batches.split(",")]
        for n, generate in [(n, 0) for n in sizes] + [(sizes[-1], 1)]:
            pg.psql("-c", f"SELECT bench_make_batches({n})")
            out = as_pg(["pgbench", *pg.conn, "-n", "-c", "1", "-T", str(a.seconds), "-D", f"n={n}",
                         "-D", f"generate={generate}", "-f", f"{HERE}/authorize_batched.sql", "postgres"])
            tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
            lat = float(re.search(r"latency average = ([\d.]+) ms", out).group(1))
            made = ", requests made inside the timed call (the earlier method)" if generate else ""
            rows.append((f"batched realtime.authorize, batch {n:,}{made}", 1, tps * n, lat))
        out = as_pg(["pgbench", *pg.conn, "-n", "-c", "8", "-j", "2", "-T", str(a.seconds),
                     "-f", f"{HERE}/authorize_probe.sql", "postgres"])
        tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
        lat = float(re.search(r"latency average = ([\d.]+) ms", out).group(1))
        rows.append(("Supabase's probe, one transaction per verdict", 8, tps, lat))
    base = rows[-1][2]
    # The probe's own inputs are drawn by pgbench (\set) and cost it about 1 µs of a
    # millisecond-long transaction; ours are prepared before the run (bench_make_batches).
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; PostgreSQL 15; "
          f"{a.seconds} s per row; read verdicts, about half allowed.\n")
    print("| method | clients | verdicts/s | vs probe | latency per call (ms) |")
    print("|---|---:|---:|---:|---:|")
    for label, clients, vps, lat in rows:
        print(f"| {label} | {clients} | {vps:,.0f} | {vps / base:.1f}x | {lat:.3f} |")


def batched(pg, n, seconds):
    """Verdicts per second of `seconds` of batched calls of n requests."""
    pg.psql("-c", f"SELECT bench_make_batches({n})")
    out = as_pg(["pgbench", *pg.conn, "-n", "-c", "1", "-T", str(seconds), "-D", f"n={n}",
                 "-D", "generate=0", "-f", f"{HERE}/authorize_batched.sql", "postgres"])
    return float(re.search(r"tps = ([\d.]+)", out).group(1)) * n


def delivery_trigger(a):
    """The read probes' rows have no event, so the delivery trigger's WHEN clause leaves them
    out before any function runs: what remains is that clause, per probe row. Measured as the
    batched calls with the trigger on and off (ALTER TABLE ... DISABLE TRIGGER), in turn."""
    sizes = [int(x) for x in a.batches.split(",")]
    vps = {(n, on): [] for n in sizes for on in (True, False)}
    with harness.Cluster(a.port, "max_connections = 50") as pg:
        pg.psql("-f", f"{HERE}/authorize_setup.sql")
        trigger = pg.psql("-c", "SELECT tgname FROM pg_trigger WHERE tgrelid = 'realtime.messages'::regclass "
                                "AND tgfoid = 'realtime.deliver_inserted()'::regprocedure").strip()
        assert trigger, "no delivery trigger on realtime.messages"
        for _ in range(a.delivery_trigger):
            for on in (True, False):
                pg.psql("-c", f"ALTER TABLE realtime.messages {'ENABLE' if on else 'DISABLE'} TRIGGER {trigger}")
                for n in sizes:
                    vps[(n, on)].append(batched(pg, n, a.seconds))
        pg.psql("-c", f"ALTER TABLE realtime.messages ENABLE TRIGGER {trigger}")
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; PostgreSQL 15; "
          f"{a.seconds} s per call size and state, {a.delivery_trigger} rounds in turn; read verdicts.\n")
    print("| batch | verdicts/s, trigger on (rounds) | verdicts/s, trigger off (rounds) | on / off (median) |")
    print("|---:|---|---|---:|")
    for n in sizes:
        on, off = vps[(n, True)], vps[(n, False)]
        print(f"| {n:,} | {' · '.join(f'{x:,.0f}' for x in on)} | {' · '.join(f'{x:,.0f}' for x in off)} "
              f"| {statistics.median(on) / statistics.median(off):.3f} |")


if __name__ == "__main__":
    main()
