//! Per-key counters for the limits that count by who sends (an address, a user, everyone):
//! events per second, and things in flight. Both are bounded maps: an entry exists only
//! while it counts something, so a client cannot grow them by naming new keys faster than
//! the limits let it act (see each type for its bound).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(1);
/// Live keys a `RateTally` holds at most, in multiples of its `sweep_at`.
const HARD_CAP: usize = 4;

/// Why a rate refused: Supabase's two answers to a batch (its texts are in `rest_limits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The key already spent its second's budget.
    Rate,
    /// The key has budget left, but not for this many at once.
    Batch,
}

/// Events per key per one-second window (fixed windows, as `rate::Rate`). Entries are made
/// only by a charge; expired ones are swept when the map reaches `sweep_at`. Most charges are
/// bounded by the caller's total rate, but a refused batch also spends its address's second
/// (`rest_limits`), so the map is capped too: past `HARD_CAP` times `sweep_at` live keys, a
/// new key is not recorded (the total rate still bounds what it may send).
pub struct RateTally<K> {
    map: Mutex<HashMap<K, (Instant, u32)>>,
    sweep_at: usize,
}

impl<K: Eq + Hash + Clone> RateTally<K> {
    pub fn new(sweep_at: usize) -> Self {
        RateTally {
            map: Mutex::default(),
            sweep_at: sweep_at.max(64),
        }
    }

    /// Whether `n` more events of `key` fit under `limit` this second (nothing is counted).
    pub fn check(&self, key: &K, n: u32, limit: u32) -> Result<(), Over> {
        let map = self.map.lock().unwrap();
        let spent = match map.get(key) {
            Some((start, count)) if start.elapsed() < WINDOW => *count,
            _ => 0,
        };
        if spent >= limit {
            Err(Over::Rate)
        } else if spent.saturating_add(n) > limit {
            Err(Over::Batch)
        } else {
            Ok(())
        }
    }

