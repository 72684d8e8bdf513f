//! Where the Postgres Changes checks run: beside the drain, on connections of their own.
//!
//! Why: a table's check (`deliver::check`) may take up to its budget,
//! CHANGES_CHECK_TIMEOUT_MS (a bulk write into a table whose policy is costly). Run on the
//! drain's connection, in the drain's loop, it held every broadcast, presence diff and
//! other table's change of the batch, and of every batch behind it, that long: in the soak
//! one bulk writer took ordinary subscribers' p99 from 5 ms to 2.2 s. Now the drain matches
//! a batch's changes to channels (no database call), hands a job per changed table to this
//! pool, leaves a slot in each matched channel's hold (`crate::out`, its slots) and hands out the
//! rest of the batch at once; the channels with a slot pending wait, each in its own queue
//! order, until the check fills it.
//!
//! The pool: CHANGES_CHECK_CONNECTIONS workers, each with its connection (opened at its
//! first job, opened again after it is lost). A table's jobs run one at a time, in the
//! order drained (so its changes' slots fill in order and one slow table holds one
//! connection); different tables' jobs run at once on the other connections, the table
//! that has waited longest first. A worker takes every job its table has waiting as one
//! check: a check pays a fixed cost per identity (a subtransaction, its settings, an
//! executor start: `realtime.visible`), so while one runs, the batches drained meanwhile
//! are checked together, as they were when the check held the drain. One check per drained
//! batch fell behind for good at 100 inserts/s into a table of 1,000 subscribers
//! (`pgbench/change_positions.py`, RESULTS.md).
//!
//! Bounded: the changes waiting (or being checked) count against CHANGES_CHECK_BACKLOG and
//! their data against CHANGES_CHECK_BACKLOG_BYTES. A table's share of a batch that does not
//! fit is withheld at once, its channels told why, as for a check that timed out: nothing
//! unchecked is ever sent, and the drain never waits for the pool.
//!
//! The guarantees of the drain stay: a check that fails, times out or loses its connection
//! withholds what it did not decide with a `system` notice (now in the channel's order);
//! the drain is never asked to drain a batch again because of a check.

use super::deliver::{self, Limits, Outgoing, TableSet};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::out::{At, Fill, Reach};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

type TableKey = (String, String);

/// One table's share of one drained batch, to be checked.
struct Job {
    id: u64,
    set: TableSet,
    /// The channels holding a slot of this job: each is filled once it is decided.
    reaches: Vec<Reach>,
}

#[derive(Default)]
struct Sched {
    /// Each table's jobs waiting, in the order drained.
    waiting: HashMap<TableKey, VecDeque<Job>>,
    /// Tables with a job waiting and none running, the longest waiting first.
    ready: VecDeque<TableKey>,
    /// Tables whose job is being checked.
    running: HashSet<TableKey>,
    /// Changes and data bytes admitted and not yet decided (CHANGES_CHECK_BACKLOG).
    changes: usize,
    bytes: usize,
}

struct Inner {
    /// Lock rule: held for a few instructions to take or give a job, never across an
    /// await; no other lock is taken inside it.
    sched: Mutex<Sched>,
    /// Wakes a worker when a table became ready.
    ready: Notify,
    next_job: AtomicU64,
    max_changes: usize,
    max_bytes: usize,
}

/// The pool's handle, shared by the drainer and the workers.
#[derive(Clone)]
pub struct Checks {
    inner: Arc<Inner>,
}

impl Checks {
    pub fn new(cfg: &Config) -> Checks {
        Checks {
            inner: Arc::new(Inner {
                sched: Mutex::default(),
                ready: Notify::new(),
                next_job: AtomicU64::new(1),
                max_changes: cfg.changes_check_backlog as usize,
                max_bytes: cfg.changes_check_backlog_bytes as usize,
            }),
        }
    }

