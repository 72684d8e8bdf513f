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
//! `realtime.max_topics_per_consumer`) gets `realtime.listen_all` instead; once fewer keys
//! are held than were refused, the whole set is offered again and filtering comes back on.
//!
//! A join holds its topic at once and its tables only once its bindings passed the
//! database's check (`channels/join.rs`), so no unchecked name is ever uploaded. Names are
//! validated at the edge (`client_text`); should the database still refuse an upload for
//! its input, the upload is split in halves down to the keys that sank it: those are
//! refused to the joins that hold them (`Held::ready`), never uploaded again while held, and
//! the rest is uploaded. (Before, one NUL in a table name failed every upload, the worker
//! reconnected and re-uploaded the same set forever, and every join of a new key timed out.)

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

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Topic(t) => write!(f, "topic {t:?}"),
            Key::Table(t) => write!(f, "table {t:?}"),
            Key::AllTables => f.write_str("every table"),
        }
    }
}

/// The keys of Postgres Changes `bindings` (held once they passed the check).
pub fn table_keys(bindings: &[Binding]) -> Vec<Key> {
    let mut keys = Vec::new();
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
    /// FILTER_TOPICS is off: nothing is counted and every key is ready at once.
    disabled: bool,
    /// The database refused this many keys (`realtime.max_topics_per_consumer`) and the
    /// slot receives everything: keys are still counted, and ready at once; once fewer are
    /// held, the worker offers the whole set again.
    gave_up_at: Option<usize>,
    /// Keys the database refused for their input (each alone), with its message: never
    /// uploaded while held, and refused to whoever holds them.
    refused: HashMap<Key, String>,
}

/// Why a hold is not ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// The database did not apply the round in time.
    Failed(DbFailure),
    /// The database refused this key for its input (its message).
    Refused(Key, String),
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

impl Held {
    /// Takes `other`'s keys into this hold (a join's tables, held after its check, join
    /// its topic for the channel's life).
    pub fn absorb(&mut self, mut other: Held) {
        self.keys.append(&mut other.keys);
    }

    /// Waits until the database applied `round` (from `hold`); Err after `deadline` (the
    /// database did not answer: a join is then refused as for any database failure, and
    /// its client retries), or when the database refused one of these keys.
    pub async fn ready(&self, round: u64, deadline: Duration) -> Result<(), NotReady> {
        self.interest.ready(round, &self.keys, deadline).await
    }
}

impl Interest {
    /// `filtering` off: nothing is uploaded and every hold is ready at once (the drainer
    /// tells the database to send everything before it drains).
    pub fn new(filtering: bool) -> Arc<Self> {
        Arc::new(Interest {
            inner: Mutex::new(Inner {
                next_round: 1,
                disabled: !filtering,
                ..Inner::default()
            }),
            changed: Notify::new(),
            uploaded: watch::channel(0).0,
        })
    }

