//! The interest tables in shared memory, one per consumer slot: their layout, keys and
//! lock rules. What a consumer's interest is for, and the SQL that changes it, are in
//! `interest`; this file imports nothing that imports it back (the queue's shared state
//! holds these tables).
//!
//! # Layout and lock rules
//!
//! `realtime.max_consumers` tables sit after the consumer slots, one per slot, each a
//! header and `capacity()` entries of open addressing with linear probing (a key, its
//! count, and the sequence it is wanted from: `Entry`). A key is a
//! 64-bit hash of a topic or of a table's name (`topic_key`, `table_key`); 0 marks an empty
//! entry and 1 a removed one. A hash collision only makes a drain return a message nobody
//! here wants, which the sidecar drops as it drops any topic without subscribers.
//!
//! Writers (`listen`, `unlisten`, `listen_all`, creating or dropping the slot) hold the queue
//! lock exclusively, so there is one writer at a time, and bracket every change with the
//! header's `version`, a sequence lock: odd while a change is under way. Readers (drains,
//! outside the lock, once per record) take no lock: a read that overlapped a change, seen
//! by an odd or moved `version`, answers "wanted". So readers never wait for writers, and an
//! answer is either exact or errs towards delivering.
//!
//! # The summary in front of the entries
//!
//! Most records a drain reads past are of topics its consumer does not listen to, and each
//! of those cost a probe of the entries: a cache miss in a table of up to a few hundred KB
//! that nothing kept warm, since a routed sidecar's drain runs a few dozen times a second
//! among many processes (`Interest::wants_at` led a profile of 8 drain backends,
//! `pgbench/results/2026-11-29.md`). So the header also holds a summary: one bit for each of
//! `SUMMARY_BITS` buckets of the key space (`bucket`), set while some live key falls in the
//! bucket, and the count of live keys per bucket that keeps it exact. A reader looks at the
//! bit (512 bytes that stay in cache through a batch) and probes only when it is set.
//! Summary and entries change together, inside the same `version` bracket, so a read that
//! did not overlap a change sees them agree.

use crate::gucs;
use crate::message::MessageView;
use std::collections::HashMap;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64};

/// What a change of a table asks its caller to show: that it holds the queue lock
/// exclusively (the queue's `ExclusiveGuard` is such a proof; `shared` says so).
pub trait ExclusiveLock {}

const EMPTY: u64 = 0;
const REMOVED: u64 = 1;

/// One table's header, followed by its entries.
#[repr(C)]
pub struct InterestHead {
    /// Sequence lock: bumped to odd before a change, to even after; changed under the
    /// exclusive queue lock only.
    version: AtomicU64,
    /// The consumer receives only what it listens to. Exclusive lock to change.
    filtering: AtomicBool,
    /// Keys listened to. Exclusive lock to change.
    live: AtomicU32,
    /// Entries not empty (live and removed). Exclusive lock to change.
    used: AtomicU32,
    /// Bit `b` set while `bucket_live[b]` is above zero. Exclusive lock to change; read by
    /// drains with no lock, within the `version` bracket.
    summary: [AtomicU64; SUMMARY_BITS / 64],
    /// Live keys in each bucket. Exclusive lock to read or change (writers only).
    bucket_live: [AtomicU32; SUMMARY_BITS],
}

/// Buckets of the summary: 4,096 bits, 512 bytes a table. With 250 keys listened to (a
/// routed sidecar's share of 2,000 topics), at most 6% of the other topics' records still
/// probe (3.4% of the lab's `cost-0` to `cost-1999`).
pub const SUMMARY_BITS: usize = 4096;

/// A key's bucket in the summary: the top bits of the key times the golden ratio's odd
/// constant (Fibonacci hashing). Not the key's own top bits: FNV-1a's last multiply moves a
/// difference in the last byte only up to bit 49, so `room:0` and `room:1` share those, and
/// 2,000 topics `cost-0` to `cost-1999` fell in 70 buckets. Mixed, they fill 1,670.
fn bucket(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SUMMARY_BITS.trailing_zeros())) as usize
}

/// An entry: its key, how many listens hold it, and the sequence the queue's next message
/// had when the key was first listened to. Exclusive lock to change; readers look at `key`
/// and `since` (a present key always has a count above zero).
#[repr(C)]
pub struct Entry {
    key: AtomicU64,
    count: AtomicU64,
    /// A message of this key is wanted from this sequence on: what was published before
    /// the key was listened to is not, whenever the drain happens to read it. (Drains sleep
    /// through commits they do not listen to, `wake.rs`, so a drain may read a message
    /// only after a later listen made its key wanted: without `since` a channel that just
    /// joined was sent messages committed before it joined.)
    since: AtomicU64,
}

/// How many keys one consumer may listen to at once (`realtime.max_topics_per_consumer`).
pub fn max_keys() -> u32 {
    gucs::max_topics_per_consumer()
}

