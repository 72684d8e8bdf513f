#!/usr/bin/env python3
"""The soak: a thousand ordinary subscribers beside twenty-six attackers, against the same run
without the attackers, on one throwaway cluster and one sidecar with its default limits.

Ordinary (each group from its own loopback address, so none is near a per-address limit):
  broadcast   600 clients on 20 topics, the database sending 200 msg/s (realtime.send)
  changes     300 clients on 30 rooms of an RLS table, 30 inserts/s, Postgres Changes with
              a filter, as role authenticated
  presence    100 members of one room (10 observing) filling, then 20 churners toggling
Attackers (pgbench/loadgen/src/bin/attackers.rs; each from its own address, at fixed
rates, anonymous except the bulk writer and the persisting user): NUL in a binding's table
and schema, never-matching bindings by the thousand, a join naming 17,000 tables, a 200 KB
presence key, a presence flood, NUL events over WebSocket and REST, invalid JSON in 2.0.0
binary pushes, REST floods of 18,000 messages a request (a full 1 MB body), resumes from seq 0 of a 20 MB
history never read, a slow reader on the busiest topic, 100 KB join_refs, a connection hog,
a 10,000-row insert under a 2 ms-a-row policy every 15 s, a user persisting 200 1 KB
messages a second on a new topic every 500, a connection rejoining 150 channels a second, a socket a second asking
for 1,600 `like` patterns in one join and then the most a connection may hold, held long
enough that its address passes MAX_PATTERNS_PER_ADDRESS, a socket every two seconds resuming
200 messages of 100 KB from seq 0 and reading nothing for ten seconds, 20 UPDATEs a
second of a cheap column of a row whose 100 KB value compresses well, watched by a channel,
and at the largest sizes (MAX_FRAME_SIZE 5 MB, realtime.max_message_size 3,000 KB): eight
sockets sending 5 MB frames at 256 KB/s, 3,000 KB broadcasts ten a second to a topic a socket of
the same address never reads, and REST bodies of one 3,000 KB message four at a time.

With --attackers-apart, a third run sends the same attackers to a second sidecar on the
same database: the ordinary groups' sidecar serves none of them, so what is left of their
cost to the ordinary groups is the machine's (the 2 cores, Postgres, the queue): the floor
under any change to the sidecar.

Measured per run: each ordinary group's commit-to-receive p50/p99 and what it lost (for
presence: push-to-diff at the observers and what they never saw), the sidecar's peak RSS
and CPU, Postgres's CPU, and the load generators' CPU (ordinary and attackers apart).
Prints markdown (the JSON lines on stderr). Run as root after scripts/install-extension.sh;
builds the sidecar and the load generators (release)."""

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import threading
import time

import harness
from harness import HERE

SECRET = "soak-benchmark-secret-with-enough-length-for-hs256"
ATTACKERS = f"{harness.ROOT}/target/release/attackers"
PRESENCE_LOAD = f"{harness.ROOT}/target/release/presence-load"


