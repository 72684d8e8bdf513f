//! Bytes the sidecar holds on clients' behalf, bounded per client address and for the whole
//! sidecar: the client frames being read (`reading`), and the broadcasts waiting for the
//! relay (`relay`) with the pushes held while a private channel's verdict is asked (`held`).
//! A frame may be megabytes; counted in frames or messages, a few clients' large ones could
//! hold what the machine has. Each bound has two settings (`..._PER_ADDRESS`
//! and the sidecar's), and what is held is taken before the bytes are (a frame's header
//! announces its length; a broadcast's size is known before it is queued): a take that
//! does not fit is refused at once, never waited for, so no client holds another's place.
//! A backend's connection (`Claims::is_backend`, no address) counts against the sidecar's
//! bound only, as its other per-address limits count none of it.
//!
//! The totals are `tally::Amounts`, each holder's share a `Charge` of each.

use crate::address::AddressKey;
use crate::tally::{Amounts, Charge};
use std::sync::Arc;

/// One kind of bytes held, and its two bounds.
#[derive(Clone)]
pub struct ByteBudget {
    inner: Arc<Inner>,
}

struct Inner {
    by_address: Amounts<AddressKey>,
    sidecar: Amounts<()>,
    per_address: usize,
    sidecar_limit: usize,
}

/// Which bound a take would have passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The holder's client address's (`..._PER_ADDRESS`).
    Address,
    /// The sidecar's.
    Sidecar,
}

/// What one holder (a connection's reader, a broadcast) holds; given back when dropped.
pub struct Hold {
    inner: Arc<Inner>,
    address: Option<Charge<AddressKey>>,
    sidecar: Charge<()>,
}

impl ByteBudget {
    pub fn new(per_address: usize, sidecar: usize) -> ByteBudget {
        ByteBudget {
            inner: Arc::new(Inner {
                by_address: Amounts::default(),
                sidecar: Amounts::default(),
                per_address,
                sidecar_limit: sidecar,
            }),
        }
    }

    /// A holder for `address` (None: a backend's), holding nothing yet.
    pub fn holder(&self, address: Option<AddressKey>) -> Hold {
        let i = &self.inner;
        Hold {
            inner: i.clone(),
            address: address.map(|a| i.by_address.charge(a)),
            sidecar: i.sidecar.charge(()),
        }
    }

    /// `bytes` held for `address`, or the bound they would pass.
    pub fn take(&self, address: Option<AddressKey>, bytes: usize) -> Result<Hold, Over> {
        let mut hold = self.holder(address);
        hold.set(bytes)?;
        Ok(hold)
    }

    /// Bytes held by every holder.
    pub fn held(&self) -> usize {
        self.inner.sidecar.total(&())
    }

    /// Bytes held for `address`.
    #[cfg(test)]
    fn held_by(&self, address: &AddressKey) -> usize {
        self.inner.by_address.total(address)
    }
}

impl Hold {
    /// Makes what this holder holds `bytes`, unless its address's or the sidecar's total
    /// would then pass its bound: then nothing changes. Each total is checked and moved
    /// under its own lock, so two holders never both pass on the same room.
    pub fn set(&mut self, bytes: usize) -> Result<(), Over> {
        let before = self.sidecar.amount();
        if let Some(a) = &mut self.address {
            a.set_within(bytes, bytes, self.inner.per_address)
                .map_err(|_| Over::Address)?;
        }
        if self
            .sidecar
            .set_within(bytes, bytes, self.inner.sidecar_limit)
            .is_err()
        {
            if let Some(a) = &mut self.address {
                a.set(before);
            }
            return Err(Over::Sidecar);
        }
        Ok(())
    }

    /// What this holder holds.
    pub fn amount(&self) -> usize {
        self.sidecar.amount()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn address(s: &str) -> AddressKey {
        AddressKey::of(s.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn a_take_past_its_address_or_the_sidecar_is_refused_and_changes_nothing() {
        let budget = ByteBudget::new(100, 150);
        let a = address("192.0.2.1");
        let b = address("192.0.2.2");
        let first = budget.take(Some(a), 80).unwrap();
        assert_eq!(budget.take(Some(a), 21).err(), Some(Over::Address));
        assert_eq!(budget.held_by(&a), 80);
        // Another address has its own share, up to what the sidecar has left.
        let second = budget.take(Some(b), 70).unwrap();
        assert_eq!(budget.take(Some(b), 1).err(), Some(Over::Sidecar));
        assert_eq!((budget.held_by(&b), budget.held()), (70, 150));
        // A backend's counts against the sidecar's bound alone.
        assert_eq!(budget.take(None, 1).err(), Some(Over::Sidecar));
        drop(first);
        assert_eq!(budget.held(), 70);
        let backend = budget.take(None, 80).unwrap();
        assert_eq!(budget.held_by(&a), 0);
        drop((second, backend));
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_holder_grows_within_its_bounds_and_shrinks_whatever_they_are() {
        let budget = ByteBudget::new(100, 1000);
        let a = address("192.0.2.1");
        let mut h = budget.holder(Some(a));
        h.set(60).unwrap();
        h.set(100).unwrap();
        assert_eq!(h.set(101), Err(Over::Address));
        assert_eq!(h.amount(), 100);
        h.set(10).unwrap();
        assert_eq!((budget.held_by(&a), budget.held()), (10, 10));
    }
}
