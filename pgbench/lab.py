#!/usr/bin/env python3
"""The lab's checks (issue 42), run by `scripts/lab.sh test [--short]` against the hosts
`scripts/lab.sh up` made: each prints its figures and a PASS or FAIL line, and the exit status
is 1 when any correctness check failed.

  sanity    no host has a default route, an address outside the lab has no route, and
            each sidecar and the edge reach the primary (psql round trips, ms)
  routing   clients through HAProxy, hashed by the `route` URL parameter (their first topic):
            each topic's clients on one sidecar, so the keys the sidecars' drains listen to
            overlap ≤ 1.02× the topics and they drain ≤ 1.05× what is published, nothing
            lost; a control row without the parameter (HAProxy's round robin) for comparison
  partition sc1 cut from both database hosts (blackhole routes both ways) while the proxy
            still reaches it, for --cut seconds: its clients told within 7 s, its slot drained
            again within 10 s of the heal, none of its old backends left 10 s after the
            heal, nothing lost or sent twice, sc2's clients told nothing, and no client told
            "available" more than once (realtime-js clients, pgbench/lab_clients.mjs)
  switchover  a planned switchover (pg_autoctl perform switchover) under load: how long
            the publisher could not write, every client told (DatabaseRestarted live, both
            sidecars), no message lost silently (acknowledged to the publisher, not received,
            and no notice covering it: a notice covers what was committed on the old primary
            only), no message received whose transaction the new primary lacks (its audit row)
  standby   the pg_auto_failover secondary refuses realtime.send and consumer creation
  restart   the primary restarted under load: every client told, none disconnected by the
            proxy, nothing lost silently; not in --short
  forced    the primary cut off from its standby and the monitor while the sidecars still
            reach it: its commits wait for the standby, those waits are cancelled, then it
            is stopped fast, and the standby is promoted; every client told, nothing lost
            silently, and no message received whose transaction the new primary lacks (the
            commits that finished locally on the old primary); not in --short
  cost      the primary's CPU per message and the drains' wake-ups per message at 0, 1, 2, 4
            and 8 sidecar processes (half on each sidecar host, clients routed to each
            process by topic, 2 per topic), at one message rate (pgbench at a fixed rate):
            the consumers' share is each row minus the 0 row, and at 8 it must be ≤ 1.2× the
            share at 1 (not in --short; the lab's two sidecars are stopped for it, so it runs
            last)

Sizes are for this 2-core box (--short: the test suite's form). Every process this starts
runs in a lab host's cgroup, so `scripts/lab.sh down` stops whatever is left of it."""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

LAB = os.environ.get("LAB_DIR", "/var/tmp/pg_realtime_lab")
NS = "rtlab"
CG = f"/sys/fs/cgroup/cpuacct/{NS}"
ADDR = {"db1": "198.18.0.11", "db2": "198.18.0.12", "mon": "198.18.0.13", "sc1": "198.18.0.21",
        "sc2": "198.18.0.22", "edge": "198.18.0.31"}
SIDECARS = ("sc1", "sc2")
PROXY = f"ws://{ADDR['edge']}:8080"
SOURCES = [f"198.18.{k}.1" for k in range(1, 21)]
SECRET = os.environ.get("LAB_SECRET", "lab-secret-with-enough-length-for-hs256")
PRIMARY = f"host={ADDR['db1']},{ADDR['db2']} port=5432 user=postgres dbname=postgres target_session_attrs=read-write"

results = []


def on(host, cmd, **kw):
    """`cmd` on lab host `host`: in its cgroup first (the namespace's /sys hides it), then its
    namespace."""
    wrapped = ["bash", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', f"{CG}/{host}",
               "ip", "netns", "exec", f"{NS}-{host}", *map(str, cmd)]
    return subprocess.run(wrapped, **kw)


