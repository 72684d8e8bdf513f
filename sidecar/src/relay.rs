//! The relay: client broadcasts (WebSocket `broadcast` pushes and `POST /api/broadcast`)
//! written into the queue through `realtime.relay`, a batch per statement, so that every
//! sidecar delivers them in the one order the queue gives; each sender hears how its
//! broadcast ended once the batch has committed (or failed).

use crate::address::AddressKey;
use crate::byte_budget::{ByteBudget, Hold, Over};
use crate::config::Config;
use crate::db_worker::{self, Batched, CallError, Db, DbFailure};
use crate::hub::Payload;
use crate::metrics::Metrics;
use crate::out::ReplyTo;
use crate::persist_full::{self, FullQuotas, Kept};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

/// A batch in one statement; its persisted messages are kept in the same statement, within
/// their topic's, their sender's and the database's quotas (`sql/persisted.sql`).
/// The ids senders named travel as text, checked at the edge (`message_id`), and become
/// `uuid` here.
const RELAY_SQL: &str = "SELECT realtime.relay_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
     $11, $12, $13, $14, $15::text[]::uuid[])";

/// Broadcasts waiting for the relay at most (`config::RELAY_QUEUE`).
pub use crate::config::RELAY_QUEUE as QUEUE;

/// Why a broadcast was not relayed.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// The database refused this message (too large, say).
    Refused(String),
    /// The database could not be reached, or too many broadcasts are waiting for it.
    Unavailable(&'static str),
}

impl Failure {
    pub fn reason(&self) -> String {
        match self {
            Failure::Refused(why) => format!("UnableToBroadcast: {why}"),
            Failure::Unavailable(why) => format!("UnableToBroadcast: {why}"),
        }
    }
}

pub const DB_UNAVAILABLE: Failure = Failure::Unavailable("the database is unavailable");

/// Who hears how a broadcast ended: a broadcast is never dropped silently.
pub enum AckTo {
    /// A WebSocket push: with `ack: true` answered with a `phx_reply` either way; without
    /// it, only a failure is reported, as a `system` message on the channel (realtime-js
    /// ignores replies to pushes it sent without ack, but apps see system messages).
    Socket {
        to: ReplyTo,
        ack: bool,
        /// The push asked to be kept: realtime-js returns a refusal's `response.error` then.
        persist: bool,
    },
    /// A REST request, answered once all its messages are settled.
    Http(oneshot::Sender<Result<(), Failure>>),
}

impl AckTo {
    pub fn settle(self, result: Result<(), Failure>) {
        let AckTo::Socket { to, ack, persist } = self else {
            if let AckTo::Http(tx) = self {
                let _ = tx.send(result);
            }
            return;
        };
        // A full queue means the client is being cut off as too slow anyway.
        match (result, ack) {
            (Ok(()), false) => {}
            (Ok(()), true) => {
                to.ok();
            }
            (Err(f), true) => {
                to.reply(&refusal(&f.reason(), persist));
            }
            (Err(f), false) => {
                to.reach.system("error", &f.reason());
            }
        }
    }
}

/// An error reply's payload: Supabase's `reason`, and for a push that asked to be kept,
/// the same text as `error`, which realtime-js returns to the app for such pushes.
pub fn refusal(why: &str, persist: bool) -> serde_json::Value {
    let mut response = json!({ "reason": why });
    if persist {
        response["error"] = json!(why);
    }
    json!({"status": "error", "response": response})
}

/// Who sends a client broadcast: its connection as `realtime.relay` origins name it, whose
/// persist quota it counts against (`persist::sender`), and the client address whose relay
/// bytes it counts against (None: a backend's, the sidecar's bound only).
pub struct Author {
    pub origin: i64,
    pub sender: Option<String>,
    pub address: Option<AddressKey>,
}

/// A client broadcast on its way to the database.
pub struct Broadcast {
    pub origin: i64,
    pub topic: String,
    pub event: String,
    pub private: bool,
    pub payload: Payload,
    /// Keep it for this many seconds (`persist`).
    pub persist: Option<i32>,
    /// Whose quota a kept message counts against (`persist::sender`).
    pub sender: Option<String>,
    /// The id its sender named (`POST /api/broadcast`'s `id`, a UUID checked by
    /// `message_id`), delivered as `meta.id`; a socket's broadcast names none.
    pub id: Option<String>,
    pub reply: AckTo,
    /// Its bytes, held against MAX_RELAY_BYTES_PER_ADDRESS and MAX_RELAY_BYTES until it is
    /// settled (`hold_bytes`).
    pub held: Hold,
}

