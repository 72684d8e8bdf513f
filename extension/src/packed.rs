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
//! The layout (version 1; all integers little-endian):
//!
//! ```text
//! value   = "RTP1" count:u32 entry{count}
//! entry   = kind:u8 flags:u8 seq:i64 body
//! kind    = 1 message | 2 presence | 3 change | 4 gap | 5 filtered
//! body of message, presence, change =
//!           committed_us:i64 id:[16]u8 origin:i64 topic:str event:str payload:str
//! body of gap = lost_first:i64 lost_last:i64
//! body of filtered = (nothing)
//! str     = len:u32 bytes{len}
//! flags   = 1 private | 2 binary payload | 4 payload present (else NULL, len 0)
//!         | 8 id present (else 16 zero bytes) | 16 origin present (else 0)
//! ```
//! `committed_us` is the commit time in microseconds since the Unix epoch, as the sidecar's
//! row query computed it from `committed_at`. A change's topic is its table and its payload
//! the decoded `data` (absent when its table was not asked for); a message's payload is JSON
//! text unless flag 2 says bytes. Nothing follows the last entry.

use crate::consumer::{drain_into, DrainRow, DrainSink};
use crate::errors;
use crate::message::MessageView;
use pgrx::pg_sys;
use pgrx::prelude::*;

pub const MAGIC: &[u8; 4] = b"RTP1";

const KIND_MESSAGE: u8 = 1;
const KIND_PRESENCE: u8 = 2;
const KIND_CHANGE: u8 = 3;
const KIND_GAP: u8 = 4;
const KIND_FILTERED: u8 = 5;

const F_PRIVATE: u8 = 1;
const F_BINARY: u8 = 2;
const F_PAYLOAD: u8 = 4;
const F_ID: u8 = 8;
const F_ORIGIN: u8 = 16;

/// Microseconds from the Unix epoch to Postgres's (2000-01-01).
const PG_EPOCH_UNIX_US: i64 = 946_684_800_000_000;

/// A batch being packed.
pub struct Packed {
    buf: Vec<u8>,
    count: u32,
    last: Option<u64>,
}

impl Default for Packed {
    fn default() -> Self {
        let mut buf = Vec::with_capacity(4096);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&0u32.to_le_bytes());
        Packed {
            buf,
            count: 0,
            last: None,
        }
    }
}

impl Packed {
    fn head(&mut self, kind: u8, flags: u8, seq: u64) {
        self.count += 1;
        self.last = Some(seq);
        self.buf.push(kind);
        self.buf.push(flags);
        self.buf.extend_from_slice(&(seq as i64).to_le_bytes());
    }

    fn str(&mut self, s: &[u8]) {
        self.buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(s);
    }

    #[allow(clippy::too_many_arguments)]
    fn entry(
        &mut self,
        kind: u8,
        mut flags: u8,
        m: &MessageView,
        id: Option<&[u8; 16]>,
        origin: u64,
        payload: Option<&[u8]>,
    ) {
        flags |= if id.is_some() { F_ID } else { 0 }
            | if origin != 0 { F_ORIGIN } else { 0 }
            | if payload.is_some() { F_PAYLOAD } else { 0 };
        self.buf.reserve(
            2 + 8
                + 8
                + 16
                + 8
                + 12
                + m.topic.len()
                + m.event.len()
                + payload.map_or(0, <[u8]>::len),
        );
        self.head(kind, flags, m.header.seq);
        let committed_us = m.header.committed_at.saturating_add(PG_EPOCH_UNIX_US);
        self.buf.extend_from_slice(&committed_us.to_le_bytes());
        self.buf.extend_from_slice(id.unwrap_or(&[0; 16]));
        self.buf.extend_from_slice(&(origin as i64).to_le_bytes());
        self.str(m.topic.as_bytes());
        self.str(m.event.as_bytes());
        self.str(payload.unwrap_or_default());
    }

    /// The finished value.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf[4..8].copy_from_slice(&self.count.to_le_bytes());
        self.buf
    }
}

impl DrainSink for Packed {
    fn gap(&mut self, first: u64, last: u64) {
        self.head(KIND_GAP, 0, last);
        self.buf.extend_from_slice(&(first as i64).to_le_bytes());
        self.buf.extend_from_slice(&(last as i64).to_le_bytes());
    }

    fn message(&mut self, m: &MessageView, kind: &'static str) {
        let kind = if kind == "presence" {
            KIND_PRESENCE
        } else {
            KIND_MESSAGE
        };
        let private = if m.is_private() { F_PRIVATE } else { 0 };
        if m.is_binary() {
            let flags = private | F_BINARY;
            self.entry(
                kind,
                flags,
                m,
                Some(&m.header.id),
                m.header.origin,
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
                m.header.origin,
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
        self.head(KIND_FILTERED, 0, seq);
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn last_seq(&self) -> Option<u64> {
        self.last
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
    let mut r = Reader {
        at: 0,
        bytes: packed,
    };
    if r.take(4)? != MAGIC {
        return Err("it does not start with \"RTP1\"".into());
    }
    let count = r.u32()?;
    let mut rows = Vec::new();
    for _ in 0..count {
        let kind = r.u8()?;
        let flags = r.u8()?;
        let seq = r.i64()?;
        let row = match kind {
            KIND_GAP => {
                let (first, last) = (r.i64()?, r.i64()?);
                let mut row = crate::consumer::gap_row(first as u64, last as u64);
                row.0 = seq;
                row
            }
            KIND_FILTERED => crate::consumer::marker_row(seq as u64, "filtered"),
            KIND_MESSAGE | KIND_PRESENCE | KIND_CHANGE => {
                let committed_us = r.i64()?;
                let id: [u8; 16] = r.take(16)?.try_into().expect("16 bytes");
                let origin = r.i64()?;
                let topic = r.text()?;
                let event = r.text()?;
                let payload = r.str()?;
                let payload = (flags & F_PAYLOAD != 0).then_some(payload);
                let (json, binary) = match payload {
                    Some(p) if flags & F_BINARY != 0 => (None, Some(p.to_vec())),
                    Some(p) => (Some(utf8(p)?.to_owned()), None),
                    None => (None, None),
                };
                let change = kind == KIND_CHANGE;
                (
                    seq,
                    match kind {
                        KIND_MESSAGE => "message",
                        KIND_PRESENCE => "presence",
                        _ => "change",
                    },
                    Some(topic.to_owned()),
                    Some(event.to_owned()),
                    json,
                    binary,
                    (!change).then_some(flags & F_PRIVATE != 0),
                    TimestampWithTimeZone::try_from(committed_us - PG_EPOCH_UNIX_US).ok(),
                    (flags & F_ID != 0).then(|| pgrx::Uuid::from_bytes(id)),
                    (flags & F_ORIGIN != 0).then_some(origin),
                    None,
                    None,
                )
            }
            other => return Err(format!("entry {} has unknown kind {other}", rows.len() + 1)),
        };
        rows.push(row);
    }
    if r.at != packed.len() {
        return Err(format!(
            "{} bytes follow the last entry",
            packed.len() - r.at
        ));
    }
    Ok(rows)
}

fn utf8(b: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(b).map_err(|_| "a text field is not valid UTF-8".to_string())
}

struct Reader<'a> {
    at: usize,
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "it ends at byte {} where {n} more were expected",
                self.bytes.len()
            ));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Result<&'a str, String> {
        utf8(self.str()?)
    }
}