def sql(query, host="edge", dsn=PRIMARY, check=True):
    """Rows of `query` (lists of strings), run with psql on `host`."""
    out = on(host, ["psql", "-X", "-q", "-At", "-F", "|", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", query],
             capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise RuntimeError(f"psql on {host}: {out.stderr.strip()}")
    return [line.split("|") for line in out.stdout.splitlines()], out


def verdict(name, ok, figures, correctness=True):
    line = f"{name}: {'PASS' if ok else 'FAIL'}  {figures}"
    print(line, flush=True)
    results.append({"check": name, "pass": ok, "figures": figures, "correctness": correctness})


def sanity():
    routes_ok, unroutable = True, True
    for h in ["sw", *ADDR]:
        routes = subprocess.run(["ip", "-n", f"{NS}-{h}", "route"], capture_output=True, text=True).stdout
        if "default" in routes:
            routes_ok = False
            print(f"  {h} has a default route: {routes.strip()}")
        # A documentation address (RFC 5737): a route lookup sends nothing.
        if subprocess.run(["ip", "-n", f"{NS}-{h}", "route", "get", "192.0.2.1"], capture_output=True).returncode == 0:
            unroutable = False
            print(f"  {h} has a route to 192.0.2.1")
    rtts = {}
    for h in ("sc1", "sc2", "edge"):
        args = ["-c", "\\timing on"] + ["-c", "select 1"] * 20
        out = on(h, ["psql", "-X", "-q", "-d", f"{PRIMARY} sslmode=prefer", *args], capture_output=True, text=True,
                 timeout=60).stdout
        times = sorted(float(t) for t in re.findall(r"Time: ([0-9.]+) ms", out))
        rtts[h] = times[len(times) // 2] if times else None
    reached = all(v is not None for v in rtts.values())
    figures = (f"default routes {'none' if routes_ok else 'FOUND'}, 192.0.2.1 {'unroutable' if unroutable else 'ROUTED'}, "
               "select 1 p50 " + ", ".join(f"{h} {v:.2f} ms" if v is not None else f"{h} unreachable"
                                            for h, v in rtts.items()))
    verdict("sanity", routes_ok and unroutable and reached, figures)


def consumers():
    rows, _ = sql("select name, delivered, coalesce(listening, -1) from realtime.consumers() where name in ('sc1', 'sc2')")
    return {r[0]: {"delivered": int(r[1]), "listening": int(r[2])} for r in rows}


def enqueued():
    rows, _ = sql("select messages_enqueued from realtime.stats()")
    return int(rows[0][0])


def proxy_sessions():
    """Current sessions per sidecar, from HAProxy's stats socket."""
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.connect(f"{LAB}/haproxy.sock")
    s.sendall(b"show stat\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    lines = data.decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    out = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))
        if row.get("pxname") == "sidecars" and row.get("svname") in SIDECARS:
            out[row["svname"]] = {"scur": int(row["scur"] or 0), "stot": int(row["stot"] or 0),
                                  "status": row["status"]}
    return out


def loadgen(clients, topics, rate, seconds, route, label):
    """The load generator on the edge host, through HAProxy, its clients spread over the
    edge's 20 source addresses (each its own /24), two clients per topic; returns its result
    line and, sampled while it ran, the keys the sidecars listened to and the proxy's
    sessions at their peak."""
    cmd = harness.loadgen_cmd(PROXY, PRIMARY, SECRET, "--clients", clients, "--topics", topics,
                              "--topic-prefix", f"{label}-", "--rate", rate, "--seconds", seconds,
                              "--publisher", "send", "--assign", "round-robin", "--pad", 200,
                              "--source-ip", ",".join(SOURCES), "--label", label,
                              *(["--route-param", "route"] if route else []))
    peak = {"listening": {}, "sessions": {}}
    done = threading.Event()

    def sample():
        while not done.wait(0.5):
            try:
                for name, c in consumers().items():
                    peak["listening"][name] = max(peak["listening"].get(name, 0), c["listening"])
                for name, s in proxy_sessions().items():
                    peak["sessions"][name] = max(peak["sessions"].get(name, 0), s["scur"])
            except (RuntimeError, OSError):
                pass

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out = on("edge", cmd, capture_output=True, text=True, timeout=seconds + 180)
    finally:
        done.set()
        sampler.join()
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1]), peak


def routing(a):
    rows = []
    for route in (True, False):
        before_c, before_e = consumers(), enqueued()
        r, peak = loadgen(a.clients, a.topics, a.rate, a.seconds, route, "routed" if route else "roundrobin")
        after_c, after_e = consumers(), enqueued()
        published = after_e - before_e
        drained = sum(after_c[n]["delivered"] - before_c[n]["delivered"] for n in SIDECARS)
        keys = sum(peak["listening"].get(n, 0) for n in SIDECARS)
        sessions = [peak["sessions"].get(n, 0) for n in SIDECARS]
        row = {"route": route, "overlap": keys / a.topics, "amplification": drained / max(published, 1),
               "published": published, "drained": drained, "sessions": sessions, "lost": r["lost"],
               "failed": r["failed_connections"] + r["closed_early"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
               "received": r["received"]}
        rows.append(row)
        print(f"  {'routed by url_param' if route else 'round robin (control)'}: clients per sidecar "
              f"{sessions[0]:,}/{sessions[1]:,}, keys listened {keys:,} for {a.topics:,} topics "
              f"(overlap {row['overlap']:.2f}), drained {drained:,} of {published:,} published "
              f"(amplification {row['amplification']:.2f}), received {r['received']:,}, lost {r['lost']:,}, "
              f"failed connections {row['failed']}, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms", flush=True)
    routed, control = rows
    balance = max(routed["sessions"]) / max(min(routed["sessions"]), 1)
    ok = (routed["overlap"] <= 1.02 and routed["amplification"] <= 1.05 and routed["lost"] == 0
          and routed["failed"] == 0 and routed["received"] > 0 and balance <= 1.3)
    verdict("routing", ok, f"overlap {routed['overlap']:.2f} (≤ 1.02; round robin {control['overlap']:.2f}), "
            f"amplification {routed['amplification']:.2f} (≤ 1.05; round robin {control['amplification']:.2f}), "
            f"clients max/min {balance:.2f} (≤ 1.3), lost {routed['lost']}")


class Clients:
    """`with Clients(n, topics, rate) as c:` pgbench/lab_clients.mjs on the edge host, its
    clients joined on entry; `c.publish()`, then `c.stop()` returns its result."""

    def __init__(self, n, topics, rate, prefix, settle=30):
        self.cmd = ["node", f"{harness.HERE}/lab_clients.mjs", "--url", PROXY,
                    "--clients", n, "--topics", topics, "--rate", rate, "--prefix", prefix, "--settle", settle,
                    "--sources", ",".join(SOURCES), "--secret", SECRET,
                    "--db-hosts", f"{ADDR['db1']},{ADDR['db2']}"]

    def __enter__(self):
        wrapped = ["bash", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', f"{CG}/edge",
                   "ip", "netns", "exec", f"{NS}-edge", *map(str, self.cmd)]
        self.p = subprocess.Popen(wrapped, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._line(120)
        return self

    def _line(self, seconds):
        import select
        ready, _, _ = select.select([self.p.stdout], [], [], seconds)
        line = self.p.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"lab clients: no answer within {seconds} s")
        return json.loads(line)

    def publish(self):
        self.p.stdin.write("publish\n")
        self.p.stdin.flush()
        return self._line(30)

    def stop(self):
        self.p.stdin.write("stop\n")
        self.p.stdin.flush()
        return self._line(180)

    def __exit__(self, *exc):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=30)


def backends(host):
    rows, _ = sql(f"select pid from pg_stat_activity where client_addr = '{ADDR[host]}'")
    return {int(r[0]) for r in rows}


def healthz(host):
    out = on("edge", ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "1",
                      f"http://{ADDR[host]}:4000/healthz"], capture_output=True, text=True)
    return out.stdout.strip()


def wait_draining(after):
    """Until both sidecars drain again (/healthz 200), at most 60 s each."""
    for h in SIDECARS:
        deadline = time.time() + 60
        while healthz(h) != "200":
            if time.time() > deadline:
                raise RuntimeError(f"sidecar {h} not draining again within 60 s of {after}")
            time.sleep(0.2)


def cut(host, others, heal=False):
    """Blackhole routes between `host` and each of `others`, both ways (this kernel has no
    netem); `heal` removes them."""
    verb = "del" if heal else "add"
    for o in others:
        subprocess.run(["ip", "-n", f"{NS}-{host}", "route", verb, "blackhole", f"{ADDR[o]}/32"], check=True)
        subprocess.run(["ip", "-n", f"{NS}-{o}", "route", verb, "blackhole", f"{ADDR[host]}/32"], check=True)


def judge_clients(result, fault_at, prefix):
    """Per client: lost (published, never received), sent twice, the first system notice
    after the fault, and the "available" notices it got."""
    published = result["published"]
    rows = []
    for c in result["clients"]:
        want = published[int(c["topic"][len(prefix) + 1:])]
        ns = [n for n, _ in c["received"]]
        distinct = set(ns)
        told = [t for t, m in c["systems"] if t >= fault_at and "unavailable" in m.get("message", "")]
        available = [t for t, m in c["systems"] if "available again" in m.get("message", "")]
        rows.append({"server": c["servers"][-1][1] if c["servers"] else None,
                     "lost": len(set(range(want)) - distinct), "twice": len(ns) - len(distinct),
                     "told_after": (told[0] - fault_at) / 1000 if told else None, "available": len(available),
                     "reconnects": len(c["servers"]) - 1})
    return rows


def partition(a):
    prefix = "part"
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, prefix) as clients:
        old = backends("sc1")
        clients.publish()
        time.sleep(3)
        t0 = time.time()
        cut("sc1", ["db1", "db2"])
        t_503 = t_healed = t_200 = None
        deadline = t0 + a.cut
        while time.time() < deadline:
            if t_503 is None and healthz("sc1") == "503":
                t_503 = time.time() - t0
            time.sleep(0.2)
        cut("sc1", ["db1", "db2"], heal=True)
        t_healed = time.time()
        while time.time() < t_healed + 30:
            if healthz("sc1") == "200":
                t_200 = time.time() - t_healed
                break
            time.sleep(0.2)
        time.sleep(max(0.0, t_healed + 10 - time.time()))
        stale = old & backends("sc1")
        time.sleep(2)
        result = clients.stop()
    rows = judge_clients(result, t0 * 1000, prefix)
    on_sc1 = [r for r in rows if r["server"] == "sc1"]
    on_sc2 = [r for r in rows if r["server"] == "sc2"]
    told = [r["told_after"] for r in on_sc1 if r["told_after"] is not None]
    lost = sum(r["lost"] for r in rows)
    twice = sum(r["twice"] for r in rows)
    told_sc2 = sum(1 for r in on_sc2 if r["told_after"] is not None)
    flips = max((r["available"] for r in rows), default=0)
    print(f"  cut {a.cut} s: clients on sc1 {len(on_sc1)}, on sc2 {len(on_sc2)}; published "
          f"{sum(result['published']):,} (publisher errors {result['publish_errors']}); sc1 /healthz 503 after "
          f"{t_503 if t_503 is None else round(t_503, 1)} s; told after (max) "
          f"{round(max(told), 1) if told else None} s; slot drained again {t_200 if t_200 is None else round(t_200, 1)} s "
          f"after the heal; old backends left at heal + 10 s {len(stale)} of {len(old)}", flush=True)
    ok = (len(on_sc1) > 0 and len(told) == len(on_sc1) and max(told) <= 7 and t_200 is not None and t_200 <= 10
          and not stale and lost == 0 and twice == 0 and told_sc2 == 0 and flips <= 1)
    verdict(f"partition {a.cut} s", ok,
            f"told {len(told)}/{len(on_sc1)} of sc1's clients, slowest {max(told) if told else 0:.1f} s (≤ 7), "
            f"drained again {t_200 if t_200 is None else round(t_200, 1)} s after heal (≤ 10), stale backends "
            f"{len(stale)}, lost {lost}, sent twice {twice}, sc2's clients told {told_sc2}, "
            f"'available' notices per client ≤ {flips}")


