//! The shared segment that holds the queue: its allocation at postmaster start, its lock,
//! the condition variables readers sleep on (one per consumer slot: who is woken is
//! `wake.rs`), and the statistics counters. The queue's design is explained in `queue.rs`.

use crate::gucs;
use crate::queue::{QueueCore, Ring};
use pgrx::pg_sys;
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicU8};

const TRANCHE: &CStr = c"pg_realtime";
const SEGMENT: &CStr = c"pg_realtime queue";

/// Monotonic counters shown by `realtime.stats()`; updated without the lock.
#[repr(C)]
#[derive(Default)]
pub struct Counters {
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
    pub transactions: AtomicU64,
    pub aborted_after_reserve: AtomicU64,
    pub oversize_rejections: AtomicU64,
    pub queue_full_errors: AtomicU64,
    /// Messages dropped (`dropped.rs`), by reason: a NULL, empty or too long topic or event,
    /// or a payload that is not an object; over `realtime.max_message_size`; a transaction
    /// whose messages did not fit the queue.
    pub dropped_invalid: AtomicU64,
    pub dropped_too_large: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    /// Refused by the INSERT policies of `realtime.messages` (`send_policy.rs`).
    pub dropped_unauthorized: AtomicU64,
}

/// The segment's header. Every backend maps it at the same place; Rust sees it only through
/// `&QueueShared`, so what changes after start-up sits in `UnsafeCell`s or atomics.
#[repr(C)]
pub struct QueueShared {
    /// Set once at start-up.
    lock: *mut pg_sys::LWLock,
    /// Postmaster start time of this queue's incarnation (TimestampTz). Set once.
    pub epoch: i64,
    /// Set once.
    pub capacity: u64,
    /// Set once.
    pub nslots: u32,
    /// Read under `lock` held shared or exclusive; written only under it held exclusive
    /// (`Guard::core`, `ExclusiveGuard::core`).
    core: UnsafeCell<QueueCore>,
    /// Atomics, no lock.
    pub counters: Counters,
    /// When a presence reap was last let through in each database (`presence.rs`).
    pub presence_reaps: [ReapStamp; REAP_STAMPS],
}

/// Databases whose presence reaps are spaced (`realtime.presence_reap_due`); in a further
/// one every reap goes ahead, as before there was spacing.
pub const REAP_STAMPS: usize = 16;

/// One database's last presence reap. Atomics, no lock: `db` goes from 0 to a database's
/// oid once (compare and swap) and stays; `at` is only compared and swapped.
#[repr(C)]
pub struct ReapStamp {
    pub db: AtomicU32,
    /// TimestampTz; 0 before the first.
    pub at: AtomicI64,
}

/// Longest consumer name.
pub const NAME_MAX: usize = 63;

/// One named consumer's slot (`consumer.rs` is its API), `realtime.max_consumers` of them
/// after the header. Every field is atomic, so reading one never tears; the lock rule of
/// each says when a value may change and what a reader can rely on.
#[repr(C)]
pub struct ConsumerSlot {
    /// Changed only under the exclusive lock (create, drop): holding the lock, shared or
    /// exclusive, a reader sees a stable set of slots.
    in_use: AtomicBool,
    /// Changed only under the exclusive lock, with `in_use`.
    name_len: AtomicU64,
    /// Changed only under the exclusive lock, with `in_use`.
    name: [AtomicU8; NAME_MAX],
    /// Bumped under the exclusive lock whenever the slot is taken or freed, so that a
    /// reference found earlier can tell, under the lock, that it still names the same
    /// consumer (`confirm_if_current`).
    generation: AtomicU64,
    /// The confirmed position: set at create (exclusive lock); afterwards only raised, with
    /// `fetch_max`, by the slot's reader or by `confirm_if_current` under the lock.
    pub confirmed: AtomicU64,
    /// Where the last read stopped (sequence read through, ring offset): written by the
    /// slot's one reader (the backend in `pid`), a hint that `locate` checks before use.
    pub hint_seq: AtomicU64,
    pub hint_off: AtomicU64,
    /// Written by the slot's one reader; for statistics.
    pub last_read: AtomicU64,
    /// The backend reading the slot (0: none); claimed under the exclusive lock, cleared by
    /// that backend at exit.
    pub pid: AtomicI32,
    /// Statistics, written by the slot's reader; reset at create.
    pub gaps: AtomicU64,
    pub lost: AtomicU64,
    pub lost_through: AtomicU64,
    pub delivered: AtomicU64,
}

