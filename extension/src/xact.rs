//! The backend-local buffer of messages sent by the current transaction, and the transaction
//! callbacks that move it into the shared queue at commit (protocol in `queue.rs`).

use crate::dropped::{self, By, Reason, Refusal};
use crate::errors;
use crate::gucs;
use crate::message::{encode_record, record_len, MessageView, COMMITTED_AT};
use crate::payload;
use crate::queue::ReserveError;
use crate::shared::queue;
use crate::sync_hold;
use crate::wake;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;
use std::cell::RefCell;
use std::sync::atomic::Ordering::Relaxed;

/// Sub-topic limit: with the `realtime:` prefix it must fit the 255-byte topic field of
/// Supabase's binary (2.0.0) frames.
pub const MAX_TOPIC_LEN: usize = 255 - "realtime:".len();
pub const MAX_EVENT_LEN: usize = 255;

/// A buffer larger than this is released after its transaction instead of kept for reuse.
const KEEP_CAPACITY: usize = 1 << 20;

#[derive(Default)]
struct TxnBuffer {
    /// Encoded PENDING records, in call order.
    records: Vec<u8>,
    /// For each record: the subtransaction that sent it and where it starts.
    marks: Vec<(pg_sys::SubTransactionId, usize)>,
    /// Where `records` went in the ring, once reserved at pre-commit.
    reserved: Option<u64>,
    /// The transaction's messages did not fit the queue: each was made a dropped record,
    /// and so is each one sent after (`dropped.rs`: together or not at all).
    dropping: bool,
    /// The sidecar sent some of them (`By::Sidecar`): a failure at commit is an ERROR.
    by_sidecar: bool,
}

impl TxnBuffer {
    /// Appends a record (or a dropped record) made by `encode`, marked with the current
    /// subtransaction.
    fn push(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        let subid = unsafe { pg_sys::GetCurrentSubTransactionId() };
        self.marks.push((subid, self.records.len()));
        encode(&mut self.records);
    }

    /// Makes every record a dropped record (reason `QueueFull`), in place and order. Those
    /// that would take more than half the queue are left out (counted and warned all the
    /// same): a transaction of millions of tiny messages must not overflow it with their
    /// notices. Returns how many messages were dropped now.
    fn drop_all(&mut self, capacity: u64) -> u64 {
        let old = std::mem::take(&mut self.records);
        let marks = std::mem::take(&mut self.marks);
        let mut dropped = 0;
        for (i, &(subid, at)) in marks.iter().enumerate() {
            let end = marks.get(i + 1).map_or(old.len(), |m| m.1);
            let m = MessageView::parse(&old[at..end]);
            if m.is_dropped() {
                // Dropped before, for its own reason, and counted then.
                self.marks.push((subid, self.records.len()));
                self.records.extend_from_slice(&old[at..end]);
                continue;
            }
            dropped += 1;
            let size = m.topic.len() + m.event.len() + m.payload.len();
            let (flags, reason) = (m.header.flags, Reason::QueueFull);
            let len = dropped::len(m.topic, m.event, flags, reason, size);
            if (self.records.len() + len) as u64 > capacity / 2 {
                continue;
            }
            self.marks.push((subid, self.records.len()));
            dropped::encode(
                &mut self.records,
                m.topic,
                m.event,
                flags,
                m.header.id,
                m.payload,
                reason,
                size,
            );
        }
        self.dropping = true;
        dropped
    }
}

thread_local! {
    static BUFFER: RefCell<TxnBuffer> = RefCell::new(TxnBuffer::default());
}

/// A producer called on a standby: what it queued there would surface only after a
/// promotion, if ever. An ERROR whatever `realtime.strict_send` says (misuse, not data).
fn refuse_on_standby() {
    if unsafe { pg_sys::RecoveryInProgress() } {
        errors::fail(
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            "cannot send realtime messages during recovery",
            Some("Send from the primary: a message queued on a standby is never delivered to the primary's subscribers."),
        );
    }
}

/// What is wrong with a message's topic, event or size, if anything.
fn check(topic: &str, event: &str, payload_len: usize) -> Option<Refusal> {
    if topic.is_empty() {
        return Some(Refusal::invalid(
            Reason::InvalidTopic,
            "topic must not be empty",
            None,
        ));
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Some(Refusal::invalid(
            Reason::InvalidTopic,
            format!(
                "topic is {} bytes long; the limit is {MAX_TOPIC_LEN} bytes",
                topic.len()
            ),
            Some("Realtime clients cannot join topics longer than this."),
        ));
    }
    if event.is_empty() {
        return Some(Refusal::invalid(
            Reason::InvalidEvent,
            "event must not be empty",
            Some("Realtime clients listen to a named event (or to every event with '*')."),
        ));
    }
    if event.len() > MAX_EVENT_LEN {
        return Some(Refusal::invalid(
            Reason::InvalidEvent,
            format!(
                "event is {} bytes long; the limit is {MAX_EVENT_LEN} bytes",
                event.len()
            ),
            None,
        ));
    }
    let size = topic.len() + event.len() + payload_len;
    let limit = gucs::max_message_size_bytes();
    if size > limit {
        return Some(Refusal::limit(
            Reason::TooLarge,
            format!("realtime message of {size} bytes exceeds realtime.max_message_size ({limit} bytes)"),
            "Send a smaller payload, or raise realtime.max_message_size.",
        ));
    }
    None
}