    /// Starts the workers; they end when `shutdown` turns true.
    pub fn start(
        &self,
        cfg: Arc<Config>,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..cfg.changes_check_connections)
            .map(|_| {
                let worker = Worker {
                    inner: self.inner.clone(),
                    cfg: cfg.clone(),
                    metrics: metrics.clone(),
                };
                tokio::spawn(worker.run(shutdown.clone()))
            })
            .collect()
    }

    /// Admits `set` to the backlog: the id its slots are left under, or why it does not fit
    /// (then its changes are to be withheld with that).
    pub(crate) fn admit(&self, set: &TableSet) -> Result<u64, String> {
        let n = set.changes();
        let mut s = self.inner.sched.lock().unwrap();
        // One set is always taken into an empty backlog, so a batch larger than the bound
        // is still checked (its size is bounded by DRAIN_BATCH).
        let empty = s.changes == 0;
        if !empty
            && (s.changes + n > self.inner.max_changes
                || s.bytes + set.bytes > self.inner.max_bytes)
        {
            return Err(format!(
                "more than CHANGES_CHECK_BACKLOG ({}) changes, or CHANGES_CHECK_BACKLOG_BYTES \
                 ({}), are waiting for their check",
                self.inner.max_changes, self.inner.max_bytes
            ));
        }
        s.changes += n;
        s.bytes += set.bytes;
        Ok(self.inner.next_job.fetch_add(1, Relaxed))
    }

    /// Queues admitted job `id` behind its table's earlier ones; `reaches`: the channels
    /// given a slot of it. A job no channel holds a slot of is dropped (and un-admitted).
    pub(crate) fn submit(&self, id: u64, set: TableSet, reaches: Vec<Reach>) {
        let mut s = self.inner.sched.lock().unwrap();
        if reaches.is_empty() {
            s.changes -= set.changes();
            s.bytes -= set.bytes;
            return;
        }
        let key = (set.schema.clone(), set.table.clone());
        let queue = s.waiting.entry(key.clone()).or_default();
        queue.push_back(Job { id, set, reaches });
        let first = queue.len() == 1;
        if first && !s.running.contains(&key) {
            s.ready.push_back(key);
            drop(s);
            self.inner.ready.notify_one();
        }
    }

    /// Changes admitted and not yet decided.
    pub fn backlog(&self) -> usize {
        self.inner.sched.lock().unwrap().changes
    }
}

struct Worker {
    inner: Arc<Inner>,
    cfg: Arc<Config>,
    metrics: Arc<Metrics>,
}

/// A worker's connection and the statements prepared on it.
struct Conn {
    client: tokio_postgres::Client,
    statements: deliver::Statements,
}

