#!/usr/bin/env python3
"""Presence at scale, across two sidecar processes (each with its own consumer slot and
presence session), with the load generator's presence mode (`presence-load`):

1. A room fills: N members (default 10,000) track over a few seconds, alternating between
   the two sidecars; 100 of them observe (presence enabled). Measured: when every observer's
   view holds every member, whether all views are the same (keys and refs), the presence
   frames the observers received, tracks/s. Run at two speeds (the goal's, and one step
   faster), then once more with the observers on a third sidecar, whose memory growth is the
   view's (bytes per member), and the database's bytes per member row.
2. Churn: in a room of 5,000, 1,000 more clients toggle (500 joins and 500 leaves a
   second: 1,000 joins and leaves), then one step larger (2,000 a second), then in a room of
   1,000, with 100 observers. Measured: from each track or untrack to the diff showing it at
   each observer, and at the last of them.

Beside them, Supabase's published limits (not run: Supabase cannot run here). Prints
markdown (the generator's JSON lines on stderr). Run as root after
scripts/install-extension.sh; builds the sidecar and the load generator (release)."""

import argparse
import datetime
import json
import re
import subprocess
import sys
import urllib.request

import harness

SECRET = "presence-benchmark-secret-with-enough-length"
PRESENCE_LOAD = f"{harness.ROOT}/target/release/presence-load"


