//! MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL: a channel's presence pushes wait for their change
//! to commit, so while the database holds a write they pile up. Past the limit a push is
//! refused at once, with the limit's name, and changes nothing; once the database answers,
//! every waiting push is answered and the channel may push again. Here a trigger on the
//! members' table holds the channel's first write on a lock the test holds.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const LOCK: i64 = 4243;

/// Reads `client`'s frames for at most `secs` until the replies to every ref in `refs` came;
/// returns them by ref (those that did not come are missing).
async fn replies(client: &mut Client, refs: &[&str], secs: u64) -> Vec<(String, Value)> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut got = Vec::new();
    while got.len() < refs.len() {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            break;
        };
        match tokio::time::timeout(left, client.next_json(secs)).await {
            Ok(Some(f)) if f["event"] == "phx_reply" => {
                let r = f["ref"].as_str().unwrap_or_default();
                if refs.contains(&r) {
                    got.push((r.to_owned(), f["payload"].clone()));
                }
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    got
}

#[tokio::test]
async fn pushes_past_the_limit_are_refused_while_the_database_holds_the_channels_write() {
    let s = Sidecar::start(
        "t_presence_pushes_waiting",
        &[("MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL", "3")],
    )
    .await;
    let topic = format!("pushes-waiting-{}", now());
    let channel = format!("realtime:{topic}");
    let held = PresenceWritesHeld::new(&topic, LOCK).await;

    let mut ann = Client::connect(s.port, "1.0.0").await;
    let reply = ann
        .join(&channel, json!({"presence": {"key": "ann"}}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let track = |n: u32| json!({"type": "presence", "event": "track", "payload": {"n": n}});
    let first = ann.push(Some("1"), &channel, "presence", track(1)).await;

    // The first write waits on the lock; two more pushes wait behind it.
    held.writer().await;
    let second = ann.push(Some("1"), &channel, "presence", track(2)).await;
    let third = ann.push(Some("1"), &channel, "presence", track(3)).await;

    // Past the limit: refused at once, the track and the untrack alike.
    let fourth = ann.push(Some("1"), &channel, "presence", track(4)).await;
    let untrack = json!({"type": "presence", "event": "untrack"});
    let fifth = ann.push(Some("1"), &channel, "presence", untrack).await;
    let refused = replies(&mut ann, &[&fourth, &fifth], 5).await;
    let reason = "Too many presence pushes of this channel are waiting for the database: \
                  the limit is 3 (MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL)";
    assert_eq!(refused.len(), 2, "refused: {refused:?}");
    for (r, payload) in &refused {
        assert_eq!(payload["status"], "error", "push {r}: {payload}");
        assert_eq!(payload["response"]["reason"], reason, "push {r}: {payload}");
    }

    held.release().await;
    let answered = replies(&mut ann, &[&first, &second, &third], 15).await;
    assert_eq!(
        answered.len(),
        3,
        "answered: {answered:?}; log:\n{}",
        s.log()
    );
    for (r, payload) in &answered {
        assert_eq!(payload["status"], "ok", "push {r}: {payload}");
    }
    // The refused pushes changed nothing: once this sidecar's view has the third push's
    // meta (its diff comes through the queue, after the push was answered), ann is there
    // with that meta alone.
    let mut watcher = Client::connect(s.port, "1.0.0").await;
    let reply = watcher
        .join(&channel, json!({"presence": {"key": "", "enabled": true}}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let n_of = |f: &Value| -> Option<Value> {
        let ann = match f["event"].as_str() {
            Some("presence_state") => &f["payload"]["ann"],
            Some("presence_diff") => &f["payload"]["joins"]["ann"],
            _ => return None,
        };
        Some(ann["metas"][0]["n"].clone())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let f = watcher.next_json(10).await.expect("presence frames");
        if n_of(&f) == Some(json!(3)) {
            break;
        }
        assert!(Instant::now() < deadline, "ann's third meta never came");
    }
    let mut late = Client::connect(s.port, "1.0.0").await;
    let reply = late
        .join(&channel, json!({"presence": {"key": "", "enabled": true}}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let state = loop {
        let f = late.next_json(10).await.expect("a presence_state");
        if f["event"] == "presence_state" {
            break f["payload"].clone();
        }
    };
    let metas = &state["ann"]["metas"];
    assert_eq!(metas.as_array().map(Vec::len), Some(1), "{state}");
    assert_eq!(metas[0]["n"], 3, "{state}");
    assert_eq!(state.as_object().map(|o| o.len()), Some(1), "{state}");

    // Answered pushes no longer count: the channel pushes again.
    let sixth = ann.push(Some("1"), &channel, "presence", track(6)).await;
    let again = replies(&mut ann, &[&sixth], 10).await;
    assert_eq!(again.len(), 1, "push {sixth} not answered");
    assert_eq!(again[0].1["status"], "ok", "{:?}", again[0]);
}
