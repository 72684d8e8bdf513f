//! A sidecar that stops and comes back to its consumer slot loses nothing: it confirms its
//! position on the way out and drains exactly what was committed while it was away.

mod common;

use common::*;
use std::time::{Duration, Instant};

async fn last_seq(db: &tokio_postgres::Client) -> i64 {
    db.query_one("SELECT last_seq FROM realtime.stats()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Waits (at most 10 s) until the sidecar has drained up to `seq`.
async fn drained_to(s: &Sidecar, seq: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.metric("realtime_last_seq").await < seq as f64 {
        assert!(
            Instant::now() < deadline,
            "sidecar did not drain up to {seq}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sidecar_restart_resumes_from_its_slot_without_loss() {
    let db = db().await;
    // Nobody joins here, and a sidecar that filters by topic (`interest`) rightly skips
    // messages no channel of its own listens to: this test is about the slot's position, so
    // both sidecars drain everything.
    let everything = [("FILTER_TOPICS", "false")];
    let mut first = Sidecar::start("t_resume", &everything).await;
    db.execute(
        "SELECT realtime.send('{}', 'e', 'resume', false) FROM generate_series(1, 3)",
        &[],
    )
    .await
    .unwrap();
    let before = last_seq(&db).await;
    drained_to(&first, before).await;
    assert!(first.stop().success(), "graceful shutdown exits 0");
    let confirmed: i64 = db
        .query_one(
            "SELECT confirmed_seq FROM realtime.consumers() WHERE name = 't_resume'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        confirmed, before,
        "shutdown confirmed everything it drained"
    );

    db.execute(
        "SELECT realtime.send('{}', 'e', 'resume', false) FROM generate_series(1, 5)",
        &[],
    )
    .await
    .unwrap();
    let after = last_seq(&db).await;
    // start_on, not start: the same slot, as a restarted sidecar finds it.
    let second = Sidecar::start_on(free_port(), "t_resume", &everything).await;
    drained_to(&second, after).await;
    assert_eq!(second.metric("realtime_drain_messages_total").await, 5.0);
    assert_eq!(
        second.metric("realtime_drain_lost_messages_total").await,
        0.0
    );
}