/// A message that cannot be sent (`dropped.rs`): an ERROR for the sidecar or with
/// `realtime.strict_send`; else warned and counted, and, when its topic is usable, a dropped
/// record in its place. `topic` and `event` are None when NULL.
pub fn refuse(
    by: By,
    (topic, event): (Option<&str>, Option<&str>),
    flags: u8,
    size: usize,
    refusal: Refusal,
) {
    refuse_on_standby();
    let usable = |s: &str, max: usize| !s.is_empty() && s.len() <= max;
    let topic = topic.filter(|t| usable(t, MAX_TOPIC_LEN));
    let Some(topic) = topic.filter(|_| refusal.reason != Reason::Unauthorized) else {
        return refusal.raise_or_warn(by, 1, false);
    };
    let event = event.filter(|e| usable(e, MAX_EVENT_LEN)).unwrap_or("");
    let reason = refusal.reason;
    refusal.raise_or_warn(by, 1, true);
    BUFFER.with_borrow_mut(|b| {
        refuse_while_committing(b);
        b.push(|out| {
            dropped::encode(
                out,
                topic,
                event,
                flags,
                payload::new_id(),
                &[],
                reason,
                size,
            )
        });
    });
}

fn refuse_while_committing(b: &TxnBuffer) {
    if b.reserved.is_some() {
        // Another extension's pre-commit hook is sending after ours copied the buffer.
        errors::fail(
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "cannot send realtime messages while the transaction is committing",
            None,
        );
    }
}

/// Appends one message to the current transaction's buffer (it reaches the queue at
/// commit, in `pre_commit`, or never). What could not be delivered (an empty or over-long
/// topic or event, a message over `realtime.max_message_size`, a transaction whose messages
/// would not fit in the queue) is refused as `dropped.rs` says.
pub fn append(
    by: By,
    topic: &str,
    event: &str,
    payload: &[u8],
    flags: u8,
    id: [u8; 16],
    origin: u64,
) {
    refuse_on_standby();
    let size = topic.len() + event.len() + payload.len();
    if let Some(r) = check(topic, event, payload.len()) {
        return refuse(by, (Some(topic), Some(event)), flags, size, r);
    }
    let len = record_len(topic, event, payload.len());
    let capacity = queue().capacity;
    BUFFER.with_borrow_mut(|b| {
        refuse_while_committing(b);
        b.by_sidecar |= by == By::Sidecar;
        let total = (b.records.len() + len) as u64;
        if b.dropping || total > capacity {
            let refusal = Refusal::limit(
                Reason::QueueFull,
                format!(
                    "this transaction's realtime messages ({total} bytes) exceed realtime.queue_size ({capacity} bytes)"
                ),
                "Send fewer or smaller messages per transaction, or raise realtime.queue_size.",
            );
            if Refusal::raises(by) || b.by_sidecar {
                queue().counters.oversize_rejections.fetch_add(1, Relaxed);
                errors::fail(refusal.code, refusal.message, refusal.hint);
            }
            // Together or not at all: what the transaction sent before goes too.
            let before = if b.dropping { 0 } else { b.drop_all(capacity) };
            let reason = refusal.reason;
            refusal.raise_or_warn(by, before + 1, true);
            let dlen = dropped::len(topic, event, flags, reason, size);
            if (b.records.len() + dlen) as u64 <= capacity / 2 {
                b.push(|out| dropped::encode(out, topic, event, flags, id, payload, reason, size));
            }
            return;
        }
        b.push(|out| encode_record(out, topic, event, payload, flags, id, origin));
    });
}

/// Registers the callbacks for the life of the backend (they cost one check per transaction
/// that sent nothing).
pub fn register_callbacks() {
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT => pre_commit(),
        XACT_EVENT_COMMIT => finish(true),
        XACT_EVENT_ABORT => finish(false),
        XACT_EVENT_PRE_PREPARE => refuse_prepare(),
        _ => {}
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_subxact(
    event: pg_sys::SubXactEvent::Type,
    sub: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        // Every subtransaction that started after `sub` is nested in it, and ids grow with
        // time, so what `sub` and its children sent is exactly the marks with id >= sub,
        // and they are the last ones: found from the end, at the cost of what goes. (Found
        // from the start, each rollback read every mark before them: a held send, which
        // rolls back a subtransaction of its own, cost 38 us a send after 2,000 sends in a
        // transaction and 58 us after 20,000.)
        BUFFER.with_borrow_mut(|b| {
            let gone = b
                .marks
                .iter()
                .rev()
                .take_while(|&&(id, _)| id >= sub)
                .count();
            if gone > 0 {
                let keep = b.marks.len() - gone;
                b.records.truncate(b.marks[keep].1);
                b.marks.truncate(keep);
            }
        });
    }
}

