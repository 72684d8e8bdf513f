//! The one way to a joined channel's socket: which connection, its serializer, the
//! channel's topic and join_ref, and the connection's outbound queue. Every registry that
//! sends to a channel (the hub, Postgres Changes listeners, presence watchers, a history
//! being sent, the relay's and the presence worker's answers) holds a `Reach` and builds
//! its envelopes here, so the reply, push and `system` frames are written in one place.
//!
//! A `Reach` never decides that its client is too slow: `send` hands the frame to the
//! outbound queue, which marks itself overflowed when full, and the socket loop closes the
//! connection (`queue`).

use super::gate::{Gate, Opened};
use super::queue::{self, Sent};
use super::slots::Hold;
use crate::frame::{self, Inbound, Vsn};
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
    out: queue::Sender,
}

impl Link {
    pub fn new(id: ConnId, vsn: Vsn, origin: i64, out: queue::Sender) -> Self {
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
            gate: None,
        }
    }
}

/// Where a live frame stands in queue order: the queue's epoch and the message's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub epoch: i64,
    pub seq: i64,
}

/// A frame a Postgres Changes check decided for one of the slots it left (`Reach::fill`).
pub struct Fill {
    pub job: u64,
    /// The change's index in its check.
    pub change: u32,
    pub frame: Message,
    /// The change's place, for a channel behind a gate; None for a frame that is not the
    /// change itself (a notice that it was withheld) or when the caller has none to give.
    pub at: Option<At>,
}

/// The way to one joined channel.
#[derive(Clone)]
pub struct Reach {
    pub conn: ConnId,
    pub vsn: Vsn,
    /// The channel's topic as the client named it: `realtime:` and the sub-topic.
    pub topic: Arc<str>,
    pub join_ref: Option<Arc<str>>,
    out: queue::Sender,
    /// What the drain hands this channel waits here behind its changes whose check is
    /// pending (`slots`); shared by every clone of this channel's `Reach`.
    hold: Arc<Hold>,
    /// While the channel's history is sent, its live frames wait here (`gate`); shared by
    /// every clone made after `gated`.
    gate: Option<Arc<Gate>>,
}

impl Reach {
    /// The channel's topic without `realtime:`, as `system` messages name it.
    pub fn sub_topic(&self) -> &str {
        frame::sub_topic(&self.topic)
    }

    pub fn join_ref(&self) -> Option<&str> {
        self.join_ref.as_deref()
    }

    /// This channel's way with a gate that holds its live frames until its history is sent
    /// (`open_gate`), holding at most `max_frames` frames and `max_bytes` bytes.
    pub fn gated(mut self, max_frames: usize, max_bytes: usize) -> Reach {
        self.gate = Some(Gate::new(max_frames, max_bytes));
        self
    }

    /// The same way without the gate: for live frames the history does not resend (the
    /// changes of a channel that does not resume them), which must not wait for it.
    pub fn ungated(&self) -> Reach {
        Reach {
            gate: None,
            ..self.clone()
        }
    }

    /// The channel's live frames wait behind a history's gate (open or not).
    pub fn is_gated(&self) -> bool {
        self.gate.is_some()
    }

    // 1. Live frames, handed out by the drain at their queue place: through the gate, then
    //    behind the changes whose check is pending, then the queue or the socket.

    /// A message that tells the position `at` (Postgres Changes' `position`): held by the
    /// gate while the history is sent, where it goes after every frame of that sequence
    /// (None), dropped if the history went past it (None), otherwise queued behind the
    /// pending slots. It is not recorded as sent: it names the end of its batch while the
    /// batch's changes may still be checked.
    pub fn live_position(&self, at: At, frame: Message) -> Option<Sent> {
        let frame = self.pass(at, frame, true)?;
        Some(self.hold.send(frame, &self.out))
    }

    /// A run of live frames in queue order (`at[i]` is `frames[i]`'s place), written to the
    /// socket at once when nothing waits (`queue::Sender::send_batch`): how many were taken
    /// of those that passed the gate, and why the rest were not.
    pub fn live_run(&self, frames: &[Message], at: &[At]) -> (usize, Sent) {
        debug_assert_eq!(frames.len(), at.len());
        let passed: Vec<Message>;
        let frames = match &self.gate {
            None => frames,
            Some(_) => {
                passed = frames
                    .iter()
                    .zip(at)
                    .filter_map(|(f, at)| self.pass(*at, f.clone(), false))
                    .collect();
                &passed
            }
        };
        if frames.is_empty() {
            return (0, Sent::Queued);
        }
        if !self.hold.is_clear() {
            return self.each_in_order(frames);
        }
        self.out.send_batch(frames)
    }

