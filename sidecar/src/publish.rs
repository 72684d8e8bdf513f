//! Client-originated broadcasts: relayed through the database (`realtime.relay`) in batches,
//! so every sidecar delivers them in the one order the queue gives, and acknowledged to the
//! sender once the batch has committed.

use crate::batch;
use crate::config::Config;
use crate::frame::{self, Vsn};
use crate::hub::Payload;
use crate::metrics::Metrics;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;

/// Most broadcasts relayed in one statement.
const BATCH: usize = 1000;

const RELAY_SQL: &str = "SELECT count(realtime.relay(o, t, e, p, j::json, b)) \
     FROM unnest($1::int8[], $2::text[], $3::text[], $4::bool[], $5::text[], $6::bytea[]) AS u(o, t, e, p, j, b)";

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
        tx: mpsc::Sender<Message>,
        vsn: Vsn,
        join_ref: Option<String>,
        reference: Option<String>,
        topic: String,
        ack: bool,
    },
    /// A REST request, answered once all its messages are settled.
    Http(oneshot::Sender<Result<(), Failure>>),
}

impl AckTo {
    pub fn settle(self, result: Result<(), Failure>) {
        let AckTo::Socket {
            tx,
            vsn,
            join_ref,
            reference,
            topic,
            ack,
        } = self
        else {
            if let AckTo::Http(tx) = self {
                let _ = tx.send(result);
            }
            return;
        };
        let text = match (result, ack) {
            (Ok(()), false) => return,
            (Ok(()), true) => frame::encode(
                vsn,
                join_ref.as_deref(),
                reference.as_deref(),
                &topic,
                "phx_reply",
                &json!({"status": "ok", "response": {}}),
            ),
            (Err(f), true) => frame::encode(
                vsn,
                join_ref.as_deref(),
                reference.as_deref(),
                &topic,
                "phx_reply",
                &json!({"status": "error", "response": {"reason": f.reason()}}),
            ),
            (Err(f), false) => {
                frame::system(vsn, join_ref.as_deref(), &topic, "error", &f.reason())
            }
        };
        // A full queue means the client is being cut off as too slow anyway.
        let _ = tx.try_send(Message::text(text));
    }
}

pub struct Publish {
    pub origin: i64,
    pub topic: String,
    pub event: String,
    pub private: bool,
    pub payload: Payload,
    pub reply: AckTo,
}

/// Runs until shutdown, relaying what connections queue on `rx`.
pub async fn run(
    cfg: Arc<Config>,
    mut rx: mpsc::Receiver<Publish>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let unavailable = || Err(DB_UNAVAILABLE);
    loop {
        let fail = |m: Publish| settle(vec![m], unavailable(), &metrics);
        let Some(client) = batch::connect(&cfg, "publish", &mut rx, &mut shutdown, fail).await
        else {
            return;
        };
        while let Some(batch) = batch::next(&mut rx, BATCH, &mut shutdown).await {
            let deadline = cfg.db_call_deadline();
            match tokio::time::timeout(deadline, relay(&client, &batch)).await {
                Ok(Ok(())) => settle(batch, Ok(()), &metrics),
                Ok(Err(_)) | Err(_) if client.is_closed() => {
                    settle(batch, unavailable(), &metrics);
                    break;
                }
                // A hung call: the connection's state is unknown, so it is replaced.
                Err(_) => {
                    settle(batch, unavailable(), &metrics);
                    break;
                }
                Ok(Err(e)) => {
                    // One bad message must not sink the others: relay them one at a time.
                    tracing::debug!(error = %e, "relay batch failed; isolating");
                    for m in batch {
                        let one = std::slice::from_ref(&m);
                        let result = match tokio::time::timeout(deadline, relay(&client, one)).await
                        {
                            Ok(r) => r.map_err(|e| refusal(&e)),
                            Err(_) => unavailable(),
                        };
                        settle(vec![m], result, &metrics);
                    }
                }
            }
        }
        if *shutdown.borrow() || rx.is_closed() {
            return;
        }
    }
}

/// The reason a client sees for a broadcast the database refused.
fn refusal(e: &tokio_postgres::Error) -> Failure {
    Failure::Refused(
        e.as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
    )
}

/// Tells each sender how its broadcast ended, and counts it.
pub fn settle(batch: Vec<Publish>, result: Result<(), Failure>, metrics: &Metrics) {
    let counter = match result {
        Ok(()) => &metrics.client_broadcasts_total,
        Err(_) => &metrics.client_broadcast_failures_total,
    };
    counter.fetch_add(batch.len() as u64, Relaxed);
    for m in batch {
        m.reply.settle(result.clone());
    }
}

async fn relay(
    client: &tokio_postgres::Client,
    batch: &[Publish],
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
    client
        .execute(
            RELAY_SQL,
            &[&origins, &topics, &events, &privates, &json, &binary],
        )
        .await?;
    Ok(())
}