impl ConsumerSlot {
    pub fn in_use(&self) -> bool {
        self.in_use.load(Relaxed)
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    pub fn name(&self) -> String {
        let n = self.name_len.load(Relaxed) as usize;
        let bytes: Vec<u8> = self.name[..n].iter().map(|c| c.load(Relaxed)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Takes a free slot for `name`, positioned at `position` (ring offset `offset`).
    /// Lock: exclusive.
    pub fn occupy(&self, name: &str, position: u64, offset: u64) {
        for (cell, b) in self.name.iter().zip(name.bytes()) {
            cell.store(b, Relaxed);
        }
        self.name_len.store(name.len() as u64, Relaxed);
        for c in [&self.gaps, &self.lost, &self.delivered] {
            c.store(0, Relaxed);
        }
        for p in [
            &self.confirmed,
            &self.last_read,
            &self.lost_through,
            &self.hint_seq,
        ] {
            p.store(position, Relaxed);
        }
        self.hint_off.store(offset, Relaxed);
        self.pid.store(0, Relaxed);
        self.generation.fetch_add(1, Relaxed);
        self.in_use.store(true, Relaxed);
    }

    /// Frees the slot. Lock: exclusive.
    pub fn release(&self) {
        self.in_use.store(false, Relaxed);
        self.generation.fetch_add(1, Relaxed);
    }

    /// Raises the confirmed position to `seq` if the slot still holds the consumer it held
    /// at `generation`; false (and nothing written) if it was dropped or taken again since.
    /// Lock: shared (create and drop, which change the generation, need it exclusive).
    pub fn confirm_if_current(&self, generation: u64, seq: u64) -> bool {
        if !self.in_use() || self.generation() != generation {
            return false;
        }
        self.confirmed.fetch_max(seq, Relaxed);
        true
    }
}

static mut SHARED: *mut QueueShared = std::ptr::null_mut();
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

fn header_size() -> usize {
    // Keep slots and ring 64-byte aligned.
    std::mem::size_of::<QueueShared>().next_multiple_of(64)
}

fn slots_size(nslots: u32) -> usize {
    (std::mem::size_of::<ConsumerSlot>() * nslots as usize).next_multiple_of(64)
}

/// The consumers' interest tables (`interest.rs`), one per slot, after the slots.
fn interests_size(nslots: u32) -> usize {
    crate::interest_table::table_size() * nslots as usize
}

/// The slots' condition variables (`wake.rs`), one per slot, after the interest tables.
/// Postgres's own synchronisation (`ConditionVariable*` functions): no lock of ours needed.
fn slot_cvs_size(nslots: u32) -> usize {
    (std::mem::size_of::<pg_sys::ConditionVariable>() * nslots as usize).next_multiple_of(64)
}

fn slot_cvs_offset(nslots: u32) -> usize {
    header_size() + slots_size(nslots) + interests_size(nslots)
}

/// Where the ring starts: after the header, the slots, their interest tables and their
/// condition variables.
fn ring_offset(nslots: u32) -> usize {
    slot_cvs_offset(nslots) + slot_cvs_size(nslots)
}

fn segment_size() -> usize {
    ring_offset(gucs::max_consumers()) + gucs::queue_size_bytes() as usize
}

/// Installs the shared memory hooks; called from `_PG_init` in the postmaster.
pub fn install_hooks() {
    unsafe {
        PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request_hook);
        PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup_hook);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_hook() {
    unsafe {
        if let Some(prev) = PREV_REQUEST_HOOK {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(segment_size());
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup_hook() {
    unsafe {
        if let Some(prev) = PREV_STARTUP_HOOK {
            prev();
        }
        // AddinShmemInitLock is a macro in C: slot 21 of the main LWLock array.
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let size = segment_size();
        let p = pg_sys::ShmemInitStruct(SEGMENT.as_ptr(), size, &mut found) as *mut QueueShared;
        if !found {
            // Initialise in place: the segment is far too large to build on the stack.
            // All-zero slots are free and all-zero interest tables unfiltered.
            std::ptr::write_bytes(p as *mut u8, 0, ring_offset(gucs::max_consumers()));
            (*p).lock = &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
            // Zero is not an empty wait list (its ends are INVALID_PROC_NUMBER): each
            // variable is initialised.
            let cvs = (p as *mut u8).add(slot_cvs_offset(gucs::max_consumers()))
                as *mut pg_sys::ConditionVariable;
            for i in 0..gucs::max_consumers() as usize {
                pg_sys::ConditionVariableInit(cvs.add(i));
            }
            (*p).epoch = pg_sys::GetCurrentTimestamp();
            (*p).capacity = gucs::queue_size_bytes();
            (*p).nslots = gucs::max_consumers();
            std::ptr::write(&raw mut (*p).core, UnsafeCell::new(QueueCore::default()));
            std::ptr::write(&raw mut (*p).counters, Counters::default());
            // Touch the whole ring now, once, in the postmaster. The kernel hands out shared
            // pages on first touch and zeroes each one then; untouched, the ring's first lap
            // made committing writers pay that: a page fault every few messages, about 2 µs
            // per transaction in the trigger profile (`pgbench/profile.py trigger
            // --callgraph`). Each backend still maps a page on its own first touch, which
            // costs far less than zeroing it.
            std::ptr::write_bytes(
                (p as *mut u8).add(ring_offset(gucs::max_consumers())),
                0,
                gucs::queue_size_bytes() as usize,
            );
        }
        pg_sys::LWLockRelease(init_lock);
        SHARED = p;
    }
}

/// The queue's shared state. Only valid in a server that preloaded the extension, which
/// `_PG_init` guarantees before any SQL function can run.
pub fn queue() -> &'static QueueShared {
    unsafe {
        let p = SHARED;
        assert!(!p.is_null(), "pg_realtime shared memory is not initialised");
        &*p
    }
}

/// A held queue lock; released on drop (also during unwinding, though Postgres would
/// release it on abort anyway).
pub struct Guard<'a> {
    q: &'a QueueShared,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        unsafe { pg_sys::LWLockRelease(self.q.lock) }
    }
}

impl<'a> Guard<'a> {
    pub fn core(&self) -> &QueueCore {
        // SAFETY: the lock is held (shared or exclusive), so no one writes meanwhile.
        unsafe { &*self.q.core.get() }
    }
}

/// An exclusively held queue lock: gives mutable access to the positions.
pub struct ExclusiveGuard<'a> {
    inner: Guard<'a>,
}

// Holding it is holding the queue lock exclusively, which the interest tables' changes ask.
impl crate::interest_table::ExclusiveLock for ExclusiveGuard<'_> {}

impl<'a> ExclusiveGuard<'a> {
    pub fn core(&mut self) -> &mut QueueCore {
        // SAFETY: the lock is held exclusively and this guard is borrowed mutably, so this
        // is the only reference to the positions.
        unsafe { &mut *self.inner.q.core.get() }
    }
}

impl QueueShared {
    pub fn shared(&self) -> Guard<'_> {
        unsafe { pg_sys::LWLockAcquire(self.lock, pg_sys::LWLockMode::LW_SHARED) };
        Guard { q: self }
    }

    pub fn exclusive(&self) -> ExclusiveGuard<'_> {
        unsafe { pg_sys::LWLockAcquire(self.lock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
        ExclusiveGuard {
            inner: Guard { q: self },
        }
    }

    fn base(&self) -> *mut u8 {
        self as *const QueueShared as *mut u8
    }

    pub fn ring(&self) -> Ring {
        unsafe { Ring::new(self.base().add(ring_offset(self.nslots)), self.capacity) }
    }

    pub fn slots(&self) -> &[ConsumerSlot] {
        unsafe {
            std::slice::from_raw_parts(
                self.base().add(header_size()) as *const ConsumerSlot,
                self.nslots as usize,
            )
        }
    }

    /// The interest table of slot `i` (`interest.rs` has its lock rules).
    pub fn interest(&self, i: usize) -> crate::interest_table::Interest<'_> {
        assert!(i < self.nslots as usize);
        let table = crate::interest_table::table_size();
        // SAFETY: the tables were zeroed at start-up and live as long as the segment.
        unsafe {
            crate::interest_table::Interest::at(
                self.base()
                    .add(header_size() + slots_size(self.nslots) + i * table),
            )
        }
    }

    /// The interest table of `slot`, one of `slots()`.
    pub fn interest_of(&self, slot: &ConsumerSlot) -> crate::interest_table::Interest<'_> {
        self.interest(self.slot_index(slot))
    }