    /// The hub's fast path: a run of frames encoded once for many channels
    /// (`write::encode`). None for a channel behind a gate, whose frames pass it one by one
    /// (`live_run`).
    pub fn live_encoded(&self, frames: &[Message], encoded: &Bytes) -> Option<(usize, Sent)> {
        if self.gate.is_some() {
            return None;
        }
        if !self.hold.is_clear() {
            return Some(self.each_in_order(frames));
        }
        Some(self.out.send_encoded(frames, encoded))
    }

    /// A frame the drain hands out with no queue place of its own (a notice about the
    /// queue or a change): behind the pending slots, never held by the gate.
    pub fn in_order(&self, frame: Message) -> Sent {
        self.hold.send(frame, &self.out)
    }

    /// Leaves a slot for change `change` of check `job` at `seq` in this channel's order
    /// (`Hold::slot`); false if the channel was cut off for holding too much.
    pub fn slot(&self, job: u64, change: u32, seq: i64) -> bool {
        self.hold.slot(job, change, seq, &self.out)
    }

    /// Checks `jobs` decided: their slots here get `frames`, each through the gate at its
    /// place (`Hold::fill`). Returns how many frames passed, and how many of those had a
    /// place (were a change's own frame, not a notice).
    pub fn fill(&self, jobs: &[u64], frames: Vec<Fill>) -> (usize, usize) {
        let mut placed = 0;
        // Collected in place: the frames' own allocation is reused.
        let passed: Vec<_> = frames
            .into_iter()
            .filter_map(|f| {
                let frame = match (f.at, &self.gate) {
                    (Some(at), Some(_)) => self.pass(at, f.frame, false)?,
                    _ => f.frame,
                };
                // None above: held by the gate (let out when it opens) or already sent as
                // history; the slot is filled with nothing here.
                placed += usize::from(f.at.is_some());
                Some((f.job, f.change, frame))
            })
            .collect();
        let n = passed.len();
        self.hold.fill(jobs, passed, &self.out);
        (n, placed)
    }

    fn pass(&self, at: At, frame: Message, position: bool) -> Option<Message> {
        match &self.gate {
            None => Some(frame),
            Some(gate) if position => gate.pass_position(at.epoch, at.seq, frame),
            Some(gate) => gate.pass(at.epoch, at.seq, frame),
        }
    }

    fn each_in_order(&self, frames: &[Message]) -> (usize, Sent) {
        for (i, f) in frames.iter().enumerate() {
            let sent = self.hold.send(f.clone(), &self.out);
            if sent != Sent::Queued {
                return (i, sent);
            }
        }
        (frames.len(), Sent::Queued)
    }

    // 2. The history's side of the gate.

    /// The history went through `through` (`dedupe`: and what else it sent): `first` (the
    /// resume's system message), then the frames the gate held after it, go out in queue
    /// order among the pending slots, under the gate's lock, so no later live frame
    /// overtakes them (`Gate::open`). Without a gate: `Opened::Closed`.
    pub fn open_gate(&self, epoch: i64, dedupe: (i64, Vec<i64>), first: Option<Message>) -> Opened {
        let Some(gate) = &self.gate else {
            return Opened::Closed;
        };
        gate.open(epoch, dedupe, first, |frames| {
            self.hold.merge(frames, &self.out)
        })
    }

    /// Records that the history queued the message at `at` to the socket.
    pub fn history_sent(&self, at: At) {
        if let Some(gate) = &self.gate {
            gate.sent(at.epoch, at.seq);
        }
    }

    /// The position of the last message queued to the socket through the gate.
    pub fn last_sent(&self) -> Option<(i64, i64)> {
        self.gate.as_ref().and_then(|g| g.last_sent())
    }

    /// The channel left: nothing more passes the gate, and its history still being sent
    /// stops. Returns the sequence its history went through, if it was sent.
    pub fn close_gate(&self) -> Option<i64> {
        self.gate.as_ref().and_then(|g| g.close())
    }

    /// The gate was closed (the channel left, or the client fell too far behind).
    pub fn gate_closed(&self) -> bool {
        self.gate.as_ref().is_some_and(|g| g.is_closed())
    }

    // 3. Leaving, and what is not live.

    /// The channel left: nothing held or handed to it later reaches the socket.
    /// Returns where what it held began, past `after` (`Hold::close`).
    pub fn close_hold(&self, after: i64) -> Option<i64> {
        self.hold.close(after)
    }

    /// Names this channel's hold: the same for every clone of this channel's `Reach`.
    pub fn hold_id(&self) -> usize {
        Arc::as_ptr(&self.hold) as usize
    }

    /// Queues a frame that is not live (a reply, presence, a history's resent frames):
    /// never behind the gate or the slots.
    pub fn send(&self, m: Message) -> Sent {
        self.out.send(m)
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

    /// Ends the connection as too slow (`queue::Sender::cut_off`).
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
        let (tx, rx) = queue::channel(8);
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
        let (tx, rx) = queue::channel(1);
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
