#!/usr/bin/env python3
"""Our sidecar against a real peer, same scenario, same run, same 2 cores: Centrifugo v5.4.9
relaying database writes through its PostgreSQL outbox consumer, against pg_realtime's
realtime.send and the sidecar. 1,000 subscribers of one channel; the database publishes at
rising rates (each rung run for both, interleaved); the load generator speaks each server's
protocol. Then k6 checks one row of the load generator's figures against our sidecar.
Prints markdown tables; --json writes every result line. Run as root after
scripts/install-extension.sh and scripts/install-peers.sh."""

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import harness
from harness import HERE, PEERS

SECRET = "peers-benchmark-secret-with-enough-length"
P99_GOAL_MS = 50


def row(label, r):
    return (f"| {label} | {r['sent'] / max(r['send_seconds'], 1e-9):,.0f} | {r['deliveries_per_second']:,.0f} | "
            f"{r['lost']:,} | {r['gaps']:,} | {r['failed_connections'] + r['closed_early']} | {r['p50_ms']:.1f} | "
            f"{r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['server_cpu_pct']:.0f}% | "
            f"{r['send_cpu_pct']:.0f}% | {r['cpu_us_per_delivery']:.2f} | "
            f"{r['server_peak_rss_mb']:.0f} MB | {r['pg_cpu_pct']:.0f}% |")


def per_delivery(r, u):
    """The server's CPU while the publisher sent (samples inside the send window, so the
    subscribers' connects and joins are left out), and per delivery in that window."""
    w = u.window(r["send_started_unix"], r["send_ended_unix"])
    cpu_s, secs = (w["server_cpu_s"], w["window_seconds"]) if w else (0.0, 1.0)
    r["send_cpu_pct"] = 100 * cpu_s / secs
    r["cpu_us_per_delivery"] = 1e6 * cpu_s / max(r["deliveries_per_second"] * secs, 1)


def meets(r):
    return r["p99_ms"] <= P99_GOAL_MS and r["lost"] == 0


