//! Private-channel authorization: requests from all connections are batched into one
//! `realtime.authorize` call (whatever arrived while the previous call ran goes into the
//! next), on the sidecar's own connection, so joins cost a fraction of a database round trip.
//!
//! One request cannot sink the others: when a call fails without losing the connection (an
//! input the database refuses, a statement timeout), the batch is split in halves and each
//! half asked again, down to single requests, so only the bad one is denied. A failure of
//! the database itself (connection lost, call timed out) is a `Verdict::Failed`, never a
//! denial: a re-check keeps the channel and retries.

use crate::config::Config;
use crate::db_worker;
use crate::metrics::Metrics;
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

/// Why the database could not give a verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbFailure {
    /// No connection (or it was lost during the call).
    Unreachable,
    /// The call was cancelled or hit its statement timeout.
    QueryCanceled,
}

impl DbFailure {
    /// Supabase's reason text for a join that failed this way.
    pub fn reason(&self) -> &'static str {
        match self {
            DbFailure::Unreachable => {
                "UnableToConnectToProject: Realtime was unable to connect to the project database"
            }
            DbFailure::QueryCanceled => {
                "QueryCanceled: the authorization query was cancelled or timed out"
            }
        }
    }
}

/// One request's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Allowed,
    /// A definite no; with the error a policy or the role guard raised, if any.
    Denied(Option<String>),
    /// The database could not answer; ask again later.
    Failed(DbFailure),
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        matches!(self, Verdict::Allowed)
    }

    /// Why the database could not answer, if it could not.
    pub fn failure(&self) -> Option<&DbFailure> {
        match self {
            Verdict::Failed(f) => Some(f),
            _ => None,
        }
    }
}

/// Who asks: the JWT's role and claims (JSON) and the request's headers (JSON).
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    pub role: String,
    pub claims: String,
    pub headers: String,
}

/// Asks for one verdict (batched with whatever else is waiting).
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
        return Verdict::Failed(DbFailure::Unreachable);
    }
    rx.await.unwrap_or(Verdict::Failed(DbFailure::Unreachable))
}

/// A private channel's read verdicts: broadcast read, and presence read (asked only when
/// presence is enabled on the join). Write verdicts are asked at the first push that needs
/// one (`write_access`, `presence_access`), as Supabase asks them: a join costs one verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Access {
    pub broadcast_read: Verdict,
    pub presence_read: Option<Verdict>,
}

impl Access {
    /// A public channel's: anyone may read and send.
    pub fn public() -> Self {
        Access {
            broadcast_read: Verdict::Allowed,
            presence_read: None,
        }
    }

    /// The first database failure among the verdicts, if any: then nothing is decided.
    pub fn failure(&self) -> Option<&DbFailure> {
        [Some(&self.broadcast_read), self.presence_read.as_ref()]
            .into_iter()
            .flatten()
            .find_map(Verdict::failure)
    }

    /// A join is admitted, as Supabase admits it, if broadcast or (with presence enabled)
    /// presence may be read. Broadcasts reach the channel only with broadcast read.
    pub fn readable(&self) -> bool {
        self.broadcast_read.allowed() || self.presence_read.as_ref().is_some_and(Verdict::allowed)
    }

    /// The role guard's refusal of the read verdicts, if that is why they were denied: the
    /// client is told which role was refused. Other errors (a policy that raised, a missing
    /// grant) stay in the sidecar's log and metrics, as Supabase keeps them from clients.
    pub fn role_refusal(&self) -> Option<&str> {
        [Some(&self.broadcast_read), self.presence_read.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|v| match v {
                Verdict::Denied(Some(e)) if e.starts_with("role \"") => Some(e.as_str()),
                _ => None,
            })
    }
}

pub async fn channel_access(
    tx: &mpsc::Sender<AuthRequest>,
    who: &Identity,
    topic: &str,
    presence: bool,
) -> Access {
    let (broadcast_read, presence_read) =
        tokio::join!(ask(tx, who, topic, "broadcast", false), async {
            match presence {
                true => Some(ask(tx, who, topic, "presence", false).await),
                false => None,
            }
        });
    Access {
        broadcast_read,
        presence_read,
    }
}