    /// Counts `n` events of `key`.
    pub fn charge(&self, key: &K, n: u32) {
        let mut map = self.map.lock().unwrap();
        if map.len() >= self.sweep_at && !map.contains_key(key) {
            map.retain(|_, (start, _)| start.elapsed() < WINDOW);
            if map.len() >= self.sweep_at * HARD_CAP {
                return;
            }
        }
        let entry = map.entry(key.clone()).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 = entry.1.saturating_add(n);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

/// Things in flight per key (requests, connections). An entry exists while its count is
/// above zero, so the map never holds more keys than there are things in flight, which the
/// caller bounds by a total.
pub struct InFlight<K: Eq + Hash> {
    map: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: Eq + Hash> Default for InFlight<K> {
    fn default() -> Self {
        InFlight {
            map: Arc::default(),
        }
    }
}

impl<K: Eq + Hash + Clone> InFlight<K> {
    /// One more for `key`, unless it already has `limit`; it counts until the guard drops.
    pub fn enter(&self, key: K, limit: usize) -> Option<Entered<K>> {
        let mut map = self.map.lock().unwrap();
        let count = map.entry(key.clone()).or_insert(0);
        if *count >= limit {
            if *count == 0 {
                map.remove(&key);
            }
            return None;
        }
        *count += 1;
        Some(Entered {
            map: self.map.clone(),
            key,
        })
    }

    pub fn count(&self, key: &K) -> usize {
        self.map.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    #[cfg(test)]
    fn keys(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

/// One thing in flight; dropping it ends it.
pub struct Entered<K: Eq + Hash> {
    map: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
}

impl<K: Eq + Hash> Drop for Entered<K> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap();
        if let Some(count) = map.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// Amounts held per key by many holders (the Postgres Changes bindings of an address's
/// connections): each holder's share is one `Charge`, moved as its amount changes and given
/// back when it drops. An entry exists while its total is above zero, so the map never holds
/// more keys than there are holders with something held (each a connection, bounded by
/// MAX_CONNECTIONS).
pub struct Amounts<K: Eq + Hash> {
    map: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: Eq + Hash> Default for Amounts<K> {
    fn default() -> Self {
        Amounts {
            map: Arc::default(),
        }
    }
}

impl<K: Eq + Hash + Clone> Amounts<K> {
    /// A new holder of `key`, holding nothing yet.
    pub fn charge(&self, key: K) -> Charge<K> {
        Charge {
            map: self.map.clone(),
            key,
            amount: 0,
        }
    }

    pub fn total(&self, key: &K) -> usize {
        self.map.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    #[cfg(test)]
    fn keys(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

/// One holder's share of its key's total; dropping it gives the share back.
pub struct Charge<K: Eq + Hash> {
    map: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
    amount: usize,
}

impl<K: Eq + Hash + Clone> Charge<K> {
    /// Makes this holder's share `to`, unless the key's total with `counted` in place of this
    /// share would pass `limit`: then nothing changes and the error is that total. (`counted`
    /// is what the limit judges, which may be less than what is held meanwhile: a rejoin is
    /// judged by its difference while its old channel still holds its bindings.) Checked and
    /// moved under one lock, so two holders of one key cannot both pass on the same room.
    pub fn set_within(&mut self, to: usize, counted: usize, limit: usize) -> Result<(), usize> {
        let mut map = self.map.lock().unwrap();
        let others = map.get(&self.key).copied().unwrap_or(0) - self.amount;
        let judged = others + counted;
        if judged > limit {
            return Err(judged);
        }
        Self::put(&mut map, &self.key, others + to);
        self.amount = to;
        Ok(())
    }

    /// The key this holder's share is of.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// This holder's share.
    pub fn amount(&self) -> usize {
        self.amount
    }

    /// Makes this holder's share `to`, whatever the total (a share that shrinks, or what was
    /// admitted by `set_within` becoming held).
    pub fn set(&mut self, to: usize) {
        if to == self.amount {
            return;
        }
        let mut map = self.map.lock().unwrap();
        let others = map.get(&self.key).copied().unwrap_or(0) - self.amount;
        Self::put(&mut map, &self.key, others + to);
        self.amount = to;
    }

    fn put(map: &mut HashMap<K, usize>, key: &K, total: usize) {
        if total == 0 {
            map.remove(key);
        } else {
            map.insert(key.clone(), total);
        }
    }
}

impl<K: Eq + Hash> Drop for Charge<K> {
    fn drop(&mut self) {
        if self.amount == 0 {
            return;
        }
        let mut map = self.map.lock().unwrap();
        if let Some(total) = map.get_mut(&self.key) {
            *total -= self.amount;
            if *total == 0 {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_refuses_a_spent_key_and_a_batch_too_large_for_what_is_left() {
        let t = RateTally::new(64);
        assert_eq!(t.check(&"a", 5, 10), Ok(()));
        t.charge(&"a", 8);
        assert_eq!(t.check(&"a", 2, 10), Ok(()));
        assert_eq!(t.check(&"a", 3, 10), Err(Over::Batch));
        t.charge(&"a", 2);
        assert_eq!(t.check(&"a", 1, 10), Err(Over::Rate));
        // Another key is not touched.
        assert_eq!(t.check(&"b", 10, 10), Ok(()));
        assert_eq!(t.check(&"b", 11, 10), Err(Over::Batch));
    }

    #[test]
    fn expired_keys_are_swept_when_the_map_is_full() {
        let t = RateTally::new(64);
        for i in 0..64 {
            t.charge(&i, 1);
        }
        assert_eq!(t.len(), 64);
        std::thread::sleep(WINDOW);
        t.charge(&1000, 1);
        assert_eq!(t.len(), 1, "the 64 expired keys went, the new one stayed");
    }

    #[test]
    fn live_keys_are_capped_whatever_is_charged() {
        let t = RateTally::new(64);
        for i in 0..1000 {
            t.charge(&i, 1);
        }
        assert_eq!(t.len(), 64 * HARD_CAP, "no more live keys than the cap");
        // A key already held is still counted.
        t.charge(&0, 5);
        assert_eq!(t.check(&0, 1, 6), Err(Over::Rate));
    }

    #[test]
    fn in_flight_counts_per_key_and_forgets_a_key_at_zero() {
        let f = InFlight::default();
        let a1 = f.enter("a", 2).unwrap();
        let a2 = f.enter("a", 2).unwrap();
        assert!(f.enter("a", 2).is_none());
        assert!(f.enter("b", 0).is_none());
        assert_eq!(f.keys(), 1, "a refused key leaves nothing behind");
        drop(a1);
        assert_eq!(f.count(&"a"), 1);
        drop(a2);
        assert_eq!(f.keys(), 0);
    }

    #[test]
    fn amounts_are_judged_together_and_forget_a_key_at_zero() {
        let a = Amounts::default();
        let mut one = a.charge("a");
        let mut two = a.charge("a");
        assert_eq!(one.set_within(6, 6, 10), Ok(()));
        // The second holder is judged with the first's share.
        assert_eq!(two.set_within(5, 5, 10), Err(11));
        assert_eq!(a.total(&"a"), 6, "a refusal changes nothing");
        assert_eq!(two.set_within(4, 4, 10), Ok(()));
        // A holder replacing part of its own share is judged by what it counts, and holds
        // what it says it holds meanwhile.
        assert_eq!(one.set_within(9, 6, 10), Ok(()));
        assert_eq!(a.total(&"a"), 13);
        one.set(3);
        assert_eq!(a.total(&"a"), 7);
        // Another key is apart.
        let mut b = a.charge("b");
        assert_eq!(b.set_within(10, 10, 10), Ok(()));
        assert_eq!(a.keys(), 2);
        drop(b);
        assert_eq!(a.keys(), 1, "a key whose holders hold nothing is gone");
        two.set(0);
        drop(one);
        assert_eq!(a.keys(), 0);
        drop(two);
        assert_eq!(a.total(&"a"), 0);
    }
}
