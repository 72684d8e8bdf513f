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
            still reaches it, for --cut seconds: its clients told within 7 s, their presence
            gone from sc2's view within 4.5 s, its slot drained again within 10 s of the
            heal, none of its old backends left 10 s after the heal, nothing lost or sent
            twice, sc2's clients told nothing, no client told "available" more than once,
            and no ghost (realtime-js clients, pgbench/lab_clients.mjs)
  switchover  a planned switchover (pg_autoctl perform switchover) under load: how long
            the publisher could not write, every client told (DatabaseRestarted live, both
            sidecars), no message lost silently (acknowledged to the publisher, not received,
            and no notice covering it: a notice covers what was committed on the old primary
            only), no message received whose transaction the new primary lacks (its audit
            row); every failover also judges presence (every view whole again within 5 s of
            the sidecars draining again, no ghost at the end) and persisted broadcasts (every
            one answered 202 is in the new primary's table)
  standby   the pg_auto_failover secondary refuses realtime.send and consumer creation
  restart   the primary restarted under load: every client told, none disconnected by the
            proxy, nothing lost silently; not in --short
  forced    the primary cut off from its standby and the monitor while the sidecars still
            reach it: its commits wait for the standby, those waits are cancelled, then it
            is stopped fast, and the standby is promoted; every client told, nothing lost
            silently, and no message received whose transaction the new primary lacks (the
            commits that finished locally on the old primary); not in --short
  unplugged-primary  the primary's cable pulled under load: the standby promoted, every
            client told, nothing lost silently, no message the new primary lacks; plugged in
            again, it rejoins as the standby; not in --short
  async     the forced case again with the standby asynchronous (replication-quorum false):
            figures of the trade-off (what clients received that the new primary lacks),
            not judged; not in --short
  killed, unplugged, restarted  sc1 killed (SIGKILL), its cable pulled for 20 s, or
            restarted for a deploy (drained in HAProxy, SIGTERM, started, ready): its clients
            live again within 15 s (p99) with recovered: true and nothing lost, its presence
            gone from sc2's view within 4.5 s, no ghost; not in --short
  third     sc3 started and enabled in HAProxy under load: no connected client moves, new
            ones spread over the three, nothing lost; not in --short
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
# The lab's hosts, client sources and secret, as `scripts/lab.sh up` wrote them (`load`).
ADDR, SOURCES, SECRET, PROXY, PRIMARY = {}, [], "", "", ""
SIDECARS = ("sc1", "sc2")


def load():
    global SECRET, PROXY, PRIMARY
    try:
        with open(f"{LAB}/lab.json") as f:
            lab = json.load(f)
    except FileNotFoundError:
        sys.exit(f"lab: no {LAB}/lab.json: scripts/lab.sh up first")
    ADDR.update(lab["hosts"])
    SOURCES[:] = lab["sources"]
    SECRET = lab["secret"]
    PROXY = f"ws://{ADDR['edge']}:8080"
    PRIMARY = f"host={ADDR['db1']},{ADDR['db2']} port=5432 user=postgres dbname=postgres target_session_attrs=read-write"


results = []


def on(host, cmd, **kw):
    """`cmd` on lab host `host`: in its cgroup first (the namespace's /sys hides it), then its
    namespace."""
    wrapped = ["bash", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', f"{CG}/{host}",
               "ip", "netns", "exec", f"{NS}-{host}", *map(str, cmd)]
    return subprocess.run(wrapped, **kw)


def sql(query, host="edge", dsn=None, check=True):
    """Rows of `query` (lists of strings), run with psql on `host` (on the primary, unless
    `dsn` says otherwise)."""
    out = on(host, ["psql", "-X", "-q", "-At", "-F", "|", "-v", "ON_ERROR_STOP=1", "-d", dsn or PRIMARY, "-c", query],
             capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise RuntimeError(f"psql on {host}: {out.stderr.strip()}")
    return [line.split("|") for line in out.stdout.splitlines()], out


def verdict(name, ok, figures, correctness=True):
    line = f"{name}: {'PASS' if ok else 'FAIL'}  {figures}"
    print(line, flush=True)
    results.append({"check": name, "pass": ok, "figures": figures, "correctness": correctness})


def figures(name, text):
    """A trade-off's figures: printed and kept, judged by nobody."""
    print(f"{name}: FIGURES  {text}", flush=True)
    results.append({"check": name, "pass": None, "figures": text, "correctness": False})


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
        cpu0 = {h: cpu_seconds(h) for h in (*SIDECARS, primary_host())} | {"haproxy": haproxy_cpu_seconds()}
        r, peak = loadgen(a.clients, a.topics, a.rate, a.seconds, route, "routed" if route else "roundrobin")
        after_c, after_e = consumers(), enqueued()
        cpu = {h: cpu_seconds(h) - c if h != "haproxy" else haproxy_cpu_seconds() - c for h, c in cpu0.items()}
        published = after_e - before_e
        drained = sum(after_c[n]["delivered"] - before_c[n]["delivered"] for n in SIDECARS)
        keys = sum(peak["listening"].get(n, 0) for n in SIDECARS)
        sessions = [peak["sessions"].get(n, 0) for n in SIDECARS]
        row = {"route": route, "overlap": keys / a.topics, "amplification": drained / max(published, 1),
               "published": published, "drained": drained, "sessions": sessions, "lost": r["lost"],
               "failed": r["failed_connections"] + r["closed_early"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
               "received": r["received"]}
        rows.append(row)
        # Per-unit costs for the paper estimate (sidecar/README.md): the run includes the
        # clients' connections and joins.
        deliveries = max(r["received"], 1)
        sidecar_us = 1e6 * sum(cpu[h] for h in SIDECARS) / deliveries
        proxy_us = 1e6 * cpu["haproxy"] / deliveries
        primary_us = 1e6 * cpu[next(h for h in cpu if h.startswith("db"))] / max(published, 1)
        print(f"  {'routed by url_param' if route else 'round robin (control)'}: clients per sidecar "
              f"{sessions[0]:,}/{sessions[1]:,}, keys listened {keys:,} for {a.topics:,} topics "
              f"(overlap {row['overlap']:.2f}), drained {drained:,} of {published:,} published "
              f"(amplification {row['amplification']:.2f}), received {r['received']:,}, lost {r['lost']:,}, "
              f"failed connections {row['failed']}, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms; CPU: sidecars "
              f"{sidecar_us:.1f} µs a delivery, HAProxy {proxy_us:.1f} µs a delivery, the primary {primary_us:.1f} µs a "
              "message", flush=True)
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

    def __init__(self, n, topics, rate, prefix, settle=30, presence=True):
        """With `presence`, each client tracks itself and one watcher a topic watches the
        topic's presence straight on sc2 (the checks' faults fall on sc1 or the database)."""
        self.cmd = ["node", f"{harness.HERE}/lab_clients.mjs", "--url", PROXY,
                    "--clients", n, "--topics", topics, "--rate", rate, "--prefix", prefix, "--settle", settle,
                    "--sources", ",".join(SOURCES), "--secret", SECRET,
                    "--db-hosts", f"{ADDR['db1']},{ADDR['db2']}"]
        if presence:
            self.cmd += ["--presence", "--watch", f"ws://{ADDR['sc2']}:4000"]

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


def wait_draining(after, down_first=False):
    """Until both sidecars drain again (/healthz 200), at most 60 s. With `down_first`, a
    sidecar counts once it has been seen not draining and then draining (or after 10 s
    without a 503: right after a quick restart it may not have noticed yet, or may have
    come back between two looks)."""
    start = time.time()
    seen_down = {h: not down_first for h in SIDECARS}
    back = set()
    while back != set(SIDECARS):
        for h in set(SIDECARS) - back:
            code = healthz(h)
            if code != "200":
                seen_down[h] = True
            elif seen_down[h] or time.time() > start + 10:
                back.add(h)
        if time.time() > start + 60:
            raise RuntimeError(f"sidecars {sorted(set(SIDECARS) - back)} not draining again within 60 s of {after}")
        time.sleep(0.05)


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


def expected_keys(result):
    """Each topic's presence keys: its clients, each tracking itself as c<i>."""
    keys = {}
    for i, c in enumerate(result["clients"]):
        keys.setdefault(c["topic"], set()).add(f"c{i}")
    return keys


def ghosts(result):
    """At the end, per watcher: keys in its view that no client tracks, keys tracked more
    than once (a lost session's meta left beside the new one) and keys missing."""
    keys = expected_keys(result)
    extra = twice = missing = 0
    for w in result["watchers"]:
        view, want = w["view"], keys.get(w["topic"], set())
        extra += len(set(view) - want)
        twice += sum(1 for k in want & set(view) if len(view[k]) > 1)
        missing += len(want - set(view))
    return {"extra": extra, "twice": twice, "missing": missing, "ok": extra == twice == missing == 0,
            "figures": f"ghosts {extra}, keys twice {twice}, missing {missing}"}


def server_before(client, at):
    """The sidecar a client of lab_clients.mjs was last on before `at` (ms), or None."""
    before = [s for t, s in client["servers"] if t < at]
    return before[-1] if before else None


def presence_gone(result, fault_at, server="sc1"):
    """How soon the metas that the clients on `server` tracked before the fault left the
    watchers' views (on sc2): per meta, the first sync after the fault without its ref.
    Returns (seconds of the slowest, metas never gone, metas watched)."""
    on_server = {f"c{i}" for i, c in enumerate(result["clients"]) if server_before(c, fault_at) == server}
    slowest, never, watched = 0.0, 0, 0
    for w in result["watchers"]:
        before = [v for t, v in w["syncs"] if t < fault_at]
        if not before:
            continue
        for key, refs in before[-1].items():
            if key not in on_server:
                continue
            for ref in refs:
                watched += 1
                gone = next((t for t, v in w["syncs"] if t >= fault_at and ref not in v.get(key, [])), None)
                if gone is None:
                    never += 1
                else:
                    slowest = max(slowest, (gone - fault_at) / 1000)
    return slowest, never, watched


def presence_converged(result, since, fault_at):
    """After `since` (ms): how long until every watcher's view was whole again for good
    (each of its topic's clients once); and how many keys left the view after `fault_at`
    (ms: the flicker a new database session makes, a leave and a join)."""
    keys = expected_keys(result)
    slowest, flickered = 0.0, 0
    for w in result["watchers"]:
        want = keys.get(w["topic"], set())
        whole = lambda v: set(v) == want and all(len(r) == 1 for r in v.values())  # noqa: E731
        # The view as it stood at `since`, then every sync after.
        syncs = [(t, v) for t, v in w["syncs"] if t < since][-1:] + [(t, v) for t, v in w["syncs"] if t >= since]
        last_broken = max((i for i, (_, v) in enumerate(syncs) if not whole(v)), default=None)
        if last_broken is not None and last_broken + 1 < len(syncs):
            slowest = max(slowest, (syncs[last_broken + 1][0] - since) / 1000, 0.0)
        elif last_broken is not None:
            slowest = float("inf")
        flickered += len({k for t, v in w["syncs"] if t >= fault_at for k in want if k not in v})
    return slowest, flickered


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
    gone_s, never, watched = presence_gone(result, t0 * 1000)
    back_s, flickered = presence_converged(result, t_healed * 1000, t0 * 1000)
    g = ghosts(result)
    print(f"  cut {a.cut} s: clients on sc1 {len(on_sc1)}, on sc2 {len(on_sc2)}; published "
          f"{sum(result['published']):,} (publisher errors {result['publish_errors']}); sc1 /healthz 503 after "
          f"{t_503 if t_503 is None else round(t_503, 1)} s; told after (max) "
          f"{round(max(told), 1) if told else None} s; slot drained again {t_200 if t_200 is None else round(t_200, 1)} s "
          f"after the heal; old backends left at heal + 10 s {len(stale)} of {len(old)}", flush=True)
    print(f"  presence: {watched} metas of sc1's clients watched on sc2, back in every view {back_s:.1f} s after "
          f"the heal ({flickered} keys left and joined again)", flush=True)
    ok = (len(on_sc1) > 0 and len(told) == len(on_sc1) and max(told) <= 7 and t_200 is not None and t_200 <= 10
          and not stale and lost == 0 and twice == 0 and told_sc2 == 0 and flips <= 1
          and watched > 0 and never == 0 and gone_s <= 4.5 and g["ok"])
    verdict(f"partition {a.cut} s", ok,
            f"told {len(told)}/{len(on_sc1)} of sc1's clients, slowest {max(told) if told else 0:.1f} s (≤ 7), "
            f"presence gone from sc2 {gone_s:.1f} s (≤ 4.5; never {never}), "
            f"drained again {t_200 if t_200 is None else round(t_200, 1)} s after heal (≤ 10), stale backends "
            f"{len(stale)}, lost {lost}, sent twice {twice}, sc2's clients told {told_sc2}, "
            f"'available' notices per client ≤ {flips}, {g['figures']}")


def as_postgres(host, *args, timeout=120):
    """A command on database host `host` as the postgres OS user, as scripts/lab.sh runs
    them there (its own /var/run/postgresql, the lab's XDG paths for pg_autoctl)."""
    inner = ["runuser", "-u", "postgres", "--", "env", "PATH=/usr/lib/postgresql/15/bin:/usr/bin:/bin",
             f"XDG_CONFIG_HOME={LAB}/xdg/config", f"XDG_DATA_HOME={LAB}/xdg/data", f"XDG_RUNTIME_DIR={LAB}/xdg/run",
             *args]
    return on(host, ["bash", "-c", 'mount --bind "$0" /var/run/postgresql && exec "$@"', f"{LAB}/run/{host}", *inner],
              capture_output=True, text=True, errors="replace", timeout=timeout)


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
        wait_draining("the switchover")
        back_at = time.time()
        time.sleep(8)
        result = clients.stop()
    audit = audited(PRIMARY)
    prims = result["primaries"]
    j = judge_failover(result, t0, prefix, audit, back_at)
    failover_s = (prims[-1][1] / 1000 - t0) if len({h for h, _, _ in prims}) > 1 else None
    print(f"  primaries before {before}, after {after}; pg_autoctl perform switchover took {switched:.1f} s; publisher "
          f"wrote to {' then '.join(dict.fromkeys(h for h, _, _ in prims))}, first write to the new primary "
          f"{failover_s if failover_s is None else round(failover_s, 1)} s after the start; published "
          f"{sum(result['published']):,}, publisher errors {result['publish_errors']}", flush=True)
    ok = out.returncode == 0 and len({h for h, _, _ in prims}) > 1 and j["ok"]
    verdict("switchover", ok, f"failover {failover_s if failover_s is None else round(failover_s, 1)} s, {j['figures']}")


def judge_failover(result, t0, prefix, audit, back_at):
    """Every client told (DatabaseRestarted live, or epoch_changed); a message acknowledged to
    the publisher whose transaction the new primary has (its audit row) but that a client
    never received, with no notice covering it, is lost silently (a notice covers what was
    committed on the old primary only); a message received whose audit row the new primary
    lacks was delivered from a transaction that did not survive. Messages whose transactions
    the new primary lacks and nobody received were lost with their transactions (the
    publisher was told at most "might not have been replicated"). Presence: every watcher's
    view whole again within 5 s of `back_at` (both sidecars draining again; each sidecar's
    new database session tracks its members again, a leave and a join), and no ghost at the
    end. Persisted broadcasts: every one acknowledged is on the new primary."""
    prims = result["primaries"]
    # The topics' counters when the publisher first wrote to the new primary: what came
    # before was committed on the old one.
    boundary = prims[-1][2] if len(prims) > 1 else result["published"]
    published = result["published"]
    told = silent = covered = phantoms = gone = 0
    phantom_messages = set()
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
        absent = {(c["topic"], n) for n in got if (c["topic"], n) not in audit}
        phantoms += len(absent)
        phantom_messages |= absent
    n = len(result["clients"])
    converged_s, flickered = presence_converged(result, back_at * 1000, t0 * 1000)
    g = ghosts(result)
    # Persisted broadcasts answered 202 (committed with the relay's statement): every one
    # must be in the new primary's table.
    p = result["persisted"]
    rows, _ = sql(f"select payload->>'k' from realtime.persisted_messages where topic = '{p['topic']}'")
    kept = len(set(p["acked"]) & {int(r[0]) for r in rows})
    acked = len(p["acked"])
    return {"ok": (told == n and silent == 0 and phantoms == 0 and converged_s <= 5 and g["ok"]
                   and acked > 0 and kept == acked),
            "phantoms": phantoms, "gone": gone,
            "figures": f"clients told {told}/{n}, lost silently {silent}, received but absent on the new primary "
                       f"{phantoms} ({len(phantom_messages)} messages), lost and told {covered}, lost with their transaction {gone}, presence "
                       f"converged {converged_s:.1f} s after the sidecars drained again (≤ 5; {flickered} keys "
                       f"flickered), {g['figures']}, persisted messages kept {kept}/{acked}"}


def restart(a):
    """The primary restarted under load (pg_ctl restart -m fast; the monitor may fail over
    meanwhile, and the line says whether it did): every client told that the database restarted, none of them
    disconnected by the proxy (both sidecars are NOLB meanwhile: their /healthz is 503 while
    the database is away, and HAProxy keeps their connections), nothing lost silently."""
    prefix = "restart"
    primary = primary_host()
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, prefix) as clients:
        clients.publish()
        time.sleep(3)
        t0 = time.time()
        # The new postmaster's output to a file: on our pipe it would keep it open. Not
        # judged by pg_ctl's exit status: pg_autoctl's keeper, which supervises the server,
        # may start it first (pg_ctl's own start then fails, the server up all the same);
        # and the monitor may fail over to the standby meanwhile, as it does for any stop
        # of the primary it notices (`pg_ctl stop`, or `pg_autoctl stop`, always failed over
        # here). Either way the clients must be told and kept.
        out = as_postgres(primary, "pg_ctl", "-D", f"{LAB}/{primary}", "restart", "-m", "fast", "-w",
                          "-l", f"{LAB}/{primary}.restart.log", timeout=120)
        restarted_s = time.time() - t0
        wait_draining("the restart", down_first=True)
        back_s = time.time() - t0
        time.sleep(8)
        result = clients.stop()
    direct = f"host={ADDR[primary]} port=5432 user=postgres dbname=postgres"
    rows, _ = sql(f"select pg_postmaster_start_time() > to_timestamp({t0})", dsn=direct)
    restarted = rows[0] == ["t"]
    failed_over = len({h for h, _, _ in result["primaries"]}) > 1
    j = judge_failover(result, t0, prefix, audited(PRIMARY), t0 + back_s)
    dropped = sum(1 for c in result["clients"] if len(c["servers"]) > 1)
    print(f"  pg_ctl restart of {primary} returned after {restarted_s:.1f} s "
          f"({'ok' if out.returncode == 0 else out.stderr.strip().splitlines()[0][:80]}); {primary} "
          f"{'started again' if restarted else 'NOT started again'}"
          f"{', and the monitor failed over meanwhile' if failed_over else ', still the primary'}, "
          f"both sidecars draining again {back_s:.1f} s after the start; published {sum(result['published']):,}, "
          f"publisher errors {result['publish_errors']}", flush=True)
    verdict("restart", j["ok"] and dropped == 0 and restarted,
            f"clients disconnected {dropped}, {j['figures']}")


def forced(a, synchronous=True):
    """The old primary cut off from its standby and the monitor while the sidecars (and the
    publisher) still reach it: its commits wait for the standby; some of those waits are
    cancelled, then the server is stopped fast (which terminates the rest): each of those
    commits finishes locally, and its messages must never reach a client, since the
    promoted standby lacks them. With `synchronous` false the standby is made asynchronous
    first (replication-quorum false): the old primary's commits then finish at once for 5 s
    before the stop, and what that costs is reported as figures, not judged."""
    prefix = "forced" if synchronous else "async"
    old = primary_host()
    standby = next(h for h in ("db1", "db2") if h != old)
    direct = f"host={ADDR[old]} port=5432 user=postgres dbname=postgres"
    waiting = "select count(*) from pg_stat_activity where wait_event = 'SyncRep'"
    if not synchronous:
        replication_quorum(standby, old, False)
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, prefix) as clients:
        clients.publish()
        time.sleep(3)
        # How the standby streamed just before the cut (sync or async, and how far behind).
        streaming, _ = sql("select application_name, state, sync_state, pg_current_wal_lsn() - replay_lsn "
                           "from pg_stat_replication", dsn=direct)
        t0 = time.time()
        cut(old, [standby, "mon"])
        cancelled = 0
        if synchronous:
            deadline = time.time() + 30
            while int(sql(waiting, dsn=direct)[0][0][0]) == 0:
                if time.time() > deadline:
                    raise RuntimeError(f"no commit on {old} ever waited for the standby")
                time.sleep(0.2)
            time.sleep(2)
            # Each cancelled on its own: one statement that both lists and cancels was once
            # itself answered "canceling statement due to user request".
            rows, _ = sql("select pid from pg_stat_activity where wait_event = 'SyncRep' "
                          "and pid <> pg_backend_pid()", dsn=direct)
            for (pid,) in rows:
                sent, _ = sql(f"select pg_cancel_backend({int(pid)})", dsn=direct, check=False)
                cancelled += sent == [["t"]]
            # Until the cancelled commits have finished locally (at most 10 s).
            pids = ",".join(r[0] for r in rows) or "0"
            deadline = time.time() + 10
            while int(sql(f"{waiting} and pid in ({pids})", dsn=direct)[0][0][0]) and time.time() < deadline:
                time.sleep(0.1)
        else:
            # The window an asynchronous primary writes alone: its commits are acknowledged
            # and delivered, and the standby never gets them.
            time.sleep(5)
        rows, _ = sql("select pending_bytes, last_seq from realtime.stats()", dsn=direct)
        held_bytes = int(rows[0][0])
        stop = as_postgres(old, "pg_ctl", "-D", f"{LAB}/{old}", "stop", "-m", "fast", timeout=60)
        t_stopped = time.time() - t0
        wait_promoted(standby, 120)
        failover_s = time.time() - t0
        cut(old, [standby, "mon"], heal=True)
        wait_draining("the failover")
        back_at = time.time()
        time.sleep(8)
        result = clients.stop()
    audit = audited(PRIMARY)
    j = judge_failover(result, t0, prefix, audit, back_at)
    print(f"  before the cut, {old} streamed to: "
          + (", ".join(f"{n} ({st}, {ss}, replay {lag} bytes behind)" for n, st, ss, lag in streaming) or "nobody"),
          flush=True)
    print(f"  {old} cut from {standby} and the monitor: {cancelled} waiting commits cancelled, {held_bytes:,} bytes "
          f"held on {old} for the standby, stopped fast {t_stopped:.1f} s after the cut "
          f"({'ok' if stop.returncode == 0 else stop.stderr.strip()[-200:]}), {standby} promoted {failover_s:.1f} s "
          f"after it; published {sum(result['published']):,}, publisher errors {result['publish_errors']}", flush=True)
    wait_pair()
    if synchronous:
        verdict("forced failover", j["ok"] and cancelled > 0,
                f"failover {failover_s:.1f} s, {cancelled} stuck commits cancelled, {j['figures']}")
    else:
        replication_quorum(old, standby, True)
        figures("forced failover, asynchronous", f"failover {failover_s:.1f} s, {j['figures']}")


def replication_quorum(node, primary, on):
    """pg_autoctl set node replication-quorum on `node` (the standby): false makes it
    asynchronous, and the primary's synchronous_standby_names empty; waits (at most 60 s)
    until the primary's setting says so."""
    out = as_postgres(node, "pg_autoctl", "set", "node", "replication-quorum", "true" if on else "false",
                      "--pgdata", f"{LAB}/{node}", timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"pg_autoctl set node replication-quorum on {node}: {out.stderr.strip()[-300:]}")
    direct = f"host={ADDR[primary]} port=5432 user=postgres dbname=postgres"
    deadline = time.time() + 60
    while (sql("show synchronous_standby_names", dsn=direct)[0][0][0] != "") == (not on):
        if time.time() > deadline:
            raise RuntimeError(f"synchronous_standby_names on {primary} never followed replication-quorum {on}")
        time.sleep(0.5)


def wait_promoted(node, seconds):
    deadline = time.time() + seconds
    while monitor_states().get(node) not in ("primary", "wait_primary", "single"):
        if time.time() > deadline:
            raise RuntimeError(f"{node} was not promoted within {seconds} s: {monitor_states()}")
        time.sleep(0.5)


def wait_pair(seconds=240):
    """Until the monitor reports a primary and a secondary again (an old primary rejoins as
    the standby: pg_rewind, then streaming), so that the next check starts from the same
    pair."""
    deadline = time.time() + seconds
    while sorted(monitor_states().values()) != ["primary", "secondary"]:
        if time.time() > deadline:
            raise RuntimeError(f"no primary and secondary within {seconds} s: {monitor_states()}")
        time.sleep(1)


def plug(host, up):
    """The host's cable: its port on the bridge set down (unplugged) or up."""
    subprocess.run(["ip", "-n", f"{NS}-sw", "link", "set", f"v-{host}", "up" if up else "down"], check=True)


def unplugged_primary(a):
    """The primary unplugged under load: the monitor promotes the standby; every client
    told, nothing lost silently, no message whose transaction the new primary lacks,
    presence whole again; then the old primary plugged back in rejoins as the standby."""
    prefix = "unplug-db"
    old = primary_host()
    standby = next(h for h in ("db1", "db2") if h != old)
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, prefix) as clients:
        clients.publish()
        time.sleep(3)
        t0 = time.time()
        plug(old, False)
        try:
            wait_promoted(standby, 180)
            failover_s = time.time() - t0
            wait_draining("the failover")
            back_at = time.time()
            time.sleep(8)
        finally:
            plug(old, True)
        result = clients.stop()
    j = judge_failover(result, t0, prefix, audited(PRIMARY), back_at)
    print(f"  {old} unplugged: {standby} promoted {failover_s:.1f} s later, both sidecars draining again "
          f"{back_at - t0:.1f} s after it; published {sum(result['published']):,}, publisher errors "
          f"{result['publish_errors']}", flush=True)
    wait_pair()
    verdict("primary unplugged", j["ok"], f"failover {failover_s:.1f} s, {j['figures']}")


