//! The bytes of large frames waiting in connections' queues, for the whole sidecar and per
//! client address (MAX_SIDECAR_OUTBOUND_BYTES, MAX_OUTBOUND_BYTES_PER_ADDRESS).
//!
//! A broadcast's frame is made once and shared by every subscriber's queue (one `Bytes`,
//! many owners). MAX_OUTBOUND_BYTES counts it in each connection's queue, as that
//! connection's bound must; summed over queues, a 3 MB message to 10,000 slow subscribers
//! would count 30 GB where 3 MB is held. Here each distinct frame counts once for the
//! sidecar, and once for each address whose connections queue it, from the first queue that
//! takes it until the last one lets it go (written, dropped, or its connection gone). A push
//! whose frame would pass a bound cuts its connection off as too slow, naming the bound: its
//! socket took nothing of the frame while the sidecar holds its share. Nothing waits.
//!
//! Frames under `COUNTED` bytes are left out: each connection's are bounded by
//! MAX_OUTBOUND_FRAMES and MAX_OUTBOUND_BYTES, and the common fan-out of small messages
//! never takes this table's lock. Frames are told apart by where their payload lives.
//!
//! Lock: one mutex over the table, taken inside a queue's lock (a queue's → this one), for
//! a few instructions, never across an await.

use crate::address::AddressKey;
use crate::byte_budget::Over;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_tungstenite::tungstenite::Message;

/// Frames this large or larger are counted.
pub const COUNTED: usize = 16 * 1024;

/// The table of counted frames, shared by every connection's queue.
#[derive(Clone)]
pub struct SharedBytes {
    inner: Arc<Inner>,
}

struct Inner {
    table: Mutex<Table>,
    per_address: usize,
    sidecar: usize,
}

#[derive(Default)]
struct Table {
    /// By (payload address, length): the queues holding the frame, in all and per address.
    frames: HashMap<(usize, usize), Held>,
    total: usize,
    by_address: HashMap<AddressKey, usize>,
}

#[derive(Default)]
struct Held {
    queues: u32,
    addresses: HashMap<AddressKey, u32>,
}

/// A frame's identity and size, if it is counted.
fn key(frame: &Message) -> Option<(usize, usize)> {
    let payload: &[u8] = match frame {
        Message::Text(t) => t.as_bytes(),
        Message::Binary(b) => b,
        _ => return None,
    };
    (payload.len() >= COUNTED).then_some((payload.as_ptr() as usize, payload.len()))
}

impl SharedBytes {
    pub fn new(per_address: usize, sidecar: usize) -> SharedBytes {
        SharedBytes {
            inner: Arc::new(Inner {
                table: Mutex::default(),
                per_address,
                sidecar,
            }),
        }
    }

    /// A queue of `address` (None: a backend's, counted for the sidecar only) takes `frame`,
    /// unless it would pass a bound; `force`: taken whatever the bounds (a reply put ahead).
    pub fn enter(
        &self,
        frame: &Message,
        address: Option<AddressKey>,
        force: bool,
    ) -> Result<(), Over> {
        let Some((at, len)) = key(frame) else {
            return Ok(());
        };
        let mut t = self.inner.table.lock().unwrap();
        let held = t.frames.get(&(at, len));
        let new_frame = held.is_none_or(|h| h.queues == 0);
        let new_for_address = address.is_some_and(|a| {
            held.and_then(|h| h.addresses.get(&a))
                .is_none_or(|n| *n == 0)
        });
        if !force {
            if new_frame && t.total + len > self.inner.sidecar {
                return Err(Over::Sidecar);
            }
            if let Some(a) = address.filter(|_| new_for_address) {
                if t.by_address.get(&a).copied().unwrap_or(0) + len > self.inner.per_address {
                    return Err(Over::Address);
                }
            }
        }
        if new_frame {
            t.total += len;
        }
        if let Some(a) = address.filter(|_| new_for_address) {
            *t.by_address.entry(a).or_insert(0) += len;
        }
        let held = t.frames.entry((at, len)).or_default();
        held.queues += 1;
        if let Some(a) = address {
            *held.addresses.entry(a).or_insert(0) += 1;
        }
        Ok(())
    }

    /// A queue of `address` let `frame` go.
    pub fn leave(&self, frame: &Message, address: Option<AddressKey>) {
        let Some((at, len)) = key(frame) else {
            return;
        };
        let mut t = self.inner.table.lock().unwrap();
        let Some(held) = t.frames.get_mut(&(at, len)) else {
            return;
        };
        held.queues -= 1;
        let last = held.queues == 0;
        let mut last_of_address = false;
        if let Some(a) = address {
            if let Some(n) = held.addresses.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    held.addresses.remove(&a);
                    last_of_address = true;
                }
            }
        }
        if last {
            t.frames.remove(&(at, len));
            t.total -= len;
        }
        if let Some(a) = address.filter(|_| last_of_address) {
            if let Some(total) = t.by_address.get_mut(&a) {
                *total -= len;
                if *total == 0 {
                    t.by_address.remove(&a);
                }
            }
        }
    }

    /// Bytes of the distinct counted frames queued.
    pub fn held(&self) -> usize {
        self.inner.table.lock().unwrap().total
    }

    #[cfg(test)]
    fn held_by(&self, a: &AddressKey) -> usize {
        let t = self.inner.table.lock().unwrap();
        t.by_address.get(a).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(s: &str) -> Option<AddressKey> {
        Some(AddressKey::of(s.parse().unwrap()))
    }

    #[test]
    fn a_frame_shared_by_many_queues_counts_once_and_until_the_last_lets_it_go() {
        let shared = SharedBytes::new(100_000, 100_000);
        let frame = Message::binary(vec![7u8; 40_000]);
        let (a, b) = (address("192.0.2.1"), address("192.0.2.2"));
        for q in [a, a, b, None] {
            shared.enter(&frame.clone(), q, false).unwrap();
        }
        assert_eq!(shared.held(), 40_000);
        assert_eq!(shared.held_by(&a.unwrap()), 40_000);
        shared.leave(&frame, a);
        shared.leave(&frame, None);
        assert_eq!(
            (shared.held(), shared.held_by(&a.unwrap())),
            (40_000, 40_000)
        );
        shared.leave(&frame, a);
        assert_eq!((shared.held(), shared.held_by(&a.unwrap())), (40_000, 0));
        shared.leave(&frame, b);
        assert_eq!(shared.held(), 0);
        // Small frames are not counted.
        shared.enter(&Message::text("hi"), a, false).unwrap();
        assert_eq!(shared.held(), 0);
    }

    #[test]
    fn a_distinct_frame_past_a_bound_is_refused_unless_forced() {
        let shared = SharedBytes::new(50_000, 70_000);
        let (a, b) = (address("192.0.2.1"), address("192.0.2.2"));
        let one = Message::binary(vec![1u8; 40_000]);
        let two = Message::binary(vec![2u8; 20_000]);
        shared.enter(&one, a, false).unwrap();
        assert_eq!(shared.enter(&two, a, false), Err(Over::Address));
        // Another address may hold the same frame (nothing new for the sidecar); a backend's
        // queue counts for the sidecar only, up to its bound.
        shared.enter(&one, b, false).unwrap();
        shared.enter(&two, None, false).unwrap();
        let three = Message::binary(vec![3u8; 20_000]);
        assert_eq!(shared.enter(&three, None, false), Err(Over::Sidecar));
        shared.enter(&three, None, true).unwrap();
        assert_eq!(shared.held(), 80_000);
    }
}
