//! `realtime.drain_packed`: a drained batch as one `bytea` instead of a row per message.
//!
//! `realtime.drain` returns twelve columns a row: the executor forms each row, every column
//! goes through its output or send function, and the sidecar parses every column again.
//! Measured at 8 writers, that was 3.3 µs of the drain backend's CPU and 2.1 µs of the
//! sidecar's per message (pgbench/RESULTS.md, "The consumers' share"). A packed batch is
//! built with one copy of each message out of the ring and read by the sidecar in place
//! (`sidecar/src/packed.rs`). `realtime.drain_unpack` turns one back into
//! `realtime.drain`'s rows, for psql users and for the test that both carry the same.
//!
//! The layout is defined once for both sides, with its writer and reader, in the
//! `realtime-packed` crate (`extension/packed/src/lib.rs`); the sidecar reads with the same.

use crate::consumer::{drain_into, DrainRow, DrainSink};
use crate::errors;
use crate::message::MessageView;
use pgrx::pg_sys;
use pgrx::prelude::*;
use realtime_packed::{
    Entry, Record, Writer, F_BINARY, F_PRIVATE, KIND_CHANGE, KIND_DROPPED, KIND_MESSAGE,
    KIND_PRESENCE,
};

/// Microseconds from the Unix epoch to Postgres's (2000-01-01).
const PG_EPOCH_UNIX_US: i64 = 946_684_800_000_000;

/// A batch being packed.
#[derive(Default)]
pub struct Packed(Writer);

impl Packed {
    fn entry(
        &mut self,
        kind: u8,
        flags: u8,
        m: &MessageView,
        id: Option<&[u8; 16]>,
        origin: u64,
        payload: Option<&[u8]>,
    ) {
        self.0.record(Record {
            kind,
            flags,
            seq: m.header.seq as i64,
            committed_us: m.header.committed_at.saturating_add(PG_EPOCH_UNIX_US),
            id,
            origin: origin as i64,
            topic: m.topic.as_bytes(),
            event: m.event.as_bytes(),
            payload,
        });
    }

    /// The finished value.
    pub fn finish(self) -> Vec<u8> {
        self.0.finish()
    }
}

impl DrainSink for Packed {
    fn gap(&mut self, first: u64, last: u64) {
        self.0.gap(first as i64, last as i64);
    }

    fn message(&mut self, m: &MessageView, kind: &'static str) {
        let kind = match kind {
            "presence" => KIND_PRESENCE,
            "dropped" => KIND_DROPPED,
            _ => KIND_MESSAGE,
        };
        let private = if m.is_private() { F_PRIVATE } else { 0 };
        if m.is_binary() {
            let flags = private | F_BINARY;
            self.entry(
                kind,
                flags,
                m,
                Some(&m.header.id),
                m.reported_origin().unwrap_or(0) as u64,
                Some(m.payload),
            );
        } else {
            // As the row form's text column: JSON text, made valid UTF-8 if it were not.
            let text = String::from_utf8_lossy(m.payload);
            let payload = Some(text.as_bytes());
            self.entry(
                kind,
                private,
                m,
                Some(&m.header.id),
                m.reported_origin().unwrap_or(0) as u64,
                payload,
            );
        }
    }

    fn change(&mut self, m: &MessageView, data: Option<String>) {
        self.entry(
            KIND_CHANGE,
            0,
            m,
            None,
            0,
            data.as_deref().map(str::as_bytes),
        );
    }

    fn marker(&mut self, seq: u64, kind: &'static str) {
        debug_assert_eq!(kind, "filtered", "a drain's only marker");
        self.0.filtered(seq as i64);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn last_seq(&self) -> Option<u64> {
        self.0.last_seq().map(|s| s as u64)
    }
}

/// `realtime.drain` with the same arguments and behaviour, its batch returned as one packed
/// value (the layout above); an empty batch is a value of no entries.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."drain_packed"(consumer text, after_seq bigint DEFAULT NULL, max_messages integer DEFAULT 10000, timeout_ms integer DEFAULT 1000, linger_ms integer DEFAULT 0, decode oid[] DEFAULT NULL)
RETURNS bytea
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn drain_packed(
    consumer: &str,
    after_seq: Option<i64>,
    max_messages: i32,
    timeout_ms: i32,
    linger_ms: i32,
    decode: Option<Vec<Option<pg_sys::Oid>>>,
) -> Vec<u8> {
    let mut packed = Packed::default();
    drain_into(
        consumer,
        after_seq,
        max_messages,
        timeout_ms,
        linger_ms,
        decode,
        &mut packed,
    );
    packed.finish()
}

/// A packed batch as `realtime.drain`'s rows, in order.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."drain_unpack"(packed bytea)
RETURNS TABLE(seq bigint, kind text, topic text, event text, payload json, binary_payload bytea, private boolean, committed_at timestamptz, id uuid, origin bigint, lost_first bigint, lost_last bigint)
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
#[allow(clippy::type_complexity)]
fn drain_unpack(
    packed: &[u8],
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
    match unpack(packed) {
        Ok(rows) => TableIterator::new(rows),
        Err(why) => errors::invalid(
            format!("malformed packed drain batch: {why}"),
            Some("Pass a value returned by realtime.drain_packed, unchanged."),
        ),
    }
}

/// Reads `packed` back into rows. Err says what is wrong with it.
fn unpack(packed: &[u8]) -> Result<Vec<DrainRow>, String> {
    let entries = realtime_packed::read(packed).map_err(|e| e.to_string())?;
    let mut rows = Vec::with_capacity(entries.len());
    for entry in entries {
        let row = match entry {
            Entry::Gap { seq, first, last } => {
                let mut row = crate::consumer::gap_row(first as u64, last as u64);
                row.0 = seq;
                row
            }
            Entry::Filtered { seq } => crate::consumer::marker_row(seq as u64, "filtered"),
            Entry::Record(r) => {
                let (json, binary) = match r.payload() {
                    Some(p) if r.binary() => (None, Some(p.to_vec())),
                    Some(p) => (Some(utf8(p)?.to_owned()), None),
                    None => (None, None),
                };
                (
                    r.seq,
                    match r.kind {
                        KIND_MESSAGE => "message",
                        KIND_PRESENCE => "presence",
                        KIND_DROPPED => "dropped",
                        _ => "change",
                    },
                    Some(utf8(r.topic)?.to_owned()),
                    Some(utf8(r.event)?.to_owned()),
                    json,
                    binary,
                    (r.kind != KIND_CHANGE).then_some(r.private()),
                    TimestampWithTimeZone::try_from(r.committed_us - PG_EPOCH_UNIX_US).ok(),
                    r.id().map(|id| pgrx::Uuid::from_bytes(*id)),
                    r.origin(),
                    None,
                    None,
                )
            }
        };
        rows.push(row);
    }
    Ok(rows)
}

fn utf8(b: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(b).map_err(|_| "a text field is not valid UTF-8".to_string())
}
