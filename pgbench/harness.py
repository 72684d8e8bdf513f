"""What the benchmark runners share: a throwaway cluster with pg_realtime, the release
builds of the sidecar and load generator, a running sidecar and its metrics."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def machine():
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem:.0f} GiB"


# The sidecar the runners start: this tree's release build, or another build named by
# REALTIME_SIDECAR_BIN (a copy of an earlier commit's, to measure a change against it in the
# same session).
SIDECAR_BIN = os.environ.get("REALTIME_SIDECAR_BIN", f"{ROOT}/target/release/realtime-sidecar")


def build():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "realtime-sidecar", "-p", "realtime-loadgen"],
                   cwd=ROOT, check=True)


def as_pg(args, **kw):
    """Runs a Postgres client program as the postgres OS user; returns its stdout."""
    return subprocess.run(["runuser", "-u", "postgres", "--"] + args, check=True, capture_output=True, text=True,
                          **kw).stdout


class Cluster:
    """`with Cluster(port, settings) as c:` a cluster that preloads pg_realtime, stopped on exit."""

    def __init__(self, port, *settings):
        self.port = port
        self.settings = settings
        self.dir = tempfile.mkdtemp(prefix="pg_realtime_bench.")
        os.chmod(self.dir, 0o755)
        self.conn = ["-h", f"{self.dir}/pg", "-p", str(port), "-U", "postgres"]
        self.dsn = f"host={self.dir}/pg port={port} user=postgres dbname=postgres"

    def __enter__(self):
        subprocess.run([f"{ROOT}/scripts/cluster.sh", "start", f"{self.dir}/pg", str(self.port), *self.settings], check=True)
        return self

    def __exit__(self, *exc):
        subprocess.run([f"{ROOT}/scripts/cluster.sh", "stop", f"{self.dir}/pg"])
        # Each cluster is about 100 MB: 122 of them once filled /tmp with 7 GB.
        shutil.rmtree(self.dir, ignore_errors=True)

    def psql(self, *args):
        return as_pg(["psql", *self.conn, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", *args])


PEERS = f"{ROOT}/target/peers"


def proc_stats(pid):
    """CPU seconds used and peak RSS (kB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/status") as f:
        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
    return cpu, hwm


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))


def postgres_usage(pg_dir):
    """CPU seconds of the cluster's processes, living and (through the postmaster's
    children counters) exited, and the sum of their private memory (kB: RssAnon, so
    shared buffers are not counted once per backend)."""
    with open(f"{pg_dir}/postmaster.pid") as f:
        postmaster = int(f.readline())
    cpu, anon = 0.0, 0
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(pid) != postmaster and int(fields[1]) != postmaster:
                continue
            tick = os.sysconf("SC_CLK_TCK")
            cpu += (int(fields[11]) + int(fields[12])) / tick
            if int(pid) == postmaster:
                cpu += (int(fields[13]) + int(fields[14])) / tick
            with open(f"/proc/{pid}/status") as f:
                anon += next((int(l.split()[1]) for l in f if l.startswith("RssAnon")), 0)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return cpu, anon


