//! Fixed bug (issue 42): a presence leave committed while a sidecar had not yet drained it,
//! then lost with the queue when Postgres restarted (a failover loses it the same way: the
//! queue is the old primary's memory), left the member in that sidecar's view for ever: a
//! ghost on every channel watching there. A new epoch now reads the views again from the
//! table and sends each watching channel the state, which Phoenix's client diffs against
//! its own (the member leaves).

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// A watcher's view as Phoenix's client keeps it: key → refs, moved by `presence_state`
/// (replaces it) and `presence_diff` (joins add, leaves remove).
#[derive(Default)]
struct View(BTreeMap<String, BTreeSet<String>>);

impl View {
    fn refs(entry: &Value) -> BTreeSet<String> {
        entry["metas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["phx_ref"].as_str().map(str::to_owned))
            .collect()
    }

    /// Applies a frame; true if it was a presence frame.
    fn apply(&mut self, frame: &Value) -> bool {
        let p = &frame["payload"];
        match frame["event"].as_str() {
            Some("presence_state") => {
                self.0 = p
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, e)| (k.clone(), Self::refs(e)))
                    .collect();
            }
            Some("presence_diff") => {
                for (k, e) in p["joins"].as_object().into_iter().flatten() {
                    self.0.entry(k.clone()).or_default().extend(Self::refs(e));
                }
                for (k, e) in p["leaves"].as_object().into_iter().flatten() {
                    if let Some(refs) = self.0.get_mut(k) {
                        refs.retain(|r| !Self::refs(e).contains(r));
                        if refs.is_empty() {
                            self.0.remove(k);
                        }
                    }
                }
            }
            _ => return false,
        }
        true
    }

    /// Reads `c`'s frames until `done` holds of the view, at most `secs`.
    async fn until(&mut self, c: &mut Client, secs: u64, done: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match tokio::time::timeout(left, c.next_json(secs)).await {
                Ok(Some(frame)) => {
                    self.apply(&frame);
                }
                _ => return false,
            }
        }
        true
    }
}

#[tokio::test]
async fn a_leave_lost_with_the_queue_in_a_restart_still_reaches_the_watchers() {
    let a = Sidecar::start("t_leave_lost_a", &[]).await;
    let b = Sidecar::start("t_leave_lost_b", &[]).await;
    let topic = format!("leave-lost-{}", now());
    let channel = format!("realtime:{topic}");

    // ann tracks on sidecar a; a watcher on sidecar b sees her.
    let mut ann = Client::connect(a.port, "1.0.0").await;
    let reply = ann
        .join(&channel, json!({"presence": {"key": "ann"}}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let track = json!({"type": "presence", "event": "track", "payload": {"n": 1}});
    let r = ann.push(Some("1"), &channel, "presence", track).await;
    assert_eq!(ann.reply(&r).await["status"], "ok");
    let mut watcher = Client::connect(b.port, "1.0.0").await;
    let reply = watcher
        .join(&channel, json!({"presence": {"key": "", "enabled": true}}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let mut view = View::default();
    assert!(
        view.until(&mut watcher, 10, |v| v.0.contains_key("ann"))
            .await,
        "the watcher sees ann"
    );

    // Sidecar b stops draining (the process stopped, and its drain's backend ended: one
    // waiting in a drain call would send the leave to the stopped process's socket); ann
    // leaves, and her leave is committed to the queue; then Postgres restarts before b has
    // read it.
    b.signal("STOP");
    let db = db().await;
    assert!(
        end_drain_backend(&db, &b.consumer).await,
        "b's drain backend ended"
    );
    let untrack = json!({"type": "presence", "event": "untrack"});
    let r = ann.push(Some("1"), &channel, "presence", untrack).await;
    assert_eq!(ann.reply(&r).await["status"], "ok");
    let live: i64 = db
        .query_one(
            "SELECT count(*) FROM realtime.presences WHERE topic = $1 AND left_at IS NULL",
            &[&topic],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, 0, "ann's leave committed");
    drop(db);
    restart_postgres();
    b.signal("CONT");

    // Before the fix the watcher's view kept ann for good (this waited out its 30 s).
    let gone = view
        .until(&mut watcher, 30, |v| !v.0.contains_key("ann"))
        .await;
    assert!(
        gone,
        "ann is still in the watcher's view 30 s after the restart: {:?}",
        view.0
    );
}
