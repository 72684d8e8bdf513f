//! When Postgres restarts, the sidecar reconnects with backoff, subscribers are told that the
//! database went away and that messages may have been lost, and delivery resumes.

mod common;

use common::*;
use serde_json::Value;

async fn next_system(c: &mut Client) -> Value {
    loop {
        let m = c.next_json(20).await.expect("a system message within 20 s");
        if m["event"] == "system" {
            return m["payload"].clone();
        }
    }
}

/// Also a fixed bug: after a restart the sidecar's new slot started at the end of the queue,
/// so messages committed after the restart but before it reconnected never arrived. The
/// sidecar's login is kept from reconnecting while they are committed, so they are.
#[tokio::test]
async fn postgres_restart_is_survived_and_nothing_committed_since_is_lost() {
    let mut sidecar = Sidecar::start("t_pg_restart", &[]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:survive").await;
    let db = db().await;
    // A position of the epoch before the restart, for the resume at the end.
    db.execute(
        "SELECT realtime.send('{\"before\": 1}', 'ev', 'survive', false)",
        &[],
    )
    .await
    .unwrap();
    let before = c.next_json(10).await.expect("a message before the restart");
    let old_meta = before["payload"]["meta"].clone();
    db.batch_execute("ALTER ROLE realtime_sidecar NOLOGIN")
        .await
        .unwrap();
    restart_postgres();
    let away = next_system(&mut c).await;
    assert_eq!(away["status"], "error");
    assert!(
        away["message"]
            .as_str()
            .unwrap()
            .starts_with("The database is unavailable"),
        "{away}"
    );
    let db = common::db().await;
    db.execute(
        "SELECT realtime.send(jsonb_build_object('during', i), 'ev', 'survive', false) FROM generate_series(1, 3) i",
        &[],
    )
    .await
    .unwrap();
    db.batch_execute("ALTER ROLE realtime_sidecar LOGIN")
        .await
        .unwrap();
    let back = next_system(&mut c).await;
    assert_eq!(back["status"], "error");
    assert!(
        back["message"]
            .as_str()
            .unwrap()
            .starts_with("The database restarted"),
        "{back}"
    );
    for i in 1..=3 {
        let m = c.next_json(10).await.expect("committed while reconnecting");
        assert_eq!(m["payload"]["payload"]["during"], i, "{m}");
    }
    sidecar.wait_healthy().await.unwrap();
    db.execute(
        "SELECT realtime.send('{\"after\": \"restart\"}', 'ev', 'survive', false)",
        &[],
    )
    .await
    .unwrap();
    let m = c.next_json(10).await.expect("delivery resumes");
    assert_eq!(m["payload"]["payload"]["after"], "restart");

    // A client that was away across the restart resumes with its old position: it gets what
    // the new epoch holds of the topic, and a system message naming the epoch change. (Also
    // a fixed bug: the history task's connection had died with the restart, and the first
    // resume after it was told the database could not be read, with nothing resent.)
    let mut late = Client::connect(sidecar.port, "1.0.0").await;
    let r = late
        .join(
            "realtime:survive",
            serde_json::json!({"broadcast": {"resume": old_meta}}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let mut payloads = Vec::new();
    let system = loop {
        let m = late.next_json(10).await.expect("the resume's messages");
        match m["event"].as_str() {
            Some("broadcast") => payloads.push(m["payload"]["payload"].clone()),
            Some("system") => break m["payload"].clone(),
            _ => {}
        }
    };
    assert_eq!(
        payloads.len(),
        4,
        "the 3 sent while away and the one after: {payloads:?}"
    );
    assert_eq!(system["recovered"], false, "{system}");
    assert_eq!(system["epoch_changed"], true, "{system}");
    assert_ne!(system["epoch"], old_meta["epoch"]);
    assert_eq!(
        system["first_missing"],
        old_meta["seq"].as_i64().unwrap() + 1,
        "{system}"
    );
}
