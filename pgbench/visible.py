#!/usr/bin/env python3
"""Postgres Changes' RLS check, the database side alone: (subscriber, changed row) answers per
second of the batched `realtime.visible` (one call: 1,000 distinct users x 100 changed rows,
one query per user; one client, as the sidecar's authorizer uses one connection; asked every
pair, then only the 10,000 pairs a room filter lets through) against
Supabase's algorithm (one primary-key lookup under the subscriber's role and claims per
subscriber per change) driven by pgbench with 8 clients; same table, policy (room membership
through auth.uid()), cluster and run. Prints a markdown table. Run as root after
scripts/install-extension.sh."""

import argparse
import datetime
import re

import harness
from harness import HERE, as_pg

PAIRS_PER_CALL = 1000 * 100


def pgbench(pg, clients, seconds, script):
    out = as_pg(["pgbench", *pg.conn, "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds),
                 "-f", f"{HERE}/{script}", "postgres"])
    return (float(re.search(r"tps = ([\d.]+)", out).group(1)),
            float(re.search(r"latency average = ([\d.]+) ms", out).group(1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--port", type=int, default=24380)
    ap.add_argument("--check-users", type=int, default=1000,
                    help="users whose answers for every row are compared between the two methods first")
    a = ap.parse_args()
    with harness.Cluster(a.port, "max_connections = 50") as pg:
        pg.psql("-f", f"{HERE}/visible_setup.sql")
        # Both methods must agree before either is timed.
        differ = pg.psql("-c", """
            SELECT count(*) FROM vis_batch b, generate_series(1, %d) u, generate_series(1, 100) i
            WHERE supabase_visible(md5(u::text)::uuid, i) IS DISTINCT FROM EXISTS (
                SELECT 1 FROM realtime.visible('vis_messages', b.roles[u:u], b.claims[u:u], b.records[i:i]))""" % a.check_users)
        visible = pg.psql("-c", "SELECT count(*) FROM vis_batch b, realtime.visible('vis_messages', b.roles, "
                                "b.claims, b.records) v")
        batched = pgbench(pg, 1, a.seconds, "visible_batched.sql")
        asked = pgbench(pg, 1, a.seconds, "visible_asked.sql")
        probe = pgbench(pg, 8, a.seconds, "visible_probe.sql")
    rows = [("batched realtime.visible, 1,000 identities x 100 rows per call", 1, batched[0] * PAIRS_PER_CALL,
             batched[1]),
            ("batched realtime.visible, asked only each user's room's 10 rows (10,000 pairs per call)", 1,
             asked[0] * PAIRS_PER_CALL / 10, asked[1]),
            ("Supabase's algorithm, one lookup per subscriber per change", 8, probe[0], probe[1])]
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; PostgreSQL 15; {a.seconds} s per row; "
          f"{visible.strip()} of the {PAIRS_PER_CALL:,} pairs visible; answers that differ between the two "
          f"methods ({a.check_users * 100:,} pairs compared): {differ.strip()}.\n")
    print("| method | clients | (subscriber, row) answers/s | vs Supabase's | latency per call (ms) |")
    print("|---|---:|---:|---:|---:|")
    for label, clients, per_s, lat in rows:
        print(f"| {label} | {clients} | {per_s:,.0f} | {per_s / rows[-1][2]:.1f}x | {lat:.3f} |")


if __name__ == "__main__":
    main()