def as_postgres(host, *args, timeout=120):
    """A command on database host `host` as the postgres OS user, as scripts/lab.sh runs
    them there (its own /var/run/postgresql, the lab's XDG paths for pg_autoctl)."""
    inner = ["runuser", "-u", "postgres", "--", "env", "PATH=/usr/lib/postgresql/15/bin:/usr/bin:/bin",
             f"XDG_CONFIG_HOME={LAB}/xdg/config", f"XDG_DATA_HOME={LAB}/xdg/data", f"XDG_RUNTIME_DIR={LAB}/xdg/run",
             *args]
    return on(host, ["bash", "-c", 'mount --bind "$0" /var/run/postgresql && exec "$@"', f"{LAB}/run/{host}", *inner],
              capture_output=True, text=True, timeout=timeout)


def autoctl(*args, timeout=120):
    """pg_autoctl on the monitor host."""
    return as_postgres("mon", "pg_autoctl", *args, timeout=timeout)


def audited(dsn):
    rows, _ = sql("select topic, n from lab_audit", dsn=dsn)
    return {(t, int(n)) for t, n in rows}


def switchover(a):
    prefix = "switch"
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, prefix) as clients:
        clients.publish()
        time.sleep(3)
        before = monitor_states()
        t0 = time.time()
        out = autoctl("perform", "switchover", "--pgdata", f"{LAB}/mon", timeout=180)
        switched = time.time() - t0
        if out.returncode != 0:
            print(f"  pg_autoctl perform switchover failed: {out.stderr.strip()[-500:]}")
        after = monitor_states()
        time.sleep(8)
        result = clients.stop()
    audit = audited(PRIMARY)
    prims = result["primaries"]
    j = judge_failover(result, t0, prefix, audit)
    failover_s = (prims[-1][1] / 1000 - t0) if len({h for h, _, _ in prims}) > 1 else None
    print(f"  primaries before {before}, after {after}; pg_autoctl perform switchover took {switched:.1f} s; publisher "
          f"wrote to {' then '.join(dict.fromkeys(h for h, _, _ in prims))}, first write to the new primary "
          f"{failover_s if failover_s is None else round(failover_s, 1)} s after the start; published "
          f"{sum(result['published']):,}, publisher errors {result['publish_errors']}", flush=True)
    ok = out.returncode == 0 and len({h for h, _, _ in prims}) > 1 and j["ok"]
    verdict("switchover", ok, f"failover {failover_s if failover_s is None else round(failover_s, 1)} s, {j['figures']}")


