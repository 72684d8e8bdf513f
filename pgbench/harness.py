"""What the benchmark runners share: a throwaway cluster with pg_realtime, the release
builds of the sidecar and load generator, a running sidecar and its metrics."""

import os
import re
import subprocess
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def machine():
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem:.0f} GiB"


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

    def psql(self, *args):
        return as_pg(["psql", *self.conn, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", *args])


def metric(port, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return float(re.search(rf"^{name} (\S+)$", body, re.M).group(1))


class Sidecar:
    """`with Sidecar(port, dsn, consumer, secret, **env) as s:` the release sidecar, healthy
    (bounded wait) on entry, SIGTERMed on exit."""

    def __init__(self, port, dsn, consumer, secret, **env):
        self.port = port
        self.env = dict(os.environ, PORT=str(port), API_JWT_SECRET=secret, DATABASE_URL=dsn, CONSUMER_NAME=consumer,
                        LOG_LEVEL="warn", **env)

    def __enter__(self):
        self.process = subprocess.Popen([f"{ROOT}/target/release/realtime-sidecar"], env=self.env)
        deadline = time.time() + 15
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz").status == 200:
                    return self
            except OSError:
                pass
            if time.time() > deadline:
                self.process.kill()
                raise RuntimeError("the sidecar did not become healthy within 15 s")
            time.sleep(0.05)

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)

    def metric(self, name):
        return metric(self.port, name)
