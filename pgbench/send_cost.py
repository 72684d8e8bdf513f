#!/usr/bin/env python3
"""What a send costs a role held to the INSERT policies of realtime.messages (neither a
superuser nor BYPASSRLS: extension/src/send_policy.rs inserts Supabase's row as the caller in
a subtransaction and rolls it back), against a stand-in for Supabase's send (its documented
PL/pgSQL: the same INSERT as the caller in an exception block; pgbench/send_cost_setup.sql)
and against a send not held (the superuser). One backend, one cluster, the three senders in
turn within each round, each round's statements rolled back. Prints per-send microseconds and
the ratio to the stand-in. Run as root after scripts/install-extension.sh."""

import argparse
import datetime
import statistics

import harness
from harness import HERE

SENDERS = [
    ("postgres (not held)", "", "ours"),
    ("held (INSERT policy)", "SET ROLE held;", "ours"),
    ("held, the stand-in for Supabase's send", "SET ROLE held;", "standin"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sends", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=24371)
    a = ap.parse_args()
    per_send = {label: [] for label, _, _ in SENDERS}
    with harness.Cluster(a.port, "realtime.queue_size = 256MB") as pg:
        pg.psql("-f", f"{HERE}/send_cost_setup.sql")
        # Each backend keeps the held send's plan after its first call: warm it, as an app's
        # long-lived connection is.
        for _ in range(a.rounds):
            script = "BEGIN;\n"
            for label, role, how in SENDERS:
                script += (f"{role} SELECT bench.time_sends('{how}', 100); "
                           f"SELECT bench.time_sends('{how}', {a.sends}); RESET ROLE;\n")
            script += "ROLLBACK;\n"
            lines = pg.psql("-c", script).split("\n")
            # Two numbers per sender: the warm-up's, then the round's.
            times = [float(x) for x in lines if x.strip()][1::2]
            for (label, _, _), us in zip(SENDERS, times):
                per_send[label].append(us / a.sends)
    base = per_send[SENDERS[2][0]]
    print(f"Machine: {harness.machine()}; {datetime.date.today()}; PostgreSQL 15; "
          f"{a.sends:,} sends a round, {a.rounds} rounds, one backend.\n")
    print("| sender | per send (us), each round | median | against the stand-in (median of rounds) |")
    print("|---|---|---:|---:|")
    for label, _, _ in SENDERS:
        xs = per_send[label]
        ratio = statistics.median(x / b for x, b in zip(xs, base))
        print(f"| {label} | {' · '.join(f'{x:.1f}' for x in xs)} | {statistics.median(xs):.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
