#!/usr/bin/env python3
"""Where the CPU goes in the workloads whose goals are missed: `perf record -e cpu-clock -a`
(this VM has no hardware counters) over the whole machine while one workload runs, then
the top symbols by process and library. Benchmarks measure; this explains.
  trigger  pgbench inserting through one trigger-cost variant (and plain INSERT, for the
           difference), with the queue's consumer draining as in trigger_cost.py
  fanout   1,000 subscribers of one topic at a given message rate through the sidecar
  kafkorama  --subscribers clients on --topics topics, each sent once a second (routed.py's
           shape, one sidecar)
  joins    private joins through the sidecar (RLS authorization)
  authorize  one client calling realtime.authorize with batches of 10,000 random requests
  drain    no perf: the time realtime.drain takes per message, in SQL (100,000 messages of
           broadcast_changes' size queued, drained 10,000 at a time)
  consumers  no perf: what the queue's consumers (the drain backend, the sidecar) cost per
           message and per drain call, and how often they are switched out, while pgbench
           clients insert through a trigger-cost variant; one run per --lingers value
Run as root after scripts/install-extension.sh (and scripts/install-peers.sh for trigger)."""

import argparse
import contextlib
import json
import os
import re
import subprocess
import tempfile
import time

import harness
from harness import HERE

SECRET = "profile-benchmark-secret-with-enough-length"


def samples(data):
    """Samples per (process, library, symbol) in a perf.data file."""
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--stdio", "-n", "--sort", "comm,dso,sym",
                          "--percent-limit", "0", "-g", "none"], capture_output=True, text=True).stdout
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].endswith("%") and parts[1].isdigit():
            counts[" ".join(parts[2:])] = int(parts[1])
    return counts


def inclusive(data):
    """Samples per (process, symbol) including callees' (perf's children view)."""
    out = subprocess.run(["perf", "report", "-i", data, "--children", "--stdio", "-n", "--sort", "comm,sym", "-g",
                          "none", "--percent-limit", "0.05"], capture_output=True, text=True).stdout
    total = sum(samples(data).values())
    shares = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].endswith("%") and parts[1].endswith("%"):
            shares[" ".join(parts[3:])] = float(parts[0][:-1]) * total / 100
    return shares


def perf(seconds, label, during, keep=False, callgraph=False, comms="postgres", callers=None):
    """Samples the whole machine for `seconds` while `during()` runs; prints the top.
    Returns the samples per symbol when `keep`. With `callgraph`, also prints each
    function's inclusive share in the backends (itself and what it calls), unwound from
    .eh_frame since Debian's Postgres keeps no frame pointers."""
    scratch = tempfile.TemporaryDirectory()
    data = f"{scratch.name}/perf.data"
    graph = ["--call-graph", "dwarf,8192"] if callgraph else []
    rec = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "999", *graph, "-a", "-o", data, "--",
                            "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    during()
    rec.wait(timeout=seconds + 120)
    def report(*args):
        out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--stdio", "-g", "none", *args],
                             capture_output=True, text=True).stdout
        return "\n".join(l for l in out.splitlines() if l.strip() and not l.startswith("#"))
    print(f"\n### {label}\n\nBy process and library:\n```")
    print(report("--sort", "comm,dso", "--percent-limit", "1"))
    print("```\nTop symbols:\n```")
    print(report("--sort", "comm,dso,sym", "--percent-limit", "0.7"))
    print("```\nOur code (pg_realtime.so and the sidecar), symbols over 0.1%:\n```")
    print(report("--sort", "comm,dso,sym", "--percent-limit", "0.1", "--dsos", "pg_realtime.so,realtime-sidecar"))
    print("```")
    if callgraph:
        print(f"Inclusive share in {comms} (a function and its callees), over 1%:\n```")
        print(report("--children", "--comm", comms, "--sort", "dso,sym", "--percent-limit", "1"))
        print("```")
    if callgraph and callers:
        # Who calls `callers`: for each sample whose stack holds it, the three frames above
        # it, counted (the samples' share of all in this run).
        script = subprocess.run(["perf", "script", "-i", data, "--comm", comms, "-F", "comm,ip,sym"],
                                capture_output=True, text=True).stdout
        chains, total, stack = {}, 0, []
        for line in script.splitlines() + [""]:
            if line.strip():
                # "<address> <symbol>[ (inlined)]", after the sample's "<comm>" line.
                parts = line.strip().split(None, 1)
                stack.append(parts[-1].replace(" (inlined)", ""))
                continue
            if stack:
                total += 1
                hit = next((i for i, f in enumerate(stack) if callers in f), None)
                if hit is not None:
                    key = " <- ".join(stack[hit:hit + 4])
                    chains[key] = chains.get(key, 0) + 1
            stack = []
        print(f"Callers of {callers} (share of this process set's samples):\n```")
        for key, n in sorted(chains.items(), key=lambda kv: -kv[1])[:10]:
            print(f"{100 * n / max(total, 1):6.2f}%  {key}")
        print("```")
    counts = samples(data) if keep else None
    if keep and callgraph:
        counts = (counts, inclusive(data))
    scratch.cleanup()
    return counts


