//! Topic → subscribers, and fan-out. A message is encoded at most once per serializer and
//! the same bytes are queued to every subscriber; a subscriber whose queue is full is told
//! to disconnect instead of slowing anyone else down.

use crate::frame::{self, Meta, Vsn};
use crate::metrics::Metrics;
pub use crate::out::ConnId;
use crate::out::Sent;
use crate::out::{At, Reach};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use tokio_tungstenite::tungstenite::Message;

/// Channels are addressed by sub-topic and privacy: a public channel never receives private
/// messages, and the reverse (Supabase keeps them in separate namespaces too).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopicKey {
    pub private: bool,
    pub topic: String,
}

/// A joined channel the hub delivers to.
#[derive(Clone)]
pub struct Subscriber {
    pub reach: Reach,
    /// This channel's connection, as `realtime.relay` origins name it.
    pub origin: i64,
    /// Whether the connection wants its own broadcasts back (`config.broadcast.self`).
    pub self_broadcast: bool,
}

/// A message drained from the queue, ready for fan-out: sent in the database
/// (`realtime.send`, `broadcast_changes`) or a client broadcast relayed through it.
pub struct QueueMessage {
    pub topic: String,
    pub event: String,
    pub payload: Payload,
    pub private: bool,
    /// The message id, sent as `meta.id` (database messages only).
    pub id: Option<String>,
    /// The connection a client broadcast came from.
    pub origin: Option<i64>,
    /// The queue's epoch and the message's sequence: its position, sent in `meta`.
    pub epoch: i64,
    pub seq: i64,
    /// Sent from the queue's history at a join rather than live (`meta.replayed`).
    pub replayed: bool,
    /// A message dropped when it was sent (`extension/src/dropped.rs`), in its place: the
    /// payload is `{"reason", "size"}`, and subscribers get a `system` message saying so.
    pub dropped: bool,
}

impl QueueMessage {
    /// The frame for sockets of serializer `vsn`; None when it cannot carry the message (a
    /// binary payload to a 1.0.0 socket, which Supabase drops too; a field over 255 bytes).
    pub fn frame(&self, vsn: Vsn) -> Option<Message> {
        let channel_topic = frame::channel_topic(&self.topic);
        let meta = Meta {
            id: self.id.as_deref(),
            replayed: self.replayed,
            epoch: self.epoch,
            seq: self.seq,
        };
        if self.dropped {
            return Some(Message::text(self.dropped_notice(
                vsn,
                &channel_topic,
                &meta,
            )));
        }
        match vsn {
            Vsn::V1 => match &self.payload {
                Payload::Json(p) => Some(Message::text(frame::user_broadcast_v1(
                    &channel_topic,
                    &self.event,
                    p,
                    &meta,
                ))),
                Payload::Binary(_) => None,
            },
            Vsn::V2 => {
                let (encoding, bytes) = match &self.payload {
                    Payload::Json(p) => (frame::ENCODING_JSON, p.as_bytes()),
                    Payload::Binary(b) => (frame::ENCODING_BINARY, &b[..]),
                };
                frame::user_broadcast_v2(&channel_topic, &self.event, encoding, bytes, &meta)
                    .map(Message::Binary)
            }
        }
    }
}

impl QueueMessage {
    /// The `system` message that takes a dropped message's place: why, its event and size,
    /// and its position (`meta`, as a broadcast's), so a client that resumes from the last
    /// position it saw goes on after it.
    fn dropped_notice(&self, vsn: Vsn, channel_topic: &str, meta: &Meta) -> String {
        let why: serde_json::Value = match &self.payload {
            Payload::Json(j) => serde_json::from_str(j).unwrap_or_default(),
            Payload::Binary(_) => serde_json::Value::Null,
        };
        let notice = crate::reason::Notice::MessageDropped {
            event: self.event.clone(),
            reason: why["reason"].as_str().unwrap_or("unknown").to_owned(),
            size: why["size"].as_u64().unwrap_or(0),
        };
        let meta: serde_json::Value = serde_json::from_str(&meta.json()).unwrap_or_default();
        let payload = serde_json::json!({
            "extension": "broadcast",
            "status": notice.status(),
            "message": notice.text(),
            "channel": self.topic,
            "dropped": {"event": self.event, "reason": why["reason"], "size": why["size"]},
            "meta": meta,
        });
        frame::encode(vsn, None, None, channel_topic, "system", &payload)
    }
}