def judge_failover(result, t0, prefix, audit):
    """Every client told (DatabaseRestarted live, or epoch_changed); a message acknowledged to
    the publisher whose transaction the new primary has (its audit row) but that a client
    never received, with no notice covering it, is lost silently (a notice covers what was
    committed on the old primary only); a message received whose audit row the new primary
    lacks was delivered from a transaction that did not survive. Messages whose transactions
    the new primary lacks and nobody received were lost with their transactions (the
    publisher was told at most "might not have been replicated")."""
    prims = result["primaries"]
    # The topics' counters when the publisher first wrote to the new primary: what came
    # before was committed on the old one.
    boundary = prims[-1][2] if len(prims) > 1 else result["published"]
    published = result["published"]
    told = silent = covered = phantoms = gone = 0
    for c in result["clients"]:
        t = int(c["topic"][len(prefix) + 1:])
        got = {n for n, _ in c["received"]}
        restarted = any("restarted" in m.get("message", "") or m.get("epoch_changed") for ts, m in c["systems"]
                        if ts >= t0 * 1000)
        told += restarted
        for n in set(range(published[t])) - got:
            if (c["topic"], n) not in audit:
                gone += 1
            elif restarted and n < boundary[t]:
                covered += 1
            else:
                silent += 1
        phantoms += sum(1 for n in got if (c["topic"], n) not in audit)
    n = len(result["clients"])
    return {"ok": told == n and silent == 0 and phantoms == 0,
            "figures": f"clients told {told}/{n}, lost silently {silent}, received but absent on the new primary "
                       f"{phantoms}, lost and told {covered}, lost with their transaction {gone}"}


