//! Private-channel authorization: requests from all connections are batched into one
//! `realtime.authorize` call (whatever arrived while the previous call ran goes into the
//! next), on the sidecar's own connection, so joins cost a fraction of a database round trip.
//!
//! One request cannot sink the others: when a call fails without losing the connection (an
//! input the database refuses, a statement timeout), the batch is split in halves and each
//! half asked again, down to single requests, so only the bad one is denied. A failure of
//! the database itself (connection lost, call timed out) is a `Verdict::Failed`, never a
//! denial: a re-check keeps the channel and retries.

use crate::address::AddressKey;
use crate::config::Config;
use crate::db_worker::DbFailure;
use crate::db_worker::{self, Batched, CallError, Db};
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

const SQL: &str =
    "SELECT ordinality, allowed, error FROM realtime.authorize($1, $2, $3, $4, $5, $6)";

/// Who asks (the JWT's role and claims, the request headers) to do what on which topic.
pub struct AuthRequest {
    pub who: Arc<Identity>,
    pub topic: String,
    pub extension: &'static str,
    pub write: bool,
    pub reply: oneshot::Sender<Verdict>,
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
    /// The client address whose line its requests wait in (`verdict_queue`); None for a
    /// backend's. Not part of what a verdict is for.
    pub address: Option<AddressKey>,
}

