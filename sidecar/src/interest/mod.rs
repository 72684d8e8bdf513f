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
//! worker (`upload`, one connection) uploads whatever changed since its last round in one
//! call. This registry never waits on the database; only the worker does.
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

pub mod upload;

use crate::db_worker::DbFailure;
use crate::postgres_changes::Binding;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};

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