/// Entries per table: twice the keys at least, so probes stay short.
pub fn capacity() -> u32 {
    (max_keys() * 2).next_power_of_two()
}

/// Bytes of one slot's table, kept 64-byte aligned.
pub fn table_size() -> usize {
    (std::mem::size_of::<InterestHead>().next_multiple_of(64)
        + capacity() as usize * std::mem::size_of::<Entry>())
    .next_multiple_of(64)
}

fn fnv1a(kind: u8, bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::iter::once(&kind).chain(bytes) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // 0 and 1 mark empty and removed entries.
    h.max(2)
}

pub fn topic_key(topic: &str) -> u64 {
    fnv1a(b't', topic.as_bytes())
}

/// A captured table's changes, by the table's name (a change's topic): a name, unlike an
/// oid, still means the table a client subscribed to after it was dropped and created again.
pub fn table_key(table: &str) -> u64 {
    fnv1a(b'r', table.as_bytes())
}

/// Every captured table's changes.
pub fn all_tables_key() -> u64 {
    fnv1a(b'a', &[])
}

/// One consumer slot's table.
#[derive(Clone, Copy)]
pub struct Interest<'a> {
    head: &'a InterestHead,
    entries: &'a [Entry],
}

impl<'a> Interest<'a> {
    /// # Safety
    /// `base` must point to a table of `table_size()` bytes laid out as above (all-zero is
    /// a valid, unfiltered table) that outlives `'a`.
    pub unsafe fn at(base: *mut u8) -> Self {
        let entries = base.add(std::mem::size_of::<InterestHead>().next_multiple_of(64));
        Interest {
            head: &*(base as *const InterestHead),
            entries: std::slice::from_raw_parts(entries as *const Entry, capacity() as usize),
        }
    }

    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    /// Whether some live key shares `key`'s bucket (false: `key` is not listened to).
    fn summarised(&self, key: u64) -> bool {
        let b = bucket(key);
        self.head.summary[b / 64].load(Relaxed) & (1 << (b % 64)) != 0
    }

    /// One live key more (`up`) or less in `key`'s bucket; the bit follows. Writers only.
    fn count_in_bucket(&self, key: u64, up: bool) {
        let b = bucket(key);
        let word = &self.head.summary[b / 64];
        let bit = 1u64 << (b % 64);
        if up {
            if self.head.bucket_live[b].fetch_add(1, Relaxed) == 0 {
                word.fetch_or(bit, Relaxed);
            }
        } else if self.head.bucket_live[b].fetch_sub(1, Relaxed) == 1 {
            word.fetch_and(!bit, Relaxed);
        }
    }

    /// Where `key` is, or None. Probes stop at an empty entry.
    fn find(&self, key: u64) -> Option<usize> {
        let mut i = key as usize & self.mask();
        for _ in 0..self.entries.len() {
            match self.entries[i].key.load(Relaxed) {
                k if k == key => return Some(i),
                EMPTY => return None,
                _ => i = (i + 1) & self.mask(),
            }
        }
        None
    }

    /// Whether a drain should return a message with this key and sequence (`u64::MAX`:
    /// whether the key is listened to at all). No lock; see the file's comment for why an
    /// overlapping change answers true.
    pub fn wants(&self, key: u64, seq: u64) -> bool {
        let before = self.head.version.load(Acquire);
        if before % 2 == 1 || !self.head.filtering.load(Relaxed) {
            return true;
        }
        let found = self.summarised(key)
            && self
                .find(key)
                .is_some_and(|i| seq >= self.entries[i].since.load(Relaxed));
        fence(Acquire);
        found || self.head.version.load(Relaxed) != before
    }

    fn wants_at(&self, m: &MessageView, seq: u64) -> bool {
        if m.is_change() {
            self.wants(all_tables_key(), seq) || self.wants(table_key(m.topic), seq)
        } else {
            self.wants(topic_key(m.topic), seq)
        }
    }

    /// Whether the drain should return this published record.
    pub fn wants_record(&self, m: &MessageView) -> bool {
        self.wants_at(m, m.header.seq)
    }

    /// Whether this record's key is listened to, whatever its sequence (a record being
    /// published has none yet: `wake.rs` asks this).
    pub fn listens_to(&self, m: &MessageView) -> bool {
        self.wants_at(m, u64::MAX)
    }

    pub fn filtering(&self) -> bool {
        self.head.filtering.load(Relaxed)
    }

    pub fn live(&self) -> u32 {
        self.head.live.load(Relaxed)
    }

    /// Runs `change` as one writer's change, readers told by `version`.
    fn write<T>(&self, _lock: &mut impl ExclusiveLock, change: impl FnOnce() -> T) -> T {
        let v = self.head.version.load(Relaxed);
        self.head.version.store(v + 1, Relaxed);
        fence(Release);
        let out = change();
        self.head.version.store(v + 2, Release);
        out
    }

