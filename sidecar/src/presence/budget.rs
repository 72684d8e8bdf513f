//! Presence's budgets of tracks per second, beside each channel's own
//! (MAX_CLIENT_PRESENCE_EVENTS_PER_SECOND): a connection's, a client address's, and the
//! sidecar's. Every track a sidecar accepts is written to the database and sent to every
//! watcher of its topic, so one client tracking as fast as it can must not spend everyone's
//! budget: the first two bound each source, and once the sidecar's total is spent only the
//! heaviest sources are refused: an address is still served while it has spent less than
//! its fair share (the total divided by the addresses that tracked this second). So a
//! bystander that tracks once is served while a flood goes on, and what the sidecar takes
//! in a second stays under twice its total. A refused track gets an error reply with the
//! reason; no channel is closed for a budget it did not spend. No budget refuses an untrack
//! (it only removes). A backend's connections (`Claims::is_backend`) have no address budget
//! and share one fair share among them, as if they were one address.

use crate::address::AddressKey;
use crate::rate::Rate;
use crate::reason::Refusal;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One connection as the budgets see it: its address (none for a backend's) and its own
/// tracks this second.
pub struct Source {
    pub address: Option<AddressKey>,
    rate: Rate,
}

impl Source {
    pub fn new(address: Option<AddressKey>) -> Self {
        Source {
            address,
            rate: Rate::default(),
        }
    }
}

pub struct Budgets {
    per_connection: u32,
    per_address: u32,
    total: u32,
    window: Mutex<Window>,
}

/// The current second: tracks in total and by address. The map is cleared each second and
/// holds only addresses whose tracks were accepted, at most twice the total of them; the
/// backends' tracks together are the entry `None`.
struct Window {
    start: Instant,
    total: u32,
    by_address: HashMap<Option<AddressKey>, u32>,
}

impl Budgets {
    pub fn new(per_connection: u32, per_address: u32, total: u32) -> Self {
        Budgets {
            per_connection,
            per_address,
            total,
            window: Mutex::new(Window {
                start: Instant::now(),
                total: 0,
                by_address: HashMap::new(),
            }),
        }
    }

    /// Counts one track of `source`, or says which budget refuses it.
    pub fn admit(&self, source: &mut Source) -> Result<(), Refusal> {
        let mut w = self.window.lock().unwrap();
        if w.start.elapsed() >= Duration::from_secs(1) {
            w.start = Instant::now();
            w.total = 0;
            w.by_address.clear();
        }
        let spent = w.by_address.get(&source.address).copied().unwrap_or(0);
        if spent >= self.per_address && source.address.is_some() {
            return Err(Refusal::PresenceAddressBudget);
        }
        if w.total >= self.total {
            let sources = (w.by_address.len() as u32).max(1);
            if spent >= (self.total / sources).max(1) {
                return Err(Refusal::PresenceSidecarBudget);
            }
        }
        // Counted last: a track another budget refused spends none of the connection's.
        if !source.rate.allow(self.per_connection) {
            return Err(Refusal::PresenceConnectionBudget);
        }
        w.total += 1;
        *w.by_address.entry(source.address).or_insert(0) += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(last: u8) -> Source {
        Source::new(Some(AddressKey::of(std::net::IpAddr::from([
            192, 0, 2, last,
        ]))))
    }

    #[test]
    fn a_connection_and_an_address_each_have_a_budget() {
        let b = Budgets::new(2, 3, 100);
        let (mut one, mut two) = (at(1), at(1));
        assert_eq!(b.admit(&mut one), Ok(()));
        assert_eq!(b.admit(&mut one), Ok(()));
        assert_eq!(b.admit(&mut one), Err(Refusal::PresenceConnectionBudget));
        // Another connection of the same address has its own two, and the address three.
        assert_eq!(b.admit(&mut two), Ok(()));
        assert_eq!(b.admit(&mut two), Err(Refusal::PresenceAddressBudget));
        assert_eq!(b.admit(&mut at(2)), Ok(()));
    }

    #[test]
    fn past_the_total_only_the_heaviest_addresses_are_refused() {
        let b = Budgets::new(1000, 1000, 10);
        let mut flood = at(1);
        for _ in 0..10 {
            b.admit(&mut flood).unwrap();
        }
        // The total is spent, all of it by one address: it is refused, a bystander is not.
        assert_eq!(b.admit(&mut flood), Err(Refusal::PresenceSidecarBudget));
        let mut bystander = at(2);
        assert_eq!(b.admit(&mut bystander), Ok(()));
        // Two addresses now: the fair share is 5; the bystander is under it.
        for _ in 0..4 {
            assert_eq!(b.admit(&mut bystander), Ok(()));
        }
        assert_eq!(b.admit(&mut bystander), Err(Refusal::PresenceSidecarBudget));
    }

    #[test]
    fn a_backend_has_no_address_budget_and_past_the_total_one_fair_share() {
        let b = Budgets::new(1000, 2, 10);
        let (mut one, mut two) = (Source::new(None), Source::new(None));
        // Past an address's 2: no address counts a backend's connections.
        for _ in 0..3 {
            assert_eq!(b.admit(&mut one), Ok(()));
        }
        for _ in 0..7 {
            assert_eq!(b.admit(&mut two), Ok(()));
        }
        // The total spent by the backends: they are the heaviest source, a bystander is not.
        assert_eq!(b.admit(&mut one), Err(Refusal::PresenceSidecarBudget));
        assert_eq!(b.admit(&mut at(2)), Ok(()));
    }
}