def run_all(commands, timeout):
    """Runs the commands at once; returns (last stdout line parsed, CPU seconds) of each."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in commands]
    results = [None] * len(procs)

    def collect(i, p):
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        results[i] = (out, usage.ru_utime + usage.ru_stime)

    threads = [threading.Thread(target=collect, args=(i, p)) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    deadline = time.time() + timeout
    for t in threads:
        t.join(max(1, deadline - time.time()))
    for p in procs:
        if p.returncode is None:
            p.kill()
    out = []
    for (text, cpu), p, c in zip(results, procs, commands):
        if p.returncode != 0:
            raise RuntimeError(f"{c[0]} failed ({p.returncode})")
        out.append((json.loads(text.strip().splitlines()[-1]), cpu))
    return out


def one_run(a, pg, epoch, attackers, apart=False):
    label = ("with the attackers on a sidecar of their own" if apart
             else "with the attackers" if attackers else "without attackers")
    url = f"ws://127.0.0.1:{a.http_port}"
    # The defaults, stated: the ordinary groups each come from one address.
    env = {"MAX_CONNECTIONS_PER_ADDRESS": "1000", "MAX_PRESENCE_EVENTS_PER_SECOND_PER_ADDRESS": "1000",
           "MAX_BINDINGS_PER_ADDRESS": "10000", "MAX_RESUMES_PER_ADDRESS": "100",
           "MAX_RESUMES_WAITING_PER_ADDRESS": "1000"}
    with contextlib.ExitStack() as stack:
        sidecar = stack.enter_context(harness.Sidecar(a.http_port, pg.dsn, f"soak_{int(attackers)}", SECRET, **env))
        pid = sidecar.process.pid
        if a.pin:
            subprocess.run(["taskset", "-a", "-pc", "0", str(pid)], check=True, stdout=subprocess.DEVNULL)
        # --attackers-apart: the floor under any sidecar. The attackers reach the same
        # database and queue through a second sidecar, so the ordinary subscribers' sidecar
        # serves none of their connections; what they still cost the ordinary groups is the
        # machine's (shared cores, Postgres, the queue), which no change to the sidecar moves.
        attackers_port = a.http_port
        if apart:
            aside = stack.enter_context(harness.Sidecar(a.http_port + 2, pg.dsn, "soak_apart", SECRET, **env))
            attackers_port = a.http_port + 2
            if a.pin:
                subprocess.run(["taskset", "-a", "-pc", "1", str(aside.process.pid)], check=True,
                               stdout=subprocess.DEVNULL)
        commands = [
            harness.loadgen_cmd(url, pg.dsn, SECRET, "--clients", 600, "--topics", 20, "--topic-prefix", "bench-",
                                "--publisher", "send", "--rate", 200, "--seconds", a.seconds, "--vsn", "2.0.0",
                                "--source-ip", "127.0.0.50", "--label", "broadcast"),
            harness.loadgen_cmd(url, pg.dsn, SECRET, "--clients", 300, "--topics", 30, "--publisher", "changes",
                                "--postgres-changes", "--rate", 30, "--seconds", a.seconds, "--vsn", "2.0.0",
                                "--source-ip", "127.0.0.51", "--label", "changes"),
            [PRESENCE_LOAD, "--urls", url, "--jwt-secret", SECRET, "--topic", f"soak-room-{int(attackers)}",
             "--members", "100", "--observers", "10", "--fill-seconds", "2", "--churners", "20",
             "--churn-rate", "20", "--churn-seconds", str(max(a.seconds - 5, 1)), "--pids", str(pid),
             "--source-ips", "127.0.0.52"],
        ]
        if attackers:
            commands.append([ATTACKERS, "--port", str(attackers_port), "--jwt-secret", SECRET, "--dsn", pg.dsn,
                             "--seconds", str(a.seconds), "--epoch", str(epoch), "--busy-topic", "bench-0",
                             *(["--skip", a.skip_attackers] if a.skip_attackers else []),
                             *(["--only", a.only_attackers] if a.only_attackers else [])])
        if a.pin:
            # Every load generator, the attackers' included, off the sidecar's core: what
            # is left of the attackers' cost is the sidecar's own and Postgres's.
            commands = [["taskset", "-c", "1", *c] for c in commands]
        with harness.Usage([pid], f"{pg.dir}/pg/data") as u:
            cpu0 = harness.proc_stats(aside.process.pid)[0] if apart else 0
            results = run_all(commands, timeout=a.seconds + 300)
            if apart:
                r_apart = harness.proc_stats(aside.process.pid)[0] - cpu0
    r = {"label": label, **u.result}
    (b, b_cpu), (c, c_cpu), (p, p_cpu) = results[:3]
    r.update(broadcast=b, changes=c, presence=p, ordinary_loadgen_cpu_s=b_cpu + c_cpu + p_cpu)
    if attackers:
        r["attackers"], r["attackers_cpu_s"] = results[3][0]["attackers"], results[3][1]
    if apart:
        r["attackers_sidecar_cpu_s"] = r_apart
    print(json.dumps(r), file=sys.stderr)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--skip-attackers", default="", help="attackers to leave out, by name (comma-separated)")
    ap.add_argument("--only-attackers", default="", help="only these attackers, by name (comma-separated)")
    ap.add_argument("--pin", action="store_true",
                    help="the sidecar on CPU 0, every load generator on CPU 1, Postgres on either")
    ap.add_argument("--attackers-apart", nargs="?", const="after", choices=["after", "before"],
                    help="a third run with the attackers on a second sidecar (pinned with the load generators "
                         "under --pin), after the run with them on ours or before it: what they cost the "
                         "ordinary groups through the machine alone")
    ap.add_argument("--pg-port", type=int, default=24396)
    ap.add_argument("--http-port", type=int, default=24397)
    a = ap.parse_args()

    harness.build()
    with harness.Cluster(a.pg_port, "max_connections = 100", "realtime.queue_size = 128MB",
                         "realtime.max_consumers = 8") as pg:
        pg.psql("-v", "users=300", "-v", "rooms=30", "-f", f"{HERE}/changes_setup.sql")
        pg.psql("-f", f"{HERE}/soak_setup.sql")
        epoch = int(pg.psql("-c", "SELECT (extract(epoch FROM epoch) * 1000000)::int8 FROM realtime.stats()").strip())
        # The runs share one cluster (what the attackers persisted stays), so the apart run
        # can go before the run with the attackers on ours, to show the order does not decide.
        kinds = [(False, False), (True, False)] + ([(True, True)] if a.attackers_apart else [])
        if a.attackers_apart == "before":
            kinds[1], kinds[2] = kinds[2], kinds[1]
        by_kind = {k: one_run(a, pg, epoch, *k) for k in kinds}
        runs = [by_kind[k] for k in sorted(by_kind)]
        ran = ", ".join(by_kind[k]["label"] for k in kinds)

    where = ("the sidecar pinned to CPU 0, every load generator (the attackers' too) to CPU 1, Postgres on either"
             if a.pin else "sidecar, Postgres and every load generator on the same 2 cores")
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; {a.seconds} s a run, one after the other on one "
          f"cluster ({ran}); one sidecar with its default limits; {where}.\n")
    print("| run | broadcast p50 / p99 ms | lost | changes p50 / p99 ms | lost | presence p50 / p99 ms | unseen | "
          "sidecar peak RSS | sidecar CPU | Postgres CPU | ordinary load gen. CPU | attackers' CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        b, c, churn = r["broadcast"], r["changes"], r["presence"].get("churn") or {}
        each = churn.get("each_observer", {})
        print(f"| {r['label']} | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} | {b['lost']:,} | "
              f"{c['p50_ms']:.1f} / {c['p99_ms']:.1f} | {c['lost']:,} | "
              f"{each.get('p50_ms', float('nan')):.1f} / {each.get('p99_ms', float('nan')):.1f} | "
              f"{churn.get('unseen', 'n/a')} | {r['server_peak_rss_mb']:.0f} MB | {r['server_cpu_pct']:.0f}% | "
              f"{r['pg_cpu_pct']:.0f}% | {r['ordinary_loadgen_cpu_s']:.1f} s | "
              f"{r.get('attackers_cpu_s', 0):.1f} s"
              + (f" (their sidecar {r['attackers_sidecar_cpu_s']:.1f} s)" if "attackers_sidecar_cpu_s" in r else "")
              + " |")
    base, hit = runs[:2]
    print()
    for run in runs[1:]:
        ratio = lambda k: run[k]["p99_ms"] / max(base[k]["p99_ms"], 1e-9)
        print(f"p99 {run['label']} against without: broadcast {ratio('broadcast'):.2f}x, "
              f"Postgres Changes {ratio('changes'):.2f}x.")
    print()
    print("| attacker | address | sent | accepted | refused (reason: count) | connect failures |")
    print("|---|---|---:|---:|---|---:|")
    for t in hit["attackers"]:
        refused = "; ".join(f"{k}: {v:,}" for k, v in sorted(t["refused"].items(), key=lambda kv: -kv[1])[:4])
        print(f"| {t['attacker']} | {t['address']} | {t['sent']:,} | {t['accepted']:,} | {refused or '-'} | "
              f"{t['connect_failures']:,} |")


if __name__ == "__main__":
    main()
