//! The shared-memory message queue.
//!
//! # What it is for
//!
//! Every message a transaction sends (`realtime.send`, `realtime.send_binary`,
//! `realtime.broadcast_changes`, `realtime.broadcast_trigger`) must reach the sidecars if and
//! only if the transaction commits, after its writes are visible, contiguously, in commit
//! order, numbered by a gapless 64-bit sequence; and a consumer that is slow or absent must
//! never block or fail a writer. This file is the one place where messages from all backends
//! meet and get their order.
//!
//! # Layout
//!
//! One shared segment, allocated at postmaster start (the extension must be preloaded):
//! a `QueueShared` header (positions, counters, the lock, a condition variable), then
//! `realtime.max_consumers` consumer slots (`ConsumerSlot` in `shared.rs`, each field with its
//! lock rule; their API in `consumer.rs`), then a byte ring of
//! `realtime.queue_size`. Records (`message.rs`) are stored back to back and may wrap around
//! the ring's end; every position is a monotonic 64-bit byte offset, the ring index being the
//! offset modulo the capacity, so offsets never repeat and comparing them is always meaningful.
//!
//! ```text
//!   tail            published                       head
//!    |  retained,     |  reserved by transactions that |  free ...
//!    |  numbered      |  are committing (PENDING), or  |
//!    |  (readable)    |  resolved but behind a PENDING |
//! ```
//!
//! * `[tail, published)`: records whose transactions have ended; committed ones carry a
//!   sequence number and are what readers see. `tail_seq` is the sequence of the oldest
//!   retained message, `next_seq` the one the next published message gets; every sequence in
//!   `[tail_seq, next_seq)` is retained.
//! * `[published, head)`: space reserved at pre-commit. A record here is PENDING until its
//!   transaction's commit or abort callback marks it.
//!
//! # How a message travels, and why this order is commit order
//!
//! 1. A send appends an encoded PENDING record to a backend-local buffer (`xact.rs`), tagged
//!    with the subtransaction that made it; a subtransaction abort truncates the buffer back
//!    to what its parent had, so nothing a rolled-back savepoint sent survives.
//! 2. At `XACT_EVENT_PRE_COMMIT` the backend takes the lock exclusively, reserves space at
//!    `head` and copies its whole buffer there in one piece. That is what makes one
//!    transaction's messages contiguous and in call order. An error is still allowed here
//!    (the transaction then aborts cleanly), so a full queue is reported at this point.
//! 3. After the commit record is written and the transaction has left the proc array
//!    (`ProcArrayEndTransaction`: its writes are visible to every new snapshot),
//!    `XACT_EVENT_COMMIT` marks the records COMMITTED with the commit timestamp and
//!    *publishes*: starting at `published`, it numbers consecutive COMMITTED records and
//!    skips ABORTED ones, stopping at the first PENDING record. Then it wakes the readers
//!    that have a reason to read what it published (`wake.rs`).
//!    An abort after step 2 marks the records ABORTED and publishes likewise.
//!
//! The order of the queue is the order of step 2. If transaction B could see A's writes,
//! A had finished committing before B took its snapshot, so A passed step 2 before B did:
//! causally ordered transactions are queued in order, and a record stays unpublished while
//! any earlier one is still PENDING, so nobody sees B before A. This is the property
//! `async.c` gets for NOTIFY by holding a heavyweight lock from pre-commit to the end of
//! commit, which serializes every notifying commit (including its WAL flush). Here the lock
//! is held only to copy bytes at pre-commit and to flip states at commit, never across the
//! commit record or its flush, so broadcasting writers commit in parallel.
//!
//! With synchronous standbys, step 3 also stops at a committed record whose transaction the
//! standbys have not flushed (a commit whose wait for them was cancelled or ended, or one
//! that did not ask to wait): it and everything after it wait until they have, so that no
//! reader gets a message a promoted standby would lack (`sync_hold.rs`).
//!
//! Sequence numbers are assigned at publish time, under the lock, in queue order; aborted
//! records get none, so the sequence is gapless. Visibility follows from step 3: a record is
//! readable only after its transaction's commit callback ran, which is after the transaction
//! became visible, so a consumer that receives a message and then queries sees its writes.
//!
//! # Overflow: writers never wait for readers
//!
//! Reservation evicts from `tail` until the new records fit, whatever the consumers have
//! read. Consumers learn about it when they next read: a position older than `tail_seq` is
//! answered with an explicit gap (first and last lost sequence), counted per consumer and
//! in `realtime.stats()`. Only PENDING records cannot be evicted (their transactions are
//! committing right now); if the ring holds nothing else, the reserving transaction fails at
//! pre-commit with a clear error instead of losing messages silently. A single transaction's
//! messages must fit in the ring; `xact.rs` refuses a send that would make them exceed it.
//!
//! # Readers
//!
//! Consumers (the sidecars) read through `consumer.rs`. A read takes the lock shared, finds
//! the first record after the consumer's position (from a per-slot cursor hint, or by a walk
//! from `tail`), copies up to a batch of records out, releases the lock and decodes the copy.
//! Waiting for data uses the slot's own condition variable, which a publisher broadcasts
//! when it made something readable that the slot's consumer listens to (`wake.rs`), with a
//! timeout, honouring query cancel and `statement_timeout`, as `ConditionVariableTimedSleep`
//! does.
//! A consumer that listens to some topics (`interest.rs`) has the rest skipped after the
//! copy, outside the lock, and keeps waiting while all it read was skipped.
//! `history.rs` reads without a slot: the retained messages of a few topics after a
//! position (a client's replay or resume), walking the ring in bounded steps (`walk`) so
//! that writers are never held up for long.
//!
//! # Restart
//!
//! Everything here lives in shared memory. A server restart (or crash restart) starts an
//! empty queue with a new `epoch` and sequence 1; consumers see the epoch change and must
//! tell their subscribers that undelivered messages were lost, as LISTEN/NOTIFY loses them.