/// Holds the bytes of a broadcast about to be queued for the relay: its payload, topic and
/// event, against its address's and the sidecar's bound; the refusal its sender hears when
/// they would pass one. Nothing waits for room: the sender may retry.
pub fn hold_bytes(
    budget: &ByteBudget,
    address: Option<AddressKey>,
    topic: &str,
    event: &str,
    payload: &Payload,
    metrics: &Metrics,
) -> Result<Hold, Failure> {
    let bytes = persist_full::size(payload) + topic.len() + event.len();
    take_bytes(budget, address, bytes, metrics).map_err(|over| {
        Failure::Unavailable(match over {
            Over::Address => "this client address's broadcasts waiting for the database would pass MAX_RELAY_BYTES_PER_ADDRESS; retry",
            Over::Sidecar => "the broadcasts waiting for the database would pass MAX_RELAY_BYTES; retry",
        })
    })
}

/// Holds `bytes` of pushes waiting for the database (broadcasts, queued for the relay or
/// held for a private channel's verdict; a held track, `held`), or says which bound they
/// would pass.
pub fn take_bytes(
    budget: &ByteBudget,
    address: Option<AddressKey>,
    bytes: usize,
    metrics: &Metrics,
) -> Result<Hold, Over> {
    budget.take(address, bytes).inspect_err(|_| {
        metrics.relay_bytes_refusals_total.increment(1);
    })
}

impl Broadcast {
    /// The message as the persist quotas count it.
    fn kept(&self) -> Kept<'_> {
        Kept {
            topic: &self.topic,
            private: self.private,
            sender: self.sender.as_deref(),
            bytes: persist_full::size(&self.payload),
        }
    }
}

/// Runs until shutdown, relaying what connections queue on `rx`.
pub async fn run(
    cfg: Arc<Config>,
    rx: mpsc::Receiver<Broadcast>,
    full: Arc<FullQuotas>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    let quota = Quota {
        messages: cfg.max_persisted_messages_per_topic as i32,
        bytes: cfg.max_persisted_bytes_per_topic as i64,
        sender_messages: cfg.max_persisted_messages_per_user as i32,
        sender_bytes: cfg.max_persisted_bytes_per_user as i64,
        total_messages: cfg.max_persisted_messages as i64,
        total_bytes: cfg.max_persisted_bytes as i64,
    };
    let relay = Relay {
        metrics,
        quota,
        full,
    };
    db_worker::serve(&cfg, relay, rx, shutdown).await
}

/// A kept message's refusal if one of its quotas was just found full (`persist_full`):
/// its sender is answered as the database would answer it, and it never enters the relay.
pub fn known_full(full: &FullQuotas, b: &Broadcast, metrics: &Metrics) -> Option<Failure> {
    b.persist?;
    let why = full.refused(&b.kept())?;
    metrics.persist_full_refusals_total.increment(1);
    Some(Failure::Refused(why))
}

/// What may be kept of persisted messages: per topic (`MAX_PERSISTED_*_PER_TOPIC`), per
/// sender (`MAX_PERSISTED_*_PER_USER`) and in all (`MAX_PERSISTED_MESSAGES`, `_BYTES`).
#[derive(Clone, Copy)]
struct Quota {
    messages: i32,
    bytes: i64,
    sender_messages: i32,
    sender_bytes: i64,
    total_messages: i64,
    total_bytes: i64,
}

/// One `realtime.relay` statement over a batch: all of it relayed, or none.
struct Relay {
    metrics: Arc<Metrics>,
    quota: Quota,
    full: Arc<FullQuotas>,
}

impl Batched for Relay {
    type Req = Broadcast;
    type Out = ();
    const WHAT: &'static str = "relay";
    const MAX: usize = 1000;
    /// Messages may be megabytes each: a statement carries at most this much of them.
    const MAX_BYTES: usize = 16 << 20;

    fn size(b: &Broadcast) -> usize {
        b.held.amount()
    }

    async fn call(&self, db: &Db, batch: &[Broadcast]) -> Result<Vec<()>, CallError> {
        db.run(relay(&db.client, batch, self.quota)).await?;
        Ok(vec![(); batch.len()])
    }

    fn answer(&self, m: Broadcast, (): ()) {
        settle(vec![m], Ok(()), &self.metrics);
    }

