//! What the database workers share. Every worker (the authorizer, the bindings' check, the
//! relay, history, interest, presence and its lease) keeps one Postgres connection up with
//! backoff (`connect_retrying`). The three that answer connections' requests in batches
//! (authorizer, check, relay) are one shape, `Batched`, served by one loop (`serve`):
//! connect with backoff, take whatever requests are waiting (no timer: a batch holds what
//! arrived while the previous one was in the database), make one call, hand each request
//! its answer. A call the database refuses is split in halves and each half asked again,
//! down to the one request that sank it, which alone is refused; a lost connection fails
//! every request left (never a refusal: the database could not answer) and is replaced.
//! Each worker is reduced to its SQL (`Batched::call`) and its answers.

use crate::config::Config;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

/// Why the database could not give an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbFailure {
    /// No connection (or it was lost during the call, or the call hung past its deadline).
    Unreachable,
    /// The call was cancelled or hit its statement timeout.
    QueryCanceled,
    /// Not asked: the client's address already has as many authorization checks waiting as
    /// it may (`verdict_queue`).
    Busy,
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
            DbFailure::Busy => {
                "ClientJoinRateLimitReached: Too many authorization checks of this client address are waiting (MAX_VERDICTS_WAITING_PER_ADDRESS)"
            }
        }
    }
}

/// How one call over a batch failed.
#[derive(Debug)]
pub enum CallError {
    /// The database could not answer; the connection is replaced.
    Lost(DbFailure),
    /// The database refused the call: an input it cannot take, an error a policy raised,
    /// or (`canceled`) its statement timeout.
    Failed { canceled: bool, message: String },
}

/// Whether the server ended the session with this error (FATAL or PANIC: the backend was
/// terminated, the server is shutting down): the connection is gone, whether or not the
/// client has read the socket's close yet, so the call was not refused, the database could
/// not answer. (Issue 42: a presence write ended so was answered to its pushes as refused.)
pub fn server_ended_session(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|d| matches!(d.severity(), "FATAL" | "PANIC"))
}

/// A worker's connection, with the deadline that bounds a call on a connection that hangs
/// (the server's statement_timeout ends a slow one first).
pub struct Db {
    pub client: Client,
    deadline: Duration,
}

impl Db {
    pub fn new(client: Client, deadline: Duration) -> Self {
        Db { client, deadline }
    }

    /// One statement's rows, its failure said as `CallError`.
    pub async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, CallError> {
        self.run(self.client.query(sql, params)).await
    }

    /// Runs one call on the connection under the deadline, its failure said as `CallError`.
    pub async fn run<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.deadline, call).await {
            Err(_) => Err(CallError::Lost(DbFailure::Unreachable)),
            Ok(Err(e)) if self.client.is_closed() || server_ended_session(&e) => {
                tracing::warn!(error = %e, "worker connection lost");
                Err(CallError::Lost(DbFailure::Unreachable))
            }
            Ok(Err(e)) => Err(CallError::Failed {
                canceled: e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
                message: e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
            }),
            Ok(Ok(t)) => Ok(t),
        }
    }
}

/// A worker that answers requests in batches, one database call per batch.
pub(crate) trait Batched {
    type Req;
    /// What one request is answered when the call went through.
    type Out;
    /// The worker's name in the log.
    const WHAT: &'static str;
    /// Most requests in one call.
    const MAX: usize;
    /// Most bytes of requests in one call, as `size` counts them (a call always takes one
    /// request, whatever its size): a statement's parameters stay far under what Postgres
    /// takes in one value (1 GB) however large each request may be.
    const MAX_BYTES: usize = usize::MAX;

    /// A request's bytes, as `MAX_BYTES` counts them.
    fn size(_req: &Self::Req) -> usize {
        0
    }

    /// One call over `batch`: an answer per request, in order.
    async fn call(&self, db: &Db, batch: &[Self::Req]) -> Result<Vec<Self::Out>, CallError>;

    /// Hands a request its answer.
    fn answer(&self, req: Self::Req, out: Self::Out);

    /// The database could not answer this request.
    fn fail(&self, req: Self::Req, why: DbFailure);

    /// The database refused a call holding only this request: it alone is refused.
    fn refuse(&self, req: Self::Req, message: String);

    /// A batch was taken (for the worker's metrics).
    fn taken(&self, _batch: &[Self::Req]) {}

    /// A refused call of `n` requests is being split.
    fn split(&self, _n: usize, _message: &str) {}
}

/// One call over a batch: `Batched::call` on the worker's connection, or a test's stand-in,
/// so the splitting below is tested without a database.
pub(crate) trait Call<R, O> {
    async fn call(&self, batch: &[R]) -> Result<Vec<O>, CallError>;
}

/// A worker's calls on its live connection.
struct On<'a, B> {
    worker: &'a B,
    db: &'a Db,
}