use crate::message::{RecordHeader, HEADER_LEN, STATE_ABORTED, STATE_COMMITTED, STATE_PENDING};

/// A ring of bytes addressed by monotonic offsets.
#[derive(Clone, Copy)]
pub struct Ring {
    base: *mut u8,
    cap: u64,
}

impl Ring {
    /// # Safety
    /// `base` must point to `cap` writable bytes that outlive every use of the ring.
    pub unsafe fn new(base: *mut u8, cap: u64) -> Self {
        Ring { base, cap }
    }

    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// The ring's first byte (for mapping its pages, `ring_pages.rs`).
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn write(&self, off: u64, src: &[u8]) {
        let at = (off % self.cap) as usize;
        let first = src.len().min(self.cap as usize - at);
        // SAFETY: at + first <= cap and src.len() - first <= cap (records never exceed cap).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.base, src.len() - first);
        }
    }

    pub fn read(&self, off: u64, dst: &mut [u8]) {
        let at = (off % self.cap) as usize;
        let first = dst.len().min(self.cap as usize - at);
        // SAFETY: as in write.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(
                self.base,
                dst.as_mut_ptr().add(first),
                dst.len() - first,
            );
        }
    }

    pub fn header(&self, off: u64) -> RecordHeader {
        let mut b = [0u8; HEADER_LEN];
        self.read(off, &mut b);
        RecordHeader::decode(&b)
    }

    fn put_header(&self, off: u64, h: &RecordHeader) {
        self.write(off, &h.encode());
    }
}

/// Why a reservation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum ReserveError {
    /// The records are larger than the whole ring.
    TooLarge { need: u64, capacity: u64 },
    /// Everything that could be evicted was, and the rest is held by committing transactions.
    Full { need: u64, pending: u64 },
}

