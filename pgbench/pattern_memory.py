#!/usr/bin/env python3
"""Peak memory of the Postgres backend that answers one `realtime.match_patterns` call: N
distinct LIKE patterns, each asked about every one of M changed values of B bytes (the
shape of issue 39's H1: one anonymous client's thousands of `like` filters on a published
text column). Prints a markdown row per size: the backend's VmHWM before and after the call
(read by the backend itself from /proc) and the call's time. Memory, not speed, is the
figure: it does not move with the machine's load. Run as root after
scripts/install-extension.sh."""

import argparse
import datetime
import re
import time

import harness


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=24390)
    ap.add_argument("--sizes", default="250x400x1000,1000x400x1000",
                    help="comma-separated PATTERNSxVALUESxBYTES")
    a = ap.parse_args()
    hwm = "substring(pg_read_file('/proc/' || pg_backend_pid() || '/status') from 'VmHWM:\\s*(\\d+) kB')"
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; PostgreSQL 15.\n")
    print("| patterns | values | bytes each | backend peak before (MB) | after the call (MB) | added (MB) | call (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with harness.Cluster(a.port) as pg:
        pg.psql("-c", "CREATE EXTENSION pg_realtime")
        for size in a.sizes.split(","):
            n, m, b = (int(x) for x in size.split("x"))
            started = time.monotonic()
            out = pg.psql("-c", f"SELECT {hwm}", "-c", f"""
                SELECT count(*) FROM realtime.match_patterns(
                    (SELECT array_agg('a' || g || '%') FROM generate_series(1, {n}) g),
                    array_fill('like'::text, ARRAY[{n}]),
                    (SELECT array_agg(repeat(chr(97 + g % 26), {b})) FROM generate_series(1, {m}) g))""",
                          "-c", f"SELECT {hwm}")
            took = time.monotonic() - started
            before, answers, after = out.split()
            assert int(answers) == n * m, f"{answers} answers, not {n * m}"
            print(f"| {n:,} | {m:,} | {b:,} | {int(before) / 1024:.0f} | {int(after) / 1024:.0f} | "
                  f"{(int(after) - int(before)) / 1024:.0f} | {took:.2f} |")


if __name__ == "__main__":
    main()