fn refuse_prepare() {
    let sent = BUFFER.with_borrow(|b| !b.marks.is_empty());
    if sent {
        errors::fail(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "cannot PREPARE a transaction that has sent realtime messages",
            Some("Send realtime messages in a transaction that commits directly, or from the transaction that runs COMMIT PREPARED."),
        );
    }
}

/// Copies the transaction's messages into the ring. Runs before the commit record, so an
/// error here still aborts the transaction cleanly. When the queue has no room (transactions
/// still committing hold it), the app's messages are dropped together, as `dropped.rs` says:
/// their dropped records are reserved instead, or, if even those find no room, nothing.
fn pre_commit() {
    let (need, pending) = match reserve() {
        Ok(()) => return,
        Err(ReserveError::Full { need, pending }) => (need, pending),
        Err(ReserveError::TooLarge { need, capacity }) => {
            // `append` bounds a transaction's records by the queue's size: not reached.
            errors::fail(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("this transaction's realtime messages ({need} bytes) exceed realtime.queue_size ({capacity} bytes)"),
                None,
            );
        }
    };
    let refusal = Refusal::limit(
        Reason::QueueFull,
        format!(
            "realtime queue has no room for this transaction's {need} bytes of messages: {pending} bytes belong to transactions still committing"
        ),
        "Retry the transaction, or raise realtime.queue_size.",
    );
    if BUFFER.with_borrow(|b| b.by_sidecar) || Refusal::raises(By::App) {
        queue().counters.queue_full_errors.fetch_add(1, Relaxed);
        errors::fail(refusal.code, refusal.message, refusal.hint);
    }
    let capacity = queue().capacity;
    let dropped = BUFFER.with_borrow_mut(|b| b.drop_all(capacity));
    let told = reserve().is_ok() && BUFFER.with_borrow(|b| !b.records.is_empty());
    if !told {
        BUFFER.with_borrow_mut(|b| {
            b.records.clear();
            b.marks.clear();
        });
    }
    refusal.raise_or_warn(By::App, dropped, told);
}

/// Reserves the buffer's records in the ring (nothing to do for an empty buffer).
fn reserve() -> Result<(), ReserveError> {
    BUFFER.with_borrow_mut(|b| {
        if b.records.is_empty() {
            return Ok(());
        }
        // Until commit resolves it, the first record's commit-time field holds when it was
        // reserved: realtime.stats() reports how long the oldest PENDING record has held back
        // every later one (a commit waiting for a synchronous standby, say).
        let reserved_at = unsafe { pg_sys::GetCurrentTimestamp() };
        b.records[COMMITTED_AT].copy_from_slice(&reserved_at.to_le_bytes());
        let q = queue();
        let ring = q.ring();
        let start = q.exclusive().core().reserve(&ring, &b.records)?;
        b.reserved = Some(start);
        // After the lock is released: map the pages the next writes will touch.
        crate::ring_pages::map_ahead(ring.base(), ring.capacity(), start, b.records.len() as u64);
        Ok(())
    })
}

/// Resolves the reserved records and publishes. Runs after the commit is durable and
/// visible (or after an abort): it must not fail, and nothing here can raise an error.
fn finish(commit: bool) {
    BUFFER.with_borrow_mut(|b| {
        if let Some(start) = b.reserved.take() {
            let q = queue();
            let committed_at = if commit {
                unsafe { pg_sys::GetCurrentTransactionStopTimestamp() }
            } else {
                0
            };
            let resolved = commit.then(|| (committed_at, sync_hold::commit_lsn()));
            let hold = sync_hold::limit();
            let (published, reached, held) = {
                let mut guard = q.exclusive();
                let core = guard.core();
                core.resolve(&q.ring(), start, b.records.len() as u64, resolved);
                let published = core.publish(&q.ring(), hold);
                (published, core.published, core.held(&q.ring()).is_some())
            };
            // The record at `published` is always PENDING, or held for the standbys, when
            // the lock is free, so a publish that numbered as many messages as this
            // transaction committed numbered exactly its records; more means others' were
            // waiting behind them.
            let own = if commit { b.marks.len() as u64 } else { 0 };
            match wake::whom(published, own, held) {
                wake::Whom::Nobody => {}
                wake::Whom::ReadersOfOwn => {
                    let views: Vec<MessageView> = (0..b.marks.len())
                        .map(|i| {
                            let end = b.marks.get(i + 1).map_or(b.records.len(), |m| m.1);
                            MessageView::parse(&b.records[b.marks[i].1..end])
                        })
                        .collect();
                    wake::after_publish(q, reached, wake::Published::Own(&views));
                }
                wake::Whom::Every => wake::after_publish(q, reached, wake::Published::Others),
            }
            let c = &q.counters;
            if commit {
                c.transactions.fetch_add(1, Relaxed);
                c.messages.fetch_add(b.marks.len() as u64, Relaxed);
                c.bytes.fetch_add(b.records.len() as u64, Relaxed);
            } else {
                c.aborted_after_reserve.fetch_add(1, Relaxed);
            }
        }
        b.records.clear();
        b.marks.clear();
        b.dropping = false;
        b.by_sidecar = false;
        if b.records.capacity() > KEEP_CAPACITY {
            *b = TxnBuffer::default();
        }
    });
}
