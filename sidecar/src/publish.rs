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

/// Who waits to hear that a broadcast was committed (or why it was not).
pub enum AckTo {
    /// A WebSocket push with `ack: true`: answered with a `phx_reply`.
    Socket {
        tx: mpsc::Sender<Message>,
        vsn: Vsn,
        join_ref: Option<String>,
        reference: Option<String>,
        topic: String,
    },
    /// A REST request, answered once all its messages are settled.
    Http(oneshot::Sender<Result<(), String>>),
}

impl AckTo {
    fn reply(&self, status: &str, response: serde_json::Value) {
        if let AckTo::Socket {
            tx,
            vsn,
            join_ref,
            reference,
            topic,
        } = self
        {
            let text = frame::encode(
                *vsn,
                join_ref.as_deref(),
                reference.as_deref(),
                topic,
                "phx_reply",
                &json!({"status": status, "response": response}),
            );
            // A full queue means the client is being cut off as too slow anyway.
            let _ = tx.try_send(Message::text(text));
        }
    }

    fn settle(self, result: Result<(), String>) {
        match self {
            AckTo::Http(tx) => {
                let _ = tx.send(result);
            }
            socket => match result {
                Ok(()) => socket.reply("ok", json!({})),
                Err(reason) => socket.reply("error", json!({ "reason": reason })),
            },
        }
    }
}

pub struct Publish {
    pub origin: i64,
    pub topic: String,
    pub event: String,
    pub private: bool,
    pub payload: Payload,
    pub ack: Option<AckTo>,
}

/// Runs until shutdown, relaying what connections queue on `rx`.
pub async fn run(
    cfg: Arc<Config>,
    mut rx: mpsc::Receiver<Publish>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let dsn = cfg.dsn();
    let unavailable = || Err("The database is unavailable".to_owned());
    loop {
        let fail = |m: Publish| m.ack.into_iter().for_each(|a| a.settle(unavailable()));
        let Some(client) = batch::connect(&dsn, "publish", &mut rx, &mut shutdown, fail).await
        else {
            return;
        };
        while let Some(batch) = batch::next(&mut rx, BATCH, &mut shutdown).await {
            if let Err(e) = relay(&client, &batch).await {
                if client.is_closed() {
                    batch
                        .into_iter()
                        .for_each(|m| m.ack.into_iter().for_each(|a| a.settle(unavailable())));
                    break;
                }
                // One bad message must not sink the others: relay them one at a time.
                tracing::debug!(error = %e, "relay batch failed; isolating");
                for m in batch {
                    let result = relay(&client, std::slice::from_ref(&m)).await;
                    finish(vec![m], result, &metrics);
                }
                continue;
            }
            finish(batch, Ok(()), &metrics);
        }
        if *shutdown.borrow() || rx.is_closed() {
            return;
        }
    }
}

fn finish(batch: Vec<Publish>, result: Result<(), tokio_postgres::Error>, metrics: &Metrics) {
    let result = match result {
        Ok(()) => {
            metrics
                .client_broadcasts_total
                .fetch_add(batch.len() as u64, Relaxed);
            Ok(())
        }
        Err(e) => {
            let reason = e
                .as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned());
            Err(format!("UnableToBroadcast: {reason}"))
        }
    };
    for m in batch {
        if let Some(a) = m.ack {
            a.settle(result.clone());
        }
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
