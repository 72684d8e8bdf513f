//! Regression: sidecars lost their presence lease while their runtime was saturated. With
//! 250,000 connections on 21 sidecars, 38 leases were lost (`pgbench/RESULTS.md`,
//! "Connections held"): the renewal was a task among the connections' tasks and waited
//! behind them past its lease, so every member of the sidecar would have been reaped and
//! tracked again. The lease now renews on a thread of its own (`db_thread`).
//!
//! Here the sidecar runs in-process, and the shared runtime's two threads are held busy
//! (never yielding) for twice the lease: the session must be renewed meanwhile and survive.

mod common;

use clap::Parser;
use common::*;
use std::time::{Duration, Instant};

const CONSUMER: &str = "lease-under-load";
const LEASE_SECS: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_presence_lease_is_kept_while_the_connections_runtime_is_saturated() {
    let db = db().await;
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port().to_string()
    };
    let sidecar_dsn = sidecar_dsn();
    let lease = LEASE_SECS.to_string();
    let cfg = realtime_sidecar::config::Config::try_parse_from([
        "realtime-sidecar",
        "--port",
        &port,
        "--jwt-secret",
        SECRET,
        "--database-url",
        &sidecar_dsn,
        "--consumer",
        CONSUMER,
        "--presence-lease-secs",
        &lease,
    ])
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sidecar = tokio::spawn(realtime_sidecar::run(cfg, async {
        let _ = stopped.await;
    }));

    // This sidecar's sessions: (session id, renewed until, in seconds from now).
    let sessions = || async {
        db.query(
            "SELECT session, extract(epoch FROM expires_at - clock_timestamp())::float8 \
             FROM realtime.presence_sessions WHERE session LIKE $1 || '/%' ORDER BY session",
            &[&CONSUMER],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, f64>(1)))
        .collect::<Vec<_>>()
    };
    // The first renewal took the session (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        let now = sessions().await;
        if let Some(s) = now.iter().find(|(_, left)| *left > 0.0) {
            break s.0.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the sidecar never took a presence session"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Both threads of the shared runtime busy, without yielding, for twice the lease.
    let busy_for = Duration::from_secs(2 * LEASE_SECS);
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                let until = Instant::now() + busy_for;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    for s in spinners {
        s.await.unwrap();
    }

    // Had a renewal come late, the session would have been given up and a second one taken
    // (`<consumer>/<instance>/2`). Wait for a renewal after the busy spell, then compare.
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let now = sessions().await;
        // Renewed within the last second: more than (lease - 1) s left.
        if now.iter().any(|(_, left)| *left > (LEASE_SECS - 1) as f64) {
            break now;
        }
        assert!(Instant::now() < deadline, "no renewal after the busy spell");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let live: Vec<_> = after.iter().filter(|(_, left)| *left > 0.0).collect();
    assert_eq!(
        live.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(),
        vec![first.as_str()],
        "the lease was lost while the runtime was busy: {after:?}"
    );

    let _ = stop.send(());
    sidecar.await.unwrap().unwrap();
    db.execute(
        "DELETE FROM realtime.presence_sessions WHERE session LIKE $1 || '/%'",
        &[&CONSUMER],
    )
    .await
    .unwrap();
}