    fn clear_entries(&self) {
        for e in self.entries {
            e.key.store(EMPTY, Relaxed);
            e.count.store(0, Relaxed);
            e.since.store(0, Relaxed);
        }
        self.head.live.store(0, Relaxed);
        self.head.used.store(0, Relaxed);
        for w in &self.head.summary {
            w.store(0, Relaxed);
        }
        for c in &self.head.bucket_live {
            c.store(0, Relaxed);
        }
    }

    /// Forgets every key; `filtering` says whether the consumer then receives nothing
    /// (until it listens) or everything.
    pub fn reset(&self, lock: &mut impl ExclusiveLock, filtering: bool) {
        self.write(lock, || {
            self.clear_entries();
            self.head.filtering.store(filtering, Relaxed);
        });
    }

    /// The live keys and their `since`, to be kept across a reset (`listen`'s `reset`): a
    /// key listened to before and after it stays wanted from when it was first listened to,
    /// so a sidecar that reconnects and offers its set again loses nothing of its topics.
    pub fn live_since(&self) -> HashMap<u64, u64> {
        self.entries
            .iter()
            .map(|e| (e.key.load(Relaxed), e.since.load(Relaxed)))
            .filter(|(k, _)| *k > REMOVED)
            .collect()
    }

    fn insert(&self, key: u64, count: u64, since: u64) {
        if let Some(i) = self.find(key) {
            self.entries[i].count.fetch_add(count, Relaxed);
            return;
        }
        let mut i = key as usize & self.mask();
        loop {
            let k = self.entries[i].key.load(Relaxed);
            if k == EMPTY || k == REMOVED {
                self.entries[i].count.store(count, Relaxed);
                self.entries[i].since.store(since, Relaxed);
                self.entries[i].key.store(key, Relaxed);
                self.head.live.fetch_add(1, Relaxed);
                self.count_in_bucket(key, true);
                if k == EMPTY {
                    self.head.used.fetch_add(1, Relaxed);
                }
                return;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Counts each key once more and turns filtering on; a key new to the table is wanted
    /// from sequence `since` on, or from the one `kept` (`live_since`) gives it. All or
    /// nothing: Err(live keys it would need) when the table cannot take the new keys.
    pub fn listen(
        &self,
        lock: &mut impl ExclusiveLock,
        keys: &[u64],
        since: u64,
        kept: &HashMap<u64, u64>,
    ) -> Result<(), u64> {
        let mut new: Vec<u64> = keys
            .iter()
            .copied()
            .filter(|k| self.find(*k).is_none())
            .collect();
        new.sort_unstable();
        new.dedup();
        let needed = self.live() as u64 + new.len() as u64;
        if needed > max_keys() as u64 {
            return Err(needed);
        }
        self.write(lock, || {
            // Removed entries lengthen probes and are never empty again by themselves:
            // rebuild once they and the live keys would fill three quarters of the table.
            let used = self.head.used.load(Relaxed) as usize + new.len();
            if used * 4 > self.entries.len() * 3 {
                let live: Vec<(u64, u64, u64)> = self
                    .entries
                    .iter()
                    .map(|e| {
                        let key = e.key.load(Relaxed);
                        (key, e.count.load(Relaxed), e.since.load(Relaxed))
                    })
                    .filter(|(k, _, _)| *k > REMOVED)
                    .collect();
                self.clear_entries();
                for (k, c, s) in live {
                    self.insert(k, c, s);
                }
            }
            for k in keys {
                self.insert(*k, 1, kept.get(k).copied().unwrap_or(since));
            }
            self.head.filtering.store(true, Relaxed);
        });
        Ok(())
    }

    /// Counts each key once less; a key no longer held is removed. Keys not listened to
    /// are ignored.
    pub fn unlisten(&self, lock: &mut impl ExclusiveLock, keys: &[u64]) {
        self.write(lock, || {
            for k in keys {
                let Some(i) = self.find(*k) else { continue };
                let e = &self.entries[i];
                if e.count.fetch_sub(1, Relaxed) == 1 {
                    e.key.store(REMOVED, Relaxed);
                    self.head.live.fetch_sub(1, Relaxed);
                    self.count_in_bucket(*k, false);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_that_differ_in_their_last_byte_spread_over_the_summary() {
        let buckets: std::collections::HashSet<usize> = (0..2000)
            .map(|i| bucket(topic_key(&format!("cost-{i}"))))
            .collect();
        assert!(buckets.len() > 1500, "{} buckets", buckets.len());
    }

    #[test]
    fn the_regress_pair_shares_a_bucket() {
        // regress/sql/listen.sql unlistens one of two topics of one bucket.
        assert_eq!(bucket(topic_key("room:31")), bucket(topic_key("room:180")));
    }
}