    fn fail(&self, m: Broadcast, why: DbFailure) {
        let failure = match why {
            DbFailure::Unreachable => DB_UNAVAILABLE,
            DbFailure::QueryCanceled | DbFailure::Busy => {
                Failure::Unavailable("the database did not answer in time; retry")
            }
        };
        settle(vec![m], Err(failure), &self.metrics);
    }

    /// The database refused the statement holding this message alone (too large, say):
    /// the text is the reason its sender sees.
    fn refuse(&self, m: Broadcast, why: String) {
        if m.persist.is_some() && persist_full::is_quota(&why) {
            self.full.found_full(&m.kept(), &why);
        }
        settle(vec![m], Err(Failure::Refused(why)), &self.metrics);
    }

    fn split(&self, n: usize, message: &str) {
        tracing::debug!(error = %message, messages = n, "relay batch failed; splitting");
    }
}

/// Tells each sender how its broadcast ended, and counts it.
pub fn settle(batch: Vec<Broadcast>, result: Result<(), Failure>, metrics: &Metrics) {
    let counter = match result {
        Ok(()) => &metrics.client_broadcasts_total,
        Err(_) => &metrics.client_broadcast_failures_total,
    };
    counter.increment(batch.len() as u64);
    for m in batch {
        m.reply.settle(result.clone());
    }
}

