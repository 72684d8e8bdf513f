//! Who a commit wakes.
//!
//! # Why
//!
//! A drain that found nothing sleeps until a publish makes something readable
//! (`consumer::wait`). With one condition variable for every slot, each commit woke every
//! waiting drain, and a drain whose consumer listens to other topics (`interest.rs`) took the
//! queue lock, read the new records, skipped them all and slept again. With N sidecars
//! routed by topic the primary paid N wake-ups per message where one did the work, so its
//! CPU per message grew with the sidecars (8% to 17% of a core from 1 to 8 routed sidecar
//! processes at one message rate, `pgbench/routed.py` in `pgbench/results/2026-11-24.md`).
//!
//! # The rule
//!
//! Each consumer slot has a condition variable of its own (`QueueShared::slot_cv`), and only
//! its drain sleeps on it. After a publish (`xact.rs`, in the commit or abort callback, after
//! the queue lock is released) the publisher broadcasts the variables of the slots in use
//! that have a reason to read:
//!
//! * when what it published is exactly its own transaction's records: a slot that is
//!   unfiltered, or whose interest listens to one of those records (`Interest::listens_to`,
//!   read without the lock: a table being changed answers "wanted", so a race errs towards a
//!   wake-up), or whose reader is more than a quarter of the ring behind (so that a consumer
//!   that wants nothing of the traffic still reads through it, and moves its position on,
//!   long before the ring evicts what it has not read: it then sees no gap for messages it
//!   never wanted);
//! * otherwise every slot in use: the publish also numbered other transactions' records,
//!   which waited behind this one (their own callbacks published nothing and woke nobody),
//!   or the transaction has more records than are worth looking at per slot
//!   (`SCAN_MAX_RECORDS`);
//! * every slot in use, too, when the publish stopped at a record held for the synchronous
//!   standbys (`sync_hold.rs`): only a drain that looks publishes it (`whom`).
//!
//! # Why no wake-up is lost
//!
//! A drain registers on its slot's variable (`ConditionVariablePrepareToSleep`) before the
//! read that decides to sleep, and reads under the queue lock. A publish that came before
//! that read is seen by it. One that came after it is followed by its publisher's check,
//! which then sees the slot in use and every key listened to before the read (keys change
//! under the exclusive lock, which the publish took after them), and broadcasts the variable
//! the drain is registered on. A key listened to later covers only messages published after
//! `listen` returned (the contract in `interest.rs`), whose publishers see it.

use crate::message::MessageView;
use crate::shared::QueueShared;
use pgrx::pg_sys;
use std::sync::atomic::Ordering::Relaxed;

/// A transaction with more records than this wakes every slot rather than have each
/// slot's interest probed for each record (the probes would cost more than the wake-ups).
const SCAN_MAX_RECORDS: usize = 64;

/// Whom a commit or abort callback wakes after its publish.
#[derive(Debug, PartialEq, Eq)]
pub enum Whom {
    Nobody,
    /// The slots with a reason to read the transaction's own records.
    ReadersOfOwn,
    /// Every slot in use.
    Every,
}

/// Whom to wake after a publish that numbered `published` messages, `own` of them this
/// transaction's, and stopped at a record `held` for the synchronous standbys or not.
///
/// A publish that ends held wakes every drain, whatever it numbered: a held record is
/// published only by a drain that looks (`sync_hold::release`), and a drain asleep would not
/// look before its timeout. Its own transaction may be one nobody listens to, with the
/// held record, another's, wanted by every slot.
pub fn whom(published: u64, own: u64, held: bool) -> Whom {
    if held {
        Whom::Every
    } else if published == 0 {
        Whom::Nobody
    } else if published == own {
        Whom::ReadersOfOwn
    } else {
        Whom::Every
    }
}

/// What a publish made readable, as far as waking goes.
pub enum Published<'a> {
    /// Exactly the committing transaction's own records.
    Own(&'a [MessageView<'a>]),
    /// Other transactions' records too.
    Others,
}

/// Wakes the drains with a reason to read what was just published; `published_off` is the
/// ring offset the publish reached. No lock is held, and none is taken.
pub fn after_publish(q: &QueueShared, published_off: u64, what: Published) {
    let own = match what {
        Published::Own(records) if records.len() <= SCAN_MAX_RECORDS => Some(records),
        _ => None,
    };
    let far_behind = q.capacity / 4;
    for (i, slot) in q.slots().iter().enumerate() {
        if !slot.in_use() {
            continue;
        }
        let wake = own.is_none_or(|records| {
            let interest = q.interest(i);
            !interest.filtering()
                || published_off.saturating_sub(slot.hint_off.load(Relaxed)) > far_behind
                || records.iter().any(|m| interest.listens_to(m))
        });
        if wake {
            // SAFETY: the variable was initialised at start-up and lives as long as the
            // segment; broadcasting one nobody sleeps on only takes its spinlock.
            unsafe { pg_sys::ConditionVariableBroadcast(q.slot_cv(i)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_that_ends_held_wakes_every_slot() {
        // Its own records numbered, then stopped at another transaction's, held for the
        // standbys: only a drain that looks releases it.
        assert_eq!(whom(2, 2, true), Whom::Every);
        assert_eq!(whom(0, 1, true), Whom::Every);
    }

    #[test]
    fn a_publish_wakes_the_readers_of_its_own_records_or_everyone() {
        assert_eq!(whom(0, 1, false), Whom::Nobody);
        assert_eq!(whom(3, 3, false), Whom::ReadersOfOwn);
        assert_eq!(whom(5, 3, false), Whom::Every);
        // An abort numbers none of its own: what it published was others'.
        assert_eq!(whom(2, 0, false), Whom::Every);
    }
}