def restart(a):
    """The primary restarted under load (pg_ctl restart -m fast): every client told that
    the database restarted, none of them disconnected by the proxy (both sidecars are
    marked down meanwhile: their /healthz is 503 while the database is away, and HAProxy
    keeps their connections), nothing lost silently."""
    prefix = "restart"
    primary = primary_host()
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, prefix) as clients:
        clients.publish()
        time.sleep(3)
        t0 = time.time()
        # The new postmaster's output to a file: on our pipe it would keep it open.
        out = as_postgres(primary, "pg_ctl", "-D", f"{LAB}/{primary}", "restart", "-m", "fast", "-w",
                          "-l", f"{LAB}/{primary}.restart.log", timeout=120)
        restarted_s = time.time() - t0
        wait_draining("the restart")
        back_s = time.time() - t0
        time.sleep(5)
        result = clients.stop()
    j = judge_failover(result, t0, prefix, audited(PRIMARY))
    dropped = sum(1 for c in result["clients"] if len(c["servers"]) > 1)
    print(f"  {primary} restarted in {restarted_s:.1f} s ({'ok' if out.returncode == 0 else out.stderr.strip()[-200:]}), "
          f"both sidecars draining again {back_s:.1f} s after the start; published {sum(result['published']):,}, "
          f"publisher errors {result['publish_errors']}", flush=True)
    verdict("restart", j["ok"] and dropped == 0 and out.returncode == 0,
            f"clients disconnected {dropped}, {j['figures']}")