/// Where a read after a given sequence starts.
#[derive(Debug, PartialEq, Eq)]
pub enum Locate {
    /// The next message is at this offset (or, when it equals `published`, not yet there).
    At(u64),
    /// Messages `first..=last` were evicted before this consumer read them; reading resumes
    /// at `off` (the tail).
    Gap { first: u64, last: u64, off: u64 },
    /// The position is beyond the last published message: it belongs to another epoch.
    Ahead { last_published: u64 },
}

/// What a batch read copied out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub count: u32,
    /// Offset to continue from.
    pub next_off: u64,
    /// Sequence of the last message copied, if any.
    pub last_seq: Option<u64>,
}

/// Queue positions. Every field is guarded by the queue lock.
#[repr(C)]
#[derive(Debug)]
pub struct QueueCore {
    pub head: u64,
    pub published: u64,
    pub tail: u64,
    pub next_seq: u64,
    pub tail_seq: u64,
    pub evicted: u64,
}

impl Default for QueueCore {
    fn default() -> Self {
        QueueCore {
            head: 0,
            published: 0,
            tail: 0,
            next_seq: 1,
            tail_seq: 1,
            evicted: 0,
        }
    }
}

impl QueueCore {
    /// Copies `records` (encoded PENDING records) to the head of the ring, evicting the oldest
    /// resolved records as needed. Returns the offset the records start at. Lock: exclusive.
    pub fn reserve(&mut self, ring: &Ring, records: &[u8]) -> Result<u64, ReserveError> {
        let need = records.len() as u64;
        let cap = ring.capacity();
        if need > cap {
            return Err(ReserveError::TooLarge {
                need,
                capacity: cap,
            });
        }
        while cap - (self.head - self.tail) < need {
            if self.tail == self.published {
                return Err(ReserveError::Full {
                    need,
                    pending: self.head - self.published,
                });
            }
            let h = ring.header(self.tail);
            if h.state == STATE_COMMITTED {
                self.tail_seq = h.seq + 1;
                self.evicted += 1;
            }
            self.tail += h.len as u64;
        }
        let start = self.head;
        ring.write(start, records);
        self.head += need;
        Ok(start)
    }

    /// Marks the records in `[start, start + len)` committed (with `committed_at`) or aborted.
    /// They must have been reserved by the caller and not resolved yet. Lock: exclusive.
    /// A committed record keeps its transaction's `commit_lsn` in its sequence field until it
    /// is published (`sync_hold.rs`).
    pub fn resolve(&mut self, ring: &Ring, start: u64, len: u64, commit: Option<(i64, u64)>) {
        let mut off = start;
        while off < start + len {
            let mut h = ring.header(off);
            debug_assert_eq!(h.state, STATE_PENDING);
            if let Some((committed_at, commit_lsn)) = commit {
                h.state = STATE_COMMITTED;
                h.committed_at = committed_at;
                h.seq = commit_lsn;
            } else {
                h.state = STATE_ABORTED;
            }
            ring.put_header(off, &h);
            off += h.len as u64;
        }
    }

    /// Numbers the resolved records after `published` up to the first PENDING one, or the
    /// first committed one whose commit LSN is past `hold` (what the synchronous standbys
    /// have flushed, `sync_hold::limit`), and makes them readable. Returns how many messages
    /// were published. Lock: exclusive.
    pub fn publish(&mut self, ring: &Ring, hold: Option<u64>) -> u64 {
        let mut n = 0;
        while self.published < self.head {
            let mut h = ring.header(self.published);
            match h.state {
                STATE_PENDING => break,
                STATE_COMMITTED if hold.is_some_and(|limit| h.seq > limit) => break,
                STATE_COMMITTED => {
                    h.seq = self.next_seq;
                    self.next_seq += 1;
                    ring.put_header(self.published, &h);
                    n += 1;
                }
                _ => {}
            }
            self.published += h.len as u64;
        }
        n
    }

