//! Fixed bug (issue 42): a presence join published while a sidecar's slot received
//! everything, and not yet read when the sidecar's first listen turned filtering on, was
//! skipped by its drain: the watchers there never saw the member. After a failover every
//! sidecar's slot is new on the promoted standby, and so unfiltered; a sidecar reads the new
//! queue from its start and loads its views, and its listen may come only after another
//! sidecar tracked its members again there. (Found while looking for why the lab's forced
//! failover lost members, which another bug did: `presence_write_lost_with_its_connection`.)
//! The same state is made here without a failover: the slot is set to receive everything
//! (`realtime.listen_all`), the sidecar is stopped with its drain's backend ended, a member
//! joins, and the first listen comes after.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn a_join_published_before_the_first_listen_reaches_the_watchers() {
    let s = Sidecar::start("t_first_listen_join", &[]).await;
    let topic = format!("first-listen-{}", now());
    let channel = format!("realtime:{topic}");
    let db = db().await;

    // A watcher on the sidecar: its view of the topic is loaded (empty), and the topic is
    // listened to.
    let mut watcher = Client::connect(s.port, "1.0.0").await;
    let reply = watcher
        .join(&channel, json!({"presence": {"key": "", "enabled": true}}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let loaded = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watcher.next_json(10).await {
                Some(f) if f["event"] == "presence_state" => return true,
                Some(_) => {}
                None => return false,
            }
        }
    })
    .await;
    assert_eq!(loaded, Ok(true), "the watcher's first presence_state");

    // The slot as a promoted standby has it: receiving everything. The sidecar stopped and
    // its drain's backend ended, so nothing reads the queue until the listen below.
    db.execute("SELECT realtime.listen_all($1)", &[&s.consumer])
        .await
        .unwrap();
    s.signal("STOP");
    assert!(
        end_drain_backend(&db, &s.consumer).await,
        "the sidecar's drain backend ended"
    );

    // Another sidecar's member joins (its session renewed by this connection, which lives
    // to the end of the test, so the reaper leaves it alone).
    db.execute(
        "SELECT realtime.presence_renew('first-listen-other', '60 seconds')",
        &[],
    )
    .await
    .unwrap();
    let joined: Option<String> = db
        .query_one(
            "SELECT realtime.presence_track('first-listen-other', $1, false, 'zed', '{}')",
            &[&topic],
        )
        .await
        .unwrap()
        .get(0);
    assert!(joined.is_some(), "zed's join committed");

    // Then the slot's first listen, as the sidecar's interest worker makes it on a new slot.
    db.execute(
        "SELECT realtime.listen($1, ARRAY[$2])",
        &[&s.consumer, &topic],
    )
    .await
    .unwrap();
    s.signal("CONT");

    // Before the fix the drain skipped zed's join (published before the key was listened
    // to), and the watcher never saw zed (this waited out its 15 s).
    assert!(
        watcher.sees_presence_of("zed", 15).await,
        "the watcher never saw zed's join; sidecar log:\n{}",
        s.log()
    );
}
