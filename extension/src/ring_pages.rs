//! Mapping the queue's ring into this backend ahead of its writes.
//!
//! The ring's pages exist from the start (the postmaster touches them, `shared.rs`), but a
//! process maps a shared page into its own page table only when it first touches it, and
//! `fork` does not copy those mappings. Every writer copies its records at the shared
//! head, so a busy backend first-touches nearly every page the head passes: a page fault
//! for about every message, taken while the queue lock is held. Measured with
//! `pgbench/profile.py trigger --callgraph`: about 3 µs per transaction at 8 clients in the
//! ring's first lap, against a ring small enough to be mapped by everyone already.
//!
//! So a backend that keeps pace with the head asks the kernel, after its reservation and
//! outside the lock, to map the 2 MiB chunk it wrote in and the next one, in one call each
//! (`MADV_POPULATE_WRITE`, Linux 5.14), once per chunk for the backend's life. A backend
//! that writes rarely (the head has moved more than a chunk since its last write) maps
//! nothing: a few faults cost it less than mapping chunks it will not write in again.

use std::cell::RefCell;

const CHUNK: u64 = 2 << 20;

#[derive(Default)]
struct Mapped {
    /// One bit per ring chunk: mapped into this backend already.
    chunks: Vec<u64>,
    /// End of this backend's last reservation (a ring offset), to tell whether it keeps pace.
    last_end: Option<u64>,
    /// The kernel refused once (older than 5.14): stop asking.
    unsupported: bool,
}

thread_local! {
    static MAPPED: RefCell<Mapped> = RefCell::new(Mapped::default());
}

/// Called after reserving `[start, start + len)` of the ring whose first byte is at `base`
/// and whose capacity is `cap`.
pub fn map_ahead(base: *mut u8, cap: u64, start: u64, len: u64) {
    MAPPED.with_borrow_mut(|m| {
        let end = start + len;
        let keeping_pace = m.last_end.is_some_and(|last| end - last <= CHUNK);
        m.last_end = Some(end);
        if !keeping_pace || m.unsupported {
            return;
        }
        let nchunks = cap.div_ceil(CHUNK);
        if m.chunks.is_empty() {
            m.chunks = vec![0; nchunks.div_ceil(64) as usize];
        }
        let here = (end % cap) / CHUNK;
        for k in [here, (here + 1) % nchunks] {
            let (word, bit) = ((k / 64) as usize, 1u64 << (k % 64));
            if m.chunks[word] & bit != 0 {
                continue;
            }
            m.chunks[word] |= bit;
            let from = k * CHUNK;
            let to = ((k + 1) * CHUNK).min(cap);
            if !populate(unsafe { base.add(from as usize) }, (to - from) as usize) {
                m.unsupported = true;
                return;
            }
        }
    });
}

/// Maps `[at, at + len)` writable into this process (page-aligned outward).
fn populate(at: *mut u8, len: usize) -> bool {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let page = 4096usize;
    let from = at as usize & !(page - 1);
    let to = (at as usize + len).next_multiple_of(page);
    // SAFETY: the range lies in the shared segment, mapped read-write for the process's
    // life; populating changes no contents.
    let rc = unsafe { libc::madvise(from as *mut libc::c_void, to - from, MADV_POPULATE_WRITE) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
}
