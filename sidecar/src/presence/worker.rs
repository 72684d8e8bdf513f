//! The presence worker: this sidecar's connection for presence writes, loads and the
//! reaper. In a loop, woken by a wish (`members`), a view to load (`view`), a new session
//! (`lease`) or the reaper being due (each second):
//! 0. **Reaper.** Every second it calls `realtime.presence_reap`, which makes the members of
//!    every ended session leave: a lease that ran out (a hung or cut-off sidecar) or a
//!    backend that is gone (a killed one). Every sidecar asks; the first to ask once
//!    `REAP_AT_MOST_EVERY` has passed since the last reap (`realtime.presence_reap_due`)
//!    reaps, so the primary makes about one reap a second, not one for each sidecar. (Not on
//!    the lease's connection: the reaper may wait for row locks, a renewal must not.)
//! 1. **Loads.** The topics a view is waiting for are read in one `realtime.presence_state`
//!    call and handed to the views.
//! 2. **Writes.** Every wish that changes something is written, at most WRITE_BATCH to a
//!    statement of `realtime.presence_track` / `realtime.presence_untrack` calls, under the
//!    current session (`lease`); each call commits its diff to the queue. A statement the
//!    database refuses is split in halves down to the member that sank it, so one bad meta
//!    fails only its own push, in a few statements; one cancelled by its timeout is retried
//!    whole later. Each push is answered once
//!    its change committed.
//!
//! Under each new session (a lease lost, or this connection broken with a write in flight
//! whose fate is unknown) every member is tracked again; the old session is ended, so what
//! was written under it leaves.

use super::lease::Session;
use super::members::{Desired, MemberId, Members, Reply, Want};
use super::view::{StateRow, Views};
use crate::config::Config;
use crate::db_worker;
use crate::hub::TopicKey;
use crate::metrics::Metrics;
use crate::reason::Refusal;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;
use tokio_postgres::{Client, Statement};

/// The least time between two reaps on the primary, whichever sidecars make them: a little
/// under the reaper's tick, so that a sidecar's own tick always finds a reap due when no
/// other sidecar made one since its last, and members of an ended session never wait more
/// than a tick for it.
const REAP_AT_MOST_EVERY: std::time::Duration = std::time::Duration::from_millis(900);

/// Every sidecar asks each second, and the first to ask once REAP_AT_MOST_EVERY has passed
/// reaps: about one reap a second on the primary, however many sidecars.
const REAP_SQL: &str = "SELECT CASE WHEN realtime.presence_reap_due($1) \
                        THEN realtime.presence_reap() ELSE 0 END AS reaped";

/// Most members written by one statement: a statement stays short, whatever is waiting.
const WRITE_BATCH: usize = 1000;

const WRITE_SQL: &str = "SELECT u.i, CASE WHEN u.track \
       THEN realtime.presence_track($1, u.topic, u.private, u.key, u.meta::jsonb, u.prev) \
       ELSE realtime.presence_untrack($1, u.prev)::text END AS result \
     FROM unnest($2::bool[], $3::text[], $4::bool[], $5::text[], $6::text[], $7::text[]) \
       WITH ORDINALITY AS u(track, topic, private, key, meta, prev, i)";

const STATE_SQL: &str = "SELECT topic, private, key, ref, meta::text AS meta, live \
     FROM realtime.presence_state($1, $2)";

/// A member this sidecar has in the database.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    pub r#ref: String,
    pub key: String,
    pub meta: String,
}

/// One write of a batch.
pub struct Write {
    pub id: MemberId,
    pub op: Op,
    pub replies: Vec<Reply>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Track, replacing the member's earlier ref if it has one.
    Track {
        key: String,
        meta: String,
        prev: Option<String>,
    },
    Untrack {
        r#ref: String,
    },
}

