//! Fixed bug (issue 42): a presence write in flight when the presence connection was lost
//! took its members with it. The worker had taken their wishes to write them, the write
//! never answered, and the new session tracked again only what had been written before:
//! those members were in no view, and their pushes never answered. In the lab's forced
//! failover the sidecars wrote to the isolated old primary (its keeper had started it again)
//! where every write waited for the standby, until the keeper stopped it: every view
//! lacked 400 members for good. Here one write waits on a lock the test holds (a trigger
//! on the members' table), and its backend is ended.

mod common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_member_whose_write_was_in_flight_is_tracked_under_the_next_session() {
    let s = Sidecar::start("t_presence_write_lost", &[]).await;
    let topic = format!("write-lost-{}", now());
    let channel = format!("realtime:{topic}");
    let db = db().await;
    // A track of this topic waits for advisory lock 4242 before its row goes in.
    let held = PresenceWritesHeld::new(&topic, 4242).await;

    let mut ann = Client::connect(s.port, "1.0.0").await;
    let reply = ann
        .join(&channel, json!({"presence": {"key": "ann"}}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let track = json!({"type": "presence", "event": "track", "payload": {"n": 1}});
    let pushed = ann.push(Some("1"), &channel, "presence", track).await;

    // The worker's write waits on the lock; its backend is ended, as a stopped server ends it.
    let pid = held.writer().await;
    let ended: bool = db
        .query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(ended, "the presence write's backend ended");
    held.release().await;

    // Before the fix ann's push was never answered and no view had her (each waited out its
    // 15 s).
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut answered = None;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match tokio::time::timeout(left, ann.next_json(15)).await {
            Ok(Some(f)) if f["event"] == "phx_reply" && f["ref"] == pushed.as_str() => {
                answered = Some(f["payload"]["status"].clone());
                break;
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    assert_eq!(
        answered,
        Some(json!("ok")),
        "ann's track was not answered ok; sidecar log:\n{}",
        s.log()
    );
    let mut watcher = Client::connect(s.port, "1.0.0").await;
    let reply = watcher
        .join(&channel, json!({"presence": {"key": "", "enabled": true}}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let seen = watcher.sees_presence_of("ann", 15).await;
    assert!(seen, "the watcher never saw ann; sidecar log:\n{}", s.log());
}
