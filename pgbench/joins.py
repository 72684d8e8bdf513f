#!/usr/bin/env python3
"""Channel joins per second through the sidecar, public and private (authorized by RLS in
batched realtime.authorize calls), in one run: N WebSocket clients connect; once all are
connected they send their joins at once; joins/s = joined / time from the go to the last
reply (connecting is timed apart). Prints a markdown table.
Run as root after scripts/install-extension.sh."""

import argparse
import datetime
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SECRET = "joins-benchmark-secret-with-enough-length"


def metric(port, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return float(re.search(rf"^{name} (\S+)$", body, re.M).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=5000)
    ap.add_argument("--pg-port", type=int, default=54380)
    ap.add_argument("--http-port", type=int, default=54381)
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "realtime-sidecar", "-p", "realtime-loadgen"], cwd=ROOT, check=True)
    d = tempfile.mkdtemp(prefix="pg_realtime_joins.")
    os.chmod(d, 0o755)
    subprocess.run([f"{ROOT}/scripts/cluster.sh", "start", f"{d}/pg", str(a.pg_port)], check=True)
    dsn = f"host={d}/pg port={a.pg_port} user=postgres dbname=postgres"
    sidecar = None
    rows = []
    try:
        subprocess.run(["runuser", "-u", "postgres", "--", "psql", "-h", f"{d}/pg", "-p", str(a.pg_port), "-U", "postgres",
                        "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", f"{HERE}/joins_setup.sql"], check=True)
        env = dict(os.environ, PORT=str(a.http_port), API_JWT_SECRET=SECRET, DATABASE_URL=dsn, CONSUMER_NAME="joins",
                   LOG_LEVEL="warn", MAX_JOINS_PER_SECOND="100000")
        sidecar = subprocess.Popen([f"{ROOT}/target/release/realtime-sidecar"], env=env)
        for _ in range(100):
            try:
                metric(a.http_port, "realtime_db_up")
                break
            except OSError:
                time.sleep(0.1)
        # The first round warms the sidecar up (its first thousands of tasks and buffers) and
        # is not reported.
        for label, extra in [("warm-up", []), ("public", []), ("private (RLS)", ["--private-members", str(a.clients)])]:
            b0, r0 = metric(a.http_port, "realtime_auth_batches_total"), metric(a.http_port, "realtime_auth_requests_total")
            out = subprocess.run([f"{ROOT}/target/release/realtime-loadgen", "--url", f"ws://127.0.0.1:{a.http_port}",
                                  "--jwt-secret", SECRET, "--dsn", dsn, "--subscribers", str(a.clients), "--rate", "0",
                                  "--seconds", "0", "--topic", "joins", "--label", label] + extra,
                                 check=True, capture_output=True, text=True, timeout=300)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["auth_calls"] = metric(a.http_port, "realtime_auth_batches_total") - b0
            r["auth_verdicts"] = metric(a.http_port, "realtime_auth_requests_total") - r0
            if label != "warm-up":
                rows.append(r)
    finally:
        if sidecar:
            sidecar.terminate()
            sidecar.wait(timeout=30)
        subprocess.run([f"{ROOT}/scripts/cluster.sh", "stop", f"{d}/pg"])
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"Machine: {os.cpu_count()} cores, {mem:.0f} GiB; {datetime.date.today()}; {a.clients:,} clients connecting and "
          f"joining at once; 100,000 memberships; sidecar, Postgres and the load generator on the same 2 cores.\n")
    print("| channels | joined | refused | failed conns | connecting (s) | joining (s) | joins/s | authorize calls | verdicts |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['label']} | {r['joined']:,} | {r['join_errors']:,} | {r['failed_connections']} | {r['connect_seconds']:.2f} | "
              f"{r['join_seconds']:.2f} | {r['joins_per_second']:,.0f} | {r['auth_calls']:,.0f} | {r['auth_verdicts']:,.0f} |")


if __name__ == "__main__":
    main()