impl Op {
    /// The wish this write carries out.
    fn desired(&self) -> Desired {
        match self {
            Op::Track { key, meta, .. } => Desired::Tracked {
                key: key.clone(),
                meta: meta.clone(),
            },
            Op::Untrack { .. } => Desired::Untracked,
        }
    }
}

/// The writes that the wishes need, given what is in the database. Wishes that change
/// nothing are answered at once.
pub fn plan(wants: HashMap<MemberId, Want>, applied: &HashMap<MemberId, Applied>) -> Vec<Write> {
    let mut writes = Vec::new();
    for (id, want) in wants {
        let have = applied.get(&id);
        let op = match (&want.desired, have) {
            (Desired::Untracked, None) => None,
            (Desired::Untracked, Some(a)) => Some(Op::Untrack {
                r#ref: a.r#ref.clone(),
            }),
            (Desired::Tracked { key, meta }, Some(a)) if a.key == *key && a.meta == *meta => None,
            (Desired::Tracked { key, meta }, have) => Some(Op::Track {
                key: key.clone(),
                meta: meta.clone(),
                prev: have.map(|a| a.r#ref.clone()),
            }),
        };
        match op {
            Some(op) => writes.push(Write {
                id,
                op,
                replies: want.replies,
            }),
            None => want.replies.iter().for_each(|r| {
                r.ok();
            }),
        }
    }
    writes
}

/// Why a step of the loop stopped.
enum Stop {
    /// The connection is lost or stuck: reconnect under a new session.
    Lost(String),
}

/// How a write statement ended, when the connection survived it.
enum Refused {
    /// Cancelled by its statement timeout, or a deadlock's victim: nothing was written; try
    /// again later.
    Canceled,
    /// The database refused it; the text is its reason.
    Input(String),
}

pub struct Worker {
    cfg: Arc<Config>,
    views: Arc<Views>,
    members: Arc<Members>,
    metrics: Arc<Metrics>,
    session: Arc<Session>,
    applied: HashMap<MemberId, Applied>,
    /// The session generation `applied` was written under.
    generation: u64,
}

impl Worker {
    pub fn new(
        cfg: Arc<Config>,
        views: Arc<Views>,
        members: Arc<Members>,
        metrics: Arc<Metrics>,
        session: Arc<Session>,
    ) -> Self {
        let generation = session.generation();
        Worker {
            cfg,
            views,
            members,
            metrics,
            session,
            applied: HashMap::new(),
            generation,
        }
    }

    /// Every member this sidecar had is to be tracked again (under a new session).
    fn track_all_again(&mut self) {
        for (id, a) in std::mem::take(&mut self.applied) {
            let desired = Desired::Tracked {
                key: a.key,
                meta: a.meta,
            };
            // A wish set meanwhile is newer than what was applied: it stands.
            self.members.set_if_absent(id, desired);
        }
    }

    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut ended: Option<String> = None;
        loop {
            let Some(client) =
                db_worker::connect_retrying(&self.cfg, "presence", &mut shutdown, || {}).await
            else {
                return;
            };
            match self.serve(&client, ended.take(), &mut shutdown).await {
                Ok(()) => return,
                Err(Stop::Lost(why)) => {
                    tracing::warn!(error = %why, "presence connection lost; its members are tracked again under a new session");
                    self.metrics.presence_sessions_lost_total.increment(1);
                    ended = Some(self.session.replace());
                    self.generation = self.session.generation();
                    self.track_all_again();
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    async fn call<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<Result<T, tokio_postgres::Error>, Stop> {
        match tokio::time::timeout(self.cfg.db_call_deadline(), f).await {
            Err(_) => Err(Stop::Lost(format!("{what} did not answer in time"))),
            Ok(Err(e))
                if e.is_closed()
                    || e.as_db_error().is_none()
                    || db_worker::server_ended_session(&e) =>
            {
                Err(Stop::Lost(format!("{what}: {e}")))
            }
            Ok(r) => Ok(r),
        }
    }

    async fn serve(
        &mut self,
        client: &Client,
        ended: Option<String>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), Stop> {
        if let Some(old) = ended {
            // What was written under the old session leaves now (its backend lives on in the
            // lease task's connection, so the reaper would wait for the lease to run out).
            let end = self
                .call(
                    "presence_end",
                    client.query_one("SELECT realtime.presence_end($1)", &[&old]),
                )
                .await?;
            if let Err(e) = end {
                tracing::warn!(error = %e, "could not end the earlier presence session; its lease will");
            }
        }
        // The next reap is due a TICK after the last one began. (A separate one-second
        // interval woke the loop a moment before that, found less than a TICK gone and
        // skipped, so the reaper ran every other second: a cut-off sidecar's members left
        // up to a second late.)
        let mut reap_due = Instant::now();
        // Prepared once a connection: the reaper asks every second, and an unprepared query
        // is parsed and planned on the primary each time, in two round trips. A database that
        // refuses it (an extension older than realtime.presence_reap_due) leaves this sidecar
        // without a reaper, as a failing reap did before, not without presence.
        let reap = match self
            .call("prepare presence_reap", client.prepare(REAP_SQL))
            .await?
        {
            Ok(statement) => Some(statement),
            Err(e) => {
                tracing::warn!(error = %e, "the presence reaper cannot run on this database");
                None
            }
        };
        loop {
            if Instant::now() >= reap_due {
                reap_due = Instant::now() + super::lease::TICK;
                if let Some(reap) = &reap {
                    self.reap(client, reap).await?;
                }
            }
            self.load(client).await?;
            self.write(client).await?;
            tokio::select! {
                _ = self.members.wake.notified() => {}
                _ = self.views.wake.notified() => {}
                _ = self.session.ready.notified() => {}
                _ = tokio::time::sleep_until(reap_due.into()) => {}
                // The lease task ends the session on shutdown.
                _ = shutdown.changed() => return Ok(()),
            }
        }
    }

    async fn reap(&self, client: &Client, statement: &Statement) -> Result<(), Stop> {
        let every = REAP_AT_MOST_EVERY.as_millis() as i32;
        match self
            .call("presence_reap", client.query_one(statement, &[&every]))
            .await?
        {
            Ok(row) => {
                let n: i32 = row.get("reaped");
                if n > 0 {
                    tracing::info!(members = n, "presence members of ended sessions left");
                    self.metrics.presence_reaped_total.increment(n as u64);
                }
            }
            Err(e) => tracing::warn!(error = %e, "the presence reaper failed"),
        }
        Ok(())
    }

    async fn load(&mut self, client: &Client) -> Result<(), Stop> {
        let loads = self.views.take_loads();
        if loads.is_empty() {
            return Ok(());
        }
        let topics: Vec<&str> = loads.iter().map(|(k, _)| k.topic.as_str()).collect();
        let privates: Vec<bool> = loads.iter().map(|(k, _)| k.private).collect();
        let rows = match self
            .call(
                "presence_state",
                client.query(STATE_SQL, &[&topics, &privates]),
            )
            .await
        {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "presence state could not be read; retrying");
                self.views.retry_loads(loads);
                return Ok(());
            }
            Err(stop) => {
                self.views.retry_loads(loads);
                return Err(stop);
            }
        };
        let mut by_topic: HashMap<TopicKey, Vec<StateRow>> = HashMap::new();
        for row in rows {
            let key = TopicKey {
                topic: row.get("topic"),
                private: row.get("private"),
            };
            let meta: String = row.get("meta");
            by_topic.entry(key).or_default().push(StateRow {
                key: row.get("key"),
                r#ref: row.get("ref"),
                meta: serde_json::from_str(&meta).unwrap_or_default(),
                live: row.get("live"),
            });
        }
        self.metrics
            .presence_loads_total
            .increment(loads.len() as u64);
        for (key, load) in loads {
            let rows = by_topic.remove(&key).unwrap_or_default();
            self.views.loaded(&key, load, rows);
        }
        Ok(())
    }

    async fn write(&mut self, client: &Client) -> Result<(), Stop> {
        let Some((session, generation)) = self.session.ready_id() else {
            // A new session whose lease is not taken yet: the wishes wait for it.
            return Ok(());
        };
        if generation != self.generation {
            // The lease task took a new session (the old one's lease was lost).
            self.generation = generation;
            self.track_all_again();
        }
        if self.members.is_empty() {
            return Ok(());
        }
        let mut writes = plan(self.members.take(), &self.applied);
        while !writes.is_empty() {
            let rest = writes.split_off(writes.len().min(WRITE_BATCH));
            if let Err(stop) = self.write_batch(client, &session, writes).await {
                self.restore(rest);
                return Err(stop);
            }
            writes = rest;
        }
        Ok(())
    }

    /// Puts the wishes of writes not carried out back, with their pushes: the statement was
    /// cancelled, or the connection was lost before they were written or while they were
    /// (their fate unknown). Under the next session they are written again, beside the
    /// members tracked again from `applied` (a wish put back is newer, and stands). Dropped,
    /// they were lost: the members in no view and their pushes never answered (issue 42, the
    /// lab's forced failover: every view lacked 400 members after a write to the isolated old
    /// primary never answered).
    fn restore(&self, writes: Vec<Write>) {
        for w in writes {
            self.members.restore(w.id, w.op.desired(), w.replies);
        }
    }

    async fn write_batch(
        &mut self,
        client: &Client,
        session: &str,
        writes: Vec<Write>,
    ) -> Result<(), Stop> {
        self.metrics.presence_write_batches_total.increment(1);
        // A statement the database refuses for its input (one bad member sinks it: none of
        // it committed) is split in halves and each asked again, down to the member that
        // sank it, which alone is refused: a few statements per bad member, not one per
        // member of the batch (db_worker::settle splits the batched workers' calls so).
        let mut work = vec![writes];
        while let Some(mut part) = work.pop() {
            let done = match self.statement(client, session, &part).await {
                Ok(done) => done,
                Err(stop) => {
                    self.restore(part);
                    work.into_iter().for_each(|w| self.restore(w));
                    return Err(stop);
                }
            };
            match done {
                Ok(results) => {
                    for (w, r) in part.into_iter().zip(results) {
                        self.settle(w, Ok(r));
                    }
                }
                Err(Refused::Canceled) => {
                    tracing::warn!(
                        members = part.len(),
                        "a presence write hit its statement timeout; retrying"
                    );
                    self.restore(part);
                }
                Err(Refused::Input(why)) if part.len() == 1 => {
                    let w = part.pop().expect("one write");
                    self.settle(w, Err(why));
                }
                Err(Refused::Input(why)) => {
                    tracing::debug!(error = %why, members = part.len(), "presence write failed; splitting");
                    let back = part.split_off(part.len() / 2);
                    work.push(back);
                    work.push(part);
                }
            }
        }
        Ok(())
    }

    /// Runs one statement over `writes`; each result is the new ref of a track (None when
    /// nothing changed) or, for an untrack, whether the member was present.
    async fn statement(
        &self,
        client: &Client,
        session: &str,
        writes: &[Write],
    ) -> Result<Result<Vec<Option<String>>, Refused>, Stop> {
        let mut track = Vec::with_capacity(writes.len());
        let mut topics = Vec::with_capacity(writes.len());
        let mut privates = Vec::with_capacity(writes.len());
        let mut keys: Vec<Option<&str>> = Vec::with_capacity(writes.len());
        let mut metas: Vec<Option<&str>> = Vec::with_capacity(writes.len());
        let mut prevs: Vec<Option<&str>> = Vec::with_capacity(writes.len());
        for w in writes {
            topics.push(w.id.topic.topic.as_str());
            privates.push(w.id.topic.private);
            match &w.op {
                Op::Track { key, meta, prev } => {
                    track.push(true);
                    keys.push(Some(key));
                    metas.push(Some(meta));
                    prevs.push(prev.as_deref());
                }
                Op::Untrack { r#ref } => {
                    track.push(false);
                    keys.push(None);
                    metas.push(None);
                    prevs.push(Some(r#ref));
                }
            }
        }
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&session, &track, &topics, &privates, &keys, &metas, &prevs];
        self.metrics.presence_write_statements_total.increment(1);
        match self
            .call("presence write", client.query(WRITE_SQL, &params))
            .await?
        {
            Ok(rows) => {
                let mut results = vec![None; writes.len()];
                for row in rows {
                    let i = row.get::<_, i64>("i") as usize - 1;
                    results[i] = row.get::<_, Option<String>>("result");
                }
                Ok(Ok(results))
            }
            // Cancelled by its timeout, or chosen as a deadlock's victim (a reaper tombstoning
            // the same rows in another order): nothing was written; the same write is tried
            // again, not isolated as if its input were bad.
            Err(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED)
                    || e.code()
                        == Some(&tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED) =>
            {
                Ok(Err(Refused::Canceled))
            }
            Err(e) => Ok(Err(Refused::Input(
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
            ))),
        }
    }

    fn settle(&mut self, w: Write, result: Result<Option<String>, String>) {
        let Write { id, op, replies } = w;
        match result {
            Err(why) => {
                self.metrics.presence_write_failures_total.increment(1);
                let refusal = Refusal::UnableToTrackPresence(why);
                let why = refusal.text();
                replies.iter().for_each(|r| {
                    r.error(&why);
                });
                return;
            }
            Ok(result) => {
                self.metrics.presence_writes_total.increment(1);
                match op {
                    Op::Track { key, meta, .. } => {
                        if let Some(r#ref) = result {
                            self.applied.insert(id, Applied { r#ref, key, meta });
                        }
                    }
                    Op::Untrack { .. } => {
                        self.applied.remove(&id);
                    }
                }
            }
        }
        replies.iter().for_each(|r| {
            r.ok();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::TopicKey;

    fn id(conn: u64) -> MemberId {
        MemberId {
            conn,
            topic: TopicKey {
                private: false,
                topic: "room".into(),
            },
        }
    }

    fn want(desired: Desired) -> Want {
        Want {
            desired,
            replies: Vec::new(),
        }
    }

    fn tracked(meta: &str) -> Desired {
        Desired::Tracked {
            key: "ann".into(),
            meta: meta.into(),
        }
    }

    #[test]
    fn only_wishes_that_change_the_database_are_written() {
        let mut applied = HashMap::new();
        let have = Applied {
            r#ref: "p7".into(),
            key: "ann".into(),
            meta: "{}".into(),
        };
        applied.insert(id(1), have.clone());
        applied.insert(id(2), have.clone());
        applied.insert(id(3), have);
        let wants = HashMap::from([
            (id(1), want(tracked("{}"))),
            (id(2), want(tracked("{\"typing\":true}"))),
            (id(3), want(Desired::Untracked)),
            (id(4), want(Desired::Untracked)),
            (id(5), want(tracked("{}"))),
        ]);
        let mut ops: Vec<(u64, Op)> = plan(wants, &applied)
            .into_iter()
            .map(|w| (w.id.conn, w.op))
            .collect();
        ops.sort_by_key(|(c, _)| *c);
        assert_eq!(
            ops,
            vec![
                (
                    2,
                    Op::Track {
                        key: "ann".into(),
                        meta: "{\"typing\":true}".into(),
                        prev: Some("p7".into())
                    }
                ),
                (3, Op::Untrack { r#ref: "p7".into() }),
                (
                    5,
                    Op::Track {
                        key: "ann".into(),
                        meta: "{}".into(),
                        prev: None
                    }
                ),
            ]
        );
    }
}
