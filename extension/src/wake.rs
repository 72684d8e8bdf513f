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
//!   (`SCAN_MAX_RECORDS`).
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