def wait_sidecar(host, why):
    """Until the sidecar on `host` drains (/healthz 200), at most 60 s."""
    deadline = time.time() + 60
    while healthz(host) != "200":
        if time.time() > deadline:
            raise RuntimeError(f"sidecar {host} not draining within 60 s {why}")
        time.sleep(0.2)


def start_sidecar(host):
    """The lab's sidecar on `host` (consumer `host`, port 4000), until it drains."""
    subprocess.run(["scripts/lab.sh", "sidecar", host, host, "4000"], check=True, cwd=harness.ROOT)
    wait_sidecar(host, "of its start")


def haproxy(command):
    """One command on HAProxy's admin socket; its answer."""
    import socket
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(f"{LAB}/haproxy.sock")
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def server_state(name):
    """HAProxy's status of server `name` of the sidecars backend: UP, NOLB, DOWN, MAINT."""
    for line in haproxy("show stat").splitlines():
        f = line.split(",")
        if len(f) > 17 and f[0] == "sidecars" and f[1] == name:
            return f[17]
    return None


def sidecar_lost(a, how):
    """sc1 lost under load: `killed` (SIGKILL), `unplugged` (its cable out for 20 s) or
    `restarted` (a deploy: drained in HAProxy, SIGTERM, started again, ready). Its clients must be live again on
    another sidecar within 15 s (p99) with `recovered: true` and nothing lost, its presence
    metas gone from sc2's view within 4.5 s (the lease, 3 s, and the reaper's second), and
    no ghost at the end."""
    prefix = f"lost-{how}"
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, prefix) as clients:
        clients.publish()
        time.sleep(3)
        t0 = time.time()
        if how == "killed":
            with open(f"{LAB}/sc1.pid") as f:
                os.kill(int(f.read()), 9)
        elif how == "unplugged":
            plug("sc1", False)
        else:
            # A rolling deploy as HAProxy's operators do one: the server drained first (no
            # new clients), then stopped (its clients are closed with 1001 and reconnect to
            # another), started again, and made ready.
            haproxy("set server sidecars/sc1 state drain")
            stop_pid_file("sc1")
            start_sidecar("sc1")
            haproxy("set server sidecars/sc1 state ready")
        # The clients' time to come back (15 s) and more.
        time.sleep(20)
        if how == "killed":
            start_sidecar("sc1")
        elif how == "unplugged":
            plug("sc1", True)
        t_back = time.time()
        wait_sidecar("sc1", "of its return")
        time.sleep(3)
        result = clients.stop()
    rows = judge_clients(result, t0 * 1000, prefix)
    lost = sum(r["lost"] for r in rows)
    moved, live, recovered = 0, [], 0
    for c in result["clients"]:
        if server_before(c, t0 * 1000) != "sc1":
            continue
        moved += 1
        again = next((t for t, status, _ in c["statuses"] if t > t0 * 1000 and status == "SUBSCRIBED"), None)
        live.append((again - t0 * 1000) / 1000 if again else float("inf"))
        recovered += any(m.get("recovered") is True for t, m in c["systems"] if t > t0 * 1000)
    live.sort()
    p99 = live[min(len(live) - 1, int(0.99 * len(live)))] if live else float("inf")
    # Where sc1's clients came back: sc2, or (a deploy quicker than realtime-js's first
    # reconnect) the restarted sc1.
    landed = {h: sum(1 for c in result["clients"] if len(c["servers"]) > 1 and c["servers"][0][1] == "sc1"
                     and c["servers"][-1][1] == h) for h in ("sc1", "sc2")}
    gone_s, never, watched = presence_gone(result, t0 * 1000)
    g = ghosts(result)
    print(f"  sc1 {how}: {moved} of {len(result['clients'])} clients were on it; live again p50 "
          f"{live[len(live) // 2] if live else 0:.1f} s, p99 {p99:.1f} s, slowest {live[-1] if live else 0:.1f} s; "
          f"back on sc2 {landed['sc2']}, on sc1 again {landed['sc1']}; sc1 draining again {time.time() - t_back:.1f} s after "
          f"it was back; published {sum(result['published']):,}", flush=True)
    ok = (moved > 0 and p99 <= 15 and recovered == moved and lost == 0 and watched > 0 and never == 0
          and gone_s <= 4.5 and g["ok"])
    verdict(f"sidecar {how}", ok,
            f"clients live again p99 {p99:.1f} s (≤ 15) of {moved}, recovered: true {recovered}/{moved}, lost {lost}, "
            f"presence gone from sc2 {gone_s:.1f} s (≤ 4.5; never {never} of {watched}), {g['figures']}")