    /// The commit LSN of the record that holds publication back for the synchronous
    /// standbys, if one does (`sync_hold.rs`): the record at `published`, committed but not
    /// published. Lock: shared.
    pub fn held(&self, ring: &Ring) -> Option<u64> {
        if self.published == self.head {
            return None;
        }
        let h = ring.header(self.published);
        (h.state == STATE_COMMITTED).then_some(h.seq)
    }

    /// Sequence of the last published message (0 when none ever was).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// When the oldest PENDING record was reserved, if one holds publication back: the record
    /// at `published` is always the first of its transaction. Lock: shared.
    pub fn oldest_pending_since(&self, ring: &Ring) -> Option<i64> {
        (self.published < self.head).then(|| ring.header(self.published).committed_at)
    }

    /// Finds where reading after sequence `after` starts. `hint` is a consumer's remembered
    /// (sequence, offset) pair from its previous read. Lock: shared.
    pub fn locate(&self, ring: &Ring, after: u64, hint: Option<(u64, u64)>) -> Locate {
        let want = after + 1;
        if want > self.next_seq {
            return Locate::Ahead {
                last_published: self.last_seq(),
            };
        }
        if want == self.next_seq {
            return Locate::At(self.published);
        }
        if want < self.tail_seq {
            return Locate::Gap {
                first: want,
                last: self.tail_seq - 1,
                off: self.tail,
            };
        }
        if let Some((hseq, hoff)) = hint {
            if hseq == after && hoff >= self.tail && hoff <= self.published {
                return Locate::At(hoff);
            }
        }
        let mut off = self.tail;
        while off < self.published {
            let h = ring.header(off);
            if h.state == STATE_COMMITTED && h.seq >= want {
                return Locate::At(off);
            }
            off += h.len as u64;
        }
        // Unreachable while the invariants hold: every seq in [tail_seq, next_seq) is retained.
        Locate::At(self.published)
    }

    /// Visits the published COMMITTED records from `off` (a record boundary at or after
    /// `tail`), at most `max_walk` records in all, and returns the offset to continue from.
    /// `visit` gets each record's offset and header; it reads what else it needs from the
    /// ring, and returns false to end the walk after that record (when what it copied is
    /// enough for one hold of the lock). Lock: shared, held for the whole walk, which is why
    /// it is bounded.
    pub fn walk(
        &self,
        ring: &Ring,
        mut off: u64,
        max_walk: usize,
        mut visit: impl FnMut(u64, &RecordHeader) -> bool,
    ) -> u64 {
        let mut walked = 0;
        while off < self.published && walked < max_walk {
            let h = ring.header(off);
            let go_on = h.state != STATE_COMMITTED || visit(off, &h);
            walked += 1;
            off += h.len as u64;
            if !go_on {
                break;
            }
        }
        off
    }

    /// When the oldest retained message was committed (None when nothing is retained).
    /// Lock: shared.
    pub fn oldest_committed_at(&self, ring: &Ring) -> Option<i64> {
        let mut found = None;
        let mut off = self.tail;
        while off < self.published && found.is_none() {
            let h = ring.header(off);
            if h.state == STATE_COMMITTED {
                found = Some(h.committed_at);
            }
            off += h.len as u64;
        }
        found
    }