impl Worker {
    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // One connection per part of a check (CHANGES_CHECK_PARTS), each opened when first
        // needed.
        let mut conns: Vec<Option<Conn>> = (0..self.cfg.changes_check_parts.max(1))
            .map(|_| None)
            .collect();
        loop {
            let jobs = tokio::select! {
                jobs = self.next() => jobs,
                _ = shutdown.changed() => return,
            };
            let key = (jobs[0].set.schema.clone(), jobs[0].set.table.clone());
            let n: usize = jobs.iter().map(|j| j.set.changes()).sum();
            let bytes: usize = jobs.iter().map(|j| j.set.bytes).sum();
            self.check(jobs, &mut conns).await;
            let mut s = self.inner.sched.lock().unwrap();
            s.changes -= n;
            s.bytes -= bytes;
            s.running.remove(&key);
            if s.waiting.get(&key).is_some_and(|q| !q.is_empty()) {
                s.ready.push_back(key);
                drop(s);
                self.inner.ready.notify_one();
            }
        }
    }

    /// Every job waiting of the table ready longest, in the order drained; waits for one.
    async fn next(&self) -> Vec<Job> {
        loop {
            // Registered before the queue is looked at, so a submit in between wakes it.
            let notified = self.inner.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.inner.sched.lock().unwrap();
                if let Some(key) = s.ready.pop_front() {
                    let jobs: Vec<Job> = s
                        .waiting
                        .remove(&key)
                        .expect("a ready table has a job")
                        .into();
                    s.running.insert(key);
                    let more = !s.ready.is_empty();
                    drop(s);
                    if more {
                        // Another table is ready too: another worker may take it.
                        self.inner.ready.notify_one();
                    }
                    return jobs;
                }
            }
            notified.await;
        }
    }

    /// Checks `jobs` (one table's, in the order drained) as one set, split by identity into
    /// up to CHANGES_CHECK_PARTS parts checked at once, each on its own connection (opened if
    /// need be), and fills each job's slots with its share.
    async fn check(&self, jobs: Vec<Job>, conns: &mut [Option<Conn>]) {
        let (mut set, shares) = merge(jobs);
        // Here, not on the drain's path (`deliver::matched`).
        set.parse().await;
        let limits = Limits::of(&self.cfg);
        let mut frames: Vec<Vec<Outgoing>> = set.parsed.iter().map(|_| Vec::new()).collect();
        let started = Instant::now();
        let TableSet {
            schema,
            table,
            parsed,
            candidates,
            ..
        } = set;
        let mut parts = split(candidates, conns.len());
        // Each part with candidates gets its connection; a part whose connection cannot be
        // opened is checked with the first (or, if that one cannot be either, withheld): the
        // first is looked at last, so it is opened if what moved to it needs it.
        let mut why_lost = None;
        for k in (0..parts.len()).rev() {
            if parts[k].is_empty() || conns[k].is_some() {
                continue;
            }
            match self.connect().await {
                Ok(c) => conns[k] = Some(c),
                Err(why) if k > 0 => {
                    tracing::debug!(error = %why, "a check connection could not be opened");
                    let moved = std::mem::take(&mut parts[k]);
                    parts[0].extend(moved);
                }
                Err(why) => why_lost = Some(why),
            }
        }
        let on = deliver::Table {
            schema: &schema,
            name: &table,
        };
        if let Some(why) = why_lost {
            let rest = std::mem::take(&mut parts[0]);
            deliver::withhold_failed(&rest, on, &why, &self.metrics, &mut frames);
        }
        self.metrics.changes_checks_total.increment(1);
        let checks = parts
            .into_iter()
            .zip(conns.iter())
            .enumerate()
            .filter(|(_, (part, conn))| !part.is_empty() && conn.is_some())
            .map(|(k, (part, conn))| {
                let c = conn.as_ref().expect("filtered");
                let (limits, parsed, metrics) = (&limits, &parsed, &self.metrics);
                let pattern_budget_ms = self.cfg.filter_pattern_timeout_ms as i32;
                async move {
                    let db = deliver::Db {
                        client: &c.client,
                        grace: Duration::from_secs(5),
                        pattern_budget_ms,
                        statements: &c.statements,
                    };
                    let mut mine: Vec<Vec<Outgoing>> = parsed.iter().map(|_| Vec::new()).collect();
                    let lost =
                        deliver::check(&db, on, parsed, part, limits, metrics, &mut mine).await;
                    (k, mine, lost)
                }
            });
        for (k, mine, lost) in futures_util::future::join_all(checks).await {
            // Each channel is in one part: a change's frames from the parts are for
            // different channels, so their order among themselves does not matter.
            for (all, part) in frames.iter_mut().zip(mine) {
                all.extend(part);
            }
            if let Some(why) = lost {
                tracing::warn!(error = %why, "a Postgres Changes check connection was lost; reconnecting");
                conns[k] = None;
            }
        }
        tracing::debug!(
            %schema,
            %table,
            changes = parsed.len(),
            jobs = shares.len(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            "changes authorized"
        );
        fill_shares(shares, frames, &self.metrics);
    }

    async fn connect(&self) -> Result<Conn, String> {
        let cfg = self.cfg.pg_config().expect("validated at startup");
        let setup = Duration::from_secs(self.cfg.db_connect_timeout_secs);
        let tls = self.cfg.db_tls().expect("validated at startup");
        let (client, connection) = match tokio::time::timeout(setup, cfg.connect(tls)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(format!("the database is unavailable: {e}")),
            Err(_) => return Err("the database is unavailable: connecting timed out".into()),
        };
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a check connection closed");
            }
        });
        Ok(Conn {
            client,
            statements: deliver::Statements::default(),
        })
    }
}

/// `candidates` in `n` parts by identity (role and claims): an identity's candidates, in
/// whichever channels, are all in one part, so each is set up once; the parts come out
/// about even when the identities are many. A channel's claims are hashed once per check,
/// not once per change it matched.
fn split(candidates: Vec<deliver::Candidate>, n: usize) -> Vec<Vec<deliver::Candidate>> {
    use std::hash::{Hash, Hasher};
    if n <= 1 {
        return vec![candidates];
    }
    let mut parts: Vec<Vec<deliver::Candidate>> = (0..n).map(|_| Vec::new()).collect();
    let mut part_of: HashMap<usize, usize> = HashMap::new();
    for c in candidates {
        let k = *part_of
            .entry(Arc::as_ptr(&c.sub) as usize)
            .or_insert_with(|| {
                // A fixed hasher (not a random one): the split needs no secrecy, only evenness.
                let mut h = std::hash::DefaultHasher::new();
                (c.sub.role.as_str(), c.sub.claims.as_str()).hash(&mut h);
                (h.finish() % n as u64) as usize
            });
        parts[k].push(c);
    }
    parts
}

/// One job's share of a merged check: its id, the channels holding its slots, its changes'
/// positions, and how many changes it has (its frames are the next that many).
struct Share {
    id: u64,
    reaches: Vec<Reach>,
    positions: Vec<(i64, i64)>,
    changes: usize,
}