async fn relay(
    client: &tokio_postgres::Client,
    batch: &[Broadcast],
    quota: Quota,
) -> Result<(), tokio_postgres::Error> {
    let origins: Vec<i64> = batch.iter().map(|m| m.origin).collect();
    let topics: Vec<&str> = batch.iter().map(|m| m.topic.as_str()).collect();
    let events: Vec<&str> = batch.iter().map(|m| m.event.as_str()).collect();
    let privates: Vec<bool> = batch.iter().map(|m| m.private).collect();
    let json: Vec<Option<&str>> = batch
        .iter()
        .map(|m| match &m.payload {
            Payload::Json(j) => Some(j.as_str()),
            Payload::Binary(_) => None,
        })
        .collect();
    let binary: Vec<Option<&[u8]>> = batch
        .iter()
        .map(|m| match &m.payload {
            Payload::Binary(b) => Some(&b[..]),
            Payload::Json(_) => None,
        })
        .collect();
    let ttls: Vec<Option<i32>> = batch.iter().map(|m| m.persist).collect();
    let kept = ttls.iter().any(Option::is_some).then_some(ttls);
    let senders: Option<Vec<Option<&str>>> = kept
        .as_ref()
        .map(|_| batch.iter().map(|m| m.sender.as_deref()).collect());
    let ids: Option<Vec<Option<&str>>> = batch
        .iter()
        .any(|m| m.id.is_some())
        .then(|| batch.iter().map(|m| m.id.as_deref()).collect());
    client
        .execute(
            RELAY_SQL,
            &[
                &origins,
                &topics,
                &events,
                &privates,
                &json,
                &binary,
                &kept,
                &quota.messages,
                &quota.bytes,
                &senders,
                &quota.sender_messages,
                &quota.sender_bytes,
                &quota.total_messages,
                &quota.total_bytes,
                &ids,
            ],
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::out;
    use std::sync::Mutex;

    /// A database that refuses any statement holding the event "too_big", and loses the
    /// connection on one of at most two messages holding "gone".
    #[derive(Default)]
    struct Fake {
        relayed: Mutex<Vec<String>>,
        calls: Mutex<usize>,
    }

    impl db_worker::Call<Broadcast, ()> for Fake {
        async fn call(&self, batch: &[Broadcast]) -> Result<Vec<()>, CallError> {
            *self.calls.lock().unwrap() += 1;
            if batch.len() <= 2 && batch.iter().any(|b| b.event == "gone") {
                return Err(CallError::Lost(DbFailure::Unreachable));
            }
            if batch.iter().any(|b| b.event == "too_big") {
                return Err(CallError::Failed {
                    canceled: false,
                    message: "payload too large".into(),
                });
            }
            let events = batch.iter().map(|b| b.event.clone());
            self.relayed.lock().unwrap().extend(events);
            Ok(vec![(); batch.len()])
        }
    }

    /// Relays a batch as the relay does, with `db` in place of its connection.
    async fn relay_batch(db: &Fake, batch: Vec<Broadcast>, metrics: &Arc<Metrics>) -> bool {
        let worker = Relay {
            metrics: metrics.clone(),
            quota: Quota {
                messages: 1000,
                bytes: 1 << 20,
                sender_messages: 1000,
                sender_bytes: 1 << 20,
                total_messages: 1000,
                total_bytes: 1 << 20,
            },
            full: Arc::default(),
        };
        db_worker::settle(&worker, db, batch).await
    }

    fn socket(event: &str, ack: bool) -> (Broadcast, out::Receiver) {
        let (tx, rx) = crate::out::channel(4);
        let link = crate::out::Link::new(1, crate::frame::Vsn::V1, 1, tx);
        let reply = AckTo::Socket {
            to: ReplyTo {
                reach: link.reach("realtime:room", Some("1")),
                reference: Some(event.into()),
            },
            ack,
            persist: false,
        };
        (broadcast(event, reply), rx)
    }

    fn broadcast(event: &str, reply: AckTo) -> Broadcast {
        Broadcast {
            origin: 1,
            topic: "room".into(),
            event: event.into(),
            private: false,
            payload: Payload::Json("{}".into()),
            persist: None,
            sender: None,
            id: None,
            reply,
            held: crate::byte_budget::ByteBudget::new(usize::MAX, usize::MAX).holder(None),
        }
    }

    fn text(rx: &mut out::Receiver) -> Option<String> {
        rx.try_recv()
            .ok()
            .map(|m| m.into_text().unwrap().to_string())
    }

    #[tokio::test]
    async fn a_batch_is_one_statement_and_only_acked_pushes_are_answered() {
        let (db, metrics) = (Fake::default(), Arc::new(Metrics::default()));
        let (a, mut rx_a) = socket("a", true);
        let (b, mut rx_b) = socket("b", false);
        assert!(relay_batch(&db, vec![a, b], &metrics).await);
        assert_eq!(*db.calls.lock().unwrap(), 1);
        assert_eq!(*db.relayed.lock().unwrap(), vec!["a", "b"]);
        let ack = text(&mut rx_a).expect("ack: true is answered");
        assert!(
            ack.contains(r#""phx_reply""#) && ack.contains(r#""status":"ok""#),
            "{ack}"
        );
        assert_eq!(text(&mut rx_b), None, "without ack, success is silent");
        assert_eq!(metrics.value("realtime_client_broadcasts_total"), Some(2.0));
    }

    #[tokio::test]
    async fn a_refused_broadcast_is_isolated_and_reported_to_its_sender_only() {
        let (db, metrics) = (Fake::default(), Arc::new(Metrics::default()));
        let (a, mut rx_a) = socket("a", false);
        let (bad, mut rx_bad) = socket("too_big", false);
        let (http_tx, http_rx) = oneshot::channel();
        let c = broadcast("c", AckTo::Http(http_tx));
        assert!(relay_batch(&db, vec![a, bad, c], &metrics).await);
        // The batch, then halves down to the bad message: [a, too_big, c], [a],
        // [too_big, c], [too_big], [c].
        assert_eq!(*db.calls.lock().unwrap(), 5);
        assert_eq!(*db.relayed.lock().unwrap(), vec!["a", "c"]);
        assert_eq!(text(&mut rx_a), None);
        // Without ack the failure still reaches the sender, as a system message.
        let report = text(&mut rx_bad).expect("a failure is never silent");
        assert!(
            report.contains(r#""system""#)
                && report.contains("UnableToBroadcast: payload too large"),
            "{report}"
        );
        assert_eq!(http_rx.await.unwrap(), Ok(()));
        assert_eq!(
            metrics.value("realtime_client_broadcast_failures_total"),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn a_lost_connection_answers_everything_left_unavailable() {
        let (db, metrics) = (Fake::default(), Arc::new(Metrics::default()));
        let (a, mut rx_a) = socket("a", true);
        let (bad, _rx_bad) = socket("too_big", true);
        let (gone, mut rx_gone) = socket("gone", true);
        let (http_tx, http_rx) = oneshot::channel();
        let d = broadcast("d", AckTo::Http(http_tx));
        assert!(!relay_batch(&db, vec![a, bad, gone, d], &metrics).await);
        assert!(text(&mut rx_a).unwrap().contains(r#""status":"ok""#));
        let lost = text(&mut rx_gone).unwrap();
        assert!(
            lost.contains(r#""status":"error""#) && lost.contains(&DB_UNAVAILABLE.reason()),
            "{lost}"
        );
        // The one relayed with it is answered too.
        assert_eq!(http_rx.await.unwrap(), Err(DB_UNAVAILABLE));
        assert_eq!(*db.relayed.lock().unwrap(), vec!["a"]);
    }
}