    /// Copies whole published records starting at `off` into `out`: at most `max_count`
    /// messages and, beyond the first, no more than `max_bytes` in all. Lock: shared.
    pub fn read_batch(
        &self,
        ring: &Ring,
        mut off: u64,
        max_count: u32,
        max_bytes: usize,
        out: &mut Vec<u8>,
    ) -> Batch {
        let mut batch = Batch::default();
        while off < self.published && batch.count < max_count {
            let h = ring.header(off);
            if h.state == STATE_COMMITTED {
                let len = h.len as usize;
                if batch.count > 0 && out.len() + len > max_bytes {
                    break;
                }
                let at = out.len();
                out.resize(at + len, 0);
                ring.read(off, &mut out[at..]);
                batch.count += 1;
                batch.last_seq = Some(h.seq);
            } else {
                debug_assert_eq!(h.state, STATE_ABORTED);
            }
            off += h.len as u64;
        }
        batch.next_off = off;
        batch
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::message::{encode_record, MessageView};

    /// The gap reported (if any) and the (sequence, payload) pairs read.
    type ReadAll = (Option<(u64, u64)>, Vec<(u64, String)>);

    /// A queue over plain memory, for tests of what walks it.
    pub(crate) struct TestRing {
        _mem: Vec<u8>,
        pub(crate) ring: Ring,
        pub(crate) core: QueueCore,
    }

    pub(crate) fn ring(cap: usize) -> TestRing {
        let mut mem = vec![0u8; cap];
        let ring = unsafe { Ring::new(mem.as_mut_ptr(), cap as u64) };
        TestRing {
            _mem: mem,
            ring,
            core: QueueCore::default(),
        }
    }

    fn records(msgs: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in msgs {
            encode_record(&mut out, "t", "e", m.as_bytes(), 0, [0; 16], 0);
        }
        out
    }

    impl TestRing {
        /// Commits one message of topic "t" per item; the last sequence published.
        pub(crate) fn commit(&mut self, msgs: &[&str]) -> Result<u64, ReserveError> {
            let recs = records(msgs);
            let start = self.core.reserve(&self.ring, &recs)?;
            self.core
                .resolve(&self.ring, start, recs.len() as u64, Some((7, 0)));
            Ok(self.core.publish(&self.ring, None))
        }

        fn read_all(&self, after: u64) -> ReadAll {
            let (gap, off) = match self.core.locate(&self.ring, after, None) {
                Locate::At(off) => (None, off),
                Locate::Gap { first, last, off } => (Some((first, last)), off),
                Locate::Ahead { .. } => panic!("ahead"),
            };
            let mut buf = Vec::new();
            let b = self
                .core
                .read_batch(&self.ring, off, u32::MAX, usize::MAX, &mut buf);
            let mut out = Vec::new();
            let mut at = 0;
            for _ in 0..b.count {
                let m = MessageView::parse(&buf[at..]);
                at += m.header.len as usize;
                out.push((m.header.seq, String::from_utf8(m.payload.to_vec()).unwrap()));
            }
            (gap, out)
        }
    }

    #[test]
    fn commits_are_numbered_gaplessly_in_order() {
        let mut r = ring(4096);
        r.commit(&["a", "b"]).unwrap();
        r.commit(&["c"]).unwrap();
        let (gap, msgs) = r.read_all(0);
        assert_eq!(gap, None);
        assert_eq!(
            msgs,
            vec![(1, "a".into()), (2, "b".into()), (3, "c".into())]
        );
        assert_eq!(r.read_all(2).1, vec![(3, "c".into())]);
        assert!(r.read_all(3).1.is_empty());
    }

    #[test]
    fn pending_record_holds_back_later_commits_and_aborts_leave_no_hole() {
        let mut r = ring(4096);
        let a = records(&["a1", "a2"]);
        let b = records(&["b1"]);
        let c = records(&["c1"]);
        let sa = r.core.reserve(&r.ring, &a).unwrap();
        let sb = r.core.reserve(&r.ring, &b).unwrap();
        let sc = r.core.reserve(&r.ring, &c).unwrap();
        // B commits first but reserved after A: nothing is visible while A is pending.
        r.core.resolve(&r.ring, sb, b.len() as u64, Some((1, 0)));
        assert_eq!(r.core.publish(&r.ring, None), 0);
        assert!(r.read_all(0).1.is_empty());
        // C aborts; A commits: A then B are published, C gets no sequence.
        r.core.resolve(&r.ring, sc, c.len() as u64, None);
        r.core.resolve(&r.ring, sa, a.len() as u64, Some((2, 0)));
        assert_eq!(r.core.publish(&r.ring, None), 3);
        let (_, msgs) = r.read_all(0);
        assert_eq!(
            msgs,
            vec![(1, "a1".into()), (2, "a2".into()), (3, "b1".into())]
        );
        r.commit(&["d"]).unwrap();
        assert_eq!(r.read_all(3).1, vec![(4, "d".into())]);
    }

    /// Issue 42: a commit whose wait for the synchronous standbys was cancelled or ended
    /// published at once, so a drain of an isolated old primary handed out messages the
    /// promoted standby never had. A record past what the standbys flushed now holds back
    /// itself and everything after it.
    #[test]
    fn a_commit_the_standbys_lack_is_held_with_everything_after_it() {
        let mut r = ring(4096);
        let (a, b, c) = (records(&["a"]), records(&["b"]), records(&["c"]));
        let sa = r.core.reserve(&r.ring, &a).unwrap();
        let sb = r.core.reserve(&r.ring, &b).unwrap();
        let sc = r.core.reserve(&r.ring, &c).unwrap();
        // A's commit record ends at 50, B's at 100; C wrote nothing (no commit record).
        r.core.resolve(&r.ring, sa, a.len() as u64, Some((1, 50)));
        r.core.resolve(&r.ring, sb, b.len() as u64, Some((2, 100)));
        r.core.resolve(&r.ring, sc, c.len() as u64, Some((3, 0)));
        // The standbys flushed up to 60: A goes, B is held, and C waits behind it.
        assert_eq!(r.core.publish(&r.ring, Some(60)), 1);
        assert_eq!(r.read_all(0).1, vec![(1, "a".into())]);
        assert_eq!(r.core.held(&r.ring), Some(100));
        assert_eq!(r.core.publish(&r.ring, Some(99)), 0);
        // Once they have B: B then C, numbered in queue order.
        assert_eq!(r.core.publish(&r.ring, Some(100)), 2);
        assert_eq!(r.read_all(1).1, vec![(2, "b".into()), (3, "c".into())]);
        assert_eq!(r.core.held(&r.ring), None);
        // Without synchronous standbys nothing is held.
        let d = records(&["d"]);
        let sd = r.core.reserve(&r.ring, &d).unwrap();
        r.core
            .resolve(&r.ring, sd, d.len() as u64, Some((4, 1_000)));
        assert_eq!(r.core.publish(&r.ring, None), 1);
    }

    #[test]
    fn overflow_evicts_oldest_and_reports_a_gap() {
        let rec = records(&["0123456789"]).len();
        let mut r = ring(rec * 4 + rec / 2);
        for i in 0..10 {
            r.commit(&[&format!("{i:010}")]).unwrap();
        }
        // Four records fit: 7..=10 are retained, 1..=6 were evicted.
        assert_eq!(r.core.evicted, 6);
        let (gap, msgs) = r.read_all(0);
        assert_eq!(gap, Some((1, 6)));
        assert_eq!(
            msgs.iter().map(|m| m.0).collect::<Vec<_>>(),
            vec![7, 8, 9, 10]
        );
        assert_eq!(msgs[0].1, "0000000006");
        // A consumer that had read up to 8 loses nothing.
        assert_eq!(r.read_all(8).0, None);
    }

    #[test]
    fn records_wrap_around_the_end_of_the_ring() {
        let mut r = ring(200);
        for i in 0..50 {
            r.commit(&[&format!("message-{i}")]).unwrap();
            let (_, msgs) = r.read_all(i);
            assert_eq!(msgs, vec![(i + 1, format!("message-{i}"))]);
        }
    }

    #[test]
    fn pending_records_are_never_evicted() {
        let rec = records(&["x"]).len() as u64;
        let mut r = ring(rec as usize * 2);
        let held = records(&["x"]);
        r.core.reserve(&r.ring, &held).unwrap();
        // Fits beside the pending record, but cannot be published before it.
        assert_eq!(r.commit(&["y"]), Ok(0));
        assert_eq!(
            r.commit(&["z"]),
            Err(ReserveError::Full {
                need: rec,
                pending: 2 * rec
            })
        );
        assert_eq!(
            r.core.reserve(&r.ring, &records(&["a", "b", "c"])),
            Err(ReserveError::TooLarge {
                need: 3 * rec,
                capacity: 2 * rec
            })
        );
        r.core.resolve(&r.ring, 0, rec, Some((1, 0)));
        assert_eq!(r.core.publish(&r.ring, None), 2);
        let (_, msgs) = r.read_all(0);
        assert_eq!(msgs, vec![(1, "x".into()), (2, "y".into())]);
    }

    #[test]
    fn walks_visit_committed_records_in_bounded_steps_and_find_the_oldest_commit() {
        let mut r = ring(4096);
        assert_eq!(r.core.oldest_committed_at(&r.ring), None);
        let aborted = records(&["x"]);
        let s = r.core.reserve(&r.ring, &aborted).unwrap();
        r.core.resolve(&r.ring, s, aborted.len() as u64, None);
        r.core.publish(&r.ring, None);
        r.commit(&["a", "b", "c"]).unwrap();
        assert_eq!(r.core.oldest_committed_at(&r.ring), Some(7));
        let mut seen = Vec::new();
        // Two records walked (the aborted one and "a"), one visited.
        let mut visit = |h: &RecordHeader| {
            seen.push(h.seq);
            true
        };
        let next = r.core.walk(&r.ring, r.core.tail, 2, |_, h| visit(h));
        r.core.walk(&r.ring, next, 100, |_, h| visit(h));
        assert_eq!(seen, vec![1, 2, 3]);
    }

    #[test]
    fn a_walk_ends_after_the_record_its_visitor_says_is_enough() {
        let mut r = ring(4096);
        r.commit(&["a", "b", "c"]).unwrap();
        let mut seen = Vec::new();
        let next = r.core.walk(&r.ring, r.core.tail, 100, |_, h| {
            seen.push(h.seq);
            h.seq < 2
        });
        assert_eq!(seen, vec![1, 2]);
        // The walk goes on from the record after the last one visited.
        r.core.walk(&r.ring, next, 100, |_, h| {
            seen.push(h.seq);
            true
        });
        assert_eq!(seen, vec![1, 2, 3]);
    }

    #[test]
    fn position_beyond_the_queue_is_ahead() {
        let mut r = ring(1024);
        r.commit(&["a"]).unwrap();
        assert_eq!(
            r.core.locate(&r.ring, 5, None),
            Locate::Ahead { last_published: 1 }
        );
    }

    #[test]
    fn batches_respect_count_and_bytes_and_hint_resumes() {
        let mut r = ring(8192);
        for i in 0..20 {
            r.commit(&[&format!("{i:04}")]).unwrap();
        }
        let mut buf = Vec::new();
        let b = r.core.read_batch(&r.ring, 0, 5, usize::MAX, &mut buf);
        assert_eq!((b.count, b.last_seq), (5, Some(5)));
        let one = buf.len() / 5;
        let mut buf2 = Vec::new();
        let b2 = r
            .core
            .read_batch(&r.ring, b.next_off, 100, one * 3, &mut buf2);
        assert_eq!((b2.count, b2.last_seq), (3, Some(8)));
        // The first record is always taken, even if larger than max_bytes.
        let mut buf3 = Vec::new();
        assert_eq!(
            r.core
                .read_batch(&r.ring, b2.next_off, 100, 1, &mut buf3)
                .count,
            1
        );
        assert_eq!(
            r.core.locate(&r.ring, 8, Some((8, b2.next_off))),
            Locate::At(b2.next_off)
        );
        assert_eq!(r.core.locate(&r.ring, 8, None), Locate::At(b2.next_off));
    }
}