/// A message's frames, encoded at most once per serializer for all its subscribers.
#[derive(Default)]
struct Frames {
    v1: OnceLock<Option<Message>>,
    v2: OnceLock<Option<Message>>,
}

impl Frames {
    /// The frame `sub` gets for `m`, at its place, if any: not its own broadcast unless it
    /// asked for those, not what its serializer cannot carry.
    fn for_subscriber(&self, sub: &Subscriber, m: &QueueMessage) -> Option<(At, Message)> {
        if m.origin == Some(sub.origin) && !sub.self_broadcast {
            return None;
        }
        let frame = self.of(sub.reach.vsn, m)?;
        let at = At {
            epoch: m.epoch,
            seq: m.seq,
        };
        Some((at, frame.clone()))
    }
}

impl Frames {
    /// `m`'s frame for sockets of serializer `vsn`, made at the first ask.
    fn of(&self, vsn: Vsn, m: &QueueMessage) -> Option<&Message> {
        match vsn {
            Vsn::V1 => self.v1.get_or_init(|| m.frame(Vsn::V1)),
            Vsn::V2 => self.v2.get_or_init(|| m.frame(Vsn::V2)),
        }
        .as_ref()
    }
}

/// A run's frames for one serializer as every plain subscriber gets them (no gate, none of
/// the run its own broadcast), and those frames encoded for the wire once for all of them.
struct Shared {
    frames: Vec<Message>,
    encoded: Bytes,
}

impl Shared {
    fn of(vsn: Vsn, msgs: &[QueueMessage], frames: &[Frames]) -> Shared {
        let frames: Vec<Message> = msgs
            .iter()
            .zip(frames)
            .filter_map(|(m, f)| f.of(vsn, m).cloned())
            .collect();
        let encoded = crate::out::encode(&frames);
        Shared { frames, encoded }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    Json(String),
    Binary(Bytes),
}

impl Payload {
    /// A message's payload from its two columns as the queue's functions return them
    /// (`payload` text, `binary_payload` bytea; one is NULL).
    pub fn from_columns(binary: Option<Vec<u8>>, json: Option<String>) -> Payload {
        match binary {
            Some(b) => Payload::Binary(Bytes::from(b)),
            None => Payload::Json(json.unwrap_or_else(|| "null".into())),
        }
    }
}

/// One topic's subscribers: a dense list for fan-out, and each connection's place in it, so
/// that joining and leaving cost O(1) however many share the topic (a scan of the list made
/// a storm of 15,000 joins or leaves on one topic about 10^8 comparisons under the lock).
#[derive(Default)]
struct Subscribers {
    list: Vec<Subscriber>,
    at: HashMap<ConnId, usize>,
}

impl Subscribers {
    /// Adds `sub`, or replaces the same connection's earlier subscription.
    fn insert(&mut self, sub: Subscriber) {
        match self.at.get(&sub.reach.conn) {
            Some(&i) => self.list[i] = sub,
            None => {
                self.at.insert(sub.reach.conn, self.list.len());
                self.list.push(sub);
            }
        }
    }

    /// Removes the connection's subscription; the last one takes its place in the list.
    fn remove(&mut self, conn: ConnId) {
        let Some(i) = self.at.remove(&conn) else {
            return;
        };
        self.list.swap_remove(i);
        if let Some(moved) = self.list.get(i) {
            self.at.insert(moved.reach.conn, i);
        }
    }
}

pub struct Hub {
    topics: RwLock<HashMap<TopicKey, Subscribers>>,
    metrics: Arc<Metrics>,
}

impl Hub {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Hub {
            topics: RwLock::new(HashMap::new()),
            metrics,
        }
    }