def forced(a):
    """The old primary cut off from its standby and the monitor while the sidecars (and the
    publisher) still reach it: its commits wait for the standby; some of those waits are
    cancelled, then the server is stopped fast (which terminates the rest): each of those
    commits finishes locally, and its messages must never reach a client, since the
    promoted standby lacks them."""
    prefix = "forced"
    old = primary_host()
    standby = next(h for h in ("db1", "db2") if h != old)
    direct = f"host={ADDR[old]} port=5432 user=postgres dbname=postgres"
    waiting = "select count(*) from pg_stat_activity where wait_event = 'SyncRep'"
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, prefix) as clients:
        clients.publish()
        time.sleep(3)
        t0 = time.time()
        cut(old, [standby, "mon"])
        deadline = time.time() + 30
        while int(sql(waiting, dsn=direct)[0][0][0]) == 0:
            if time.time() > deadline:
                raise RuntimeError(f"no commit on {old} ever waited for the standby")
            time.sleep(0.2)
        time.sleep(2)
        rows, _ = sql("select pid from pg_stat_activity where wait_event = 'SyncRep' and pg_cancel_backend(pid)",
                      dsn=direct)
        cancelled = len(rows)
        # Until the cancelled commits have finished locally (at most 10 s).
        pids = ",".join(r[0] for r in rows) or "0"
        deadline = time.time() + 10
        while int(sql(f"{waiting} and pid in ({pids})", dsn=direct)[0][0][0]) and time.time() < deadline:
            time.sleep(0.1)
        rows, _ = sql("select pending_bytes, last_seq from realtime.stats()", dsn=direct)
        held_bytes = int(rows[0][0])
        stop = as_postgres(old, "pg_ctl", "-D", f"{LAB}/{old}", "stop", "-m", "fast", timeout=60)
        t_stopped = time.time() - t0
        deadline = time.time() + 120
        while monitor_states().get(standby) not in ("primary", "wait_primary", "single"):
            if time.time() > deadline:
                raise RuntimeError(f"{standby} was not promoted within 120 s: {monitor_states()}")
            time.sleep(0.5)
        failover_s = time.time() - t0
        cut(old, [standby, "mon"], heal=True)
        wait_draining("the failover")
        time.sleep(5)
        result = clients.stop()
    audit = audited(PRIMARY)
    j = judge_failover(result, t0, prefix, audit)
    print(f"  {old} cut from {standby} and the monitor: {cancelled} waiting commits cancelled, {held_bytes:,} bytes "
          f"held on {old} for the standby, stopped fast {t_stopped:.1f} s after the cut "
          f"({'ok' if stop.returncode == 0 else stop.stderr.strip()[-200:]}), {standby} promoted {failover_s:.1f} s "
          f"after it; published {sum(result['published']):,}, publisher errors {result['publish_errors']}", flush=True)
    verdict("forced failover", j["ok"] and cancelled > 0,
            f"failover {failover_s:.1f} s, {cancelled} stuck commits cancelled, {j['figures']}")