def third_added(a):
    """A third sidecar host added under load (started, then `enable server` on HAProxy's
    admin socket): no connected client moves, and new connections spread over the three,
    the consistent hash giving the new one the keys it takes; nothing lost."""
    with Clients(a.partition_clients, a.partition_topics, a.partition_rate, "grow-old", presence=False) as before:
        before.publish()
        time.sleep(2)
        start_sidecar("sc3")
        haproxy("enable server sidecars/sc3")
        deadline = time.time() + 15
        while server_state("sc3") != "UP":
            if time.time() > deadline:
                raise RuntimeError(f"HAProxy never marked sc3 up: {server_state('sc3')}")
            time.sleep(0.2)
        with Clients(a.partition_clients, a.partition_topics, a.partition_rate, "grow-new", presence=False) as after:
            after.publish()
            time.sleep(5)
            r_after = after.stop()
        r_before = before.stop()
    haproxy("disable server sidecars/sc3")
    stop_pid_file("sc3")
    moved = sum(1 for c in r_before["clients"] if len(c["servers"]) != 1)
    placed = {h: sum(1 for c in r_after["clients"] if c["servers"] and c["servers"][-1][1] == h) for h in
              ("sc1", "sc2", "sc3")}
    lost = (sum(r["lost"] for r in judge_clients(r_before, 0, "grow-old"))
            + sum(r["lost"] for r in judge_clients(r_after, 0, "grow-new")))
    verdict("third sidecar added", moved == 0 and placed["sc3"] > 0 and lost == 0,
            f"connected clients moved {moved} of {len(r_before['clients'])}, new clients on sc1 {placed['sc1']}, "
            f"sc2 {placed['sc2']}, sc3 {placed['sc3']}, lost {lost}")