    /// Adds (or replaces) a connection's subscription to a topic.
    pub fn subscribe(&self, key: TopicKey, sub: Subscriber) {
        let mut topics = self.topics.write().unwrap();
        topics.entry(key).or_default().insert(sub);
    }

    pub fn unsubscribe(&self, key: &TopicKey, conn: ConnId) {
        let mut topics = self.topics.write().unwrap();
        if let Some(subs) = topics.get_mut(key) {
            subs.remove(conn);
            if subs.list.is_empty() {
                topics.remove(key);
            }
        }
    }

    /// Hands `frames` to the subscriber's channel in one go, at their places (written
    /// straight to its socket when nothing is waiting there; through its gate while its
    /// history is sent); stops at the first not taken (a full queue closes the connection;
    /// a closing one unsubscribes itself).
    fn deliver_batch(&self, sub: &Subscriber, frames: &[Message], at: &[At]) {
        if frames.is_empty() {
            return;
        }
        let (taken, _) = sub.reach.live_run(frames, at);
        self.metrics.deliveries_total.increment(taken as u64);
    }

    /// Fans a queue message out to the subscribers of its topic.
    pub fn dispatch(&self, m: &QueueMessage) {
        self.dispatch_batch(std::slice::from_ref(m));
    }

    /// Fans out a run of queue messages (a drain batch's broadcasts, in queue order) so that
    /// each connection is handed all its frames of the run at once: written to its socket
    /// in one system call from here when nothing is waiting there, without waking its task
    /// (`out::Sender::send_batch`). Handed out a message at a time, every subscriber's
    /// task woke and wrote once per message, nearly always one frame per write. A
    /// connection's frames keep the queue's order, across all its topics.
    pub fn dispatch_batch(&self, msgs: &[QueueMessage]) {
        let topics = self.topics.read().unwrap();
        let frames: Vec<Frames> = msgs.iter().map(|_| Frames::default()).collect();
        let key = |m: &QueueMessage| TopicKey {
            private: m.private,
            topic: m.topic.clone(),
        };
        // One topic (a busy room's batch, or a single message): each subscriber once, its
        // frames in order; no grouping needed.
        let one_topic = msgs
            .windows(2)
            .all(|w| w[0].private == w[1].private && w[0].topic == w[1].topic);
        if one_topic {
            let Some(subs) = msgs.first().and_then(|m| topics.get(&key(m))) else {
                return;
            };
            // Most subscribers get the same frames: those are encoded once per serializer and
            // written to each socket as they are.
            let mut shared: [Option<Shared>; 2] = [None, None];
            let mut mine = Vec::with_capacity(msgs.len());
            let mut mine_at = Vec::with_capacity(msgs.len());
            for sub in &subs.list {
                // Its own broadcasts left out of the run, or a gate (`live_encoded` says None),
                // make a subscriber's frames its own.
                let plain = sub.self_broadcast || msgs.iter().all(|m| m.origin != Some(sub.origin));
                if plain {
                    let vsn = sub.reach.vsn;
                    let at = match vsn {
                        Vsn::V1 => 0,
                        Vsn::V2 => 1,
                    };
                    let run = shared[at].get_or_insert_with(|| Shared::of(vsn, msgs, &frames));
                    if run.frames.is_empty() {
                        continue;
                    }
                    if let Some((taken, _)) = sub.reach.live_encoded(&run.frames, &run.encoded) {
                        self.metrics.deliveries_total.increment(taken as u64);
                        continue;
                    }
                }
                mine.clear();
                mine_at.clear();
                for (m, f) in msgs.iter().zip(&frames) {
                    if let Some((at, frame)) = f.for_subscriber(sub, m) {
                        mine_at.push(at);
                        mine.push(frame);
                    }
                }
                self.deliver_batch(sub, &mine, &mine_at);
            }
            return;
        }
        // Several topics: connections in the order they first get a frame, each with its
        // frames in order.
        let mut at: HashMap<ConnId, usize> = HashMap::new();
        let mut pending: Vec<(&Subscriber, Vec<Message>, Vec<At>)> = Vec::new();
        for (m, f) in msgs.iter().zip(&frames) {
            let Some(subs) = topics.get(&key(m)) else {
                continue;
            };
            for sub in &subs.list {
                let Some(frame) = f.for_subscriber(sub, m) else {
                    continue;
                };
                let i = *at.entry(sub.reach.conn).or_insert_with(|| {
                    pending.push((sub, Vec::new(), Vec::new()));
                    pending.len() - 1
                });
                let (at, frame) = frame;
                pending[i].1.push(frame);
                pending[i].2.push(at);
            }
        }
        for (sub, frames, at) in pending {
            self.deliver_batch(sub, &frames, &at);
        }
    }