def primary_host():
    return next(h for h, state in monitor_states().items() if state in ("primary", "single", "wait_primary"))


def cpu_seconds(host):
    with open(f"{CG}/{host}/cpuacct.usage") as f:
        return int(f.read()) / 1e9


def voluntary_switches(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration):
            pass
    return total


def stop_pid_file(name):
    """SIGTERM the lab process whose PID `scripts/lab.sh` wrote to $LAB/<name>.pid; waits
    (at most 30 s) for it to go."""
    with open(f"{LAB}/{name}.pid") as f:
        pid = int(f.read())
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return
    deadline = time.time() + 30
    while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.1)


def cost(a):
    for h in SIDECARS:
        stop_pid_file(h)
    primary = primary_host()
    script = f"{LAB}/cost.sql"
    with open(script, "w") as f:
        f.write(f"\\set k random(0, {a.cost_topics - 1})\n"
                "select realtime.send('{\"n\": 1}'::jsonb, 'n', 'cost-' || :k, false);\n")
    rows = []
    for n in a.ladder:
        names = [(SIDECARS[k % 2], f"cost{n}x{k}", 4100 + k) for k in range(n)]
        for host, name, port in names:
            subprocess.run(["scripts/lab.sh", "sidecar", host, name, str(port)], check=True, cwd=harness.ROOT)
        for host, name, port in names:
            deadline = time.time() + 30
            while on("edge", ["curl", "-sf", "-o", "/dev/null", f"http://{ADDR[host]}:{port}/healthz"]).returncode:
                if time.time() > deadline:
                    raise RuntimeError(f"sidecar {name} not healthy within 30 s")
                time.sleep(0.2)
        holder = None
        if n:
            urls = ",".join(f"ws://{ADDR[host]}:{port}" for host, _, port in names)
            cmd = harness.loadgen_cmd(urls, PRIMARY, SECRET, "--clients", 2 * a.cost_topics, "--topics", a.cost_topics,
                                      "--topic-prefix", "cost-", "--publisher", "none", "--seconds",
                                      a.cost_seconds + 30, "--source-ip", ",".join(SOURCES))
            holder = subprocess.Popen(["bash", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', f"{CG}/edge",
                                       "ip", "netns", "exec", f"{NS}-edge", *map(str, cmd)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Every topic listened to by the processes its clients went to.
            deadline = time.time() + 60
            while True:
                got, _ = sql("select coalesce(sum(listening), 0) from realtime.consumers() "
                             f"where name like 'cost{n}x%'")
                if int(got[0][0]) >= a.cost_topics:
                    break
                if time.time() > deadline:
                    raise RuntimeError(f"the clients of {n} processes never joined every topic")
                time.sleep(0.5)
        got, _ = sql(f"select active_pid from realtime.consumers() where name like 'cost{n}x%' and active_pid is not null")
        drains = [int(r[0]) for r in got]
        cpu0, wake0, enq0 = cpu_seconds(primary), voluntary_switches(drains), enqueued()
        on("edge", ["pgbench", "-n", "-h", ADDR[primary], "-U", "postgres", "-c", 4, "-j", 2, "-R", a.rate,
                    "-T", a.cost_seconds, "-f", script, "postgres"], capture_output=True, check=True,
           timeout=a.cost_seconds + 60)
        cpu1, wake1, enq1 = cpu_seconds(primary), voluntary_switches(drains), enqueued()
        messages = max(enq1 - enq0, 1)
        row = {"processes": n, "messages": messages, "cpu_us": 1e6 * (cpu1 - cpu0) / messages,
               "wakeups": (wake1 - wake0) / messages, "drains": len(drains)}
        rows.append(row)
        if holder:
            holder.kill()
            holder.wait()
        for _, name, _ in names:
            stop_pid_file(name)
        # A stopped sidecar's drain backend holds its slot until its wait ends (a second).
        deadline = time.time() + 15
        while True:
            _, out = sql(f"select realtime.drop_consumer(name) from realtime.consumers() where name like 'cost{n}x%'",
                         check=False)
            if out.returncode == 0:
                break
            if time.time() > deadline:
                raise RuntimeError(f"the slots of {n} processes were never released: {out.stderr.strip()}")
            time.sleep(0.2)
    base = rows[0]["cpu_us"]
    for r in rows:
        r["share_us"] = r["cpu_us"] - base
        print(f"  {r['processes']} sidecar processes: {r['messages']:,} messages, the primary's CPU "
              f"{r['cpu_us']:.1f} µs a message, consumers' share {r['share_us']:.1f} µs, drain wake-ups "
              f"{r['wakeups']:.2f} a message ({r['drains']} drains)", flush=True)
    one = next(r for r in rows if r["processes"] == 1)
    most = rows[-1]
    ratio = most["share_us"] / one["share_us"] if one["share_us"] > 0 else float("inf")
    verdict("cost", ratio <= 1.2,
            f"consumers' share at {most['processes']} processes {most['share_us']:.1f} µs a message, at 1 "
            f"{one['share_us']:.1f} µs: {ratio:.2f}× (≤ 1.2); wake-ups a message {most['wakeups']:.2f} at "
            f"{most['processes']}, {one['wakeups']:.2f} at 1", correctness=False)


def monitor_states():
    rows, _ = sql("select nodename, reportedstate from pgautofailover.node", host="mon",
                  dsn=f"postgres://autoctl_node@{ADDR['mon']}:5432/pg_auto_failover?sslmode=verify-ca"
                      f"&sslrootcert={LAB}/tls/ca.crt")
    return dict(rows)


def standby(_a):
    states = monitor_states()
    secondary = next(n for n, s in states.items() if s == "secondary")
    dsn = f"host={ADDR[secondary]} port=5432 user=postgres dbname=postgres"
    refused = {}
    for what, query in (("realtime.send", "select realtime.send('{\"a\": 1}', 'ev', 'lab:standby')"),
                        ("realtime.create_consumer", "select realtime.create_consumer('lab_standby')")):
        _, out = sql(query, dsn=dsn, check=False)
        refused[what] = out.returncode != 0 and "during recovery" in out.stderr
        print(f"  on {secondary} (secondary): {what}: {out.stderr.strip().splitlines()[0] if out.stderr else 'accepted'}")
    verdict("standby", all(refused.values()),
            ", ".join(f"{k} {'refused' if v else 'ACCEPTED'}" for k, v in refused.items()))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--short", action="store_true", help="the test suite's form: fewer clients, shorter runs")
    p.add_argument("--json", help="write every check's result here")
    p.add_argument("--only", default="sanity,routing,partition,switchover,standby,restart,forced,cost", help="the checks to run, comma-separated")
    a = p.parse_args()
    a.clients, a.topics, a.rate, a.seconds = (400, 200, 200, 8) if a.short else (4000, 2000, 2000, 30)
    a.partition_clients, a.partition_topics, a.partition_rate = (100, 50, 100) if a.short else (400, 100, 200)
    a.ladder, a.cost_topics, a.cost_seconds = [0, 1, 2, 4, 8], 2000, 20
    started = time.time()
    only = a.only.split(",")
    if "sanity" in only:
        sanity()
    if "routing" in only:
        routing(a)
    for a.cut in ([20] if a.short else [20, 90]) if "partition" in only else []:
        partition(a)
    if "switchover" in only:
        switchover(a)
    if "standby" in only:
        standby(a)
    if "restart" in only and not a.short:
        restart(a)
    if "forced" in only and not a.short:
        forced(a)
    if "cost" in only and not a.short:
        cost(a)
    print(f"lab: {sum(r['pass'] for r in results)} of {len(results)} checks passed in {time.time() - started:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(0 if all(r["pass"] or not r["correctness"] for r in results) else 1)


if __name__ == "__main__":
    main()