    /// The condition variable slot `i`'s drain sleeps on (`wake.rs` says who broadcasts it).
    pub fn slot_cv(&self, i: usize) -> *mut pg_sys::ConditionVariable {
        assert!(i < self.nslots as usize);
        // SAFETY: initialised at start-up, inside the segment, which lives as long as the
        // server; Postgres synchronises every use of it.
        unsafe {
            (self.base().add(slot_cvs_offset(self.nslots)) as *mut pg_sys::ConditionVariable).add(i)
        }
    }

    /// The index of `slot`, one of `slots()`.
    pub fn slot_index(&self, slot: &ConsumerSlot) -> usize {
        let first = self.slots().as_ptr();
        // SAFETY: `slot` is an element of `slots()` (its callers found it there).
        unsafe { (slot as *const ConsumerSlot).offset_from(first) as usize }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_slot() -> Box<ConsumerSlot> {
        // SAFETY: every field is an atomic, for which all-zero bytes are a valid value, as
        // in the zeroed shared segment.
        Box::new(unsafe { std::mem::zeroed() })
    }

    /// Fixed bug: `confirm()` looked the slot up, released the lock, then wrote the
    /// position; a drop and re-create in between moved another consumer's position.
    #[test]
    fn confirm_after_a_drop_and_recreate_does_not_move_the_new_consumer() {
        let slot = free_slot();
        slot.occupy("first", 10, 100);
        let seen = slot.generation();
        // Meanwhile another session drops "first" and the slot is taken by "second".
        slot.release();
        slot.occupy("second", 20, 200);
        assert!(!slot.confirm_if_current(seen, 25));
        assert_eq!(
            slot.confirmed.load(Relaxed),
            20,
            "second's position untouched"
        );
        assert_eq!(slot.name(), "second");
        // A reference taken now confirms, and never backwards.
        let now = slot.generation();
        assert!(slot.confirm_if_current(now, 25));
        assert!(slot.confirm_if_current(now, 22));
        assert_eq!(slot.confirmed.load(Relaxed), 25);
        slot.release();
        assert!(!slot.confirm_if_current(now, 30), "dropped");
    }

    #[test]
    fn occupy_resets_what_the_previous_consumer_left() {
        let slot = free_slot();
        slot.occupy("a-longer-name", 5, 50);
        slot.gaps.store(3, Relaxed);
        slot.pid.store(42, Relaxed);
        slot.release();
        slot.occupy("b", 7, 70);
        assert_eq!(slot.name(), "b");
        assert_eq!(
            (
                slot.gaps.load(Relaxed),
                slot.pid.load(Relaxed),
                slot.hint_off.load(Relaxed)
            ),
            (0, 0, 70)
        );
        assert!(slot.in_use());
    }
}