    /// Holds `keys` for a channel. Some(round): the channel may be answered once
    /// `Held::ready(round)` says so (a key the database refused is known at once); None: at
    /// once.
    pub fn hold(self: &Arc<Self>, keys: Vec<Key>) -> (Held, Option<u64>) {
        let mut inner = self.inner.lock().unwrap();
        if inner.disabled || keys.is_empty() {
            let held = Held {
                interest: self.clone(),
                keys: Vec::new(),
            };
            return (held, None);
        }
        let next = inner.next_round;
        let mut wait = 0;
        let mut woke = false;
        let refused = keys.iter().any(|k| inner.refused.contains_key(k));
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
        let everything = inner.gave_up_at.is_some();
        drop(inner);
        if woke {
            self.changed.notify_one();
        }
        let uploaded = *self.uploaded.borrow();
        let round = if refused {
            // Already applied: `ready` returns at once with the refusal.
            Some(uploaded)
        } else if everything {
            // The slot receives everything meanwhile; the keys are counted for the day the
            // set fits again.
            None
        } else {
            (wait > uploaded).then_some(wait)
        };
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
                // A refused key is forgotten with its last holder: never in the database.
                if inner.refused.remove(k).is_none() {
                    inner.changed.insert(k.clone());
                    woke = true;
                }
            }
        }
        drop(inner);
        if woke {
            self.changed.notify_one();
        }
    }

    /// `Held::ready` for `keys` (held elsewhere).
    pub async fn ready(
        &self,
        round: u64,
        keys: &[Key],
        deadline: Duration,
    ) -> Result<(), NotReady> {
        let mut rx = self.uploaded.subscribe();
        let applied = tokio::time::timeout(deadline, rx.wait_for(|r| *r >= round))
            .await
            .is_ok_and(|r| r.is_ok());
        if let Some((k, why)) = self.refused_among(keys) {
            return Err(NotReady::Refused(k, why));
        }
        if applied {
            Ok(())
        } else {
            Err(NotReady::Failed(DbFailure::Unreachable))
        }
    }

    /// The first of `keys` the database refused, with its message.
    fn refused_among(&self, keys: &[Key]) -> Option<(Key, String)> {
        let inner = self.inner.lock().unwrap();
        keys.iter()
            .find_map(|k| inner.refused.get(k).map(|why| (k.clone(), why.clone())))
    }

    /// The database refused `key` alone, for its input.
    fn refuse(&self, key: Key, why: String) {
        let mut inner = self.inner.lock().unwrap();
        if inner.counts.contains_key(&key) {
            tracing::warn!(%key, error = %why, "the database refused to listen to a key; its joins are refused");
            inner.refused.insert(key, why);
        }
    }

    /// Every key held now (but those refused), for a whole upload, and the round it
    /// completes. Filtering is on again from here (`gave_up_at` cleared): a hold from now
    /// waits for a round.
    fn take_all(&self) -> (u64, HashSet<Key>) {
        let mut inner = self.inner.lock().unwrap();
        inner.changed.clear();
        inner.gave_up_at = None;
        let round = inner.next_round;
        inner.next_round += 1;
        let keys = inner
            .counts
            .keys()
            .filter(|k| !inner.refused.contains_key(*k))
            .cloned()
            .collect();
        (round, keys)
    }

    /// What changed against `stored` (what the database has): keys to add and to drop,
    /// and the round the upload completes.
    fn take_changes(&self, stored: &HashSet<Key>) -> (u64, Vec<Key>, Vec<Key>) {
        let mut inner = self.inner.lock().unwrap();
        let round = inner.next_round;
        inner.next_round += 1;
        let (mut add, mut drop) = (Vec::new(), Vec::new());
        for k in std::mem::take(&mut inner.changed) {
            if inner.refused.contains_key(&k) {
                continue;
            }
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

    /// The database refused the keys held now: from now on everything is delivered, every
    /// hold is ready, until fewer keys are held (`fits_again`).
    fn give_up_filtering(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.gave_up_at = Some(inner.counts.len().max(1));
        let round = inner.next_round;
        inner.next_round += 1;
        drop(inner);
        self.applied(round);
    }

    fn disabled(&self) -> bool {
        self.inner.lock().unwrap().disabled
    }

    /// Whether filtering was given up for want of room.
    fn given_up(&self) -> bool {
        self.inner.lock().unwrap().gave_up_at.is_some()
    }

    /// Given up, and fewer keys are held now than the database refused.
    fn fits_again(&self) -> bool {
        let inner = self.inner.lock().unwrap();
        inner.gave_up_at.is_some_and(|n| inner.counts.len() < n)
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
    let up = Uploader {
        client,
        listen: client.prepare(LISTEN_SQL).await?,
        consumer,
        interest,
    };
    let unlisten = client.prepare(UNLISTEN_SQL).await?;
    let mut stored: HashSet<Key> = HashSet::new();
    let mut whole = true;
    loop {
        if interest.disabled() {
            // The drainer cleared the slot's filter.
            metrics.listened_keys.set(f64::NAN);
            let _ = shutdown.changed().await;
            return Ok(());
        }
        if interest.given_up() {
            metrics.listened_keys.set(f64::NAN);
            if interest.fits_again() {
                whole = true;
            } else {
                tokio::select! {
                    _ = interest.changed.notified() => continue,
                    _ = shutdown.changed() => return Ok(()),
                }
            }
        }
        let (round, count) = if whole {
            let (round, keys) = interest.take_all();
            let Some((count, uploaded)) = up.isolating(keys.into_iter().collect(), true).await?
            else {
                continue;
            };
            whole = false;
            let count = count.unwrap_or(uploaded.len() as i32);
            stored = uploaded;
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
                let Some((n, uploaded)) = up.isolating(add, false).await? else {
                    continue;
                };
                count = Some(n.unwrap_or(stored.len() as i32));
                stored.extend(uploaded);
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

/// The worker's uploads on its connection.
struct Uploader<'a> {
    client: &'a Client,
    listen: tokio_postgres::Statement,
    consumer: &'a str,
    interest: &'a Interest,
}

/// How one `realtime.listen` call ended.
enum Listened {
    /// How many keys the slot listens to now.
    Count(i32),
    /// More keys than the database takes: the slot now receives everything.
    TooMany,
    /// The database refused the call for its input (its message).
    Refused(String),
}

/// One `realtime.listen` call: the worker's connection, or a test's stand-in, so the
/// splitting below is tested without a database.
trait ListenCall {
    async fn call(&self, keys: &[Key], reset: bool) -> Result<Listened, tokio_postgres::Error>;
}

impl ListenCall for Uploader<'_> {
    async fn call(&self, keys: &[Key], reset: bool) -> Result<Listened, tokio_postgres::Error> {
        Uploader::call(self, keys, reset).await
    }
}

/// Uploads `keys` (first forgetting the slot's set, with `reset`), splitting a call the
/// database refuses for its input down to the keys that sank it, which are refused to their
/// joins (`Interest::refuse`). Some((keys the slot listens to, when a call went through),
/// the keys uploaded); None when the database refused that many keys (the caller then
/// makes the slot receive everything). Err: the connection is lost.
async fn isolating(
    db: &impl ListenCall,
    interest: &Interest,
    keys: Vec<Key>,
    reset: bool,
) -> Result<Option<(Option<i32>, HashSet<Key>)>, tokio_postgres::Error> {
    let mut uploaded = HashSet::new();
    let mut count = None;
    // Halves in order; only the first call of all forgets the slot's set.
    let mut work = vec![(keys, reset)];
    while let Some((mut part, reset)) = work.pop() {
        match db.call(&part, reset).await? {
            Listened::Count(n) => {
                count = Some(n);
                uploaded.extend(part);
            }
            Listened::TooMany => return Ok(None),
            Listened::Refused(why) if part.len() <= 1 => {
                if let Some(k) = part.pop() {
                    interest.refuse(k, why);
                }
                if reset {
                    // The reset still has to happen, whatever the key.
                    if let Listened::Count(n) = db.call(&[], true).await? {
                        count = Some(n);
                    }
                }
            }
            Listened::Refused(why) => {
                tracing::debug!(error = %why, keys = part.len(), "interest upload refused; splitting");
                let back = part.split_off(part.len() / 2);
                work.push((back, false));
                work.push((part, reset));
            }
        }
    }
    Ok(Some((count, uploaded)))
}

impl Uploader<'_> {
    /// `isolating` on this connection; the slot told to receive everything when the
    /// database refuses that many keys.
    async fn isolating(
        &self,
        keys: Vec<Key>,
        reset: bool,
    ) -> Result<Option<(Option<i32>, HashSet<Key>)>, tokio_postgres::Error> {
        match isolating(self, self.interest, keys, reset).await? {
            Some(done) => Ok(Some(done)),
            None => {
                self.receive_everything().await?;
                Ok(None)
            }
        }
    }

    async fn call(&self, keys: &[Key], reset: bool) -> Result<Listened, tokio_postgres::Error> {
        let (topics, tables, all) = split(keys.iter().cloned());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&self.consumer, &topics, &tables, &all, &reset];
        match self.client.query_one(&self.listen, &params).await {
            Ok(row) => Ok(Listened::Count(row.get("keys"))),
            Err(e) if too_many(&e) => {
                tracing::warn!(error = %e, "the database refuses this many topics for one consumer; this sidecar now receives every message");
                Ok(Listened::TooMany)
            }
            // An error on a connection still open is the database refusing this input (a
            // cancel is not: the call is tried again on a new connection).
            Err(e)
                if !self.client.is_closed()
                    && e.as_db_error().is_some()
                    && e.code() != Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) =>
            {
                let why = e.as_db_error().map(|d| d.message().to_owned());
                Ok(Listened::Refused(why.unwrap_or_default()))
            }
            Err(e) => Err(e),
        }
    }

    /// The database refused the set: the slot is told to return everything, and only then
    /// are the joins waiting for this round answered (a reply before would let the drain
    /// skip what commits after it).
    async fn receive_everything(&self) -> Result<(), tokio_postgres::Error> {
        self.client
            .execute("SELECT realtime.listen_all($1)", &[&self.consumer])
            .await?;
        self.interest.give_up_filtering();
        Ok(())
    }
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
        assert!(a1.ready(1, Duration::from_millis(10)).await.is_err());
        i.applied(1);
        assert!(a1.ready(1, Duration::from_millis(10)).await.is_ok());
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
        let (a, round) = on.hold(vec![topic("a")]);
        on.give_up_filtering();
        assert!(a
            .ready(round.unwrap(), Duration::from_millis(10))
            .await
            .is_ok());
        assert_eq!(on.hold(vec![topic("b")]).1, None);
    }

    #[test]
    fn filtering_comes_back_once_fewer_keys_are_held_than_were_refused() {
        let i = Interest::new(true);
        let (a, _) = i.hold(vec![topic("a")]);
        let (b, _) = i.hold(vec![topic("b")]);
        i.give_up_filtering();
        assert!(i.given_up() && !i.fits_again());
        // Held while everything is received: ready at once, and counted.
        let (c, now) = i.hold(vec![topic("c")]);
        assert_eq!(now, None);
        drop((a, b));
        assert!(i.fits_again(), "1 key held, 2 were refused");
        let (round, keys) = i.take_all();
        assert_eq!(keys, [topic("c")].into());
        assert!(
            !i.given_up(),
            "filtering again: a new hold waits for a round"
        );
        let (_d, wait) = i.hold(vec![topic("d")]);
        assert_eq!(wait, Some(round + 1));
        drop(c);
    }

    /// Refuses every call holding table "bad"; counts the calls.
    struct Refusing {
        calls: std::sync::atomic::AtomicUsize,
        resets: Mutex<Vec<bool>>,
    }

    impl ListenCall for Refusing {
        async fn call(&self, keys: &[Key], reset: bool) -> Result<Listened, tokio_postgres::Error> {
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.resets.lock().unwrap().push(reset);
            if keys.contains(&Key::Table("bad".into())) {
                return Ok(Listened::Refused("invalid byte sequence".into()));
            }
            Ok(Listened::Count(keys.len() as i32))
        }
    }

    #[tokio::test]
    async fn a_refused_upload_refuses_its_bad_key_alone_and_uploads_the_rest() {
        let i = Interest::new(true);
        let good_keys: Vec<Key> = (0..64).map(|n| topic(&n.to_string())).collect();
        let (bad, round) = i.hold(vec![topic("0"), Key::Table("bad".into())]);
        let (good, _) = i.hold(good_keys.clone());
        let mut keys = good_keys;
        keys.insert(40, Key::Table("bad".into()));
        let db = Refusing {
            calls: 0.into(),
            resets: Mutex::new(Vec::new()),
        };
        let (_, uploaded) = isolating(&db, &i, keys.clone(), true)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(uploaded.len(), 64, "every key but the bad one");
        assert!(!uploaded.contains(&Key::Table("bad".into())));
        // Halving finds one key among 65 in at most 2 calls per level.
        let calls = db.calls.load(std::sync::atomic::Ordering::Relaxed);
        assert!(calls <= 2 * 8, "{calls} calls");
        // The refused whole call and its first half reset the slot; no later half does
        // (it would forget what the halves before it listened to).
        let resets = db.resets.lock().unwrap().clone();
        assert_eq!(resets[..2], [true, true]);
        assert!(resets[2..].iter().all(|r| !r), "{resets:?}");
        i.applied(round.unwrap());
        let why = bad.ready(round.unwrap(), Duration::from_millis(10)).await;
        assert_eq!(
            why,
            Err(NotReady::Refused(
                Key::Table("bad".into()),
                "invalid byte sequence".into()
            ))
        );
        assert!(good
            .ready(round.unwrap(), Duration::from_millis(10))
            .await
            .is_ok());
        // Never offered again while held; forgotten with its last holder.
        let (_, all) = i.take_all();
        assert!(!all.contains(&Key::Table("bad".into())));
        let (again, _) = i.hold(vec![Key::Table("bad".into())]);
        assert!(again.ready(0, Duration::from_millis(10)).await.is_err());
        drop((bad, again));
        assert!(i.refused_among(&[Key::Table("bad".into())]).is_none());
    }
}
