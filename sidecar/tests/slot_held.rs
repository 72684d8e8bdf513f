//! Regression (issue 42: "contradictory notices while the slot is held"): after its drain
//! connection was lost, the sidecar told every client "The database is available again"
//! as soon as it had reconnected, before its first drain claimed the consumer slot; while
//! another backend still held the slot (a cut connection's stale backend), each attempt
//! failed there and told "unavailable" again: a pair of contradictory notices per attempt,
//! and `/healthz` flipping between 200 and 503. "Available" is told once the slot is
//! claimed now.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[tokio::test]
async fn available_is_told_once_the_slot_is_claimed_not_at_each_reconnect() {
    let consumer = "t_slot_held";
    let sidecar = Sidecar::start(consumer, &[]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:slot-held").await;
    let db = db().await;

    // The sidecar's drain backend goes, and this session takes the slot before the sidecar
    // is back (bounded: when the sidecar wins the race, its new backend goes too).
    let holder = common::db().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "never took the slot");
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE usename = 'realtime_sidecar' AND query LIKE '%realtime.drain%' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
        let mut taken = false;
        for _ in 0..50 {
            if holder
                .execute("SELECT 1 FROM realtime.drain($1, NULL, 1, 0)", &[&consumer])
                .await
                .is_ok()
            {
                taken = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if taken {
            break;
        }
    }
    // Held for 4 s: the sidecar tries again and again meanwhile (100 ms, then doubling).
    let held_until = Instant::now() + Duration::from_secs(4);
    let mut told = Vec::new();
    while Instant::now() < held_until {
        let left = held_until.saturating_duration_since(Instant::now());
        if let Ok(Some(m)) = tokio::time::timeout(left, c.next_json(5)).await {
            if m["event"] == "system" {
                told.push(m["payload"]["message"].as_str().unwrap_or("").to_owned());
            }
        }
    }
    let health = http(sidecar.port, "GET", "/healthz", &[], "")
        .await
        .unwrap()
        .0;
    drop(holder);
    // Released: the sidecar claims the slot and tells it once.
    let back = loop {
        let m = c
            .next_json(15)
            .await
            .expect("the database is available again");
        if m["event"] == "system" {
            break m["payload"]["message"].as_str().unwrap_or("").to_owned();
        }
    };
    assert_eq!(
        told,
        vec!["The database is unavailable; reconnecting. Messages are kept and delivered when it returns, unless it restarts."],
        "while the slot was held"
    );
    assert_eq!(health, 503, "/healthz while the slot was held");
    assert_eq!(
        back,
        "The database is available again; no messages were lost."
    );
}
