//! A channel's position after its Postgres Changes, for a channel that asked for it
//! (`config.broadcast.resume.changes`, `history::ask::change_positions`).
//!
//! A broadcast carries its position in `meta`, which realtime-js hands to the app. A change
//! cannot: realtime-js rebuilds the change for the callback from `data`'s schema, table,
//! commit_timestamp, type, errors and records alone, so a field beside them never reaches
//! the app, and one inside the records would change the app's rows. A `system` message does
//! reach it (`channel.on('system', ...)`): after each drained batch that sent a channel a
//! change, the channel gets one, `{extension: "postgres_changes", status: "ok", message:
//! "position", epoch, seq}`, where `seq` is the batch's end: everything of the channel up
//! to it was queued before it (broadcasts and changes in queue order), so a rejoin with
//! `resume: {epoch, seq, changes: true}` continues exactly after it. One message per batch,
//! not per change: its cost is measured in `pgbench/RESULTS.md`.

use super::subscribers::Subscriber;
use crate::hub::ConnId;
use crate::metrics::Metrics;
use crate::out::At;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_tungstenite::tungstenite::Message;

/// The channels of one batch that were sent a change and asked for positions.
#[derive(Default)]
pub struct Positions {
    sent: HashMap<(ConnId, Arc<str>), Arc<Subscriber>>,
}

impl Positions {
    /// Notes a channel that was left a slot for a change of this batch (its check runs
    /// beside the drain, `crate::out`): its position follows the batch behind the slot. A
    /// channel only told that changes were withheld (no slot) is not noted.
    pub fn note_slot(&mut self, sub: &Arc<Subscriber>) {
        if sub.positions {
            let key = (sub.reach.conn, sub.reach.topic.clone());
            self.sent.entry(key).or_insert_with(|| sub.clone());
        }
    }

    /// After the batch was handed out through `seq`: each channel noted gets its position
    /// (through its gate while its history is being sent, as its changes did).
    pub fn send(self, epoch: i64, seq: i64, metrics: &Metrics) {
        // One encoding per (serializer, topic, join_ref): the members of a room share it.
        type Shape = (crate::frame::Vsn, Arc<str>, Option<Arc<str>>);
        let mut frames: HashMap<Shape, Message> = HashMap::new();
        for sub in self.sent.into_values() {
            let r = &sub.reach;
            let frame = frames
                .entry((r.vsn, r.topic.clone(), r.join_ref.clone()))
                .or_insert_with(|| frame(&sub, epoch, seq))
                .clone();
            // In the channel's order: behind its changes whose check is pending, and
            // through its gate while its history is sent.
            if sub.reach.live_position(At { epoch, seq }, frame).is_some() {
                metrics.change_positions_total.increment(1);
            }
        }
    }
}

/// The `system` message that tells a channel its position.
pub fn frame(sub: &Subscriber, epoch: i64, seq: i64) -> Message {
    let payload = json!({
        "extension": "postgres_changes",
        "status": "ok",
        "message": "position",
        "channel": sub.reach.sub_topic(),
        "epoch": epoch.to_string(),
        "seq": seq,
    });
    Message::text(crate::frame::encode(
        sub.reach.vsn,
        sub.reach.join_ref(),
        None,
        &sub.reach.topic,
        "system",
        &payload,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres_changes::parse_bindings;
    use serde_json::Value;

    fn sub(conn: u64, positions: bool, gated: bool) -> (Arc<Subscriber>, crate::out::Receiver) {
        let (tx, rx) = crate::out::channel(16);
        let link = crate::out::Link::new(conn, crate::frame::Vsn::V1, conn as i64, tx);
        let bindings = serde_json::json!([{"event": "*", "schema": "public", "table": "t"}]);
        let mut reach = link.reach("realtime:tasks", Some("1"));
        if gated {
            reach = reach.gated(100, usize::MAX);
        }
        let s = Subscriber {
            reach,
            bindings: parse_bindings(Some(&bindings)).unwrap(),
            role: "anon".into(),
            claims: "{}".into(),
            positions,
        };
        (Arc::new(s), rx)
    }

    fn payloads(rx: &crate::out::Receiver) -> Vec<Value> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| {
                serde_json::from_str::<Value>(&m.into_text().unwrap()).unwrap()["payload"].clone()
            })
            .collect()
    }

    #[test]
    fn one_position_per_batch_only_to_channels_that_asked_and_were_sent_a_change() {
        let m = Metrics::default();
        let (asked, asked_rx) = sub(1, true, false);
        let (plain, plain_rx) = sub(2, false, false);
        // Channel 3 asked, but got no change of this batch (only a notice, or nothing).
        let (_told_only, told_rx) = sub(3, true, false);
        let mut p = Positions::default();
        for s in [&asked, &asked, &plain] {
            p.note_slot(s);
        }
        p.send(7, 42, &m);
        let got = payloads(&asked_rx);
        assert_eq!(got.len(), 1, "one per batch, not per change");
        assert_eq!(got[0]["extension"], "postgres_changes");
        assert_eq!(got[0]["message"], "position");
        assert_eq!(got[0]["epoch"], "7", "a string, as meta.epoch is");
        assert_eq!(got[0]["seq"], 42, "the batch's end");
        assert_eq!(got[0]["channel"], "tasks");
        assert!(
            payloads(&plain_rx).is_empty(),
            "an app that did not ask sees nothing new"
        );
        assert!(payloads(&told_rx).is_empty(), "a notice alone is no change");
    }

    #[test]
    fn a_position_waits_behind_the_gate_with_the_changes_and_is_dropped_if_the_history_covered_it()
    {
        let m = Metrics::default();
        let (s, rx) = sub(1, true, true);
        let mut p = Positions::default();
        p.note_slot(&s);
        p.send(7, 10, &m);
        let mut p = Positions::default();
        p.note_slot(&s);
        p.send(7, 20, &m);
        assert!(payloads(&rx).is_empty(), "held while the history is sent");
        // The history went through 15: the position at 10 was covered by it, 20 passes.
        assert_eq!(
            s.reach.open_gate(7, (15, vec![]), None),
            crate::out::Opened::Yes
        );
        let got = payloads(&rx);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["seq"], 20);
        // Not counted as sent: a second join of the channel resumes after what was sent,
        // and a position names its batch's end while the batch's changes may still wait
        // for their checks (a loss if the second join dropped them); a duplicate is the
        // cost instead.
        assert_eq!(s.reach.last_sent(), None);
    }
}
