#!/usr/bin/env python3
"""A resume storm: many clients on a few topics, receiving live, drop their sockets at once
and rejoin with `config.broadcast.resume` at positions 1 to 5 s old (as clients coming
back from a network blip would, whose last acknowledged position lags). Measured: how long
until every client is live again (its resume's system message arrived), how many messages
the sidecar resent from the queue's history and how fast, whether any message was lost,
duplicated or out of order, and how many `realtime.history` calls served the storm (one
walk of the ring per batch of joins, not one per client). Beside it, computed from the same
storm's resent counts: what Supabase's replay (at most 25 messages per channel) would have
left out. With --postgres-changes, the same storm for Postgres Changes: each client a member
of its room, subscribed to the INSERTs of its room on pgbench/changes_setup.sql's RLS table
with `resume: {changes: true}`, keeping the positions the sidecar sends after each batch,
and rejoining after one of them; the publisher inserts rows (`--rate` inserts/s in all).
Prints a markdown table (the loadgen's JSON line on stderr). Run as root after
scripts/install-extension.sh; builds the sidecar and the load generator (release)."""

import argparse
import datetime
import json
import sys

import harness

SECRET = "resume-benchmark-secret-with-enough-length"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=10000)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--rate", type=int, default=1000, help="messages/s in all, spread over the topics")
    ap.add_argument("--seconds", type=int, default=20, help="sending window")
    ap.add_argument("--storm-after", type=float, default=10, help="seconds into the window")
    ap.add_argument("--behind-min", type=float, default=1)
    ap.add_argument("--behind-max", type=float, default=5)
    ap.add_argument("--vsn", default="2.0.0")
    ap.add_argument("--postgres-changes", action="store_true",
                    help="the storm of Postgres Changes channels that keep their position")
    ap.add_argument("--pg-port", type=int, default=24364)
    ap.add_argument("--http-port", type=int, default=24365)
    a = ap.parse_args()

    harness.build()
    with harness.Cluster(a.pg_port, "max_connections = 50") as pg:
        changes = []
        if a.postgres_changes:
            pg.psql("-v", f"users={a.clients}", "-v", f"rooms={a.topics}", "-f", f"{harness.HERE}/changes_setup.sql")
            changes = ["--postgres-changes", "--change-positions", "--publisher", "changes"]
        else:
            pg.psql("-c", "CREATE EXTENSION pg_realtime")
        with harness.Sidecar(a.http_port, pg.dsn, "resume", SECRET) as sidecar:
            r = harness.loadgen(f"ws://127.0.0.1:{a.http_port}", pg.dsn, SECRET, "--vsn", a.vsn, *changes,
                                "--clients", a.clients, "--topics", a.topics, "--rate", a.rate,
                                "--seconds", a.seconds, "--storm-after", a.storm_after,
                                "--behind-min", a.behind_min, "--behind-max", a.behind_max,
                                "--source-ip", "127.0.0.2", "--topic-prefix", "storm-",
                                "--label", "resume storm", timeout=a.seconds + 600)
            r["history_calls"] = sidecar.metric("realtime_history_calls_total")
            r["history_requests"] = sidecar.metric("realtime_history_requests_total")
            print(json.dumps(r), file=sys.stderr)
    s = r["storm"]
    per_client_rate = a.rate / a.topics
    what = ("Postgres Changes channels (INSERTs of an RLS table, a filter per room, positions asked for); "
            "latency counts the resent changes too, which carry no mark" if a.postgres_changes else "broadcast")
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; serializer {a.vsn}; sidecar, Postgres and the "
          f"load generator on the same 2 cores; {what}. {a.clients:,} clients on {a.topics} topics (one each), "
          f"{a.rate:,} msg/s in all ({per_client_rate:g}/s per topic, {a.rate * a.clients / a.topics:,.0f} "
          f"deliveries/s live), {a.seconds} s of sending; {a.storm_after:g} s in, every client drops its socket "
          f"and rejoins with the position it had {a.behind_min:g} to {a.behind_max:g} s before.\n")
    c = s["connected_after"]
    print("| clients | rejoined | recovered | not recovered | until all live | live after p50 / p99 | "
          "of which reconnecting p50 / p99 | resent | resent/s | history calls | lost | gaps | duplicates | "
          "live deliveries/s | live p50 / p99 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {r['clients']:,} | {s['rejoined']:,} | {s['recovered']:,} | {s['unrecovered']:,} | "
          f"{s['all_live_seconds']:.2f} s | {s['live_after_p50_ms']:.0f} / {s['live_after_p99_ms']:.0f} ms | "
          f"{c['p50_ms']:.0f} / {c['p99_ms']:.0f} ms | "
          f"{s['resent']:,} | {s['resent_per_second']:,.0f} | {r['history_calls']:.0f} for {r['history_requests']:.0f} joins | "
          f"{r['lost']:,} | {r['gaps']:,} | {r['reordered']:,} | {r['deliveries_per_second']:,.0f} | "
          f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms |")
    if a.postgres_changes:
        print("\nSupabase for the same storm: every change committed while a client was away is lost, and none "
              "is told.")
        return
    print(f"\nSupabase's replay for the same storm (computed from the resent counts above, not run: its replay "
          f"returns at most 25 messages per channel, private channels only): {s['clients_supabase_replay_would_short']:,} "
          f"of {s['rejoined']:,} clients would miss messages, {s['supabase_replay_would_leave_out']:,} messages in all, "
          f"and none would be told.")


if __name__ == "__main__":
    main()