def fixed_port(port):
    """`port`, refused if it lies in the ephemeral range: there any outgoing connection's
    source port may take it first (the load tests open tens of thousands of them), and the
    server then fails to start now and then."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    if low <= port <= high:
        raise ValueError(f"port {port} is in the ephemeral range {low}-{high}; choose one below {low}")
    return port


def metric(port, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return float(re.search(rf"^{name} (\S+)$", body, re.M).group(1))


# The load generators are thousands of clients from one or a few loopback addresses: the
# per-address limits, which stop one real address from taking a sidecar, would refuse them.
def builds(spec):
    """`--sidecars LABEL=BINARY,...` as [(label, binary)]; this tree's release build, unlabelled,
    when not given."""
    return [tuple(b.split("=", 1)) for b in spec.split(",")] if spec else [("", SIDECAR_BIN)]


def abba(rounds, items, builds):
    """(round, item, build) for each round, each item, each build: every other round runs the
    builds in the other order (ABBA), so a drift over the run (a table that grows, a machine
    that warms) does not favour the build that runs first."""
    return [(rnd, item, b) for rnd in range(rounds) for item in items
            for b in (builds if rnd % 2 == 0 else builds[::-1])]


ONE_ADDRESS = {"MAX_CONNECTIONS_PER_ADDRESS": "10000000", "MAX_PRESENCE_EVENTS_PER_SECOND_PER_ADDRESS": "10000000",
               "MAX_BINDINGS_PER_ADDRESS": "100000000", "MAX_RESUMES_PER_ADDRESS": "1000000",
               "MAX_RESUMES_WAITING_PER_ADDRESS": "1000000",
               # The address's networks (/24, /56, /48) and the sidecar as a whole are bound too
               # (issue 39): at 15,000 clients from 127.0.0.1, joins.py was refused past 4,000
               # connections per /24 and 1,000 joins a second per address.
               "MAX_CONNECTIONS_PER_IPV4_24": "10000000", "MAX_CONNECTIONS_PER_IPV6_56": "10000000",
               "MAX_CONNECTIONS_PER_IPV6_48": "10000000",
               "MAX_BINDINGS_PER_IPV4_24": "100000000", "MAX_BINDINGS_PER_IPV6_56": "100000000",
               "MAX_BINDINGS_PER_IPV6_48": "100000000",
               "MAX_JOINS_PER_SECOND_PER_ADDRESS": "10000000", "MAX_JOINS_PER_SECOND_PER_IPV4_24": "10000000",
               "MAX_JOINS_PER_SECOND_PER_IPV6_56": "10000000", "MAX_JOINS_PER_SECOND_PER_IPV6_48": "10000000",
               "MAX_SIDECAR_JOINS_PER_SECOND": "10000000", "MAX_VERDICTS_WAITING_PER_ADDRESS": "100000",
               "MAX_HTTP_CONNECTIONS_PER_PEER": "10000000"}


class Sidecar:
    """`with Sidecar(port, dsn, consumer, secret, **env) as s:` the release sidecar, healthy
    (bounded wait) on entry, SIGTERMed on exit."""

    def __init__(self, port, dsn, consumer, secret, binary=None, **env):
        self.port = fixed_port(port)
        self.binary = binary or SIDECAR_BIN
        self.env = dict(os.environ, PORT=str(port), API_JWT_SECRET=secret, DATABASE_URL=dsn, CONSUMER_NAME=consumer,
                        LOG_LEVEL="warn", **dict(ONE_ADDRESS, **env))

    def __enter__(self):
        # The sidecar logs to stdout; the runners' stdout is their table.
        self.process = subprocess.Popen([self.binary], env=self.env, stdout=sys.stderr)
        wait_healthy(f"http://127.0.0.1:{self.port}/healthz", self.process, "the sidecar", 15)
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)

    def metric(self, name):
        return metric(self.port, name)


def wait_healthy(url, process, what, seconds=30):
    deadline = time.time() + seconds
    while True:
        try:
            if urllib.request.urlopen(url).status == 200:
                return
        except OSError:
            pass
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            raise RuntimeError(f"{what} did not become healthy within {seconds} s")
        time.sleep(0.05)


class Centrifugo:
    """`with Centrifugo(port, dsn, secret) as c:` Centrifugo v5.4.9 (scripts/install-peers.sh)
    on 127.0.0.1 with namespace `bench` and its PostgreSQL outbox consumer on `dsn`
    (the outbox of pgbench/centrifugo_outbox.sql), healthy on entry, stopped on exit."""

    def __init__(self, port, dsn, secret):
        self.port = fixed_port(port)
        self.dir = tempfile.mkdtemp(prefix="pg_realtime_centrifugo.")
        self.config = {
            "address": "127.0.0.1", "port": port, "token_hmac_secret_key": secret,
            "usage_stats_disable": True, "health": True, "log_level": "error",
            "namespaces": [{"name": "bench", "allow_subscribe_for_client": True}],
            # One partition keeps commit order, as our queue does; rows are read up to 1,000
            # at a time (default 100) and the NOTIFY trigger wakes the consumer at once.
            "consumers": [{"name": "outbox", "type": "postgresql", "postgresql": {
                "dsn": dsn, "outbox_table_name": "centrifugo_outbox", "num_partitions": 1,
                "partition_select_limit": 1000, "partition_poll_interval": "300ms",
                "partition_notification_channel": "centrifugo_partition_change"}}],
        }

    def __enter__(self):
        with open(f"{self.dir}/config.json", "w") as f:
            json.dump(self.config, f)
        self.process = subprocess.Popen([f"{PEERS}/centrifugo", "--config", f"{self.dir}/config.json"],
                                        stdout=subprocess.DEVNULL, stderr=open(f"{self.dir}/log", "w"))
        wait_healthy(f"http://127.0.0.1:{self.port}/health", self.process, "Centrifugo")
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)


def jwt_hs256(claims, secret):
    """A signed token for clients that are not the load generator (k6)."""
    import base64
    import hashlib
    import hmac

    def b64(data):
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + b64(json.dumps(claims).encode())
    return head + "." + b64(hmac.new(secret.encode(), head.encode(), hashlib.sha256).digest())


def ec_signing_key(directory, kid):
    """A new P-256 key for ES256 tokens, as Supabase's JWT signing keys make them: the private
    key written to `directory` (PEM, for the load generator's --jwt-ec-pem) and the public key
    as a JWKS (for the sidecar's API_JWT_JWKS). Returns (pem path, JWKS text)."""
    import base64
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    path = os.path.join(directory, "es256.pem")
    with open(path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    numbers = key.public_key().public_numbers()

    def b64(n):
        return base64.urlsafe_b64encode(n.to_bytes(32, "big")).rstrip(b"=").decode()
    jwk = {"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
           "x": b64(numbers.x), "y": b64(numbers.y)}
    return path, json.dumps({"keys": [jwk]})


LOADGEN = f"{ROOT}/target/release/realtime-loadgen"


def loadgen_cmd(url, dsn, secret, *flags):
    return [LOADGEN, "--url", url, "--dsn", dsn, "--jwt-secret", secret, *map(str, flags)]


def loadgen(url, dsn, secret, *flags, timeout=900, cpus=None):
    """Runs the load generator once (on the CPUs `cpus` names, `taskset` style, if given);
    returns its result line, parsed. Its progress lines go to this process's stderr."""
    pin = ["taskset", "-c", cpus] if cpus else []
    out = subprocess.run(pin + loadgen_cmd(url, dsn, secret, *flags), check=True, stdout=subprocess.PIPE, text=True,
                         timeout=timeout).stdout
    return json.loads(out.strip().splitlines()[-1])


def loadgens(commands, timeout=900):
    """Runs several load generator processes at once (each holds at most ~17,000
    connections: 20,000 open files per process); returns their result lines."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in commands]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, c in zip(procs, commands):
        if p.returncode != 0:
            raise RuntimeError(f"load generator failed ({p.returncode}): {' '.join(c)}")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def split(total, parts, p):
    """Part p of `total` split as evenly as whole numbers allow."""
    return total // parts + (1 if p < total % parts else 0)


def merge(results):
    """One result from several processes' (counts add up; latency quantiles are the worst
    process's, the conservative choice when histograms are not merged)."""
    m = dict(results[0])
    for key in ("clients", "connected", "failed_connections", "closed_early", "held_to_end", "joined", "join_errors",
                "sent", "expected", "received", "lost", "gaps", "reordered", "push_refused", "deliveries_per_second",
                "connects_per_second", "joins_per_second"):
        m[key] = sum(r[key] for r in results)
    for key in ("connect_seconds", "join_seconds", "send_seconds", "p50_ms", "p95_ms", "p99_ms", "max_ms",
                "send_ended_unix"):
        m[key] = max(r[key] for r in results)
    m["send_started_unix"] = min(r["send_started_unix"] for r in results)
    m["processes"] = len(results)
    return m


# Connections per sidecar or load generator process: under the 20,000 open files a process
# may have here, with room for the rest.
PER_PROCESS = 12_000


def processes_for(clients):
    return max(1, math.ceil(clients / PER_PROCESS))


def topic_share(topics, prefix):
    """per_process_flags for spread_loadgen: each load generator process owns an equal share
    of `topics` (named <prefix><p>-<k>): it publishes them, once a second each, and its
    clients pick among them, so every process can count what its clients should receive."""
    def share(p, n):
        mine = split(topics, n, p)
        return ["--topics", mine, "--rate", mine, "--topic-prefix", f"{prefix}{p}-", "--seed", p + 1]
    return share


def spread_loadgen(url, dsn, secret, clients, flags, per_process_flags=lambda p, n: [], timeout=900):
    """`clients` connections as processes_for(clients) load generator processes run at once,
    process p connecting from 127.0.0.(p + 2) (each source address has its own ~28,000
    ephemeral ports) with `flags` and per_process_flags(p, n); returns their merged result."""
    n = processes_for(clients)
    cmds = [loadgen_cmd(url, dsn, secret, "--clients", split(clients, n, p), "--source-ip", f"127.0.0.{p + 2}",
                        *flags, *per_process_flags(p, n)) for p in range(n)]
    return merge(loadgens(cmds, timeout=timeout))


def listeners(port):
    """How many sockets listen on 127.0.0.1:port (SO_REUSEPORT lets several)."""
    needle = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        return sum(1 for line in f if line.split()[1] == needle and line.split()[3] == "0A")


def open_files(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Sidecars:
    """`with Sidecars(n, port, dsn, secret, **env) as s:` n release sidecars sharing one port
    (SO_REUSEPORT: the kernel spreads connections at random), each with its own queue
    consumer; each is listening on entry. With `routed`, sidecar i listens on port + i
    alone, so a client can pick the sidecar of its topic (`urls()`, the load generator's
    routing)."""

    def __init__(self, n, port, dsn, secret, routed=False, **env):
        self.n, self.port, self.routed = n, fixed_port(port), routed
        if routed:
            fixed_port(port + n - 1)
        self.env = dict(os.environ, API_JWT_SECRET=secret, DATABASE_URL=dsn, LOG_LEVEL="warn", **dict(ONE_ADDRESS, **env))
        self.processes = []

    def port_of(self, i):
        return self.port + i if self.routed else self.port

    def urls(self):
        return ",".join(f"ws://127.0.0.1:{self.port_of(i)}" for i in range(self.n if self.routed else 1))

    def __enter__(self):
        for i in range(self.n):
            p = subprocess.Popen([SIDECAR_BIN], stdout=sys.stderr,
                                 env=dict(self.env, PORT=str(self.port_of(i)), CONSUMER_NAME=f"sidecar{i}"))
            self.processes.append(p)
            deadline = time.time() + 15
            while listeners(self.port_of(i)) < (1 if self.routed else i + 1):
                if p.poll() is not None or time.time() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"sidecar {i} did not listen on {self.port} within 15 s")
                time.sleep(0.05)
        for i in range(self.n if self.routed else 1):
            wait_healthy(f"http://127.0.0.1:{self.port_of(i)}/healthz", self.processes[i], "the sidecars", 15)
        return self

    def __exit__(self, *exc):
        for p in self.processes:
            p.terminate()
        for p in self.processes:
            p.wait(timeout=60)

    def pids(self):
        return [p.pid for p in self.processes]


class Usage:
    """`with Usage(pids, pg_data_dir) as u:` CPU used (percent of one core) and peak RSS,
    sampled every 0.5 s, of the server processes `pids` and of the Postgres cluster (its
    processes' private memory) while the block runs; `u.result` after it."""

    def __init__(self, pids, pg_data_dir):
        import threading
        self.pids, self.pg = list(pids), pg_data_dir
        self.peak, self.pg_peak = 0, 0
        self.samples = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self.done.wait(0.5):
            self.peak = max(self.peak, sum(rss_kb(p) for p in self.pids))
            pg_cpu, pg_private = postgres_usage(self.pg)
            self.pg_peak = max(self.pg_peak, pg_private)
            self.samples.append((time.time(), sum(proc_stats(p)[0] for p in self.pids), pg_cpu))

    def window(self, t0, t1):
        """CPU (percent of one core, and seconds) of the servers and of Postgres between the
        unix times t0 and t1, from the samples taken inside that window (every 0.5 s)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return None
        (a, sa, pa), (b, sb, pb) = inside[0], inside[-1]
        return {"window_seconds": b - a, "server_cpu_s": sb - sa, "pg_cpu_s": pb - pa,
                "server_cpu_pct": 100 * (sb - sa) / (b - a), "pg_cpu_pct": 100 * (pb - pa) / (b - a)}

    def __enter__(self):
        self.start = time.time()
        self.cpu0 = sum(proc_stats(p)[0] for p in self.pids)
        self.pg_cpu0 = postgres_usage(self.pg)[0]
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        secs = time.time() - self.start
        self.result = {
            "server_cpu_pct": 100 * (sum(proc_stats(p)[0] for p in self.pids) - self.cpu0) / secs,
            "server_peak_rss_mb": self.peak / 1024,
            "pg_cpu_pct": 100 * (postgres_usage(self.pg)[0] - self.pg_cpu0) / secs,
            "pg_peak_private_mb": self.pg_peak / 1024,
        }