/// One table's jobs as one set (changes in the order drained, candidates renumbered), and
/// each job's share of it. The set's `at` (places in one drained batch) means nothing once
/// batches are merged: it is emptied; each share keeps its changes' positions.
fn merge(jobs: Vec<Job>) -> (TableSet, Vec<Share>) {
    let mut shares = Vec::with_capacity(jobs.len());
    let mut merged: Option<TableSet> = None;
    for Job {
        id,
        mut set,
        reaches,
    } in jobs
    {
        shares.push(Share {
            id,
            reaches,
            positions: std::mem::take(&mut set.positions),
            changes: set.changes(),
        });
        set.at.clear();
        match &mut merged {
            None => merged = Some(set),
            Some(m) => {
                let offset = m.changes();
                m.candidates.extend(set.candidates.into_iter().map(|mut c| {
                    c.change += offset;
                    c
                }));
                m.raw.extend(set.raw);
                m.bytes += set.bytes;
            }
        }
    }
    (merged.expect("a ready table has a job"), shares)
}

/// Gives each channel that holds a slot of the merged check's jobs its frames of them (by
/// job and change, in order), in one fill per channel, which lets out what waited behind
/// them. A change frame to a channel whose history is being sent passes its gate first
/// (each change's (epoch, seq) in its share's `positions`), as its broadcasts do in the
/// hub: held there until the history is sent, or dropped if the history sent it.
fn fill_shares(mut shares: Vec<Share>, frames: Vec<Vec<Outgoing>>, metrics: &Metrics) {
    let mut jobs: Vec<u64> = shares.iter().map(|s| s.id).collect();
    jobs.sort_unstable();
    let mut at: HashMap<usize, usize> = HashMap::new();
    let mut by: Vec<(Reach, Vec<Fill>)> = Vec::new();
    for s in &mut shares {
        // Taken, not cloned: the shares need them no more.
        for r in std::mem::take(&mut s.reaches) {
            if let std::collections::hash_map::Entry::Vacant(v) = at.entry(r.hold_id()) {
                v.insert(by.len());
                by.push((r, Vec::new()));
            }
        }
    }
    // Changes with no place to pass a gate at always pass: counted here; the rest as they
    // pass (`Reach::fill`).
    let (mut delivered, mut changes) = (0, 0);
    let mut frames = frames.into_iter();
    for s in shares {
        for (change, outs) in frames.by_ref().take(s.changes).enumerate() {
            for o in outs {
                // A channel without a slot was cut off for holding too much: nothing for it.
                let Some(&i) = at.get(&o.to.reach.hold_id()) else {
                    continue;
                };
                let at = match s.positions.get(change) {
                    Some(&(epoch, seq)) if o.change => Some(At { epoch, seq }),
                    _ => None,
                };
                changes += u64::from(o.change && at.is_none());
                by[i].1.push(Fill {
                    job: s.id,
                    change: change as u32,
                    frame: o.frame,
                    at,
                });
            }
        }
    }
    for (reach, frames) in by {
        let (passed, placed) = reach.fill(&jobs, frames);
        delivered += passed as u64;
        changes += placed as u64;
    }
    metrics.deliveries_total.increment(delivered);
    metrics.changes_delivered_total.increment(changes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres_changes::subscribers::Subscriber;

    fn candidate(conn: u64, claims: &str) -> deliver::Candidate {
        let (tx, _rx) = crate::out::channel(4);
        let link = crate::out::Link::new(conn, crate::frame::Vsn::V1, conn as i64, tx);
        let sub = Subscriber {
            reach: link.reach(&crate::frame::channel_topic(&format!("c{conn}")), None),
            bindings: Vec::new(),
            role: "authenticated".into(),
            claims: claims.into(),
            positions: false,
        };
        deliver::Candidate::for_test(0, Arc::new(sub))
    }

    #[test]
    fn an_identity_s_channels_are_checked_in_one_part_and_many_identities_spread() {
        // Two channels of user 7 (two tabs), and 1,000 users.
        let mut all = vec![
            candidate(1, r#"{"sub":"u7"}"#),
            candidate(2, r#"{"sub":"u7"}"#),
        ];
        all.extend((0..1000).map(|n| candidate(10 + n, &format!(r#"{{"sub":"u{n}"}}"#))));
        let parts = split(all, 2);
        let with_u7: Vec<usize> = parts
            .iter()
            .map(|p| {
                p.iter()
                    .filter(|c| c.sub.claims == r#"{"sub":"u7"}"#)
                    .count()
            })
            .collect();
        assert!(
            with_u7.contains(&3),
            "u7's three channels in one part: {with_u7:?}"
        );
        let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        assert!(sizes.iter().all(|&n| n > 400), "about even: {sizes:?}");
        assert_eq!(split(vec![candidate(1, "{}")], 1).len(), 1);
    }
}