def primary_host():
    return next(h for h, state in monitor_states().items() if state in ("primary", "single", "wait_primary"))


def haproxy_cpu_seconds():
    """User and system CPU of the edge's HAProxy processes (the edge's cgroup also holds the
    load generators)."""
    total = 0
    with open(f"{CG}/edge/cgroup.procs") as f:
        pids = f.read().split()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "haproxy":
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def cpu_seconds(host):
    with open(f"{CG}/{host}/cpuacct.usage") as f:
        return int(f.read()) / 1e9


def process_cpu(pids):
    """CPU seconds the processes `pids` used so far (those gone count nothing)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def process_ns(pids):
    """Nanoseconds the processes `pids` ran so far (the scheduler's count, finer than clock
    ticks; those gone count nothing)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total


def plain_calls(primary, connections, rate, seconds):
    """The primary's backends' CPU, µs a call, for `rate` prepared `SELECT 1` calls a second
    from the edge spread over `connections` connections: what a call costs this box when its
    backend runs that often, with nothing of pg_realtime in it."""
    script = f"{LAB}/plain.sql"
    with open(script, "w") as f:
        f.write("select 1;\n")
    cmd = ["pgbench", "-n", "-h", ADDR[primary], "-U", "postgres", "-c", connections, "-j", min(connections, 2),
           "-R", rate, "-T", seconds + 4, "-M", "prepared", "-f", script, "postgres"]
    run = subprocess.Popen(["bash", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', f"{CG}/edge",
                            "ip", "netns", "exec", f"{NS}-edge", *map(str, cmd)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # pgbench's connections, once they have all come and a second has passed: pgbench
        # opens one connection of its own before its clients' and closes it, and that one,
        # taken for the 1-connection run's, once read 0 µs a call.
        listed = "select pid from pg_stat_activity where application_name = 'pgbench'"
        deadline = time.time() + 10
        while len(sql(listed)[0]) < connections:
            if time.time() > deadline:
                raise RuntimeError(f"pgbench's {connections} connections never came")
            time.sleep(0.2)
        time.sleep(1)
        pids = [int(r[0]) for r in sql(listed)[0]]
        if len(pids) != connections:
            raise RuntimeError(f"pgbench has {len(pids)} connections, not {connections}")
        ns0, t0 = process_ns(pids), time.time()
        time.sleep(seconds)
        ns1, t1 = process_ns(pids), time.time()
    finally:
        run.wait(timeout=seconds + 30)
    return (ns1 - ns0) / 1e3 / (rate * (t1 - t0))


def primary_processes():
    """The primary's server processes, {pid: kind}: a sidecar's backend by the realtime
    function it last called (its drain, lease, reaper, ...), any other by its type."""
    rows, _ = sql("select pid, backend_type, coalesce(usename, ''), "
                  "coalesce(substring(query from 'realtime\\.([a-z_]+)'), '') from pg_stat_activity")
    kinds = {}
    for pid, backend_type, user, called in rows:
        if user == "realtime_sidecar":
            kinds[int(pid)] = f"sidecar {called or 'other'}"
        elif backend_type == "client backend":
            kinds[int(pid)] = f"{user or 'client'} backend"
        else:
            kinds[int(pid)] = backend_type
    return kinds


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


def sidecar_metrics(host, port):
    """A sidecar process's /metrics (open in the lab: no METRICS_JWT_SECRET), as
    {'name{labels}': value}."""
    out = on("edge", ["curl", "-sf", f"http://{ADDR[host]}:{port}/metrics"], capture_output=True, text=True)
    values = {}
    for line in out.stdout.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                values[key] = float(value)
            except ValueError:
                pass
    return values


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
                                      a.cost_seconds + a.cost_idle_seconds + 30, "--source-ip", ",".join(SOURCES))
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
        got, _ = sql("select pid from pg_stat_activity where usename = 'realtime_sidecar'")
        others = [int(r[0]) for r in got if int(r[0]) not in drains]
        # The same minute with nothing sent: what N processes cost the primary by the second
        # (drain timeouts, presence leases and reaps, statistics), whatever the messages.
        kinds = primary_processes()
        kinds0 = {pid: process_cpu([pid]) for pid in kinds}
        idle0 = cpu_seconds(primary)
        time.sleep(a.cost_idle_seconds)
        idle_ms = 1e3 * (cpu_seconds(primary) - idle0) / a.cost_idle_seconds
        by_kind = {}
        for pid, kind in kinds.items():
            by_kind[kind] = by_kind.get(kind, 0) + 1e3 * (process_cpu([pid]) - kinds0[pid]) / a.cost_idle_seconds
        print(f"  {n} sidecar processes, idle, the primary's CPU by process kind (ms a second): " +
              ", ".join(f"{k} {v:.2f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]) if v >= 0.05),
              flush=True)
        split0 = process_cpu(drains), process_cpu(others)
        batches0 = sum(sidecar_metrics(host, port).get("realtime_drain_batches_total", 0) for host, _, port in names)
        cpu0, wake0, enq0 = cpu_seconds(primary), voluntary_switches(drains), enqueued()
        on("edge", ["pgbench", "-n", "-h", ADDR[primary], "-U", "postgres", "-c", 4, "-j", 2, "-R", a.rate,
                    "-T", a.cost_seconds, "-f", script, "postgres"], capture_output=True, check=True,
           timeout=a.cost_seconds + 60)
        cpu1, wake1, enq1 = cpu_seconds(primary), voluntary_switches(drains), enqueued()
        split1 = process_cpu(drains), process_cpu(others)
        after = [sidecar_metrics(host, port) for host, _, port in names]
        messages = max(enq1 - enq0, 1)
        # Commit to hand-out in the sidecars (their summaries cover the last minute: this
        # row's run), the slowest process's quantiles: what the linger costs in latency.
        quantile = lambda q: 1e3 * max((m.get(f'realtime_commit_to_dispatch_seconds{{quantile="{q}"}}', 0)
                                         for m in after), default=0)
        row = {"processes": n, "messages": messages, "cpu_us": 1e6 * (cpu1 - cpu0) / messages,
               "wakeups": (wake1 - wake0) / messages, "drains": len(drains),
               "batches": (sum(m.get("realtime_drain_batches_total", 0) for m in after) - batches0) / messages,
               "p50_ms": quantile("0.5"), "p99_ms": quantile("0.99"),
               "idle_ms": idle_ms,
               "drains_us": 1e6 * (split1[0] - split0[0]) / messages,
               "others_us": 1e6 * (split1[1] - split0[1]) / messages}
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
    base, idle_base = rows[0]["cpu_us"], rows[0]["idle_ms"]
    for r in rows:
        r["share_us"] = r["cpu_us"] - base
        # The share less what the processes cost by the second, spread over this row's
        # messages: the part that grows with the messages.
        r["idle_share_us"] = 1e3 * (r["idle_ms"] - idle_base) * a.cost_seconds / r["messages"]
        print(f"  {r['processes']} sidecar processes: {r['messages']:,} messages, the primary's CPU "
              f"{r['cpu_us']:.1f} µs a message, consumers' share {r['share_us']:.1f} µs, drain wake-ups "
              f"{r['wakeups']:.2f} a message ({r['drains']} drains), batches {r['batches']:.2f} a message, "
              f"commit to hand-out p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms; of the primary's CPU, the "
              f"drain backends {r['drains_us']:.1f} µs a message, the sidecars' other backends "
              f"{r['others_us']:.1f}; idle, the primary's CPU {r['idle_ms']:.1f} ms a second: "
              f"{r['idle_share_us']:.1f} µs of the share a message, {r['share_us'] - r['idle_share_us']:.1f} µs "
              f"beyond it", flush=True)
    one = next((r for r in rows if r["processes"] == 1), None)
    if one is None:
        print("cost: no row of 1 process to compare with (--ladder)", flush=True)
        return
    most = rows[-1]
    # What a call costs this box as the same calls are spread over more, each less busy,
    # backends: the drains' calls of the 1 row, made of a plain `SELECT 1` from 1 and from
    # N connections. Nothing of pg_realtime is in it; it is what the box adds.
    calls = lambda r: r["batches"] * r["messages"] / a.cost_seconds
    per_call = lambda r: r["drains_us"] / r["batches"] if r["batches"] else 0.0
    rate = max(round(calls(one)), 1)
    plain = {n: plain_calls(primary, n, rate, 20) for n in (1, most["processes"])}
    box = plain[most["processes"]] / max(plain[1], 1e-9)
    print(f"  per call, at {rate} calls a second: the drain backends {per_call(one):.0f} µs at 1 process, "
          f"{per_call(most):.0f} at {most['processes']} ({calls(most):.0f} calls a second) "
          f"({per_call(most) / max(per_call(one), 1e-9):.2f}×); a plain prepared `select 1` "
          f"{plain[1]:.0f} µs on 1 connection, {plain[most['processes']]:.0f} on {most['processes']} "
          f"({box:.2f}×)", flush=True)
    # The drains' cost a message is their calls a second times what a call costs; divided by
    # what this box adds to any call so spread (the plain call's growth), what is left is the
    # design's: more calls, and a call that does more (reading past other processes' records).
    drains = most["drains_us"] / max(one["drains_us"], 1e-9)
    print(f"  the drain backends' cost a message grew {drains:.2f}× from 1 process to {most['processes']} "
          f"(calls {calls(most) / max(calls(one), 1e-9):.2f}×, a call {per_call(most) / max(per_call(one), 1e-9):.2f}×); "
          f"this box alone grows a plain call {box:.2f}×; left to the design {drains / max(box, 1e-9):.2f}×",
          flush=True)
    ratio = most["share_us"] / one["share_us"] if one["share_us"] > 0 else float("inf")
    # The sidecars' own backends, counted process by process: a figure without the
    # publishers' row-to-row spread, which on these 2 cores exceeds the share itself.
    direct = lambda r: r["drains_us"] + r["others_us"]
    verdict("cost", ratio <= 1.2,
            f"consumers' share at {most['processes']} processes {most['share_us']:.1f} µs a message, at 1 "
            f"{one['share_us']:.1f} µs: {ratio:.2f}× (≤ 1.2); wake-ups a message {most['wakeups']:.2f} at "
            f"{most['processes']}, {one['wakeups']:.2f} at 1; the sidecars' backends {direct(most):.1f} µs a "
            f"message at {most['processes']}, {direct(one):.1f} at 1: {direct(most) / max(direct(one), 1e-9):.2f}×",
            correctness=False)


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
    p.add_argument("--only", default="sanity,routing,partition,switchover,standby,restart,forced,unplugged-primary,async,killed,unplugged,restarted,third,cost", help="the checks to run, comma-separated")
    p.add_argument("--ladder", dest="ladder_only", help="the cost check's sidecar processes, comma-separated "
                   "(default 0,1,2,4,8; the first must be 0)")
    p.add_argument("--cost-rate", type=int, help="the cost check's message rate (default 2,000 a second)")
    a = p.parse_args()
    load()
    a.clients, a.topics, a.rate, a.seconds = (400, 200, 200, 8) if a.short else (4000, 2000, 2000, 30)
    a.partition_clients, a.partition_topics, a.partition_rate = (100, 50, 100) if a.short else (400, 100, 200)
    # 40 s a row: the consumers' share is a difference of two rows of about 60-80 µs a
    # message (pgbench's own backends), which moved by ±5 µs between 20 s runs.
    a.ladder, a.cost_topics, a.cost_seconds, a.cost_idle_seconds = [0, 1, 2, 4, 8], 2000, 40, 15
    if a.ladder_only:
        a.ladder = [int(n) for n in a.ladder_only.split(",")]
    if a.cost_rate:
        a.rate = a.cost_rate
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
    if "unplugged-primary" in only and not a.short:
        unplugged_primary(a)
    if "async" in only and not a.short:
        forced(a, synchronous=False)
    for how in ("killed", "unplugged", "restarted"):
        if how in only and not a.short:
            sidecar_lost(a, how)
    if "third" in only and not a.short:
        third_added(a)
    if "cost" in only and not a.short:
        cost(a)
    checks = [r for r in results if r["pass"] is not None]
    print(f"lab: {sum(r['pass'] for r in checks)} of {len(checks)} checks passed in {time.time() - started:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(0 if all(r["pass"] or not r["correctness"] for r in checks) else 1)


if __name__ == "__main__":
    main()
