//! The one way to a joined channel's socket: which connection, its serializer, the
//! channel's topic and join_ref, and the connection's outbound queue. Every registry that
//! sends to a channel (the hub, Postgres Changes listeners, presence watchers, a history
//! being sent, the relay's and the presence worker's answers) holds a `Reach` and builds
//! its envelopes here, so the reply, push and `system` frames are written in one place.
//!
//! A `Reach` never decides that its client is too slow: `send` hands the frame to the
//! outbound queue, which marks itself overflowed when full, and the socket loop closes the
//! connection (`outbound`).

use crate::change_hold::Hold;
use crate::frame::{self, Inbound, Vsn};
use crate::outbound::{self, Sent};
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio_tungstenite::tungstenite::Message;

pub type ConnId = u64;

/// How one connection is reached: what each of its channels' `Reach` is made from.
pub struct Link {
    pub id: ConnId,
    pub vsn: Vsn,
    /// The connection as `realtime.relay` origins name it.
    pub origin: i64,
    out: outbound::Sender,
}

impl Link {
    pub fn new(id: ConnId, vsn: Vsn, origin: i64, out: outbound::Sender) -> Self {
        Link {
            id,
            vsn,
            origin,
            out,
        }
    }

    /// The way to one of this connection's channels (`topic`: `realtime:...`).
    pub fn reach(&self, topic: &str, join_ref: Option<&str>) -> Reach {
        Reach {
            conn: self.id,
            vsn: self.vsn,
            topic: topic.into(),
            join_ref: join_ref.map(Into::into),
            out: self.out.clone(),
            hold: Arc::default(),
        }
    }
}

/// The way to one joined channel.
#[derive(Clone)]
pub struct Reach {
    pub conn: ConnId,
    pub vsn: Vsn,
    /// The channel's topic as the client named it: `realtime:` and the sub-topic.
    pub topic: Arc<str>,
    pub join_ref: Option<Arc<str>>,
    out: outbound::Sender,
    /// What the drain hands this channel waits here behind its changes whose check is
    /// pending (`change_hold`); shared by every clone of this channel's `Reach`.
    hold: Arc<Hold>,
}

impl Reach {
    /// The channel's topic without `realtime:`, as `system` messages name it.
    pub fn sub_topic(&self) -> &str {
        frame::sub_topic(&self.topic)
    }

    pub fn join_ref(&self) -> Option<&str> {
        self.join_ref.as_deref()
    }

    /// Queues a frame made for this channel (or shared by many channels).
    pub fn send(&self, m: Message) -> Sent {
        self.out.send(m)
    }

    /// Queues a frame the drain hands out (a broadcast, a change, a drain's `system`
    /// notice): in queue order behind this channel's changes whose check is pending.
    pub fn send_ordered(&self, m: Message) -> Sent {
        self.hold.send(m, &self.out)
    }

    /// Leaves a slot for change `change` of check `job` in this channel's queue order
    /// (`Hold::slot`); false if the channel was cut off for holding too much.
    pub fn hold_slot(&self, job: u64, change: u32, seq: i64) -> bool {
        self.hold.slot(job, change, seq, &self.out)
    }

    /// Puts the live frames a history's gate held among the channel's pending changes, by
    /// their queue positions (`change_hold::Hold::merge`).
    pub fn merge_held(&self, frames: Vec<((i64, bool), Message)>) -> Sent {
        self.hold.merge(frames, &self.out)
    }

    /// Checks `jobs` decided: their slots here get `frames` (`Hold::fill`).
    pub fn fill_slots(&self, jobs: &[u64], frames: Vec<crate::change_hold::Filled>) {
        self.hold.fill(jobs, frames, &self.out)
    }

    /// The channel left: nothing held or handed to it later reaches the socket.
    /// Returns where what it held began, past `after` (`Hold::close`).
    pub fn close_hold(&self, after: i64) -> Option<i64> {
        self.hold.close(after)
    }

    /// Names this channel's hold: the same for every clone of this channel's `Reach`.
    pub fn hold_id(&self) -> usize {
        Arc::as_ptr(&self.hold) as usize
    }

    /// Sends a run of frames in order, written at once when nothing is waiting
    /// (`outbound::Sender::send_batch`): how many were taken, and why the rest were not.
    /// A channel with changes whose check is pending queues the run behind them instead
    /// (`send_ordered`, frame by frame).
    pub fn send_batch(&self, frames: &[Message]) -> (usize, Sent) {
        if !self.hold.is_clear() {
            return self.send_each_ordered(frames);
        }
        self.out.send_batch(frames)
    }

    /// `send_batch` with the frames encoded once for many channels (`wire::encode`).
    pub fn send_encoded(&self, frames: &[Message], encoded: &Bytes) -> (usize, Sent) {
        if !self.hold.is_clear() {
            return self.send_each_ordered(frames);
        }
        self.out.send_encoded(frames, encoded)
    }

    fn send_each_ordered(&self, frames: &[Message]) -> (usize, Sent) {
        for (i, f) in frames.iter().enumerate() {
            let sent = self.send_ordered(f.clone());
            if sent != Sent::Queued {
                return (i, sent);
            }
        }
        (frames.len(), Sent::Queued)
    }

    /// Queues a text frame.
    pub fn send_text(&self, text: String) -> Sent {
        self.send(Message::text(text))
    }

