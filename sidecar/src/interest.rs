//! What this sidecar's channels listen to, kept in the database so that its drains return
//! only that (`realtime.listen`; `extension/src/interest.rs` has the contract).
//!
//! Every sidecar process drains its own slot. Without this, each one read, shipped and
//! parsed every message of every topic, so adding processes multiplied the work; with it a
//! process pays for its own clients' topics (and tables) only, when clients are routed to
//! sidecars by topic (README, "Scaling out").
//!
//! A channel holds its keys (`Held`) from before its join is answered until it leaves: its
//! topic (broadcasts, presence) and, for Postgres Changes, its bindings' tables. A key held
//! for the first time must be in the database before the join is answered, so that what
//! commits after the reply is drained; `hold` says which upload round to wait for, and the
//! `worker` (one connection) uploads whatever changed since its last round in one call.
//! A key given up by its last channel is dropped from the database in a later round; until
//! then the drain returns a little that nobody here wants, which the hub discards.
//!
//! When it cannot filter, this sidecar receives everything, never less: a fresh slot is
//! unfiltered, each (re)connection of the worker replaces the database's set with the whole
//! current one, and a database that refuses the set (more keys than
//! `realtime.max_topics_per_consumer`) gets `realtime.listen_all` instead.

use crate::config::Config;
use crate::db_worker;
use crate::db_worker::DbFailure;
use crate::metrics::Metrics;
use crate::postgres_changes::Binding;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio_postgres::Client;

/// What a channel listens to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// Broadcasts and presence diffs of a topic (the channel's topic, without `realtime:`).
    Topic(String),
    /// Row changes of captured tables of this name (in any schema, as a change names its
    /// table).
    Table(String),
    /// Every captured table's changes (a binding without a table).
    AllTables,
}