impl<B: Batched> Call<B::Req, B::Out> for On<'_, B> {
    async fn call(&self, batch: &[B::Req]) -> Result<Vec<B::Out>, CallError> {
        self.worker.call(self.db, batch).await
    }
}

/// Runs a batched worker until shutdown: its connection kept up, its requests answered.
pub(crate) async fn serve<B: Batched>(
    cfg: &Config,
    worker: B,
    mut rx: mpsc::Receiver<B::Req>,
    mut shutdown: watch::Receiver<bool>,
) {
    // A request the last batch had no room for in bytes: the next batch's first.
    let mut carry = None;
    loop {
        let fail = |r: B::Req| worker.fail(r, DbFailure::Unreachable);
        let Some(client) = connect(cfg, B::WHAT, &mut rx, &mut shutdown, fail).await else {
            return;
        };
        let db = Db::new(client, cfg.db_call_deadline());
        let on = On {
            worker: &worker,
            db: &db,
        };
        while let Some(batch) = next_sized_batch(
            &mut rx,
            &mut carry,
            (B::MAX, B::MAX_BYTES),
            B::size,
            &mut shutdown,
        )
        .await
        {
            worker.taken(&batch);
            if !settle(&worker, &on, batch).await {
                // The connection is gone: the request waiting its turn fails as the others did.
                if let Some(r) = carry.take() {
                    worker.fail(r, DbFailure::Unreachable);
                }
                break;
            }
        }
        if *shutdown.borrow() || rx.is_closed() {
            return;
        }
    }
}

/// Answers every request of `batch`, splitting a refused call in halves down to the request
/// that sank it. False when the connection is no longer usable (every request left was
/// failed `Unreachable`, or as the loss said).
pub(crate) async fn settle<B: Batched>(
    worker: &B,
    db: &impl Call<B::Req, B::Out>,
    batch: Vec<B::Req>,
) -> bool {
    let mut work = vec![batch];
    while let Some(mut part) = work.pop() {
        match db.call(&part).await {
            Ok(outs) => {
                let mut outs = outs.into_iter();
                for r in part {
                    match outs.next() {
                        Some(o) => worker.answer(r, o),
                        // A call that answered fewer than asked: never left hanging.
                        None => worker.fail(r, DbFailure::Unreachable),
                    }
                }
            }
            Err(CallError::Lost(why)) => {
                for r in work.into_iter().flatten().chain(part) {
                    worker.fail(r, why.clone());
                }
                return false;
            }
            Err(CallError::Failed { canceled, message }) if part.len() == 1 => {
                let r = part.pop().expect("one request");
                if canceled {
                    worker.fail(r, DbFailure::QueryCanceled);
                } else {
                    worker.refuse(r, message);
                }
            }
            Err(CallError::Failed { message, .. }) => {
                worker.split(part.len(), &message);
                let back = part.split_off(part.len() / 2);
                work.push(back);
                work.push(part);
            }
        }
    }
    true
}

/// Connects with `cfg`'s settings, retrying with backoff (100 ms doubling to 5 s), and sets
/// the session's statement_timeout. Requests that wait meanwhile are handed to `fail` after
/// each failed attempt, so they are answered, not left hanging. None on shutdown.
pub async fn connect<T>(
    cfg: &Config,
    what: &str,
    rx: &mut mpsc::Receiver<T>,
    shutdown: &mut watch::Receiver<bool>,
    mut fail: impl FnMut(T),
) -> Option<Client> {
    let each_failure = || {
        while let Ok(r) = rx.try_recv() {
            fail(r);
        }
    };
    connect_retrying(cfg, what, shutdown, each_failure).await
}

