//! A channel's history sent, paced so it never takes more than half its outbound queue, then
//! its gate opened; and a channel that goes live without its history, told why.

use super::ask::Ask;
use super::budget::Held;
use super::line::{Permit, Waiting};
use super::request::{Carry, Request, MAX_PASSES};
use crate::frame::{self};
use crate::metrics::Metrics;
use crate::out::Reach;
use crate::out::Sent;
use crate::out::{At, Opened};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// A client that takes nothing from its queue for this long while its history waits is cut
/// off as too slow.
pub(super) const STALL_LIMIT: Duration = Duration::from_secs(30);

/// A `system` message of the history (queued through the gate, after the history's frames).
pub(super) fn system_frame(reach: &Reach, payload: &Value) -> Message {
    Message::text(frame::encode(
        reach.vsn,
        reach.join_ref(),
        None,
        &reach.topic,
        "system",
        payload,
    ))
}

/// The history could not be read: the channel goes live, told that nothing was recovered.
impl Waiting for Request {
    fn hold(&mut self, permit: Permit) {
        self.permit = Some(permit);
    }

    fn live(&self) -> bool {
        !self.reach.gate_closed() && !self.reach.is_closed()
    }

    fn unavailable(self, why: Option<&str>, metrics: &Metrics) {
        match why {
            Some(why) => unavailable_because(self, why, metrics),
            None => unavailable(self, metrics),
        }
    }
}

pub fn unavailable(r: Request, metrics: &Metrics) {
    unavailable_because(
        r,
        "The database could not be read to resume this channel; it is live from now on",
        metrics,
    );
}

/// The channel goes live without its history, a resume told why in `message` (a replay,
/// which Supabase ends without a word, just goes live).
pub fn unavailable_because(r: Request, message: &str, metrics: &Metrics) {
    metrics.history_unrecovered_total.increment(1);
    let sub = &r.key.topic;
    let system = matches!(r.ask, Ask::Resume { .. }).then(|| {
        system_frame(
            &r.reach,
            &json!({"extension": "broadcast", "status": "error", "channel": sub,
                    "recovered": false, "first_missing": null, "last_missing": null, "resent": 0,
                    "message": message}),
        )
    });
    // Nothing was sent from history: every held live frame passes.
    let (tx, _) = mpsc::channel(1);
    tokio::spawn(send(
        r,
        0,
        (Vec::new(), None),
        system,
        (0, Vec::new()),
        Carry::default(),
        tx,
    ));
}

/// Sends one channel's history (sequence, frame), paced so that it never takes more than
/// half the outbound queue; then opens its gate (`dedupe`: what live frames it drops),
/// `system` first. If the gate overflowed meanwhile, the join goes back to `again` for
/// another pass instead.
pub(super) async fn send(
    r: Request,
    epoch: i64,
    (frames, mut held): (Vec<(i64, Message)>, Option<Held>),
    system: Option<Message>,
    dedupe: (i64, Vec<i64>),
    carry: Carry,
    again: mpsc::Sender<Request>,
) {
    let room = r.reach.max_capacity() / 2;
    let mut progress = Instant::now();
    for (seq, f) in frames {
        loop {
            if r.reach.gate_closed() || r.reach.is_closed() {
                return;
            }
            if r.reach.room() > room {
                break;
            }
            if progress.elapsed() > STALL_LIMIT {
                r.reach.close_gate();
                r.reach.cut_off();
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let bytes = f.len();
        if r.reach.send(f) != Sent::Queued {
            // A full queue closes the connection as too slow (`crate::out`).
            r.reach.close_gate();
            return;
        }
        // Queued to the socket: the outbound queue's bound (MAX_OUTBOUND_BYTES) holds it now.
        if let Some(h) = &mut held {
            h.give_back(bytes);
        }
        // A persisted message the ring no longer holds has no position (sequence 0).
        if seq > 0 {
            r.reach.history_sent(At { epoch, seq });
        }
        progress = Instant::now();
    }
    let through = dedupe.0;
    let dropped_from = match r.reach.open_gate(epoch, dedupe, system) {
        Opened::ReadAgain(first) => first,
        Opened::Yes | Opened::Closed => return,
    };
    // After a resume's pass everything up to its read's end was sent; after a replay, only
    // what it replayed, so the next pass starts before the first live frame dropped.
    let from = if carry.skip.is_empty() || carry.from.is_some() {
        through
    } else {
        dropped_from - 1
    };
    if carry.passes >= MAX_PASSES {
        r.reach.close_gate();
        r.reach.cut_off();
        return;
    }
    let next = Request {
        ask: Ask::Resume { epoch, seq: from },
        carry: Some(carry),
        ..r
    };
    if let Err(e) = again.try_send(next) {
        let r = match e {
            mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
        };
        r.reach.close_gate();
        r.reach.cut_off();
    }
}
