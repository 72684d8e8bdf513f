//! The backend-local buffer of messages sent by the current transaction, and the transaction
//! callbacks that move it into the shared queue at commit (protocol in `queue.rs`).

use crate::errors;
use crate::gucs;
use crate::message::{encode_record, record_len, COMMITTED_AT};
use crate::queue::ReserveError;
use crate::shared::queue;
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
    /// For each message: the subtransaction that sent it and where its record starts.
    marks: Vec<(pg_sys::SubTransactionId, usize)>,
    /// Where `records` went in the ring, once reserved at pre-commit.
    reserved: Option<u64>,
}

thread_local! {
    static BUFFER: RefCell<TxnBuffer> = RefCell::new(TxnBuffer::default());
}

/// Appends one message to the current transaction's buffer (it reaches the queue at
/// commit, in `pre_commit`, or never). Refuses, with an error, anything that could
/// not be delivered: an empty or over-long topic or event, a message over
/// `realtime.max_message_size`, or a transaction whose messages would not fit in the queue.
pub fn append(topic: &str, event: &str, payload: &[u8], flags: u8, id: [u8; 16], origin: u64) {
    if topic.is_empty() {
        errors::invalid("topic must not be empty", None);
    }
    if topic.len() > MAX_TOPIC_LEN {
        errors::invalid(
            format!(
                "topic is {} bytes long; the limit is {MAX_TOPIC_LEN} bytes",
                topic.len()
            ),
            Some("Realtime clients cannot join topics longer than this."),
        );
    }
    if event.len() > MAX_EVENT_LEN {
        errors::invalid(
            format!(
                "event is {} bytes long; the limit is {MAX_EVENT_LEN} bytes",
                event.len()
            ),
            None,
        );
    }
    let size = topic.len() + event.len() + payload.len();
    let limit = gucs::max_message_size_bytes();
    if size > limit {
        queue().counters.oversize_rejections.fetch_add(1, Relaxed);
        errors::fail(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("realtime message of {size} bytes exceeds realtime.max_message_size ({limit} bytes)"),
            Some("Send a smaller payload, or raise realtime.max_message_size."),
        );
    }
    let len = record_len(topic, event, payload.len());
    BUFFER.with_borrow_mut(|b| {
        if b.reserved.is_some() {
            // Another extension's pre-commit hook is sending after ours copied the buffer.
            errors::fail(
                PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
                "cannot send realtime messages while the transaction is committing",
                None,
            );
        }
        let total = (b.records.len() + len) as u64;
        let capacity = queue().capacity;
        if total > capacity {
            queue().counters.oversize_rejections.fetch_add(1, Relaxed);
            errors::fail(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "this transaction's realtime messages ({total} bytes) exceed realtime.queue_size ({capacity} bytes)"
                ),
                Some("Send fewer or smaller messages per transaction, or raise realtime.queue_size."),
            );
        }
        let subid = unsafe { pg_sys::GetCurrentSubTransactionId() };
        b.marks.push((subid, b.records.len()));
        encode_record(&mut b.records, topic, event, payload, flags, id, origin);
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
        // time, so what `sub` and its children sent is exactly the marks with id >= sub.
        BUFFER.with_borrow_mut(|b| {
            if let Some(i) = b.marks.iter().position(|&(id, _)| id >= sub) {
                b.records.truncate(b.marks[i].1);
                b.marks.truncate(i);
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
/// error here still aborts the transaction cleanly.
fn pre_commit() {
    let result = BUFFER.with_borrow_mut(|b| {
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
    });
    match result {
        Ok(()) => {}
        Err(ReserveError::Full { need, pending }) => {
            queue().counters.queue_full_errors.fetch_add(1, Relaxed);
            errors::fail(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "realtime queue has no room for this transaction's {need} bytes of messages: {pending} bytes belong to transactions still committing"
                ),
                Some("Retry the transaction, or raise realtime.queue_size."),
            );
        }
        Err(ReserveError::TooLarge { need, capacity }) => {
            errors::fail(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("this transaction's realtime messages ({need} bytes) exceed realtime.queue_size ({capacity} bytes)"),
                None,
            );
        }
    }
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
            let published = {
                let mut guard = q.exclusive();
                let core = guard.core();
                core.resolve(
                    &q.ring(),
                    start,
                    b.records.len() as u64,
                    commit,
                    committed_at,
                );
                core.publish(&q.ring())
            };
            if published > 0 {
                q.wake_readers();
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
        if b.records.capacity() > KEEP_CAPACITY {
            *b = TxnBuffer::default();
        }
    });
}
