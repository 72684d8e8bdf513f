//! The bytes of history the sidecar holds while it is sent (issue 39, H2): a resume or
//! replay's frames are made at once and sent at the client's pace, so a slow reader keeps
//! them alive. Counting messages (MAX_RESUME_MESSAGES) did not bound them: messages may be
//! a megabyte each. Three bounds, each with its setting:
//!
//! - MAX_RESUME_BYTES: one history's frames. The newest message always fits, whatever its
//!   size (a client is never refused the one message it is behind by).
//! - MAX_RESUME_BYTES_PER_ADDRESS: the histories of one client address being sent, together
//!   (MAX_RESUMES_PER_ADDRESS of them run at once): an address's slow readers spend its own
//!   share only.
//! - MAX_RESUME_BYTES_IN_FLIGHT: every history being sent, together.
//!
//! A history is cut to what fits, its newest messages kept, and a resume is told
//! `recovered: false` with the positions not sent and the bound that cut them (`resume`).
//! What a history holds is taken when its frames are made (`Budget::take`) and given back
//! frame by frame as they are queued to the socket (`Held::give_back`), the rest when it is
//! dropped: a history that ends, is cut off or whose client leaves gives back at once.
//! Frames shared by several histories of one read are counted by each: the bound is on what
//! could be held, not on what is.
//!
//! The totals are `tally::Amounts` (per address, and one for the sidecar), each history's
//! share a `Charge` of each.

use crate::address::AddressKey;
use crate::config::Config;
use crate::tally::{Amounts, Charge};
use std::sync::Arc;

/// The sidecar's history bytes.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    by_address: Amounts<AddressKey>,
    sidecar: Amounts<()>,
    /// realtime_history_bytes_held
    gauge: Option<metrics::Gauge>,
    request: usize,
    address: usize,
    sidecar_limit: usize,
}

/// The bound that cut a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// MAX_RESUME_BYTES
    Request(usize),
    /// MAX_RESUME_BYTES_PER_ADDRESS
    Address(usize),
    /// MAX_RESUME_BYTES_IN_FLIGHT
    Sidecar(usize),
}

impl Bound {
    /// Why the positions before the cut were not sent, for the resume's `system` message.
    pub fn why(&self, seq: i64) -> String {
        match self {
            Bound::Request(n) => format!(
                "The messages after position {seq} take more than MAX_RESUME_BYTES ({n} bytes)"
            ),
            Bound::Address(n) => format!(
                "This client address's histories being sent would hold more than MAX_RESUME_BYTES_PER_ADDRESS ({n} bytes) with the messages after position {seq}"
            ),
            Bound::Sidecar(n) => format!(
                "The histories being sent would hold more than MAX_RESUME_BYTES_IN_FLIGHT ({n} bytes) with the messages after position {seq}"
            ),
        }
    }
}

/// What the history of one join may take now: at most `request` (its newest message
/// whatever its size), at most `shared` (its address's and the sidecar's room, strictly).
#[derive(Clone, Copy, Debug)]
pub struct Room {
    pub request: usize,
    pub shared: usize,
    /// The bound `shared` is (the smaller of its address's and the sidecar's).
    pub shared_bound: Bound,
    pub request_bound: Bound,
}

/// Bytes a history holds; given back as it is sent, the rest when dropped.
pub struct Held {
    inner: Arc<Inner>,
    address: Option<Charge<AddressKey>>,
    sidecar: Charge<()>,
}

impl Budget {
    pub fn of(cfg: &Config, gauge: Option<metrics::Gauge>) -> Budget {
        Budget {
            inner: Arc::new(Inner {
                by_address: Amounts::default(),
                sidecar: Amounts::default(),
                gauge,
                request: cfg.max_resume_bytes as usize,
                address: cfg.max_resume_bytes_per_address as usize,
                sidecar_limit: cfg.max_resume_bytes_in_flight as usize,
            }),
        }
    }

    /// The room of a history of `address` (None: a backend's, bound by the sidecar's only).
    pub fn room(&self, address: Option<AddressKey>) -> Room {
        let i = &self.inner;
        let sidecar = i.sidecar_limit.saturating_sub(i.sidecar.total(&()));
        let own = address.map(|a| i.address.saturating_sub(i.by_address.total(&a)));
        let (shared, shared_bound) = match own {
            Some(own) if own <= sidecar => (own, Bound::Address(i.address)),
            _ => (sidecar, Bound::Sidecar(i.sidecar_limit)),
        };
        Room {
            request: i.request,
            shared,
            shared_bound,
            request_bound: Bound::Request(i.request),
        }
    }

