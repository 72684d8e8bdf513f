//! Topic → subscribers, and fan-out. A message is encoded at most once per serializer and
//! the same bytes are queued to every subscriber; a subscriber whose queue is full is told
//! to disconnect instead of slowing anyone else down.

use crate::frame::{self, Vsn};
use crate::metrics::Metrics;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock, RwLock};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::Message;

pub type ConnId = u64;

/// Channels are addressed by sub-topic and privacy: a public channel never receives private
/// messages, and the reverse (Supabase keeps them in separate namespaces too).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopicKey {
    pub private: bool,
    pub topic: String,
}

/// What the hub needs to reach one joined channel.
#[derive(Clone)]
pub struct Subscriber {
    pub conn: ConnId,
    pub vsn: Vsn,
    pub join_ref: Option<String>,
    /// This channel's connection, as `realtime.relay` origins name it.
    pub origin: i64,
    /// Whether the connection wants its own broadcasts back (`config.broadcast.self`).
    pub self_broadcast: bool,
    pub tx: mpsc::Sender<Message>,
    /// Notified when the connection fell behind and must close.
    pub too_slow: Arc<Notify>,
}

/// A message from the queue, ready for fan-out.
pub struct DbMessage {
    pub topic: String,
    pub event: String,
    pub payload: Payload,
    pub private: bool,
    /// The message id, sent as `meta.id` (database messages only).
    pub id: Option<String>,
    /// The connection a client broadcast came from.
    pub origin: Option<i64>,
}

pub enum Payload {
    Json(String),
    Binary(Bytes),
}

pub struct Hub {
    topics: RwLock<HashMap<TopicKey, Vec<Subscriber>>>,
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
        let subs = topics.entry(key).or_default();
        subs.retain(|s| s.conn != sub.conn);
        subs.push(sub);
    }

    pub fn unsubscribe(&self, key: &TopicKey, conn: ConnId) {
        let mut topics = self.topics.write().unwrap();
        if let Some(subs) = topics.get_mut(key) {
            subs.retain(|s| s.conn != conn);
            if subs.is_empty() {
                topics.remove(key);
            }
        }
    }

    fn deliver(&self, sub: &Subscriber, msg: Message) {
        match sub.tx.try_send(msg) {
            Ok(()) => {
                self.metrics.deliveries_total.fetch_add(1, Relaxed);
            }
            Err(mpsc::error::TrySendError::Full(_)) => sub.too_slow.notify_one(),
            // The connection is closing and will unsubscribe itself.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Fans a queue message out to the subscribers of its topic.
    pub fn dispatch(&self, m: &DbMessage) {
        let key = TopicKey {
            private: m.private,
            topic: m.topic.clone(),
        };
        let topics = self.topics.read().unwrap();
        let Some(subs) = topics.get(&key) else { return };
        let channel_topic = format!("realtime:{}", m.topic);
        let v1: OnceLock<Option<Message>> = OnceLock::new();
        let v2: OnceLock<Option<Message>> = OnceLock::new();
        for sub in subs {
            if m.origin == Some(sub.origin) && !sub.self_broadcast {
                continue;
            }
            let frame = match sub.vsn {
                Vsn::V1 => v1.get_or_init(|| match &m.payload {
                    Payload::Json(p) => Some(Message::text(frame::user_broadcast_v1(
                        &channel_topic,
                        &m.event,
                        p,
                        m.id.as_deref(),
                    ))),
                    // 1.0.0 sockets cannot carry binary payloads; Supabase drops them too.
                    Payload::Binary(_) => None,
                }),
                Vsn::V2 => v2.get_or_init(|| {
                    let (encoding, bytes) = match &m.payload {
                        Payload::Json(p) => (frame::ENCODING_JSON, p.as_bytes()),
                        Payload::Binary(b) => (frame::ENCODING_BINARY, &b[..]),
                    };
                    frame::user_broadcast_v2(
                        &channel_topic,
                        &m.event,
                        encoding,
                        bytes,
                        m.id.as_deref(),
                    )
                    .map(Message::Binary)
                }),
            };
            if let Some(f) = frame {
                self.deliver(sub, f.clone());
            }
        }
    }

    /// Sends a `system` message to every joined channel (the database went away or came
    /// back, or messages were lost).
    pub fn system_all(&self, status: &str, message: &str) {
        let topics = self.topics.read().unwrap();
        for (key, subs) in topics.iter() {
            let channel_topic = format!("realtime:{}", key.topic);
            for sub in subs {
                let text = frame::system(
                    sub.vsn,
                    sub.join_ref.as_deref(),
                    &channel_topic,
                    status,
                    message,
                );
                self.deliver(sub, Message::text(text));
            }
        }
    }
}