/// Asks for one verdict (batched with whatever else is waiting).
pub async fn ask(
    tx: &mpsc::Sender<AuthRequest>,
    who: &Arc<Identity>,
    topic: &str,
    extension: &'static str,
    write: bool,
) -> Verdict {
    let (reply, rx) = oneshot::channel();
    let req = AuthRequest {
        who: who.clone(),
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
    who: &Arc<Identity>,
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
pub async fn write_access(
    tx: &mpsc::Sender<AuthRequest>,
    who: &Arc<Identity>,
    topic: &str,
) -> Verdict {
    ask(tx, who, topic, "broadcast", true).await
}

/// A private channel's presence verdicts, asked at its first track as Supabase asks them:
/// presence write, and presence read when it was not asked at join (presence was not
/// enabled then). Returns (read, write).
pub async fn presence_access(
    tx: &mpsc::Sender<AuthRequest>,
    who: &Arc<Identity>,
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

/// Runs until shutdown, answering what connections ask on `rx`.
pub async fn run(
    cfg: Arc<Config>,
    rx: mpsc::Receiver<AuthRequest>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    let ttl = Duration::from_millis(cfg.authorization_denial_cache_ms);
    let denials = Denials::new(ttl, cfg.max_remembered_denials as usize);
    db_worker::serve(&cfg, Authorizer { metrics, denials }, rx, shutdown).await
}

/// Denied verdicts remembered per (identity, topic, extension, action) for at most
/// AUTHORIZATION_DENIAL_CACHE_MS (issue 39, M1): a flood of private joins on topics its
/// identity may not read is answered here, without a database call or a probe row. Only a
/// verdict the database gave is remembered, from the moment it gave it (an answer from here
/// never renews it), so whatever a policy or grant changes counts within the TTL. Keyed by
/// a hash with this process's random key: a client cannot aim collisions, and a collision
/// could only deny. Allowed verdicts are never remembered here (a channel's own re-checks
/// have AUTHORIZATION_TTL_SECS).
struct Denials {
    ttl: Duration,
    /// Entries the map holds at most (MAX_REMEMBERED_DENIALS); past it the expired go, and
    /// if that is not enough, all (forgetting a denial only costs a database call).
    max: usize,
    hasher: std::collections::hash_map::RandomState,
    /// Lock rule: held only to read or change the map, never across an await.
    at: Mutex<HashMap<u64, Instant>>,
}

impl Denials {
    fn new(ttl: Duration, max: usize) -> Denials {
        Denials {
            ttl,
            max,
            hasher: Default::default(),
            at: Mutex::default(),
        }
    }

    fn key(&self, r: &AuthRequest) -> u64 {
        let w = &r.who;
        self.hasher.hash_one((
            &w.role,
            &w.claims,
            &w.headers,
            &r.topic,
            r.extension,
            r.write,
        ))
    }

    fn denied(&self, r: &AuthRequest) -> bool {
        if self.ttl.is_zero() {
            return false;
        }
        let key = self.key(r);
        let at = self.at.lock().unwrap();
        at.get(&key).is_some_and(|t| t.elapsed() < self.ttl)
    }

    fn remember(&self, r: &AuthRequest) {
        if self.ttl.is_zero() {
            return;
        }
        let key = self.key(r);
        let mut at = self.at.lock().unwrap();
        if at.len() >= self.max {
            let ttl = self.ttl;
            at.retain(|_, t| t.elapsed() < ttl);
            if at.len() >= self.max {
                at.clear();
            }
        }
        at.insert(key, Instant::now());
    }
}

/// `realtime.authorize` over a batch: a verdict per request.
struct Authorizer {
    metrics: Arc<Metrics>,
    denials: Denials,
}

impl Batched for Authorizer {
    type Req = AuthRequest;
    type Out = Verdict;
    const WHAT: &'static str = "authorization";
    const MAX: usize = 10_000;

    async fn call(&self, db: &Db, all: &[AuthRequest]) -> Result<Vec<Verdict>, CallError> {
        // Denials remembered are answered here; the rest are asked.
        let mut verdicts = vec![Verdict::Denied(None); all.len()];
        let asked: Vec<usize> = (0..all.len())
            .filter(|&i| !self.denials.denied(&all[i]))
            .collect();
        let cached = all.len() - asked.len();
        if cached > 0 {
            self.metrics
                .auth_denials_cached_total
                .increment(cached as u64);
        }
        if asked.is_empty() {
            return Ok(verdicts);
        }
        let batch: Vec<&AuthRequest> = asked.iter().map(|&i| &all[i]).collect();
        let col = |f: fn(&AuthRequest) -> &str| batch.iter().map(|r| f(r)).collect::<Vec<&str>>();
        let (roles, claims, headers, topics) = (
            col(|r| &r.who.role),
            col(|r| &r.who.claims),
            col(|r| &r.who.headers),
            col(|r| &r.topic),
        );
        let extensions: Vec<&str> = batch.iter().map(|r| r.extension).collect();
        let actions: Vec<&str> = batch
            .iter()
            .map(|r| if r.write { "write" } else { "read" })
            .collect();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [&roles, &claims, &headers, &topics, &extensions, &actions];
        let rows = db.query(SQL, &params).await?;
        for &i in &asked {
            verdicts[i] = Verdict::Denied(Some("no verdict".into()));
        }
        for row in rows {
            let i = asked[row.get::<_, i32>("ordinality") as usize - 1];
            let (allowed, error): (bool, Option<String>) = (row.get("allowed"), row.get("error"));
            verdicts[i] = if allowed {
                Verdict::Allowed
            } else {
                self.denials.remember(&all[i]);
                Verdict::Denied(error)
            };
        }
        Ok(verdicts)
    }

    fn answer(&self, r: AuthRequest, v: Verdict) {
        if let Verdict::Denied(Some(e)) = &v {
            log_policy_error(&self.metrics, &r, e);
        }
        let _ = r.reply.send(v);
    }

    fn fail(&self, r: AuthRequest, why: DbFailure) {
        let _ = r.reply.send(Verdict::Failed(why));
    }

    fn refuse(&self, r: AuthRequest, message: String) {
        // The database refused this request's input: it alone is denied.
        log_policy_error(&self.metrics, &r, &message);
        let _ = r.reply.send(Verdict::Denied(Some(message)));
    }

    fn taken(&self, batch: &[AuthRequest]) {
        self.metrics.auth_batches_total.increment(1);
        self.metrics
            .auth_requests_total
            .increment(batch.len() as u64);
    }

    fn split(&self, n: usize, message: &str) {
        self.metrics.auth_isolations_total.increment(1);
        tracing::debug!(error = %message, requests = n, "authorization call failed; splitting the batch");
    }
}

/// A policy that raised, a missing privilege, or a role the sidecar may not act as: logged
/// at WARNING with the fix when it is one the operator can make, and counted.
fn log_policy_error(metrics: &Metrics, r: &AuthRequest, error: &str) {
    metrics.auth_policy_errors_total.increment(1);
    if error.starts_with("permission denied for schema realtime") {
        let role = &r.who.role;
        tracing::warn!(%role, topic = %r.topic, error,
            "RlsPolicyError: role \"{}\" has no USAGE on schema realtime (roles created after CREATE EXTENSION get none): GRANT USAGE ON SCHEMA realtime TO \"{}\"; GRANT SELECT, INSERT ON realtime.messages TO \"{}\"",
            role, role, role);
    } else if error.contains("is not granted to the sidecar's login role") {
        tracing::warn!(role = %r.who.role, topic = %r.topic, error, "RlsPolicyError: the sidecar may not act as this role");
    } else {
        tracing::info!(role = %r.who.role, topic = %r.topic, error, "RlsPolicyError");
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

    impl db_worker::Call<AuthRequest, Verdict> for Fake {
        async fn call(&self, batch: &[AuthRequest]) -> Result<Vec<Verdict>, CallError> {
            self.calls.lock().unwrap().push(batch.len());
            let has = |t: &str| batch.iter().any(|r| r.topic == t);
            if has("gone") && batch.len() <= 4 {
                return Err(CallError::Lost(DbFailure::Unreachable));
            }
            if has("poison") || has("slow") {
                return Err(CallError::Failed {
                    canceled: has("slow"),
                    message: "invalid byte sequence".into(),
                });
            }
            Ok(batch
                .iter()
                .map(|r| match r.who.role.as_str() {
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
                    who: Arc::new(Identity {
                        role: if i % 5 == 4 { "anon" } else { "authenticated" }.into(),
                        claims: "{}".into(),
                        headers: "{}".into(),
                        address: None,
                    }),
                    topic: (*t).into(),
                    extension: "broadcast",
                    write: false,
                    reply,
                };
                (req, rx)
            })
            .unzip()
    }

    /// Answers a batch as the authorizer does, with `db` in place of its connection.
    async fn answer(db: &Fake, batch: Vec<AuthRequest>, metrics: &Arc<Metrics>) -> bool {
        let worker = Authorizer {
            metrics: metrics.clone(),
            denials: Denials::new(Duration::ZERO, 1),
        };
        db_worker::settle(&worker, db, batch).await
    }

    fn verdicts(rxs: Vec<oneshot::Receiver<Verdict>>) -> Vec<Verdict> {
        rxs.into_iter()
            .map(|mut rx| rx.try_recv().expect("every request is answered"))
            .collect()
    }

    /// MAX_REMEMBERED_DENIALS: a flood of denials on distinct topics within the TTL never
    /// holds more than the bound; past it what was remembered is forgotten (and asked again).
    #[test]
    fn denials_past_their_bound_are_forgotten_not_kept() {
        let denials = Denials::new(Duration::from_secs(5), 100);
        let (batch, _rxs) = requests(&["room"]);
        let who = batch[0].who.clone();
        let ask = |topic: String| {
            let (reply, _rx) = oneshot::channel();
            AuthRequest {
                who: who.clone(),
                topic,
                extension: "broadcast",
                write: false,
                reply,
            }
        };
        for i in 0..250 {
            denials.remember(&ask(format!("z{i}")));
            assert!(denials.at.lock().unwrap().len() <= 100, "at {i}");
        }
        assert!(
            denials.denied(&ask("z249".into())),
            "the newest is remembered"
        );
        assert!(
            !denials.denied(&ask("z0".into())),
            "the oldest was forgotten"
        );
    }

    #[tokio::test]
    async fn one_call_answers_a_whole_batch_in_order() {
        let (db, metrics) = (Fake::default(), Arc::new(Metrics::default()));
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
        let (db, metrics) = (Fake::default(), Arc::new(Metrics::default()));
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
        let (db, metrics) = (Fake::default(), Arc::new(Metrics::default()));
        let (batch, rxs) = requests(&["room", "slow"]);
        assert!(answer(&db, batch, &metrics).await);
        let got = verdicts(rxs);
        assert_eq!(got[0], Verdict::Allowed);
        assert_eq!(got[1], Verdict::Failed(DbFailure::QueryCanceled));
    }

    #[tokio::test]
    async fn a_lost_connection_fails_every_request_left_and_is_reported() {
        let (db, metrics) = (Fake::default(), Arc::new(Metrics::default()));
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
        let who = Arc::new(Identity {
            role: "authenticated".into(),
            claims: r#"{"sub":"u1"}"#.into(),
            headers: "{}".into(),
            address: None,
        });
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
