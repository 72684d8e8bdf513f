//! Messages held until the synchronous standbys have their transactions.
//!
//! # Why
//!
//! With synchronous replication a commit waits for the standbys (`SyncRepWaitForLSN`, inside
//! `RecordTransactionCommit`) before its commit callback publishes its messages, so a
//! message is normally readable only once a standby that could be promoted has its
//! transaction. Not always: a commit whose wait is cancelled (a query cancel) or ended (a
//! terminate, which a fast shutdown and a failover manager's demotion send to every
//! backend) finishes locally, with a WARNING, and its callback publishes at once; so does
//! a transaction that asked for less (`synchronous_commit = local` or `off`). An isolated old
//! primary being demoted published exactly such commits, and a sidecar still draining it
//! delivered messages whose transactions the new primary never had.
//!
//! # The rule
//!
//! A committed record carries its transaction's commit LSN (the end of its commit record,
//! `XactLastCommitEnd`; 0 for a transaction that wrote nothing and has no commit record) in
//! its sequence field until it is published (`QueueCore::resolve`). While synchronous
//! standbys are defined, publishing (`QueueCore::publish`) stops at the first record whose
//! commit LSN is past what they have flushed (`WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH]`, which
//! only grows: an unlocked read can only be older, which holds longer, never less); the
//! records after it wait behind it, as they wait behind a PENDING one, so queue order
//! stays commit order. Without synchronous standbys nothing is held: asynchronous
//! replication's trade-off is the operator's.
//!
//! Who publishes a held record once the standbys have it: the next commit's callback, or a
//! drain that found nothing to read and sees a held record (`release`): it polls every
//! `POLL` while one is held, since no callback tells it that a standby's flush moved. A
//! commit that ends held wakes every drain, so that those asleep start polling.

use crate::queue::Ring;
use crate::shared::QueueShared;
use crate::wake;
use pgrx::pg_sys;
use std::time::Duration;

/// How often a waiting drain looks again while a record is held for the standbys.
pub const POLL: Duration = Duration::from_millis(10);

/// The commit LSN up to which records may be published: None when no synchronous standby
/// is defined (nothing is held), else what the synchronous standbys have flushed.
pub fn limit() -> Option<u64> {
    // SAFETY: WalSndCtl is set up in shared memory at start-up in every server; its fields
    // are read without SyncRepLock, as values that only grow (lsn) or change at a reload
    // (the status), where an older value only errs towards holding.
    unsafe {
        let ctl = pg_sys::WalSndCtl;
        if ctl.is_null() {
            return None;
        }
        let status = std::ptr::read_volatile(&raw const (*ctl).sync_standbys_status) as u32;
        let defined = if status & pg_sys::SYNC_STANDBY_INIT != 0 {
            status & pg_sys::SYNC_STANDBY_DEFINED != 0
        } else {
            // Before the checkpointer first set it, the setting itself says (as
            // SyncRepWaitForLSN reads it then).
            let names = pg_sys::SyncRepStandbyNames;
            !names.is_null() && *names != 0
        };
        defined.then(|| {
            std::ptr::read_volatile(&raw const (*ctl).lsn[pg_sys::SYNC_REP_WAIT_FLUSH as usize])
        })
    }
}

/// The current transaction's commit LSN, in its commit callback: 0 when it has no commit
/// record (it was never given a transaction id: it wrote nothing).
pub fn commit_lsn() -> u64 {
    // SAFETY: plain reads of this backend's transaction state, still set in the commit
    // callbacks (CommitTransaction clears the id after them).
    unsafe {
        if pg_sys::GetTopTransactionIdIfAny() == pg_sys::InvalidTransactionId {
            0
        } else {
            pg_sys::XactLastCommitEnd
        }
    }
}

/// What a drain that found a record held (commit LSN `lsn`) and nothing to read does next.
pub enum Held {
    /// Held records were published now: read again.
    Released,
    /// A record is still held: look again after `POLL`.
    Waiting,
}

/// Publishes the held records the standbys now have (or all of them, when synchronous
/// standbys are no longer defined), waking the drains with work from them.
pub fn release(q: &QueueShared, ring: &Ring, lsn: u64) -> Held {
    if limit().is_some_and(|l| lsn > l) {
        return Held::Waiting;
    }
    let (published, reached, still_held) = {
        let mut guard = q.exclusive();
        let core = guard.core();
        let published = core.publish(ring, limit());
        (published, core.published, core.held(ring).is_some())
    };
    if published > 0 {
        wake::after_publish(q, reached, wake::Published::Others);
        return Held::Released;
    }
    // Another backend published them meanwhile, or the first is still held.
    if still_held {
        Held::Waiting
    } else {
        Held::Released
    }
}