/// A private channel's broadcast write verdict, asked at its first client broadcast.
pub async fn write_access(tx: &mpsc::Sender<AuthRequest>, who: &Identity, topic: &str) -> Verdict {
    ask(tx, who, topic, "broadcast", true).await
}

/// A private channel's presence verdicts, asked at its first track as Supabase asks them:
/// presence write, and presence read when it was not asked at join (presence was not
/// enabled then). Returns (read, write).
pub async fn presence_access(
    tx: &mpsc::Sender<AuthRequest>,
    who: &Identity,
    topic: &str,
    read: bool,
) -> (Option<Verdict>, Verdict) {
    let (write, read) = tokio::join!(ask(tx, who, topic, "presence", true), async {
        match read {
            true => Some(ask(tx, who, topic, "presence", false).await),
            false => None,
        }
    });
    (read, write)
}

pub async fn run(
    cfg: Arc<Config>,
    mut rx: mpsc::Receiver<AuthRequest>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let fail = |r: AuthRequest| drop(r.reply.send(Verdict::Failed(DbFailure::Unreachable)));
        let Some(client) =
            db_worker::connect(&cfg, "authorization", &mut rx, &mut shutdown, fail).await
        else {
            return;
        };
        while let Some(batch) = db_worker::next_batch(&mut rx, BATCH, &mut shutdown).await {
            metrics.auth_batches_total.increment(1);
            metrics.auth_requests_total.increment(batch.len() as u64);
            let db = Db {
                client: &client,
                cfg: &cfg,
            };
            if !answer(&db, batch, &metrics).await {
                break;
            }
        }
        if *shutdown.borrow() || rx.is_closed() {
            return;
        }
    }
}

/// Answers every request of `batch`, splitting it when a call fails. False when the
/// connection is no longer usable (the requests left are answered `Failed`).
async fn answer(db: &impl Call, batch: Vec<AuthRequest>, metrics: &Metrics) -> bool {
    let mut work = vec![batch];
    while let Some(mut part) = work.pop() {
        match db.call(&part).await {
            Ok(verdicts) => {
                for (r, v) in part.into_iter().zip(verdicts) {
                    if let Verdict::Denied(Some(e)) = &v {
                        log_policy_error(metrics, &r, e);
                    }
                    let _ = r.reply.send(v);
                }
            }
            Err(CallError::Lost) => {
                for r in work.into_iter().flatten().chain(part) {
                    let _ = r.reply.send(Verdict::Failed(DbFailure::Unreachable));
                }
                return false;
            }
            Err(CallError::Failed { canceled, message }) if part.len() == 1 => {
                let r = part.pop().expect("one request");
                let v = if canceled {
                    Verdict::Failed(DbFailure::QueryCanceled)
                } else {
                    // The database refused this request's input: it alone is denied.
                    log_policy_error(metrics, &r, &message);
                    Verdict::Denied(Some(message))
                };
                let _ = r.reply.send(v);
            }
            Err(CallError::Failed { message, .. }) => {
                metrics.auth_isolations_total.increment(1);
                tracing::debug!(error = %message, requests = part.len(), "authorization call failed; splitting the batch");
                let back = part.split_off(part.len() / 2);
                work.push(back);
                work.push(part);
            }
        }
    }
    true
}

/// One `realtime.authorize` call over a batch: a trait so that the batching and splitting
/// above are tested without a database.
trait Call {
    async fn call(&self, batch: &[AuthRequest]) -> Result<Vec<Verdict>, CallError>;
}

/// The real call, on the authorizer's connection.
struct Db<'a> {
    client: &'a tokio_postgres::Client,
    cfg: &'a Config,
}

impl Call for Db<'_> {
    async fn call(&self, batch: &[AuthRequest]) -> Result<Vec<Verdict>, CallError> {
        call(self.client, self.cfg, batch).await
    }
}

enum CallError {
    /// The connection is gone or in an unknown state.
    Lost,
    Failed {
        canceled: bool,
        message: String,
    },
}