/// What went wrong, said whole: a server error's own message (tokio-postgres says only "db
/// error"), else the error and each cause under it ("error performing TLS handshake:
/// invalid peer certificate: UnknownIssuer"), so an operator reads why, not only that.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(d) = e.as_db_error() {
        return d.message().to_owned();
    }
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// Connects as `connect` does, calling `each_failure` after every failed attempt. None on
/// shutdown.
pub async fn connect_retrying(
    cfg: &Config,
    what: &str,
    shutdown: &mut watch::Receiver<bool>,
    mut each_failure: impl FnMut(),
) -> Option<Client> {
    let mut backoff = Duration::from_millis(100);
    let pg = cfg.pg_config().expect("validated at startup");
    let tls = cfg.db_tls().expect("validated at startup");
    let setup = format!("SET statement_timeout = {}", cfg.db_statement_timeout_ms);
    loop {
        let attempt = async {
            let (client, conn) = pg.connect(tls.clone()).await?;
            tokio::spawn(conn);
            client.batch_execute(&setup).await?;
            Ok::<_, tokio_postgres::Error>(client)
        };
        let attempt = tokio::select! {
            c = attempt => c,
            _ = shutdown.changed() => return None,
        };
        match attempt {
            Ok(client) => return Some(client),
            Err(e) => {
                tracing::warn!(error = %describe(&e), "{what} connection failed; retrying");
                each_failure();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return None,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Waits for a request, then takes what else is waiting, up to `max`. None on shutdown or
/// when every sender is gone.
pub async fn next_batch<T>(
    rx: &mut mpsc::Receiver<T>,
    max: usize,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Vec<T>> {
    let first = tokio::select! {
        r = rx.recv() => r?,
        _ = shutdown.changed() => return None,
    };
    let mut batch = vec![first];
    while batch.len() < max {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
    Some(batch)
}

/// `next_batch` within `max.1` bytes of requests as `size` counts them: the request that
/// would pass them waits in `carry` and is the next batch's first (a batch always takes its
/// first, whatever its size).
pub async fn next_sized_batch<T>(
    rx: &mut mpsc::Receiver<T>,
    carry: &mut Option<T>,
    (max, max_bytes): (usize, usize),
    size: impl Fn(&T) -> usize,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Vec<T>> {
    let first = match carry.take() {
        Some(r) => r,
        None => tokio::select! {
            r = rx.recv() => r?,
            _ = shutdown.changed() => return None,
        },
    };
    let mut bytes = size(&first);
    let mut batch = vec![first];
    while batch.len() < max {
        match rx.try_recv() {
            Ok(r) => {
                let n = size(&r);
                if bytes.saturating_add(n) > max_bytes {
                    *carry = Some(r);
                    break;
                }
                bytes += n;
                batch.push(r);
            }
            Err(_) => break,
        }
    }
    Some(batch)
}

/// Adds to `batch` what arrives within `within`, up to `max`, but only when the batch already
/// found company (more than one request was waiting): that is a storm of requests (a
/// thousand clients rejoining after a network blip), and one round trip for many of them
/// costs the database far less than many round trips for a few each. A lone request goes at
/// once.
pub async fn gather_storm<T>(
    rx: &mut mpsc::Receiver<T>,
    batch: &mut Vec<T>,
    max: usize,
    within: Duration,
) {
    if batch.len() < 2 {
        return;
    }
    let deadline = tokio::time::Instant::now() + within;
    while batch.len() < max {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(r)) => batch.push(r),
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_goes_at_once_and_a_storm_is_gathered_for_its_window() {
        let (tx, mut rx) = mpsc::channel(100);
        let (_stop, mut shutdown) = watch::channel(false);
        tx.send(1).await.unwrap();
        let mut batch = next_batch(&mut rx, 10, &mut shutdown).await.unwrap();
        let started = tokio::time::Instant::now();
        gather_storm(&mut rx, &mut batch, 10, Duration::from_millis(50)).await;
        assert_eq!(batch, vec![1]);
        assert_eq!(started.elapsed(), Duration::ZERO, "a lone request waited");

        // Two waiting: a storm. What arrives within the window joins them; what arrives after
        // it waits for the next batch.
        tx.send(2).await.unwrap();
        tx.send(3).await.unwrap();
        let late = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            late.send(4).await.unwrap();
            tokio::time::sleep(Duration::from_millis(40)).await;
            late.send(5).await.unwrap();
        });
        let mut batch = next_batch(&mut rx, 10, &mut shutdown).await.unwrap();
        let started = tokio::time::Instant::now();
        gather_storm(&mut rx, &mut batch, 10, Duration::from_millis(50)).await;
        assert_eq!(batch, vec![2, 3, 4]);
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        assert_eq!(
            next_batch(&mut rx, 10, &mut shutdown).await.unwrap(),
            vec![5]
        );

        // A full batch goes without waiting out the window.
        for i in 0..4 {
            tx.send(i).await.unwrap();
        }
        let mut batch = next_batch(&mut rx, 3, &mut shutdown).await.unwrap();
        let started = tokio::time::Instant::now();
        gather_storm(&mut rx, &mut batch, 3, Duration::from_millis(50)).await;
        assert_eq!(batch.len(), 3);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_batch_stops_before_the_request_that_would_pass_its_bytes() {
        let (tx, mut rx) = mpsc::channel(100);
        let (_stop, mut shutdown) = watch::channel(false);
        for n in [40usize, 50, 30, 200, 5] {
            tx.send(n).await.unwrap();
        }
        let mut carry = None;
        let mut batches = Vec::new();
        for _ in 0..4 {
            let size = |n: &usize| *n;
            let b = next_sized_batch(&mut rx, &mut carry, (10, 100), size, &mut shutdown).await;
            batches.push(b.unwrap());
        }
        // The one that did not fit goes first next time; one larger than the bound goes alone.
        assert_eq!(batches, vec![vec![40, 50], vec![30], vec![200], vec![5]]);
    }
}