def k6_check(a, pg, sidecar, results):
    """The same fan-out row measured by the load generator and by k6, one after the other."""
    url = f"ws://127.0.0.1:{a.http_port}"
    common = ["--rate", a.k6_rate, "--seconds", a.seconds]
    lg = harness.loadgen(url, pg.dsn, SECRET, "--clients", a.k6_vus, "--vsn", "1.0.0", "--topic-prefix", "k6lg",
                         "--label", "loadgen", *common)
    apikey = harness.jwt_hs256({"role": "anon", "exp": int(time.time()) + 3600}, SECRET)
    scratch = tempfile.TemporaryDirectory()
    out = f"{scratch.name}/k6_summary.json"
    joined0 = sidecar.metric("realtime_joins_total")
    env = dict(os.environ, URL=url, APIKEY=apikey, TOPIC="k6t0", VUS=str(a.k6_vus),
               HOLD_MS=str((a.seconds + 20) * 1000), OUT=out)
    k6 = subprocess.Popen(["timeout", str(a.seconds + 120), f"{PEERS}/k6", "run", "--quiet", "--no-usage-report",
                           f"{HERE}/k6_fanout.js"], env=env, stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while sidecar.metric("realtime_joins_total") < joined0 + a.k6_vus:
        if time.time() > deadline or k6.poll() is not None:
            k6.kill()
            raise RuntimeError("k6's subscribers did not join within 60 s")
        time.sleep(0.1)
    pub = harness.loadgen(url, pg.dsn, SECRET, "--clients", 0, "--topic-prefix", "k6t", "--label", "publisher", *common)
    k6.wait(timeout=a.seconds + 120)
    with open(out) as f:
        m = json.load(f)["metrics"]
    scratch.cleanup()
    lat = m["commit_to_receive"]["values"]
    got = m["deliveries"]["values"]["count"]
    k = {"deliveries_per_second": got / pub["send_seconds"], "lost": pub["sent"] * a.k6_vus - got,
         "gaps": m.get("gaps", {}).get("values", {}).get("count", 0), "p50_ms": lat["med"], "p95_ms": lat["p(95)"],
         "p99_ms": lat["p(99)"], "max_ms": lat["max"]}
    results += [dict(lg, label="k6 check: loadgen"), dict(k, label="k6 check: k6")]
    print(f"\n### k6 check: {a.k6_vus} subscribers of one topic on our sidecar, {a.k6_rate} msg/s from the database, "
          f"serializer 1.0.0, {a.seconds} s; measured by the load generator, then by k6 (millisecond clock)\n")
    print("| measured by | deliveries/s | lost | gaps | p50 ms | p95 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in (("realtime-loadgen", lg), ("k6 v1.8.1", k)):
        print(f"| {label} | {r['deliveries_per_second']:,.0f} | {r['lost']:,} | {r['gaps']:,} | {r['p50_ms']:.1f} | "
              f"{r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--subscribers", type=int, default=1000)
    ap.add_argument("--rates", default="100,200,300,500,700,1000")
    ap.add_argument("--k6-vus", type=int, default=100)
    ap.add_argument("--k6-rate", type=int, default=100)
    ap.add_argument("--json", help="file to write every result line to")
    ap.add_argument("--baseline-bin", help="another sidecar build (say, an earlier commit's) run at every rung "
                    "beside this tree's, in alternating order, as 'pg_realtime sidecar (before)'")
    ap.add_argument("--baseline-http-port", type=int, default=24403)
    ap.add_argument("--no-k6", action="store_true", help="leave out the k6 check")
    ap.add_argument("--pg-port", type=int, default=24400)
    ap.add_argument("--http-port", type=int, default=24401)
    ap.add_argument("--centrifugo-port", type=int, default=24402)
    a = ap.parse_args()
    harness.build()
    results = []
    with harness.Cluster(a.pg_port, "max_connections = 100") as pg:
        pg.psql("-f", f"{HERE}/scenarios_setup.sql")
        data = f"{pg.dir}/pg/data"
        with contextlib.ExitStack() as stack:
            ours = stack.enter_context(harness.Sidecar(a.http_port, pg.dsn, "peers", SECRET))
            centrifugo = stack.enter_context(harness.Centrifugo(a.centrifugo_port, pg.dsn, SECRET))
            before = stack.enter_context(harness.Sidecar(a.baseline_http_port, pg.dsn, "peers_before", SECRET,
                                                         binary=a.baseline_bin)) if a.baseline_bin else None
            print(f"Machine: {harness.machine()}; {datetime.date.today()}; {a.subscribers:,} subscribers of one "
                  f"channel, {a.seconds} s per row, rungs interleaved; the database publishes (ours: realtime.send; "
                  "Centrifugo: INSERT into its outbox, NOTIFY trigger, its PostgreSQL consumer); servers, Postgres "
                  "and the load generator on the same 2 cores. Server CPU in % of one core, over the row and "
                  "while the publisher sent; CPU per delivery from the latter.\n")
            print("| server | msg/s sent | deliveries/s | lost | gaps | failed conns | p50 ms | p95 ms | p99 ms | max ms "
                  "| server CPU | server CPU sending | µs CPU per delivery | server peak RSS | Postgres CPU |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            best = {}
            for i, rate in enumerate([int(x) for x in a.rates.split(",")]):
                sidecars = [("pg_realtime sidecar", ours, a.http_port, "f")]
                if before:
                    # Alternating which build goes first at each rung.
                    b = ("pg_realtime sidecar (before)", before, a.baseline_http_port, "b")
                    sidecars = sidecars + [b] if i % 2 else [b] + sidecars
                servers = [(name, server, port, ["--publisher", "send", "--topic-prefix", f"{tag}{rate}-"])
                           for name, server, port, tag in sidecars]
                servers.append(("Centrifugo v5.4.9", centrifugo, a.centrifugo_port,
                                ["--protocol", "centrifugo", "--publisher", "outbox", "--topic-prefix", f"bench:f{rate}-"]))
                for name, server, port, flags in servers:
                    with harness.Usage([server.process.pid], data) as u:
                        r = harness.loadgen(f"ws://127.0.0.1:{port}", pg.dsn, SECRET, "--clients", a.subscribers,
                                            "--rate", rate, "--seconds", a.seconds, "--label", name, *flags)
                    r.update(u.result)
                    per_delivery(r, u)
                    results.append(r)
                    print(json.dumps(r), file=sys.stderr)
                    print(row(f"{name} @ {rate:,} msg/s", r), flush=True)
                    if meets(r) and r["deliveries_per_second"] > best.get(name, {"deliveries_per_second": 0})[
                            "deliveries_per_second"]:
                        best[name] = r
            theirs = best.get("Centrifugo v5.4.9", {}).get("deliveries_per_second", 0)
            top = max(int(x) for x in a.rates.split(","))
            bound = [name for name, r in best.items() if r["rate"] == top]
            for name in [n for n, *_ in sidecars]:
                ours_best = best.get(name, {}).get("deliveries_per_second", 0)
                print(f"\nHighest deliveries/s with p99 ≤ {P99_GOAL_MS} ms and nothing lost: {name} {ours_best:,.0f}, "
                      f"Centrifugo {theirs:,.0f}" + (f"; ratio {ours_best / theirs:.1f}×" if theirs else "") + ".")
            if bound:
                print(f"\n{', '.join(bound)} met it at the top rung, so its figure is a lower bound.")
            if not a.no_k6:
                k6_check(a, pg, ours, results)
    if a.json:
        with open(a.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