/// The keys of a channel on `topic` with Postgres Changes `bindings`.
pub fn keys_of(topic: &str, bindings: &[Binding]) -> Vec<Key> {
    let mut keys = vec![Key::Topic(topic.to_owned())];
    for b in bindings {
        let k = match &b.table {
            Some(t) => Key::Table(t.clone()),
            None => Key::AllTables,
        };
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

struct Count {
    holds: u32,
    /// The upload round after which the database has this key.
    ready_at: u64,
}

#[derive(Default)]
struct Inner {
    counts: HashMap<Key, Count>,
    /// Keys whose count went to or from zero since the worker last took them.
    changed: HashSet<Key>,
    /// The round the worker's next upload will be.
    next_round: u64,
    /// The database holds no filter for this sidecar (disabled, or refused): every key is
    /// ready at once.
    unfiltered: bool,
}

/// The keys this sidecar's channels hold, and the rounds of their upload.
pub struct Interest {
    inner: Mutex<Inner>,
    /// Wakes the worker when a key changed.
    changed: Notify,
    /// The last round the database applied.
    uploaded: watch::Sender<u64>,
}

/// Keys held by one channel (or a join on its way): given back when dropped.
pub struct Held {
    interest: Arc<Interest>,
    keys: Vec<Key>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.keys.is_empty() {
            self.interest.release(&self.keys);
        }
    }
}

impl Interest {
    /// `filtering` off: nothing is uploaded and every hold is ready at once (the drainer
    /// tells the database to send everything before it drains).
    pub fn new(filtering: bool) -> Arc<Self> {
        Arc::new(Interest {
            inner: Mutex::new(Inner {
                next_round: 1,
                unfiltered: !filtering,
                ..Inner::default()
            }),
            changed: Notify::new(),
            uploaded: watch::channel(0).0,
        })
    }

    /// Holds `keys` for a channel. Some(round): the channel may be answered once the
    /// database applied that round (`ready`); None: at once.
    pub fn hold(self: &Arc<Self>, keys: Vec<Key>) -> (Held, Option<u64>) {
        let mut inner = self.inner.lock().unwrap();
        if inner.unfiltered {
            let held = Held {
                interest: self.clone(),
                keys: Vec::new(),
            };
            return (held, None);
        }
        let next = inner.next_round;
        let mut wait = 0;
        let mut woke = false;
        for k in &keys {
            let c = inner.counts.entry(k.clone()).or_insert(Count {
                holds: 0,
                ready_at: next,
            });
            if c.holds == 0 {
                c.ready_at = next;
            }
            c.holds += 1;
            wait = wait.max(c.ready_at);
            if c.holds == 1 {
                inner.changed.insert(k.clone());
                woke = true;
            }
        }
        drop(inner);
        if woke {
            self.changed.notify_one();
        }
        let round = (wait > *self.uploaded.borrow()).then_some(wait);
        let held = Held {
            interest: self.clone(),
            keys,
        };
        (held, round)
    }

    fn release(&self, keys: &[Key]) {
        let mut inner = self.inner.lock().unwrap();
        let mut woke = false;
        for k in keys {
            let Some(c) = inner.counts.get_mut(k) else {
                continue;
            };
            c.holds -= 1;
            if c.holds == 0 {
                inner.counts.remove(k);
                inner.changed.insert(k.clone());
                woke = true;
            }
        }
        drop(inner);
        if woke {
            self.changed.notify_one();
        }
    }

    /// Waits until the database applied `round`; Err after `deadline` (the database did not
    /// answer: a join is then refused as for any database failure, and its client retries).
    pub async fn ready(&self, round: u64, deadline: Duration) -> Result<(), DbFailure> {
        let mut rx = self.uploaded.subscribe();
        let applied = tokio::time::timeout(deadline, rx.wait_for(|r| *r >= round))
            .await
            .is_ok_and(|r| r.is_ok());
        if applied {
            Ok(())
        } else {
            Err(DbFailure::Unreachable)
        }
    }

    /// Every key held now, for a whole upload, and the round it completes.
    fn take_all(&self) -> (u64, HashSet<Key>) {
        let mut inner = self.inner.lock().unwrap();
        inner.changed.clear();
        let round = inner.next_round;
        inner.next_round += 1;
        (round, inner.counts.keys().cloned().collect())
    }

    /// What changed against `stored` (what the database has): keys to add and to drop,
    /// and the round the upload completes.
    fn take_changes(&self, stored: &HashSet<Key>) -> (u64, Vec<Key>, Vec<Key>) {
        let mut inner = self.inner.lock().unwrap();
        let round = inner.next_round;
        inner.next_round += 1;
        let (mut add, mut drop) = (Vec::new(), Vec::new());
        for k in std::mem::take(&mut inner.changed) {
            match (inner.counts.contains_key(&k), stored.contains(&k)) {
                (true, false) => add.push(k),
                (false, true) => drop.push(k),
                _ => {}
            }
        }
        (round, add, drop)
    }

    /// The database applied `round` (and every one before).
    fn applied(&self, round: u64) {
        self.uploaded.send_if_modified(|r| {
            let moved = round > *r;
            *r = (*r).max(round);
            moved
        });
    }

    /// From now on everything is delivered: every hold is ready.
    fn give_up_filtering(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.unfiltered = true;
        let round = inner.next_round;
        drop(inner);
        self.applied(round);
    }

    fn filtering(&self) -> bool {
        !self.inner.lock().unwrap().unfiltered
    }
}

const LISTEN_SQL: &str = "SELECT realtime.listen($1, $2::text[], $3::text[], $4, $5) AS keys";
const UNLISTEN_SQL: &str = "SELECT realtime.unlisten($1, $2::text[], $3::text[], $4) AS keys";

/// The keys as `realtime.listen` takes them: topics, tables, all tables.
fn split(keys: impl IntoIterator<Item = Key>) -> (Vec<String>, Vec<String>, bool) {
    let (mut topics, mut tables, mut all) = (Vec::new(), Vec::new(), false);
    for k in keys {
        match k {
            Key::Topic(t) => topics.push(t),
            Key::Table(t) => tables.push(t),
            Key::AllTables => all = true,
        }
    }
    (topics, tables, all)
}

/// Keeps the database's copy of `interest` current until shutdown.
pub async fn worker(
    cfg: Arc<Config>,
    interest: Arc<Interest>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let Some(client) =
            db_worker::connect_retrying(&cfg, "interest", &mut shutdown, || {}).await
        else {
            return;
        };
        match session(&cfg, &interest, &metrics, &client, &mut shutdown).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "interest connection failed; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

/// One connection: the whole set, then what changes, until an error or shutdown.
async fn session(
    cfg: &Config,
    interest: &Interest,
    metrics: &Metrics,
    client: &Client,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), tokio_postgres::Error> {
    let consumer = &cfg.consumer;
    // The drainer may not have made the slot yet; making it here is the same call.
    client
        .query_one("SELECT realtime.create_consumer($1)", &[consumer])
        .await?;
    let listen = client.prepare(LISTEN_SQL).await?;
    let unlisten = client.prepare(UNLISTEN_SQL).await?;
    let mut stored: HashSet<Key> = HashSet::new();
    let mut whole = true;
    loop {
        if !interest.filtering() {
            // Disabled (the drainer cleared the slot's filter), or given up below.
            metrics.listened_keys.set(f64::NAN);
            let _ = shutdown.changed().await;
            return Ok(());
        }
        let (round, count) = if whole {
            let (round, keys) = interest.take_all();
            let Some(count) =
                upload(client, &listen, consumer, interest, keys.clone(), true).await?
            else {
                continue;
            };
            stored = keys;
            whole = false;
            (round, count)
        } else {
            let (round, add, drop) = interest.take_changes(&stored);
            let mut count = None;
            if !drop.is_empty() {
                let (topics, tables, all) = split(drop.iter().cloned());
                let row = client
                    .query_one(&unlisten, &[consumer, &topics, &tables, &all])
                    .await?;
                count = Some(row.get::<_, i32>("keys"));
                for k in &drop {
                    stored.remove(k);
                }
            }
            if !add.is_empty() {
                let Some(n) =
                    upload(client, &listen, consumer, interest, add.clone(), false).await?
                else {
                    continue;
                };
                count = Some(n);
                stored.extend(add);
            }
            (round, count.unwrap_or(stored.len() as i32))
        };
        metrics.listened_keys.set(count as f64);
        interest.applied(round);
        tokio::select! {
            _ = interest.changed.notified() => {}
            _ = shutdown.changed() => return Ok(()),
        }
    }
}

/// Listens to `keys` (first forgetting the slot's set, with `reset`); returns how many keys
/// the slot listens to, or None when the database refused that many and the slot now
/// receives everything.
async fn upload(
    client: &Client,
    listen: &tokio_postgres::Statement,
    consumer: &str,
    interest: &Interest,
    keys: impl IntoIterator<Item = Key>,
    reset: bool,
) -> Result<Option<i32>, tokio_postgres::Error> {
    let (topics, tables, all) = split(keys);
    match client
        .query_one(listen, &[&consumer, &topics, &tables, &all, &reset])
        .await
    {
        Ok(row) => Ok(Some(row.get("keys"))),
        Err(e) if too_many(&e) => {
            receive_everything(client, consumer, interest, &e).await?;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The database refused the set: the slot is told to return everything, and only then are
/// the joins waiting for this round answered (a reply before would let the drain skip what
/// commits after it).
async fn receive_everything(
    client: &Client,
    consumer: &str,
    interest: &Interest,
    refusal: &tokio_postgres::Error,
) -> Result<(), tokio_postgres::Error> {
    tracing::warn!(error = %refusal, "the database refuses this many topics for one consumer; this sidecar now receives every message");
    client
        .execute("SELECT realtime.listen_all($1)", &[&consumer])
        .await?;
    interest.give_up_filtering();
    Ok(())
}

fn too_many(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::CONFIGURATION_LIMIT_EXCEEDED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(t: &str) -> Key {
        Key::Topic(t.to_owned())
    }

    #[tokio::test]
    async fn a_new_key_waits_for_its_round_and_a_held_one_does_not() {
        let i = Interest::new(true);
        let (a1, round) = i.hold(vec![topic("a")]);
        assert_eq!(round, Some(1), "a first hold waits for the next upload");
        // A second hold of a key not yet uploaded waits for the same round.
        let (a2, again) = i.hold(vec![topic("a")]);
        assert_eq!(again, Some(1));
        let (r, keys) = i.take_all();
        assert_eq!((r, keys.len()), (1, 1));
        assert!(i.ready(1, Duration::from_millis(10)).await.is_err());
        i.applied(1);
        assert!(i.ready(1, Duration::from_millis(10)).await.is_ok());
        let (_a3, now) = i.hold(vec![topic("a")]);
        assert_eq!(now, None, "uploaded: no wait");
        drop((a1, a2));
    }

    #[test]
    fn only_the_last_release_drops_a_key_and_a_quick_rejoin_keeps_it() {
        let i = Interest::new(true);
        let (a1, _) = i.hold(vec![topic("a"), Key::AllTables]);
        let (a2, _) = i.hold(vec![topic("a")]);
        let (r, stored) = i.take_all();
        i.applied(r);
        drop(a1);
        let (_, add, drop_) = i.take_changes(&stored);
        assert!(add.is_empty());
        assert_eq!(drop_, vec![Key::AllTables], "'a' is still held by a2");
        drop(a2);
        // Left and joined again before the worker looked: nothing to upload, and the
        // rejoin waits for the next round all the same.
        let (_a4, round) = i.hold(vec![topic("a")]);
        assert_eq!(round, Some(3));
        let stored: HashSet<Key> = [topic("a")].into();
        let (r, add, drop_) = i.take_changes(&stored);
        assert_eq!((r, add.len(), drop_.len()), (3, 0, 0));
    }

    #[test]
    fn a_key_held_after_the_worker_took_its_round_waits_for_the_next() {
        let i = Interest::new(true);
        let (r, _) = i.take_all();
        assert_eq!(r, 1);
        let (_b, round) = i.hold(vec![topic("b")]);
        assert_eq!(round, Some(2), "round 1 was taken before b was held");
    }

    #[tokio::test]
    async fn unfiltered_holds_are_ready_at_once_and_giving_up_releases_waiters() {
        let off = Interest::new(false);
        assert_eq!(off.hold(vec![topic("a")]).1, None);
        let on = Interest::new(true);
        let (_a, round) = on.hold(vec![topic("a")]);
        on.give_up_filtering();
        assert!(on
            .ready(round.unwrap(), Duration::from_millis(10))
            .await
            .is_ok());
        assert_eq!(on.hold(vec![topic("b")]).1, None);
    }
}