    /// A server push on the channel (no ref).
    pub fn push(&self, event: &str, payload: &Value) -> Sent {
        self.send_text(frame::encode(
            self.vsn,
            self.join_ref(),
            None,
            &self.topic,
            event,
            payload,
        ))
    }

    /// A server push whose payload is JSON text made once for many channels.
    pub fn push_json_frame(&self, event: &str, payload_json: &str) -> Message {
        Message::text(frame::push_json(
            self.vsn,
            self.join_ref(),
            &self.topic,
            event,
            payload_json,
        ))
    }

    /// A `system` message of the channel, as realtime-js hands them to the app.
    pub fn system_text(&self, status: &str, message: &str) -> String {
        frame::system(self.vsn, self.join_ref(), &self.topic, status, message)
    }

    pub fn system(&self, status: &str, message: &str) -> Sent {
        self.send_text(self.system_text(status, message))
    }

    /// A `system` message about one extension of the channel (`postgres_changes`).
    pub fn system_of(&self, extension: &str, status: &str, message: &str) -> Sent {
        self.send_text(frame::system_of(
            self.vsn,
            self.join_ref(),
            &self.topic,
            extension,
            status,
            message,
        ))
    }

    /// A `phx_close` of the channel.
    pub fn close_text(&self) -> String {
        frame::encode(
            self.vsn,
            self.join_ref(),
            None,
            &self.topic,
            "phx_close",
            &json!({}),
        )
    }

    /// A Postgres Changes event for this channel (`data_json` as is).
    pub fn postgres_changes_text(&self, ids: &[u32], data_json: &str) -> String {
        frame::postgres_changes(self.vsn, &self.topic, ids, data_json)
    }

    /// Where the answer to push `m` goes: the same channel, under the push's own join_ref
    /// and ref (a push with a missing or stale join_ref is answered as it came).
    pub fn answering(&self, m: &Inbound) -> ReplyTo {
        ReplyTo {
            reach: Reach {
                join_ref: m.join_ref.as_deref().map(Into::into),
                ..self.clone()
            },
            reference: m.reference.clone(),
        }
    }

    /// Frames that could be queued now (a history send paces itself by it).
    pub fn room(&self) -> usize {
        self.out.capacity()
    }

    pub fn max_capacity(&self) -> usize {
        self.out.max_capacity()
    }

    /// The connection's task is gone.
    pub fn is_closed(&self) -> bool {
        self.out.is_closed()
    }

    /// Ends the connection as too slow (`outbound::Sender::cut_off`).
    pub fn cut_off(&self) {
        self.out.cut_off()
    }
}

/// Where the answer to one client push goes, later: the relay's once a broadcast
/// committed, the presence worker's once a track did.
pub struct ReplyTo {
    pub reach: Reach,
    pub reference: Option<String>,
}

impl ReplyTo {
    /// The `phx_reply` text with `payload` (`{status, response}`).
    pub fn reply_text(&self, payload: &Value) -> String {
        let r = &self.reach;
        frame::encode(
            r.vsn,
            r.join_ref(),
            self.reference.as_deref(),
            &r.topic,
            "phx_reply",
            payload,
        )
    }

    /// Queues the `phx_reply` (a full queue means the client is being cut off anyway).
    pub fn reply(&self, payload: &Value) -> Sent {
        self.reach.send_text(self.reply_text(payload))
    }

    pub fn ok(&self) -> Sent {
        self.reply(&json!({"status": "ok", "response": {}}))
    }

    pub fn error(&self, reason: &str) -> Sent {
        self.reply(&json!({"status": "error", "response": {"reason": reason}}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound(join_ref: Option<&str>, reference: &str) -> Inbound {
        Inbound {
            join_ref: join_ref.map(Into::into),
            reference: Some(reference.into()),
            topic: "realtime:room".into(),
            event: "broadcast".into(),
            payload: json!({}),
        }
    }

    #[test]
    fn envelopes_carry_the_channel_and_answers_the_push() {
        let (tx, rx) = outbound::channel(8);
        let link = Link::new(7, Vsn::V2, 70, tx);
        let reach = link.reach("realtime:room", Some("j1"));
        assert_eq!(reach.sub_topic(), "room");
        reach.system("ok", "hello");
        reach.answering(&inbound(None, "r9")).ok();
        let frames: Vec<Value> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| serde_json::from_str(m.to_text().unwrap()).unwrap())
            .collect();
        assert_eq!(
            frames[0],
            json!(["j1", null, "realtime:room", "system",
                   {"extension": "system", "status": "ok", "message": "hello", "channel": "room"}])
        );
        // A push sent without a join_ref is answered as it came.
        assert_eq!(
            frames[1],
            json!([null, "r9", "realtime:room", "phx_reply", {"status": "ok", "response": {}}])
        );
    }

    #[test]
    fn a_full_queue_is_reported_by_every_reach_of_the_connection() {
        let (tx, rx) = outbound::channel(1);
        let link = Link::new(1, Vsn::V1, 1, tx);
        let (a, b) = (
            link.reach("realtime:a", None),
            link.reach("realtime:b", None),
        );
        assert_eq!(a.system("ok", "1"), Sent::Queued);
        assert_eq!(b.system("ok", "2"), Sent::Full);
        assert_eq!(a.system("ok", "3"), Sent::Full, "the connection is closing");
        drop(rx);
        assert_eq!(a.system("ok", "4"), Sent::Closed);
    }
}