    /// Sends a `system` message to every joined channel (the database went away or came
    /// back, or messages were lost).
    pub fn system_all(&self, notice: &crate::reason::Notice) {
        let (status, message) = (notice.status(), notice.text());
        let message = message.as_str();
        let topics = self.topics.read().unwrap();
        for subs in topics.values() {
            for sub in &subs.list {
                let frame = Message::text(sub.reach.system_text(status, message));
                if sub.reach.in_order(frame) == Sent::Queued {
                    self.metrics.deliveries_total.increment(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::out;

    fn key(t: &str) -> TopicKey {
        TopicKey {
            private: false,
            topic: t.into(),
        }
    }

    fn sub(conn: ConnId) -> (Subscriber, out::Receiver) {
        sub_of(conn, 16)
    }

    /// A subscriber of topic `t` whose outbound queue holds `capacity` frames.
    fn sub_of(conn: ConnId, capacity: usize) -> (Subscriber, out::Receiver) {
        let (tx, rx) = crate::out::channel(capacity);
        let link = crate::out::Link::new(conn, Vsn::V1, conn as i64, tx);
        let s = Subscriber {
            reach: link.reach("realtime:t", Some(&conn.to_string())),
            origin: conn as i64,
            self_broadcast: false,
        };
        (s, rx)
    }

    fn message(topic: &str, origin: Option<i64>) -> QueueMessage {
        QueueMessage {
            topic: topic.into(),
            event: "ev".into(),
            payload: Payload::Json("{}".into()),
            private: false,
            id: None,
            origin,
            epoch: 1,
            seq: 1,
            replayed: false,
            dropped: false,
        }
    }

    #[test]
    fn joins_and_leaves_in_any_order_keep_every_subscriber_reachable_once() {
        let hub = Hub::new(Arc::new(Metrics::default()));
        let mut rxs: Vec<_> = (0..100)
            .map(|c| {
                let (s, rx) = sub(c);
                hub.subscribe(key("t"), s);
                rx
            })
            .collect();
        // Leave every third, out of order; rejoin one (replaces, not duplicates).
        for c in (0..100).rev().filter(|c| c % 3 == 0) {
            hub.unsubscribe(&key("t"), c);
        }
        let (again, rx_again) = sub(7);
        hub.subscribe(key("t"), again);
        rxs[7] = rx_again;
        hub.dispatch(&message("t", None));
        for (c, rx) in rxs.iter_mut().enumerate() {
            let got = std::iter::from_fn(|| rx.try_recv().ok()).count();
            assert_eq!(got, usize::from(c % 3 != 0), "connection {c}");
        }
        let topics = hub.topics.read().unwrap();
        let subs = &topics[&key("t")];
        assert_eq!(subs.list.len(), 66);
        for (i, s) in subs.list.iter().enumerate() {
            assert_eq!(subs.at[&s.reach.conn], i, "index of {}", s.reach.conn);
        }
    }

    #[test]
    fn the_last_leave_removes_the_topic_and_self_is_left_out() {
        let hub = Hub::new(Arc::new(Metrics::default()));
        let (a, rx_a) = sub(1);
        let (b, rx_b) = sub(2);
        hub.subscribe(key("t"), a);
        hub.subscribe(key("t"), b);
        // A client broadcast from connection 1 (self: false) reaches only connection 2.
        hub.dispatch(&message("t", Some(1)));
        assert!(rx_a.try_recv().is_err());
        assert!(rx_b.try_recv().is_ok());
        hub.unsubscribe(&key("t"), 1);
        hub.unsubscribe(&key("t"), 2);
        hub.unsubscribe(&key("t"), 2);
        assert!(hub.topics.read().unwrap().is_empty());
    }

    #[test]
    fn a_batch_reaches_each_connection_in_queue_order_across_its_topics() {
        let hub = Hub::new(Arc::new(Metrics::default()));
        // Connection 1 is on topics a and b (one queue); connection 2 only on b.
        let (a1, mut rx1) = sub(1);
        let mut b1 = a1.clone();
        b1.reach.join_ref = Some("b".into());
        let (b2, mut rx2) = sub(2);
        hub.subscribe(key("a"), a1);
        hub.subscribe(key("b"), b1);
        hub.subscribe(key("b"), b2);
        let mut batch = vec![message("a", None), message("b", None), message("a", None)];
        for (n, m) in batch.iter_mut().enumerate() {
            m.seq = n as i64 + 1;
        }
        hub.dispatch_batch(&batch);
        assert_eq!(seqs(&mut rx1), vec![1, 2, 3]);
        assert_eq!(seqs(&mut rx2), vec![2]);
    }

    /// The `meta.seq` of every frame queued to `rx`, in order.
    fn seqs(rx: &mut out::Receiver) -> Vec<i64> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| {
                let v: serde_json::Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
                v["payload"]["meta"]["seq"].as_i64().unwrap()
            })
            .collect()
    }

    #[test]
    fn a_one_topic_batch_reaches_each_subscriber_in_order_and_a_full_queue_stops_only_its_own() {
        use futures_util::FutureExt;
        let hub = Hub::new(Arc::new(Metrics::default()));
        let (slow, mut slow_rx) = sub_of(1, 2);
        let (fast, mut fast_rx) = sub(2);
        hub.subscribe(key("t"), slow);
        hub.subscribe(key("t"), fast);
        let mut batch: Vec<_> = (0..3).map(|_| message("t", None)).collect();
        for (n, m) in batch.iter_mut().enumerate() {
            m.seq = n as i64 + 1;
        }
        hub.dispatch_batch(&batch);
        assert_eq!(seqs(&mut fast_rx), vec![1, 2, 3]);
        assert_eq!(seqs(&mut slow_rx), vec![1, 2]);
        assert!(slow_rx.overflowed().now_or_never().is_some());
    }

    #[test]
    fn a_full_queue_cuts_its_connection_off_without_holding_up_the_others() {
        use futures_util::FutureExt;
        let hub = Hub::new(Arc::new(Metrics::default()));
        let (slow, slow_rx) = sub_of(1, 1);
        let (fast, fast_rx) = sub(2);
        hub.subscribe(key("t"), slow);
        hub.subscribe(key("t"), fast);
        hub.dispatch(&message("t", None));
        assert!(slow_rx.overflowed().now_or_never().is_none());
        hub.dispatch(&message("t", None));
        // The second message found the slow queue full: that connection is told to close,
        // the other got both.
        assert!(slow_rx.overflowed().now_or_never().is_some());
        assert_eq!(std::iter::from_fn(|| fast_rx.try_recv().ok()).count(), 2);
        assert_eq!(std::iter::from_fn(|| slow_rx.try_recv().ok()).count(), 1);
        assert_eq!(hub.metrics.value("realtime_deliveries_total"), Some(3.0));
    }

    /// The hub's batched write to an idle socket must not overtake a change of the channel
    /// whose check is pending (`crate::out`, its slots): the run waits behind it.
    #[test]
    fn a_batch_waits_behind_a_change_whose_check_is_pending() {
        let hub = Hub::new(Arc::new(Metrics::default()));
        let socket = Arc::new(Taken::default());
        let (s, rx) = sub(1);
        rx.attach(socket.clone());
        let reach = s.reach.clone();
        hub.subscribe(key("t"), s);
        assert!(reach.slot(1, 0, 1));
        let mut m = message("t", None);
        m.seq = 2;
        hub.dispatch_batch(&[m]);
        assert!(
            written_seqs(&socket).is_empty(),
            "not written past the pending change"
        );
        let mut change = message("t", None);
        change.seq = 1;
        let frame = change.frame(Vsn::V1).unwrap();
        let fill = crate::out::Fill {
            job: 1,
            change: 0,
            frame,
            at: None,
        };
        reach.fill(&[1], vec![fill]);
        let queued: Vec<i64> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| {
                let v: serde_json::Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
                v["payload"]["meta"]["seq"].as_i64().unwrap()
            })
            .collect();
        let mut got = written_seqs(&socket);
        got.extend(queued);
        assert_eq!(got, vec![1, 2]);
    }

    /// A socket that takes everything written to it.
    #[derive(Default)]
    struct Taken(std::sync::Mutex<Vec<u8>>);

    impl crate::out::Socket for Taken {
        fn try_write_vectored(&self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
            let mut t = self.0.lock().unwrap();
            bufs.iter().for_each(|b| t.extend_from_slice(b));
            Ok(bufs.iter().map(|b| b.len()).sum())
        }
    }

    /// The `meta.seq` of every frame written to `socket`, in order.
    fn written_seqs(socket: &Taken) -> Vec<i64> {
        use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};
        let bytes = socket.0.lock().unwrap().clone();
        let mut ws = WebSocket::from_raw_socket(
            std::io::Cursor::new(bytes),
            Role::Client,
            Some(Default::default()),
        );
        std::iter::from_fn(|| ws.read().ok())
            .map(|m| {
                let v: serde_json::Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
                v["payload"]["meta"]["seq"].as_i64().unwrap()
            })
            .collect()
    }

    #[test]
    fn a_batch_is_written_to_idle_sockets_from_the_hub_and_a_client_s_own_broadcast_left_out() {
        let hub = Hub::new(Arc::new(Metrics::default()));
        let sockets: Vec<Arc<Taken>> = (0..3).map(|_| Arc::new(Taken::default())).collect();
        let mut rxs = Vec::new();
        for (c, socket) in sockets.iter().enumerate() {
            let (s, rx) = sub(c as ConnId + 1);
            rx.attach(socket.clone());
            hub.subscribe(key("t"), s);
            rxs.push(rx);
        }
        // Message 2 is a client broadcast of connection 2, which did not ask for its own.
        let mut batch: Vec<_> = (1..=3).map(|_| message("t", None)).collect();
        for (n, m) in batch.iter_mut().enumerate() {
            m.seq = n as i64 + 1;
        }
        batch[1].origin = Some(2);
        hub.dispatch_batch(&batch);
        assert_eq!(written_seqs(&sockets[0]), vec![1, 2, 3]);
        assert_eq!(written_seqs(&sockets[1]), vec![1, 3]);
        assert_eq!(written_seqs(&sockets[2]), vec![1, 2, 3]);
        for rx in &rxs {
            assert!(rx.try_recv().is_err(), "written, not queued");
        }
        assert_eq!(hub.metrics.value("realtime_deliveries_total"), Some(8.0));
    }
}
