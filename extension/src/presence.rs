//! Presence diffs in the queue. Presence state lives in tables (`sql/presence.sql`:
//! members, tombstones, the sidecars' leases); every change to it queues a diff in the same
//! transaction, through `realtime.queue_presence`, so that every sidecar receives the diffs
//! in the queue's one order and only if the change committed. A diff is Phoenix's
//! `presence_diff` payload, `{joins, leaves}`, with the database-made `phx_ref`s; it is
//! drained as a row of kind 'presence' and never delivered as a broadcast.

use crate::message::{FLAG_PRESENCE, FLAG_PRIVATE};
use crate::{payload, xact};
use pgrx::prelude::*;
use std::sync::atomic::Ordering::Relaxed;

/// Queues one presence diff for `topic`. Called by the functions of `sql/presence.sql`.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."queue_presence"(topic text, private boolean, diff text)
RETURNS void VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn queue_presence(topic: &str, private: bool, diff: &str) {
    let flags = FLAG_PRESENCE | if private { FLAG_PRIVATE } else { 0 };
    xact::append(
        crate::dropped::By::Sidecar,
        topic,
        "presence_diff",
        diff.as_bytes(),
        flags,
        payload::new_id(),
        0,
    );
}

/// Whether a server process with this pid runs now: the reaper ends a presence session
/// whose backend is gone (`sql/presence.sql`). It looks in the proc array only, where
/// `pg_stat_activity` would copy every backend's status and query text, and the reaper asks
/// every second from every sidecar. A pid taken again by a new process answers true: such
/// a session ends when its lease runs out instead.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."backend_alive"(pid integer) RETURNS boolean
VOLATILE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn backend_alive(pid: i32) -> bool {
    // SAFETY: BackendPidGetProc takes ProcArrayLock itself and only reads.
    pid != 0 && unsafe { !pgrx::pg_sys::BackendPidGetProc(pid).is_null() }
}

/// Whether this caller's presence reap should go ahead: true for the first caller in this
/// database once `every_ms` has passed since the last one told so, false for the others.
/// Every sidecar's reaper asks each second (`sidecar/src/presence/worker.rs`), and the
/// leases need one reap a second, not one for each sidecar: a reap costs the primary about
/// half a millisecond of CPU with nothing to reap, and grows with the members present.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."presence_reap_due"(every_ms integer) RETURNS boolean
VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn presence_reap_due(every_ms: i32) -> bool {
    if !(0..=3_600_000).contains(&every_ms) {
        crate::errors::invalid("every_ms must be between 0 and 3600000", None);
    }
    let db = unsafe { pgrx::pg_sys::MyDatabaseId }.to_u32();
    let stamps = &crate::shared::queue().presence_reaps;
    // This database's stamp, taken from the free ones the first time.
    let Some(stamp) = stamps.iter().find(|s| {
        s.db.load(Relaxed) == db
            || s.db.compare_exchange(0, db, Relaxed, Relaxed).is_ok()
            || s.db.load(Relaxed) == db
    }) else {
        return true;
    };
    let now = unsafe { pgrx::pg_sys::GetCurrentTimestamp() };
    let mut last = stamp.at.load(Relaxed);
    loop {
        // A clock set back counts as due: the stamp is then in the future.
        if (last..last + every_ms as i64 * 1000).contains(&now) {
            return false;
        }
        match stamp.at.compare_exchange_weak(last, now, Relaxed, Relaxed) {
            Ok(_) => return true,
            Err(seen) => last = seen,
        }
    }
}