async fn call(
    client: &tokio_postgres::Client,
    cfg: &Config,
    batch: &[AuthRequest],
) -> Result<Vec<Verdict>, CallError> {
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
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&roles, &claims, &headers, &topics, &extensions, &actions];
    let query = client.query(SQL, &params);
    // The server's statement_timeout ends a slow call; this bounds a connection that hangs.
    let rows = match tokio::time::timeout(cfg.db_call_deadline(), query).await {
        Err(_) => return Err(CallError::Lost),
        Ok(Err(e)) if client.is_closed() => {
            tracing::warn!(error = %e, "authorization connection lost");
            return Err(CallError::Lost);
        }
        Ok(Err(e)) => {
            let canceled = e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED);
            let message = e
                .as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned());
            return Err(CallError::Failed { canceled, message });
        }
        Ok(Ok(rows)) => rows,
    };
    let mut verdicts = vec![Verdict::Denied(Some("no verdict".into())); batch.len()];
    for row in rows {
        let i = row.get::<_, i32>("ordinality") as usize - 1;
        let (allowed, error): (bool, Option<String>) = (row.get("allowed"), row.get("error"));
        verdicts[i] = if allowed {
            Verdict::Allowed
        } else {
            Verdict::Denied(error)
        };
    }
    Ok(verdicts)
}