def growth(base, var):
    """Each key's growth from `base` to `var` (samples per unit of work), largest first."""
    return sorted(((var.get(k, 0) - base.get(k, 0), k) for k in set(base) | set(var)), reverse=True)


def print_growth(base, var, title):
    """The symbols whose samples per unit of work grew most from `base` to `var`, idle
    excluded, and the growth by process."""
    grew = growth(base, var)
    busy = [sum(v for k, v in d.items() if not k.startswith("swapper")) for d in (var, base)]
    print(f"\n### {title}\n")
    print(f"Total: {1000 * sum(var.values()):.1f} vs {1000 * sum(base.values()):.1f}; busy (idle, swapper, "
          f"excluded): {1000 * busy[0]:.1f} vs {1000 * busy[1]:.1f}; idle excluded below.\n\n```")
    for d, k in [g for g in grew if not g[1].startswith("swapper")][:30]:
        print(f"{1000 * d:+8.2f}  {k}")
    print("```")
    by_comm = {}
    for d, k in grew:
        by_comm[k.split()[0]] = by_comm.get(k.split()[0], 0) + d
    print("By process: " + ", ".join(f"{c} {1000 * d:+.2f}" for c, d in sorted(by_comm.items(), key=lambda kv: kv[1])
                                     if abs(d) * 1000 >= 0.05))


def drain_backend(pg, seconds=15):
    """The pid of the backend running the sidecar's realtime.drain (bounded wait for its first call)."""
    query = "SELECT pid FROM pg_stat_activity WHERE query LIKE '%realtime.drain%' AND pid <> pg_backend_pid()"
    deadline = time.monotonic() + seconds
    while not (found := pg.psql("-c", query).split()):
        assert time.monotonic() < deadline, "the sidecar's drain never started"
        time.sleep(0.1)
    return int(found[0])


def insert_rows(pg, clients, seconds, table):
    """pgbench inserting one row per transaction into a trigger-cost table; its output."""
    return harness.as_pg(["pgbench", *pg.conn, "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T",
                          str(seconds), "-D", f"table={table}", "-f", f"{HERE}/insert_row.sql", "postgres"])


