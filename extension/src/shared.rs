//! The shared segment that holds the queue: its allocation at postmaster start, its lock,
//! the condition variable readers sleep on, and the statistics counters. The queue's design
//! is explained in `queue.rs`.

use crate::consumer::ConsumerSlot;
use crate::gucs;
use crate::queue::{QueueCore, Ring};
use pgrx::pg_sys;
use std::ffi::CStr;
use std::sync::atomic::AtomicU64;

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
}

#[repr(C)]
pub struct QueueShared {
    lock: *mut pg_sys::LWLock,
    cv: pg_sys::ConditionVariable,
    /// Postmaster start time of this queue's incarnation (TimestampTz).
    pub epoch: i64,
    pub capacity: u64,
    pub nslots: u32,
    /// Guarded by `lock`.
    core: QueueCore,
    pub counters: Counters,
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

fn segment_size() -> usize {
    header_size() + slots_size(gucs::max_consumers()) + gucs::queue_size_bytes() as usize
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
            std::ptr::write_bytes(
                p as *mut u8,
                0,
                header_size() + slots_size(gucs::max_consumers()),
            );
            (*p).lock = &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
            pg_sys::ConditionVariableInit(&raw mut (*p).cv);
            (*p).epoch = pg_sys::GetCurrentTimestamp();
            (*p).capacity = gucs::queue_size_bytes();
            (*p).nslots = gucs::max_consumers();
            std::ptr::write(&raw mut (*p).core, QueueCore::default());
            std::ptr::write(&raw mut (*p).counters, Counters::default());
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
        &self.q.core
    }
}

/// An exclusively held queue lock: gives mutable access to the positions.
pub struct ExclusiveGuard<'a> {
    inner: Guard<'a>,
}

impl<'a> ExclusiveGuard<'a> {
    pub fn core(&mut self) -> &mut QueueCore {
        unsafe { &mut *(&raw const self.inner.q.core as *mut QueueCore) }
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
        unsafe {
            Ring::new(
                self.base().add(header_size() + slots_size(self.nslots)),
                self.capacity,
            )
        }
    }

    pub fn slots(&self) -> &[ConsumerSlot] {
        unsafe {
            std::slice::from_raw_parts(
                self.base().add(header_size()) as *const ConsumerSlot,
                self.nslots as usize,
            )
        }
    }

    pub fn cv(&self) -> *mut pg_sys::ConditionVariable {
        &raw const self.cv as *mut pg_sys::ConditionVariable
    }

    /// Wakes every reader sleeping in `consumer::drain`.
    pub fn wake_readers(&self) {
        unsafe { pg_sys::ConditionVariableBroadcast(self.cv()) }
    }
}