/// A policy that raised, a missing privilege, or a role the sidecar may not act as: logged
/// at WARNING with the fix when it is one the operator can make, and counted.
fn log_policy_error(metrics: &Metrics, r: &AuthRequest, error: &str) {
    metrics.auth_policy_errors_total.increment(1);
    if error.starts_with("permission denied for schema realtime") {
        tracing::warn!(role = %r.role, topic = %r.topic, error,
            "RlsPolicyError: role \"{}\" has no USAGE on schema realtime (roles created after CREATE EXTENSION get none): GRANT USAGE ON SCHEMA realtime TO \"{}\"; GRANT SELECT, INSERT ON realtime.messages TO \"{}\"",
            r.role, r.role, r.role);
    } else if error.contains("is not granted to the sidecar's login role") {
        tracing::warn!(role = %r.role, topic = %r.topic, error, "RlsPolicyError: the sidecar may not act as this role");
    } else {
        tracing::info!(role = %r.role, topic = %r.topic, error, "RlsPolicyError");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A database that refuses any call holding the topic "poison" (as one holding a NUL
    /// was refused), cancels one holding "slow", and loses the connection on a call of at
    /// most four requests holding "gone" (it dies while a batch is being split).
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<usize>>,
    }

    impl Call for Fake {
        async fn call(&self, batch: &[AuthRequest]) -> Result<Vec<Verdict>, CallError> {
            self.calls.lock().unwrap().push(batch.len());
            let has = |t: &str| batch.iter().any(|r| r.topic == t);
            if has("gone") && batch.len() <= 4 {
                return Err(CallError::Lost);
            }
            if has("poison") || has("slow") {
                return Err(CallError::Failed {
                    canceled: has("slow"),
                    message: "invalid byte sequence".into(),
                });
            }
            Ok(batch
                .iter()
                .map(|r| match r.role.as_str() {
                    "authenticated" => Verdict::Allowed,
                    _ => Verdict::Denied(None),
                })
                .collect())
        }
    }

    fn requests(topics: &[&str]) -> (Vec<AuthRequest>, Vec<oneshot::Receiver<Verdict>>) {
        topics
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (reply, rx) = oneshot::channel();
                let req = AuthRequest {
                    // Every fifth asks as anon, whom the fake denies.
                    role: if i % 5 == 4 { "anon" } else { "authenticated" }.into(),
                    claims: "{}".into(),
                    headers: "{}".into(),
                    topic: (*t).into(),
                    extension: "broadcast",
                    write: false,
                    reply,
                };
                (req, rx)
            })
            .unzip()
    }

    fn verdicts(rxs: Vec<oneshot::Receiver<Verdict>>) -> Vec<Verdict> {
        rxs.into_iter()
            .map(|mut rx| rx.try_recv().expect("every request is answered"))
            .collect()
    }

    #[tokio::test]
    async fn one_call_answers_a_whole_batch_in_order() {
        let (db, metrics) = (Fake::default(), Metrics::default());
        let topics: Vec<String> = (0..10).map(|i| format!("room:{i}")).collect();
        let (batch, rxs) = requests(&topics.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(answer(&db, batch, &metrics).await);
        let got = verdicts(rxs);
        for (i, v) in got.iter().enumerate() {
            assert_eq!(v.allowed(), i % 5 != 4, "request {i}");
        }
        assert_eq!(*db.calls.lock().unwrap(), vec![10]);
    }

    #[tokio::test]
    async fn a_poisoned_request_is_split_out_and_denied_alone() {
        let (db, metrics) = (Fake::default(), Metrics::default());
        let mut topics = vec!["room"; 16];
        topics[11] = "poison";
        let (batch, rxs) = requests(&topics);
        assert!(answer(&db, batch, &metrics).await);
        let got = verdicts(rxs);
        assert_eq!(
            got[11],
            Verdict::Denied(Some("invalid byte sequence".into()))
        );
        for (i, v) in got.iter().enumerate().filter(|(i, _)| *i != 11) {
            assert_eq!(v.allowed(), i % 5 != 4, "request {i}: {v:?}");
        }
        // Halving down to the one bad request: 16, 8, 8, 4, 4, 2, 2, 1, 1 calls' sizes.
        let calls = db.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 9, "{calls:?}");
        assert_eq!(metrics.value("realtime_auth_isolations_total"), Some(4.0));
        assert_eq!(
            metrics.value("realtime_auth_policy_errors_total"),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn a_cancelled_call_is_a_failure_not_a_denial() {
        let (db, metrics) = (Fake::default(), Metrics::default());
        let (batch, rxs) = requests(&["room", "slow"]);
        assert!(answer(&db, batch, &metrics).await);
        let got = verdicts(rxs);
        assert_eq!(got[0], Verdict::Allowed);
        assert_eq!(got[1], Verdict::Failed(DbFailure::QueryCanceled));
    }

    #[tokio::test]
    async fn a_lost_connection_fails_every_request_left_and_is_reported() {
        let (db, metrics) = (Fake::default(), Metrics::default());
        let mut topics = vec!["room"; 8];
        topics[2] = "poison";
        topics[6] = "gone";
        let (batch, rxs) = requests(&topics);
        // The first half is split and answered; the connection dies on the second half,
        // which is answered Failed (not denied), and the connection is given up.
        assert!(!answer(&db, batch, &metrics).await);
        let got = verdicts(rxs);
        assert_eq!(&got[..2], &[Verdict::Allowed, Verdict::Allowed]);
        assert_eq!(
            got[2],
            Verdict::Denied(Some("invalid byte sequence".into()))
        );
        assert_eq!(got[3], Verdict::Allowed);
        for v in &got[4..] {
            assert_eq!(v, &Verdict::Failed(DbFailure::Unreachable));
        }
        assert_eq!(*db.calls.lock().unwrap(), vec![8, 4, 2, 2, 1, 1, 4]);
    }

    #[tokio::test]
    async fn a_join_asks_read_only_and_presence_read_when_enabled() {
        let (tx, mut rx) = mpsc::channel(8);
        let who = Identity {
            role: "authenticated".into(),
            claims: r#"{"sub":"u1"}"#.into(),
            headers: "{}".into(),
        };
        let asked = tokio::spawn(async move { channel_access(&tx, &who, "room", true).await });
        let mut seen = Vec::new();
        for _ in 0..2 {
            let r = rx.recv().await.unwrap();
            seen.push((r.extension, r.write));
            let v = match (r.extension, r.write) {
                ("broadcast", false) => Verdict::Denied(None),
                ("presence", false) => Verdict::Allowed,
                _ => Verdict::Denied(Some("role \"x\" is refused".into())),
            };
            r.reply.send(v).unwrap();
        }
        seen.sort();
        // No write verdict: it is asked at the first push.
        assert_eq!(seen, vec![("broadcast", false), ("presence", false)]);
        let access = asked.await.unwrap();
        // Admitted on presence read alone, as Supabase admits it.
        assert!(access.readable() && !access.broadcast_read.allowed());
        assert_eq!(access.failure(), None);
    }
}