def trigger(a):
    import trigger_cost
    extra = [f"realtime.queue_size = {a.queue_size}"] if a.queue_size else []
    with harness.Cluster(a.pg_port, "max_connections = 50", "shared_buffers = 256MB", "max_wal_size = 4GB",
                         "wal_level = logical", *extra) as pg:
        pg.psql("-f", f"{HERE}/trigger_cost_setup.sql")
        psql = ["psql", *pg.conn, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"]
        background = trigger_cost.start_consumers(psql, 4 * a.seconds + 60, sql_drainer=a.drainer == "sql")
        stack = contextlib.ExitStack()
        try:
            consumers = {}
            if a.drainer == "sidecar":
                # Unfiltered, as in trigger_cost.py: no client subscribes here.
                sidecar = stack.enter_context(harness.Sidecar(a.http_port, pg.dsn, "bench", SECRET, DRAIN_LINGER_MS="2",
                                                              FILTER_TOPICS="false"))
                consumers["sidecar process"] = sidecar.process.pid
            consumers["drain backend"] = drain_backend(pg)
            per_txn, per_txn_incl = {}, {}
            for table in (a.base, a.variant):
                txns = {}

                def run():
                    out = insert_rows(pg, a.clients, a.seconds, table)
                    print(next(l for l in out.splitlines() if l.startswith("tps")))
                    txns["n"] = int(re.search(r"actually processed: (\d+)", out).group(1))
                cpu0 = {name: harness.proc_stats(pid)[0] for name, pid in consumers.items()}
                counts = perf(a.seconds, f"{table}, {a.clients} pgbench clients", run, keep=True,
                              callgraph=a.callgraph, callers=a.callers if table != a.base else None)
                if a.callgraph:
                    counts, incl = counts
                    per_txn_incl[table] = {k: v / txns["n"] for k, v in incl.items()}
                per_txn[table] = {k: v / txns["n"] for k, v in counts.items()}
                print("Consumers' CPU per transaction: " + ", ".join(
                    f"{name} {1e6 * (harness.proc_stats(pid)[0] - cpu0[name]) / txns['n']:.1f} µs"
                    for name, pid in consumers.items()))
            # What the trigger adds: CPU samples per 1,000 transactions, variant minus base.
            print_growth(per_txn[a.base], per_txn[a.variant],
                         f"Samples per 1,000 transactions (1 sample = 1 ms of CPU), {a.variant} minus {a.base}")
            if a.callgraph:
                # The same difference with callees included: which calls the growth is under.
                base, var = per_txn_incl[a.base], per_txn_incl[a.variant]
                grew = growth(base, var)
                print(f"\nIncluding callees, backends only, per 1,000 transactions:\n\n```")
                for d, k in [g for g in grew if g[1].startswith("postgres ")][:60]:
                    print(f"{1000 * d:+8.2f}  {1000 * var.get(k, 0):8.2f}  {k}")
                print("```")
        finally:
            stack.close()
            for p in background:
                p.kill()


def switches(pid):
    """Voluntary and involuntary context switches of all of a process's threads."""
    counts = [0, 0]
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as f:
            for line in f:
                for i, key in enumerate(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    if line.startswith(key):
                        counts[i] += int(line.split()[1])
    return counts


def consumers(a):
    with harness.Cluster(a.pg_port, "max_connections = 50", "shared_buffers = 256MB", "max_wal_size = 4GB") as pg:
        pg.psql("-f", f"{HERE}/trigger_cost_setup.sql")
        print(f"\n### Consumers' cost: {a.clients} pgbench clients inserting into {a.variant}, {a.seconds} s per "
              "linger; the sidecar drains unfiltered, as in trigger_cost.py\n")
        print("| DRAIN_LINGER_MS | TPS | drain calls/s | messages per call | drain backend µs per message | "
              "… per call | its switches per call (voluntary / not) | sidecar µs per message | … per call | "
              "its switches per call |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        # Each linger once per sidecar build named by --sidecars, the builds alternating.
        builds = harness.builds(a.sidecars)
        for linger, (label, binary) in [(int(x), b) for x in a.lingers.split(",") for b in builds]:
            harness.SIDECAR_BIN = binary
            with harness.Sidecar(a.http_port, pg.dsn, "bench", SECRET, DRAIN_LINGER_MS=str(linger),
                                 FILTER_TOPICS="false") as sidecar:
                procs = {"backend": drain_backend(pg), "sidecar": sidecar.process.pid}

                def snapshot():
                    return ({k: harness.proc_stats(p)[0] for k, p in procs.items()},
                            {k: switches(p) for k, p in procs.items()},
                            sidecar.metric("realtime_drain_batches_total"),
                            sidecar.metric("realtime_drain_messages_total"))
                cpu0, sw0, calls0, msgs0 = snapshot()
                out = insert_rows(pg, a.clients, a.seconds, a.variant)
                cpu1, sw1, calls1, msgs1 = snapshot()
                tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
                calls, msgs = max(calls1 - calls0, 1), max(msgs1 - msgs0, 1)
                cells = []
                for k in ("backend", "sidecar"):
                    used = cpu1[k] - cpu0[k]
                    cells += [f"{1e6 * used / msgs:.2f}", f"{1e6 * used / calls:.0f}",
                              f"{(sw1[k][0] - sw0[k][0]) / calls:.1f} / {(sw1[k][1] - sw0[k][1]) / calls:.1f}"]
                print(f"| {label + ' ' if label else ''}{linger} | {tps:,.0f} | {calls / a.seconds:,.0f} | {msgs / calls:.1f} | " + " | ".join(cells) + " |")


def fanout(a):
    with harness.Cluster(a.pg_port) as pg:
        pg.psql("-c", "CREATE EXTENSION pg_realtime")
        with harness.Sidecar(a.http_port, pg.dsn, "profile", SECRET) as sidecar:
            url = f"ws://127.0.0.1:{a.http_port}"
            lg = subprocess.Popen(harness.loadgen_cmd(url, pg.dsn, SECRET, "--clients", a.subscribers, "--rate",
                                                      a.rate, "--seconds", a.seconds + 5), stdout=subprocess.PIPE,
                                  text=True)
            # Sample the sending window only: once every subscriber has joined.
            deadline = time.time() + 60
            while sidecar.metric("realtime_channels") < a.subscribers and time.time() < deadline:
                time.sleep(0.05)
            perf(a.seconds, f"fan-out, {a.subscribers} subscribers, {a.rate} msg/s", lambda: None)
            print(lg.communicate(timeout=a.seconds + 120)[0])


def kafkorama(a):
    """The routed shape on one sidecar (routed.py): many topics, one message a second each,
    a few clients per topic, so every delivery is a socket's only frame of its batch."""
    with harness.Cluster(a.pg_port) as pg:
        pg.psql("-c", "CREATE EXTENSION pg_realtime")
        with harness.Sidecar(a.http_port, pg.dsn, "profile", SECRET) as sidecar:
            url = f"ws://127.0.0.1:{a.http_port}"
            lg = subprocess.Popen(harness.loadgen_cmd(url, pg.dsn, SECRET, "--clients", a.subscribers, "--topics",
                                                      a.topics, "--rate", a.topics, "--assign", "random", "--pad", 480,
                                                      "--seconds", a.seconds + 5), stdout=subprocess.PIPE, text=True)
            deadline = time.time() + 120
            while sidecar.metric("realtime_channels") < a.subscribers and time.time() < deadline:
                time.sleep(0.05)
            perf(a.seconds, f"kafkorama shape, {a.subscribers} clients on {a.topics} topics, 1 msg/s each",
                 lambda: None, callgraph=a.callgraph, comms="tokio-rt-worker,realtime-sidecar")
            print(lg.communicate(timeout=a.seconds + 300)[0])


def joins(a):
    """Public joins, then private ones, each in its own perf window; then what a private
    join adds, per 1,000 joins (the windows also hold the connects, which both pay alike)."""
    with harness.Cluster(a.pg_port) as pg:
        pg.psql("-f", f"{HERE}/joins_setup.sql")
        with harness.Sidecar(a.http_port, pg.dsn, "profile", SECRET, MAX_JOINS_PER_SECOND="100000"):
            url = f"ws://127.0.0.1:{a.http_port}"
            per_join = {}
            for kind in ("public", "private"):
                res = {}

                def run():
                    # The private rooms are the ones joins_setup.sql gave its users memberships of.
                    flags, prefix = (["--private"], "room:") if kind == "private" else ([], "lobby:")
                    res["r"] = harness.loadgen(url, pg.dsn, SECRET, "--clients", a.clients, "--rate", 0, "--seconds",
                                               0, *flags, "--topics", 1000, "--topic-prefix", prefix)
                counts = perf(a.seconds, f"{a.clients} {kind} joins", run, keep=True, callgraph=a.callgraph,
                              comms="tokio-rt-worker,realtime-sidecar,postgres")
                if a.callgraph:
                    counts = counts[0]
                r = res["r"]
                print({k: r[k] for k in ("joined", "join_errors", "joins_per_second", "connect_seconds")})
                per_join[kind] = {k: v / max(r["joined"], 1) for k, v in counts.items()}
            print_growth(per_join["public"], per_join["private"],
                         "Samples per 1,000 joins (1 sample = 1 ms of CPU), private minus public")


def authorize(a):
    with harness.Cluster(a.pg_port) as pg:
        pg.psql("-f", f"{HERE}/authorize_setup.sql", "-c", f"SELECT bench_make_batches({a.batch})")

        def run():
            out = harness.as_pg(["pgbench", *pg.conn, "-n", "-c", "1", "-T", str(a.seconds), "-D", f"n={a.batch}",
                                 "-D", "generate=0", "-f", f"{HERE}/authorize_batched.sql", "postgres"])
            tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
            print(f"{tps * a.batch:,.0f} verdicts/s")
        perf(a.seconds, f"realtime.authorize, batches of {a.batch:,}", run, callgraph=a.callgraph)


def drain(a):
    with harness.Cluster(a.pg_port) as pg:
        pg.psql("-c", "CREATE EXTENSION pg_realtime", "-c", "SELECT realtime.create_consumer('profile')")
        row = {"id": 1, "room": 5, "author": "author-5", "body": "a message body of a typical chat line, about sixty bytes",
               "score": 4.5, "created_at": "2026-11-22T04:00:00.123456+00:00"}
        body = json.dumps({"table": "t_native", "record": row, "schema": "public", "operation": "INSERT",
                           "old_record": None})
        total = a.messages
        for _ in range(total // 10_000):
            pg.psql("-c", f"SELECT count(realtime.send('{body}'::jsonb, 'INSERT', 'room:5')) "
                          "FROM generate_series(1, 10000)")
        # One session, timed by psql (\\timing), so connection start-up is not counted. Each
        # call confirms the previous batch (after_seq) and takes every column, as the sidecar's
        # query does; OFFSET 0 keeps the rows computed.
        calls = ["-c", "\\timing on"]
        for k in range(total // 10_000):
            calls += ["-c", f"SELECT count(*) FROM (SELECT * FROM realtime.drain('profile', {k * 10_000}, 10000, 0) "
                            "OFFSET 0) s"]
        out = pg.psql(*calls)
        times = sorted(float(t) for t in re.findall(r"Time: ([\d.]+) ms", out))
        per = times[len(times) // 2] / 10_000 * 1000
        print(f"realtime.drain: {total:,} messages, 10,000 per call; median {per:.2f} µs per message")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["trigger", "fanout", "kafkorama", "joins", "authorize", "drain",
                                         "consumers"])
    ap.add_argument("--topics", type=int, default=10_000, help="kafkorama: topics, each sent once a second")
    ap.add_argument("--batch", type=int, default=10_000, help="authorize: requests per call")
    ap.add_argument("--messages", type=int, default=100_000, help="drain: messages queued")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--variant", default="t_native", help="trigger, consumers: the trigger-cost table to insert into")
    ap.add_argument("--base", default="t_plain",
                    help="trigger: the table the variant is compared with (t_native: what the plpgsql path adds)")
    ap.add_argument("--lingers", default="1,2,5", help="consumers: the sidecar's DRAIN_LINGER_MS values to run")
    ap.add_argument("--sidecars", help="consumers: LABEL=BINARY,... sidecar builds to run in turn at each linger "
                                       "(default: this tree's release build)")
    ap.add_argument("--drainer", choices=["sql", "sidecar"], default="sql",
                    help="trigger: what drains the queue (the sidecar's CPU is reported per transaction)")
    ap.add_argument("--clients", type=int, default=8, help="trigger, consumers: pgbench clients; joins: joining clients")
    ap.add_argument("--subscribers", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--callgraph", action="store_true",
                    help="trigger, authorize, joins, kafkorama: also record call graphs and print inclusive shares")
    ap.add_argument("--callers", help="trigger, with --callgraph: print the call chains into this symbol")
    ap.add_argument("--queue-size", help="trigger: realtime.queue_size (default: the extension's)")
    ap.add_argument("--pg-port", type=int, default=24420)
    ap.add_argument("--http-port", type=int, default=24421)
    a = ap.parse_args()
    if a.what in ("fanout", "kafkorama", "joins", "consumers") or a.drainer == "sidecar":
        harness.build()
    {"trigger": trigger, "fanout": fanout, "kafkorama": kafkorama, "joins": joins, "authorize": authorize,
     "drain": drain, "consumers": consumers}[a.what](a)


if __name__ == "__main__":
    main()
