//! Private-channel authorization: requests from all connections are batched into one
//! `realtime.authorize` call (whatever arrived while the previous call ran goes into the
//! next), on the sidecar's own connection, so joins cost a fraction of a database round trip.

use crate::batch;
use crate::config::Config;
use crate::metrics::Metrics;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

/// Most requests in one call.
const BATCH: usize = 10_000;

const SQL: &str =
    "SELECT ordinality, allowed, error FROM realtime.authorize($1, $2, $3, $4, $5, $6)";

/// Who asks (the JWT's role and claims, the request headers) to do what on which topic.
pub struct AuthRequest {
    pub role: String,
    pub claims: String,
    pub headers: String,
    pub topic: String,
    pub extension: &'static str,
    pub write: bool,
    pub reply: oneshot::Sender<Verdict>,
}

/// Allowed or not; `error` when a policy failed or the database could not be asked.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub allowed: bool,
    pub error: Option<String>,
}

impl Verdict {
    fn denied(error: impl Into<String>) -> Verdict {
        Verdict {
            allowed: false,
            error: Some(error.into()),
        }
    }
}

/// Who asks: the JWT's role and claims (JSON) and the request's headers (JSON).
#[derive(Clone, Debug)]
pub struct Identity {
    pub role: String,
    pub claims: String,
    pub headers: String,
}

/// Asks for one verdict (batched with whatever else is waiting); shutdown denies.
pub async fn ask(
    tx: &mpsc::Sender<AuthRequest>,
    who: &Identity,
    topic: &str,
    extension: &'static str,
    write: bool,
) -> Verdict {
    let (reply, rx) = oneshot::channel();
    let req = AuthRequest {
        role: who.role.clone(),
        claims: who.claims.clone(),
        headers: who.headers.clone(),
        topic: topic.to_owned(),
        extension,
        write,
        reply,
    };
    if tx.send(req).await.is_err() {
        return Verdict::denied("the server is shutting down");
    }
    rx.await
        .unwrap_or_else(|_| Verdict::denied("the server is shutting down"))
}

/// A channel's verdicts, as Supabase decides a join: readable if `broadcast` (or, with
/// presence on, `presence`) may be read; writable if `broadcast` may be written.
pub async fn channel_access(
    tx: &mpsc::Sender<AuthRequest>,
    who: &Identity,
    topic: &str,
    presence: bool,
) -> (bool, bool) {
    let (read, write, presence_read) = tokio::join!(
        ask(tx, who, topic, "broadcast", false),
        ask(tx, who, topic, "broadcast", true),
        async {
            match presence {
                true => ask(tx, who, topic, "presence", false).await.allowed,
                false => false,
            }
        }
    );
    (read.allowed || presence_read, write.allowed)
}

pub async fn run(
    cfg: Arc<Config>,
    mut rx: mpsc::Receiver<AuthRequest>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let dsn = cfg.dsn();
    let unavailable = || Verdict::denied("Realtime was unable to connect to the project database");
    loop {
        let fail = |r: AuthRequest| drop(r.reply.send(unavailable()));
        let Some(client) =
            batch::connect(&dsn, "authorization", &mut rx, &mut shutdown, fail).await
        else {
            return;
        };
        while let Some(batch) = batch::next(&mut rx, BATCH, &mut shutdown).await {
            metrics.auth_batches_total.fetch_add(1, Relaxed);
            metrics
                .auth_requests_total
                .fetch_add(batch.len() as u64, Relaxed);
            let col = |f: fn(&AuthRequest) -> &str| batch.iter().map(f).collect::<Vec<&str>>();
            let (roles, claims, headers, topics) = (
                col(|r| &r.role),
                col(|r| &r.claims),
                col(|r| &r.headers),
                col(|r| &r.topic),
            );
            let extensions: Vec<&str> = batch.iter().map(|r| r.extension).collect();
            let actions: Vec<&str> = batch
                .iter()
                .map(|r| if r.write { "write" } else { "read" })
                .collect();
            match client
                .query(
                    SQL,
                    &[&roles, &claims, &headers, &topics, &extensions, &actions],
                )
                .await
            {
                Ok(rows) => {
                    let mut verdicts = vec![Verdict::denied("no verdict"); batch.len()];
                    for row in rows {
                        let i = row.get::<_, i32>(0) as usize - 1;
                        verdicts[i] = Verdict {
                            allowed: row.get(1),
                            error: row.get(2),
                        };
                    }
                    for (r, v) in batch.into_iter().zip(verdicts) {
                        if let Some(e) = &v.error {
                            tracing::info!(topic = %r.topic, role = %r.role, error = %e, "RlsPolicyError");
                        }
                        let _ = r.reply.send(v);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "authorization call failed");
                    let closed = client.is_closed();
                    for r in batch {
                        let v = if closed {
                            unavailable()
                        } else {
                            Verdict::denied(format!("UnableToSetPolicies: {e}"))
                        };
                        let _ = r.reply.send(v);
                    }
                    if closed {
                        break;
                    }
                }
            }
        }
        if *shutdown.borrow() || rx.is_closed() {
            return;
        }
    }
}