def commit_to_dispatch(port):
    """A sidecar's commit-to-dispatch p50 and p99 (ms) over the last minute: how long drained
    messages, presence diffs included, took from their commit to the sidecar's hands."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    q = lambda x: float(re.search(rf'^realtime_commit_to_dispatch_seconds\{{quantile="{x}"\}} (\S+)$', body,
                                  re.M).group(1)) * 1000
    return q("0.5"), q("0.99")


def run(ports, pids, topic, observer_port=None, **flags):
    cmd = [PRESENCE_LOAD, "--urls", ",".join(f"ws://127.0.0.1:{p}" for p in ports), "--jwt-secret", SECRET,
           "--topic", topic, "--pids", ",".join(map(str, pids)), "--source-ips", "127.0.0.2,127.0.0.3"]
    if observer_port:
        cmd += ["--observer-urls", f"ws://127.0.0.1:{observer_port}"]
    for k, v in flags.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, timeout=900).stdout
    r = json.loads(out.strip().splitlines()[-1])
    print(json.dumps(r), file=sys.stderr)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--members", type=int, default=10000)
    ap.add_argument("--observers", type=int, default=100)
    ap.add_argument("--fill-seconds", type=float, nargs="+", default=[10, 2])
    ap.add_argument("--churn", nargs="+", default=["5000:1000:1000", "5000:2000:2000", "1000:1000:1000"],
                    help="ROOM:CHURNERS:TOGGLES_PER_SECOND runs (toggles: half joins, half leaves)")
    ap.add_argument("--churn-seconds", type=float, default=10)
    ap.add_argument("--window-ms", type=int, default=None, help="PRESENCE_WINDOW_MS of the sidecars (default theirs)")
    ap.add_argument("--pg-port", type=int, default=24366)
    ap.add_argument("--http-ports", type=int, nargs=3, default=[24367, 24368, 24369])
    a = ap.parse_args()

    harness.build()
    env = {"PRESENCE_WINDOW_MS": str(a.window_ms)} if a.window_ms else {}
    fills, churns = [], []
    with harness.Cluster(a.pg_port, "max_connections = 60") as pg:
        pg.psql("-c", "CREATE EXTENSION pg_realtime")
        with harness.Sidecar(a.http_ports[0], pg.dsn, "presence_a", SECRET, **env) as one, \
                harness.Sidecar(a.http_ports[1], pg.dsn, "presence_b", SECRET, **env) as two, \
                harness.Sidecar(a.http_ports[2], pg.dsn, "presence_views", SECRET, **env) as views:
            ports, pids = a.http_ports[:2], [one.process.pid, two.process.pid]
            for i, seconds in enumerate(a.fill_seconds):
                r = run(ports, pids, f"fill-{i}", members=a.members, observers=a.observers, fill_seconds=seconds)
                fills.append(r)
            # The same fill with the observers on a third sidecar, which holds the room's view
            # but no tracking member: its memory growth is the view's (and its 100 watchers').
            memory = run(ports, [views.process.pid], "fill-views", observer_port=a.http_ports[2],
                         members=a.members, observers=a.observers, fill_seconds=a.fill_seconds[0])
            db_bytes = int(pg.psql("-c", "SELECT pg_total_relation_size('realtime.presences')"))
            db_rows = int(pg.psql("-c", "SELECT count(*) FROM realtime.presences"))
            for i, spec in enumerate(a.churn):
                room, churners, rate = (float(x) for x in spec.split(":"))
                r = run(ports, pids, f"churn-{i}", members=int(room), observers=a.observers, fill_seconds=5,
                        churners=int(churners), churn_rate=rate, churn_seconds=a.churn_seconds)
                r["commit_to_dispatch"] = [commit_to_dispatch(p) for p in ports]
                churns.append(r)
            batches = sum(x.metric("realtime_presence_write_batches_total") for x in (one, two, views))
            writes = sum(x.metric("realtime_presence_writes_total") for x in (one, two, views))
            lost = sum(x.metric("realtime_presence_sessions_lost_total") for x in (one, two, views))

    print(f"Machine: {harness.machine()}; {datetime.date.today()}; serializer 2.0.0; Postgres, the sidecars and "
          f"the load generator on the same 2 cores; members alternate between two sidecar processes; diffs "
          f"coalesced every {a.window_ms or 20} ms (PRESENCE_WINDOW_MS). A track enables presence on its channel (as in "
          f"Supabase), so every member receives the room's state and diffs: a room of N costs N²/2 member "
          f"entries however they are framed. The observers' views are the ones checked.\n")
    print("| members | observers | tracks over | tracks/s | every observer complete, after the first track | "
          "after the last track | same view everywhere | frames/s per observer | errors |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in fills:
        f = r["fill"]
        same = "yes" if f["same_everywhere"] and f["keys_seen"] == r["members"] else "NO"
        done = f"{f['complete_after_seconds']:.2f} s" if f["all_complete"] else "not within 120 s"
        print(f"| {r['members']:,} | {r['observers']} | {f['sent_seconds']:.1f} s | {f['tracks_per_second']:,.0f} | "
              f"{done} | {f['after_last_track_ms']:,.0f} ms | {same} ({f['keys_seen']:,} keys) | "
              f"{f['observer_frames_per_second'] / r['observers']:,.1f} | {r['errors']} |")
    f = memory["fill"]
    grown = (sum(f["rss_kb_settled"]) - sum(f["rss_kb_before"])) * 1024
    print(f"\nMemory: a sidecar holding the {memory['members']:,}-member room's view for its {memory['observers']} "
          f"observers grew by {grown / memory['members']:,.0f} bytes per member (resident, 2 s after the fill; "
          f"{'complete' if f['all_complete'] else 'INCOMPLETE'}, same view everywhere: "
          f"{'yes' if f['same_everywhere'] else 'NO'}). The database holds {db_bytes / max(db_rows, 1):,.0f} bytes "
          f"per member row (table and indexes, {db_rows:,} rows: members and tombstones of every run so far). "
          f"The sidecars whose members track also send each of them the room's state once, and every diff: "
          f"their memory grows with the frames waiting in the sockets, not with the view.\n")
    print("| room | churners | toggles/s | toggles seen by every observer | push to diff, each observer p50 / p99 "
          "| at the last observer p50 / p99 / max | frames/s to the observers | sidecars' commit to dispatch "
          "p50 / p99 (last minute) | errors |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in churns:
        c = r["churn"]
        e, v = c["each_observer"], c["every_observer"]
        print(f"| {r['members']:,} | {r['churners']:,} | "
              f"{c['toggles_per_second']:,.0f} | {c['toggles'] - c['unseen']:,} of {c['toggles']:,} | "
              f"{e['p50_ms']:,.1f} / {e['p99_ms']:,.1f} ms | {v['p50_ms']:,.1f} / {v['p99_ms']:,.1f} / "
              f"{v['max_ms']:,.1f} ms | {c['observer_frames_per_second']:,.0f} | "
              f"{' and '.join(f'{a:.0f} / {b:.0f} ms' for a, b in r['commit_to_dispatch'])} | {r['errors']} |")
    print(f"\nDatabase writes: {writes:,.0f} tracks and untracks in {batches:,.0f} statements "
          f"({writes / max(batches, 1):.1f} per statement); presence sessions lost by the sidecars over "
          f"all runs: {lost:.0f}.")
    print("\nSupabase's published limits (not run: it cannot run here): presence messages 1,000/s per project at "
          "most (20 / 50 / 1,000 by plan), 5 presence calls per 30 s per client, Phoenix.Tracker's state sync "
          "every 1.5 s, a dead node's members present for about 30 s.")


if __name__ == "__main__":
    main()
