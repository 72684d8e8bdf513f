//! Named consumer slots and the drain API: the contract with the sidecar.
//!
//! A slot remembers a consumer's confirmed position (the last sequence it has fully handled)
//! across reconnects, for as long as the server runs. Each slot sees every message, unless
//! its consumer listens to some topics only (`interest.rs`). A drain
//! reads after a position, waiting for messages up to a timeout, and reports evicted
//! messages as a gap row instead of skipping them silently.

use crate::errors;
use crate::message::MessageView;
use crate::queue::Locate;
use crate::shared::{queue, ConsumerSlot, QueueShared, NAME_MAX};
use crate::sync_hold::{self, Held};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Bytes copied out of the ring per drain call beyond the first message; bounds how long a
/// reader holds the lock that committing writers need.
const MAX_BATCH_BYTES: usize = 16 << 20;

/// Looks a consumer up. The caller holds the queue lock, so slots do not change meanwhile.
fn find(q: &'static QueueShared, name: &str) -> Option<&'static ConsumerSlot> {
    q.slots().iter().find(|s| s.in_use() && s.name() == name)
}

fn missing(name: &str) -> ! {
    errors::fail(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!("realtime consumer \"{name}\" does not exist"),
        Some("Create it with realtime.create_consumer(name)."),
    )
}

fn require(q: &'static QueueShared, name: &str) -> &'static ConsumerSlot {
    let _g = q.shared();
    find(q, name).unwrap_or_else(|| missing(name))
}

fn validate_name(name: &str) {
    if name.is_empty() || name.len() > NAME_MAX {
        errors::invalid(
            format!("consumer name must be 1 to {NAME_MAX} bytes long"),
            None,
        );
    }
}

/// Creates the consumer if it does not exist, positioned after the last published message,
/// and returns its confirmed position either way.
#[pg_extern(volatile, parallel_unsafe)]
fn create_consumer(name: &str) -> i64 {
    validate_name(name);
    // A standby's queue is its own shared memory: the primary's commits never reach it, so
    // a consumer there would drain nothing, and its sidecar's clients would never know.
    if unsafe { pg_sys::RecoveryInProgress() } {
        errors::fail(
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            "cannot create a realtime consumer during recovery",
            Some("Drain from the primary: a standby's queue never holds the primary's messages (connect with target_session_attrs=read-write)."),
        );
    }
    let q = queue();
    let mut g = q.exclusive();
    if let Some(s) = find(q, name) {
        return s.confirmed.load(Relaxed) as i64;
    }
    let Some(i) = q.slots().iter().position(|s| !s.in_use()) else {
        drop(g);
        errors::fail(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!("all {} realtime consumer slots are in use", q.nslots),
            Some("Drop an unused consumer with realtime.drop_consumer(name), or raise realtime.max_consumers."),
        );
    };
    let core = g.core();
    let position = core.last_seq();
    let published = core.published;
    q.slots()[i].occupy(name, position, published);
    // A new consumer receives everything until it says what it listens to.
    q.interest(i).reset(&mut g, false);
    position as i64
}

/// Frees a consumer's slot. Returns false when there was no such consumer.
#[pg_extern(volatile, parallel_unsafe)]
fn drop_consumer(name: &str) -> bool {
    let q = queue();
    let mut _g = q.exclusive();
    let Some(i) = q
        .slots()
        .iter()
        .position(|s| s.in_use() && s.name() == name)
    else {
        return false;
    };
    let slot = &q.slots()[i];
    let pid = slot.pid.load(Relaxed);
    if pid != 0 && pid != unsafe { pg_sys::MyProcPid } && backend_alive(pid) {
        drop(_g);
        errors::fail(
            PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
            format!("realtime consumer \"{name}\" is in use by process {pid}"),
            None,
        );
    }
    slot.release();
    q.interest(i).reset(&mut _g, false);
    true
}

/// Records that the consumer has handled every message up to `seq`; a reconnecting consumer
/// resumes after its confirmed position. Never moves the position backwards.
#[pg_extern(volatile, parallel_unsafe)]
fn confirm(consumer: &str, seq: i64) {
    let q = queue();
    let (slot, generation) = {
        let _g = q.shared();
        let slot = find(q, consumer).unwrap_or_else(|| missing(consumer));
        (slot, slot.generation())
    };
    let last = q.shared().core().last_seq();
    if seq < 0 || seq as u64 > last {
        errors::invalid(
            format!("cannot confirm position {seq}: the last message of this queue is {last}"),
            Some("The server may have restarted; read the consumer's position again with realtime.create_consumer()."),
        );
    }
    // Under the lock, and only if the slot still holds the consumer looked up above: a drop
    // and re-create meanwhile must not move another consumer's position.
    let _g = q.shared();
    if !slot.confirm_if_current(generation, seq as u64) {
        drop(_g);
        missing(consumer);
    }
}

fn backend_alive(pid: i32) -> bool {
    unsafe { !pg_sys::BackendPidGetProc(pid).is_null() }
}

/// Finds the consumer and claims it for this backend: one reader per slot at a time. The
/// claim is made under the exclusive lock so that a concurrent drop cannot free the slot
/// between the lookup and the claim.
fn claim(q: &'static QueueShared, name: &str) -> &'static ConsumerSlot {
    let me = unsafe { pg_sys::MyProcPid };
    let slot = require(q, name);
    if slot.pid.load(Relaxed) == me {
        return slot;
    }
    let _g = q.exclusive();
    let slot = find(q, name).unwrap_or_else(|| missing(name));
    let holder = slot.pid.load(Relaxed);
    if holder != 0 && holder != me && backend_alive(holder) {
        errors::fail(
            PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
            format!("realtime consumer \"{name}\" is in use by process {holder}"),
            Some("Each consumer slot has one reader at a time; give every sidecar its own consumer name."),
        );
    }
    slot.pid.store(me, Relaxed);
    register_detach();
    slot
}

/// Releases this backend's slots when it exits, so a reconnecting consumer can claim them.
fn register_detach() {
    thread_local! { static REGISTERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) }; }
    if !REGISTERED.get() {
        unsafe { pg_sys::before_shmem_exit(Some(detach_all), pg_sys::Datum::from(0)) };
        REGISTERED.set(true);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn detach_all(_code: i32, _arg: pg_sys::Datum) {
    let me = unsafe { pg_sys::MyProcPid };
    for s in queue().slots() {
        let _ = s.pid.compare_exchange(me, 0, Relaxed, Relaxed);
    }
}

/// One row of `realtime.drain` (and of `realtime.history`, which returns the same columns).
pub type DrainRow = (
    i64,
    &'static str,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
    Option<bool>,
    Option<TimestampWithTimeZone>,
    Option<pgrx::Uuid>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// Returns the messages after `after_seq` (default: the consumer's confirmed position),
/// waiting up to `timeout_ms` for the first one, then up to `linger_ms` for more to batch
/// with it. Passing `after_seq` also confirms it.
/// A first row of kind 'gap' reports messages evicted before this consumer read them. A row
/// of kind 'presence' is a presence diff (`presence.rs`). A row of kind 'dropped' takes the
/// place of a message that could not be sent (`dropped.rs`): its topic and event, and a
/// payload `{"reason", "size"}`. A row of kind 'change' is a captured row change: topic is its table, event its type (INSERT,
/// UPDATE, DELETE), payload the `data` of Supabase's Postgres Changes event (`change.rs`).
/// With `decode`, only the changes of those tables are decoded; the others come with a NULL
/// payload: a consumer whose clients listen to few of the published tables does not pay
/// for turning every other change into JSON.
/// A consumer that listens (`realtime.listen`, `interest.rs`) gets only the messages of its
/// topics and the changes of its tables; a last row of kind 'filtered' carries the sequence
/// read through when messages after the last row returned were skipped. Skipped messages do
/// not end the wait: the call returns when something for this consumer (or the timeout)
/// comes.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."drain"(consumer text, after_seq bigint DEFAULT NULL, max_messages integer DEFAULT 10000, timeout_ms integer DEFAULT 1000, linger_ms integer DEFAULT 0, decode oid[] DEFAULT NULL)
RETURNS TABLE(seq bigint, kind text, topic text, event text, payload json, binary_payload bytea, private boolean, committed_at timestamptz, id uuid, origin bigint, lost_first bigint, lost_last bigint)
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
#[allow(clippy::type_complexity)]
fn drain(
    consumer: &str,
    after_seq: Option<i64>,
    max_messages: i32,
    timeout_ms: i32,
    linger_ms: i32,
    decode: Option<Vec<Option<pg_sys::Oid>>>,
) -> TableIterator<
    'static,
    (
        name!(seq, i64),
        name!(kind, &'static str),
        name!(topic, Option<String>),
        name!(event, Option<String>),
        name!(payload, Option<String>),
        name!(binary_payload, Option<Vec<u8>>),
        name!(private, Option<bool>),
        name!(committed_at, Option<TimestampWithTimeZone>),
        name!(id, Option<pgrx::Uuid>),
        name!(origin, Option<i64>),
        name!(lost_first, Option<i64>),
        name!(lost_last, Option<i64>),
    ),
> {
    let mut rows: Vec<DrainRow> = Vec::new();
    drain_into(
        consumer,
        after_seq,
        max_messages,
        timeout_ms,
        linger_ms,
        decode,
        &mut rows,
    );
    TableIterator::new(rows)
}

/// What a drain hands its batch to, entry by entry in queue order: rows for `realtime.drain`,
/// or one packed value for `realtime.drain_packed` (`packed.rs`). One drain, two shapes of
/// its answer: both carry the same entries.
pub trait DrainSink {
    /// Messages `first..=last` were evicted before this consumer read them.
    fn gap(&mut self, first: u64, last: u64);
    /// A broadcast (kind "message"), a presence diff (kind "presence") or a message dropped
    /// when it was sent (kind "dropped").
    fn message(&mut self, m: &MessageView, kind: &'static str);
    /// A captured row change; `data` is None when its table was not asked to be decoded.
    fn change(&mut self, m: &MessageView, data: Option<String>);
    /// An entry carrying only a sequence ("filtered").
    fn marker(&mut self, seq: u64, kind: &'static str);
    fn is_empty(&self) -> bool;
    /// The sequence of the last entry handed over.
    fn last_seq(&self) -> Option<u64>;
}

impl DrainSink for Vec<DrainRow> {
    fn gap(&mut self, first: u64, last: u64) {
        self.push(gap_row(first, last));
    }
    fn message(&mut self, m: &MessageView, kind: &'static str) {
        let mut row = message_row(m);
        row.1 = kind;
        self.push(row);
    }
    fn change(&mut self, m: &MessageView, data: Option<String>) {
        self.push((
            m.header.seq as i64,
            "change",
            Some(m.topic.to_owned()),
            Some(m.event.to_owned()),
            data,
            None,
            None,
            TimestampWithTimeZone::try_from(m.header.committed_at).ok(),
            None,
            None,
            None,
            None,
        ));
    }
    fn marker(&mut self, seq: u64, kind: &'static str) {
        self.push(marker_row(seq, kind));
    }
    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
    fn last_seq(&self) -> Option<u64> {
        self.last().map(|r| r.0 as u64)
    }
}

/// The drain itself (`realtime.drain`'s contract above), handing its entries to `sink`.
#[allow(clippy::too_many_arguments)]
pub fn drain_into(
    consumer: &str,
    after_seq: Option<i64>,
    max_messages: i32,
    timeout_ms: i32,
    linger_ms: i32,
    decode: Option<Vec<Option<pg_sys::Oid>>>,
    sink: &mut impl DrainSink,
) {
    if max_messages < 1 {
        errors::invalid("max_messages must be at least 1", None);
    }
    if timeout_ms < 0 {
        errors::invalid("timeout_ms must not be negative", None);
    }
    if !(0..=10_000).contains(&linger_ms) {
        errors::invalid("linger_ms must be between 0 and 10000", None);
    }
    if after_seq.is_some_and(|s| s < 0) {
        errors::invalid("after_seq must not be negative", None);
    }
    let q = queue();
    let slot = claim(q, consumer);
    let interest = q.interest_of(slot);
    let mut after = after_seq.map_or_else(|| slot.confirmed.load(Relaxed), |s| s as u64);
    let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
    let mut lingered = linger_ms == 0;
    let mut buf = Vec::new();
    let mut changes = crate::change::Decoder::default();
    let mut returned = 0u64;
    let mut skipped = false;
    loop {
        let (gap, batch) = wait(
            q,
            slot,
            after,
            max_messages as u32,
            deadline,
            linger_ms,
            &mut lingered,
            &mut buf,
        );
        let batch_through = batch.last_seq.unwrap_or(match gap {
            Some((_, last)) => last,
            None => after,
        });
        if let Some((first, last)) = gap {
            let counted = slot.lost_through.fetch_max(last, Relaxed);
            if counted < last {
                slot.gaps.fetch_add(1, Relaxed);
                slot.lost.fetch_add(last - counted.max(first - 1), Relaxed);
            }
            sink.gap(first, last);
        }
        // The changes' decoded data, bounded (realtime.drain_max_decoded_size): a batch is
        // read by the queue's bytes, and a change can decode to a hundred times its own
        // (issue 39, H4: 16 MB of cheap UPDATEs to a well-compressed column decoded past
        // what one call can return, every call, and the drain never moved). Past it the call
        // ends after the change that passed it; the next call reads on from there.
        let mut decoded = 0usize;
        let mut cut_at: Option<u64> = None;
        let mut at = 0;
        for _ in 0..batch.count {
            let m = MessageView::parse(&buf[at..]);
            at += m.header.len as usize;
            // Checked after the record was read (under the lock, after it was published),
            // so a topic listened to before its message committed is never skipped.
            if !interest.wants_record(&m) {
                skipped = true;
                continue;
            }
            returned += 1;
            if m.is_change() {
                // Decoded here, once per consumer, so that the writer only copied its row;
                // and only if the consumer asked for its table (a filtering consumer did,
                // by listening to it).
                let wanted = interest.filtering()
                    || match (&decode, crate::capture::relid_of(m.payload)) {
                        (None, _) | (_, None) => true,
                        (Some(list), Some(relid)) => list.contains(&Some(pg_sys::Oid::from(relid))),
                    };
                let data = wanted.then(|| changes.record(&m));
                decoded += data.as_ref().map_or(0, String::len);
                sink.change(&m, data);
                if decoded >= crate::gucs::drain_max_decoded_bytes() {
                    cut_at = Some(m.header.seq);
                    break;
                }
                continue;
            }
            sink.message(&m, record_kind(&m));
        }
        // A batch read whole moves the hint to its end; one cut short leaves it where it
        // was (an earlier place is a good hint too).
        let read_through = cut_at.unwrap_or(batch_through);
        if cut_at.is_none() {
            slot.hint_seq.store(read_through, Relaxed);
            slot.hint_off.store(batch.next_off, Relaxed);
        }
        slot.last_read.store(read_through, Relaxed);
        let advanced = read_through > after;
        after = read_through;
        if !sink.is_empty() || !advanced || Instant::now() >= deadline {
            break;
        }
        // Everything read was for other consumers: wait for more, within the same timeout,
        // rather than wake the consumer for nothing.
    }
    if skipped && sink.last_seq().is_none_or(|s| s < after) {
        // Messages after the last row were skipped: say how far this call read, so the
        // consumer's next position is past them.
        sink.marker(after, "filtered");
    }
    if let Some(s) = after_seq {
        slot.confirmed.fetch_max(s as u64, Relaxed);
    }
    slot.delivered.fetch_add(returned, Relaxed);
}

/// Waits until something after `after` is readable (or `deadline`), lingering once per
/// call when `linger_ms` asks for it, and copies a batch of it into `buf`: the gap before
/// it, if any, and the batch read.
#[allow(clippy::too_many_arguments)]
fn wait(
    q: &'static QueueShared,
    slot: &ConsumerSlot,
    after: u64,
    max_messages: u32,
    deadline: Instant,
    linger_ms: i32,
    lingered: &mut bool,
    buf: &mut Vec<u8>,
) -> (Option<(u64, u64)>, crate::queue::Batch) {
    let ring = q.ring();
    let read = |buf: &mut Vec<u8>| {
        buf.clear();
        let hint = Some((slot.hint_seq.load(Relaxed), slot.hint_off.load(Relaxed)));
        let g = q.shared();
        let (gap, start) = match g.core().locate(&ring, after, hint) {
            Locate::At(off) => (None, off),
            Locate::Gap { first, last, off } => (Some((first, last)), off),
            Locate::Ahead { last_published } => {
                drop(g);
                ahead(after, last_published, q.epoch);
            }
        };
        let batch = g
            .core()
            .read_batch(&ring, start, max_messages, MAX_BATCH_BYTES, buf);
        // Under the same lock: whether a record is held for the synchronous standbys.
        (gap, batch, g.core().held(&ring))
    };
    // This slot's own variable: a publish broadcasts it only when there is something here
    // for this consumer (`wake.rs`).
    let cv = q.slot_cv(q.slot_index(slot));
    let mut sleeping = false;
    let found = loop {
        let (gap, batch, held) = read(buf);
        let found = gap.is_some() || batch.count > 0;
        if found && !*lingered && batch.count < max_messages {
            // Under load, one wake-up per commit costs the consumer (and the 2 cores writers
            // share with it) more than the messages do: wait a little and take more at once.
            *lingered = true;
            if sleeping {
                unsafe { pg_sys::ConditionVariableCancelSleep() };
                sleeping = false;
            }
            sleep_interruptibly(Duration::from_millis(linger_ms as u64));
            continue;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if found || remaining.is_zero() {
            break (gap, batch);
        }
        // A record held for the synchronous standbys is published here once they have it
        // (nothing else says when their flush moved): until then, look again every POLL.
        let nap = match held.map(|lsn| sync_hold::release(q, &ring, lsn)) {
            Some(Held::Released) => continue,
            Some(Held::Waiting) => remaining.min(sync_hold::POLL),
            None => remaining,
        };
        unsafe {
            if !sleeping {
                // Registering before the re-check closes the window where a publish between
                // our read and our sleep would go unnoticed.
                pg_sys::ConditionVariablePrepareToSleep(cv);
                sleeping = true;
            } else {
                pg_sys::ConditionVariableTimedSleep(
                    cv,
                    nap.as_millis().max(1) as i64,
                    pg_sys::PG_WAIT_EXTENSION,
                );
            }
        }
    };
    if sleeping {
        unsafe { pg_sys::ConditionVariableCancelSleep() };
    }
    found
}

/// What a drained record that is not a change is: a broadcast, a presence diff, or a
/// message dropped when it was sent (`dropped.rs`).
pub fn record_kind(m: &MessageView) -> &'static str {
    if m.is_presence() {
        "presence"
    } else if m.is_dropped() {
        "dropped"
    } else {
        "message"
    }
}

/// A row of kind 'message' (a broadcast: the database's, or a client's relayed one) or
/// 'dropped' (its payload says why and how large).
pub fn message_row(m: &MessageView) -> DrainRow {
    let (payload, binary) = if m.is_binary() {
        (None, Some(m.payload.to_vec()))
    } else {
        (Some(String::from_utf8_lossy(m.payload).into_owned()), None)
    };
    (
        m.header.seq as i64,
        record_kind(m),
        Some(m.topic.to_owned()),
        Some(m.event.to_owned()),
        payload,
        binary,
        Some(m.is_private()),
        TimestampWithTimeZone::try_from(m.header.committed_at).ok(),
        Some(pgrx::Uuid::from_bytes(m.header.id)),
        m.reported_origin(),
        None,
        None,
    )
}

/// A row of kind `kind` carrying only a sequence ('end' of `realtime.history`).
pub fn marker_row(seq: u64, kind: &'static str) -> DrainRow {
    (
        seq as i64, kind, None, None, None, None, None, None, None, None, None, None,
    )
}

/// A row of kind 'gap': messages `first..=last` were evicted before they were read.
pub fn gap_row(first: u64, last: u64) -> DrainRow {
    let mut row = marker_row(last, "gap");
    row.10 = Some(first as i64);
    row.11 = Some(last as i64);
    row
}

/// Sleeps on this backend's latch (not the queue's condition variable, so commits do not
/// wake it), still answering query cancel and statement_timeout.
fn sleep_interruptibly(d: Duration) {
    let until = Instant::now() + d;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                left.as_millis().max(1) as i64,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }
}

fn ahead(after: u64, last: u64, epoch: i64) -> ! {
    let epoch = TimestampWithTimeZone::try_from(epoch)
        .map(|t| t.to_string())
        .unwrap_or_default();
    errors::invalid(
        format!("position {after} is beyond the last message of this queue ({last}); the queue started at {epoch}"),
        Some("The server restarted and undelivered messages were lost; read the consumer's position again with realtime.create_consumer()."),
    )
}