    /// Holds `bytes` for a history of `address` (measured against `room` just before: the
    /// history worker is the only taker, so the room can only have grown meanwhile).
    pub fn take(&self, address: Option<AddressKey>, bytes: usize) -> Held {
        let i = &self.inner;
        let mut held = Held {
            inner: i.clone(),
            address: address.map(|a| i.by_address.charge(a)),
            sidecar: i.sidecar.charge(()),
        };
        held.set(bytes);
        held
    }

    /// Bytes held by every history (for tests and metrics).
    pub fn held(&self) -> usize {
        self.inner.sidecar.total(&())
    }
}

impl Held {
    /// Gives `bytes` back (a frame was queued to the socket).
    pub fn give_back(&mut self, bytes: usize) {
        let left = self.sidecar.amount().saturating_sub(bytes);
        self.set(left);
    }

    fn set(&mut self, bytes: usize) {
        if let Some(a) = &mut self.address {
            a.set(bytes);
        }
        self.sidecar.set(bytes);
        if let Some(g) = &self.inner.gauge {
            g.set(self.inner.sidecar.total(&()) as f64);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// Of a history's items in queue order (`sizes`, in bytes), the index of the first one kept
/// when the newest are kept within `room`, and the bound that cut (None: all kept).
pub fn keep_newest(sizes: &[usize], room: &Room) -> (usize, Option<Bound>) {
    let mut sum = 0usize;
    let mut first = sizes.len();
    for (i, &s) in sizes.iter().enumerate().rev() {
        let with = sum.saturating_add(s);
        if with > room.shared {
            return (first, Some(room.shared_bound));
        }
        // The newest one always fits the request's own bound.
        if with > room.request && first != sizes.len() {
            return (first, Some(room.request_bound));
        }
        sum = with;
        first = i;
    }
    (first, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(request: usize, shared: usize) -> Room {
        Room {
            request,
            shared,
            shared_bound: Bound::Address(shared),
            request_bound: Bound::Request(request),
        }
    }

    #[test]
    fn the_newest_are_kept_within_the_room_and_the_newest_one_always_fits_its_request() {
        let sizes = [5, 5, 5, 5];
        assert_eq!(keep_newest(&sizes, &room(100, 100)), (0, None));
        assert_eq!(
            keep_newest(&sizes, &room(12, 100)),
            (2, Some(Bound::Request(12)))
        );
        assert_eq!(
            keep_newest(&sizes, &room(100, 11)),
            (2, Some(Bound::Address(11)))
        );
        // One message over the request's bound: still sent, alone.
        assert_eq!(
            keep_newest(&[1, 50], &room(10, 100)),
            (1, Some(Bound::Request(10)))
        );
        // Nothing left of the address's share: nothing sent.
        assert_eq!(
            keep_newest(&[1, 50], &room(100, 20)),
            (2, Some(Bound::Address(20)))
        );
        assert_eq!(keep_newest(&[], &room(0, 0)), (0, None));
    }

    #[test]
    fn what_a_history_holds_is_counted_per_address_and_given_back() {
        use clap::Parser;
        let cfg = Config::try_parse_from([
            "realtime-sidecar",
            "--jwt-secret",
            &"s".repeat(32),
            "--max-resume-bytes",
            "2000000",
            "--max-resume-bytes-per-address",
            "3000000",
            "--max-resume-bytes-in-flight",
            "5000000",
        ])
        .unwrap();
        let b = Budget::of(&cfg, None);
        let a = AddressKey::of("127.0.0.9".parse().unwrap());
        let c = AddressKey::of("127.0.0.10".parse().unwrap());
        let mut one = b.take(Some(a), 2_500_000);
        let r = b.room(Some(a));
        assert_eq!(
            (r.shared, r.shared_bound),
            (500_000, Bound::Address(3_000_000))
        );
        let two = b.take(Some(c), 2_000_000);
        let r = b.room(None);
        assert_eq!(
            (r.shared, r.shared_bound),
            (500_000, Bound::Sidecar(5_000_000))
        );
        one.give_back(1_000_000);
        assert_eq!(b.room(Some(a)).shared, 1_500_000);
        drop(one);
        drop(two);
        assert_eq!(b.held(), 0);
        assert_eq!(b.room(Some(a)).shared, 3_000_000);
    }
}
