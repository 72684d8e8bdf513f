//! `DRAIN_LINGER_MS` paces the drain calls instead of holding the first message found: a
//! message committed after a quiet spell is delivered at once, and one committed right after
//! a delivered batch waits for the linger to pass, batched with whatever else comes.
//!
//! The linger here is 5 s so that the two cases are told apart by a wide margin: the first
//! message must arrive well within half the linger (before this change it arrived no sooner
//! than the linger), the second no sooner than most of the linger after the first. Meanwhile
//! /healthz, which fails when the database has not answered for 3 s, stays up: the linger is
//! the sidecar's wait, not the database's silence.

mod common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

const LINGER_MS: u64 = 5000;

#[tokio::test]
async fn a_message_after_a_quiet_spell_is_not_held_for_the_linger() {
    let sidecar = Sidecar::start("t_drain_linger", &[("DRAIN_LINGER_MS", "5000")]).await;
    let db = db().await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let topic = format!("linger:{}", std::process::id());
    c.join_public(&format!("realtime:{topic}")).await;

    // Nothing was delivered to this sidecar before: the drain call waits on the queue.
    let sent = Instant::now();
    send(&db, json!({"n": 1}), "first", &topic).await;
    let first = c.next_json(15).await.expect("the first message");
    let first_at = Instant::now();
    assert_eq!(first["payload"]["event"], "first", "{first}");
    assert!(
        first_at - sent < Duration::from_millis(LINGER_MS / 2),
        "a message after a quiet spell was held {:?} (the linger is {LINGER_MS} ms)",
        first_at - sent
    );

    // Right after a delivered batch, the next call waits out the linger; /healthz does not
    // take that wait for a stuck database (its limit, 3 s, is shorter than this linger).
    send(&db, json!({"n": 2}), "second", &topic).await;
    // Whether /healthz answered 200 later than its 3 s limit after the last answer.
    let mut up_past_the_limit = false;
    let second = loop {
        tokio::select! {
            m = c.next_json(15) => break m.expect("the second message"),
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                assert!(first_at.elapsed() < Duration::from_secs(20), "no second message in 20 s");
                let (status, body) = http(sidecar.port, "GET", "/healthz", &[], "").await.unwrap();
                assert_eq!(status, 200, "/healthz while the drain lingered: {body}");
                up_past_the_limit |= first_at.elapsed() > Duration::from_millis(3500);
            }
        }
    };
    let second_at = Instant::now();
    assert!(
        up_past_the_limit,
        "/healthz was not asked after 3.5 s of the linger"
    );
    assert_eq!(second["payload"]["event"], "second", "{second}");
    assert!(
        second_at - first_at >= Duration::from_millis(LINGER_MS * 4 / 5),
        "the message after a batch came {:?} after it: the linger ({LINGER_MS} ms) did not pace the drain",
        second_at - first_at
    );
}
