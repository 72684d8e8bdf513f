//! The packed drain format, defined once for both sides: `realtime.drain_packed` writes a
//! drained batch as one `bytea` with `Writer` (`extension/src/packed.rs`), and the sidecar
//! (`sidecar/src/packed.rs`) and `realtime.drain_unpack` read it with `read`. Instead of
//! twelve columns a message through the executor, the wire and a parse per column, a batch
//! is one value, written with one copy of each message out of the ring and read in place.
//!
//! The layout (version 1; all integers little-endian):
//!
//! ```text
//! value   = "RTP1" count:u32 entry{count}
//! entry   = kind:u8 flags:u8 seq:i64 body
//! kind    = 1 message | 2 presence | 3 change | 4 gap | 5 filtered | 6 dropped
//! body of message, presence, change, dropped =
//!           committed_us:i64 id:[16]u8 origin:i64 topic:str event:str payload:str
//! body of gap = lost_first:i64 lost_last:i64
//! body of filtered = (nothing)
//! str     = len:u32 bytes{len}
//! flags   = 1 private | 2 binary payload | 4 payload present (else NULL, len 0)
//!         | 8 id present (else 16 zero bytes) | 16 origin present (else 0)
//! ```
//! `committed_us` is the commit time in microseconds since the Unix epoch. A change's topic
//! is its table and its payload the decoded `data` (absent when its table was not asked
//! for); a message's payload is JSON text unless flag 2 says bytes. A dropped entry is a
//! message that could not be sent, in its place: its topic and event, and a payload
//! `{"reason", "size"}` (`extension/src/dropped.rs`). Nothing follows the last entry.
//!
//! Reading checks every bound and never panics or allocates by a count it was told: anything
//! malformed (truncated, an unknown kind, bytes after the last entry) is a `ReadError`
//! saying what and where. Text fields are returned as bytes; each reader decides what UTF-8
//! it needs.

pub const MAGIC: &[u8; 4] = b"RTP1";

pub const KIND_MESSAGE: u8 = 1;
pub const KIND_PRESENCE: u8 = 2;
pub const KIND_CHANGE: u8 = 3;
pub const KIND_GAP: u8 = 4;
pub const KIND_FILTERED: u8 = 5;
pub const KIND_DROPPED: u8 = 6;

pub const F_PRIVATE: u8 = 1;
pub const F_BINARY: u8 = 2;
pub const F_PAYLOAD: u8 = 4;
pub const F_ID: u8 = 8;
pub const F_ORIGIN: u8 = 16;

/// One entry as it is in the value, its text borrowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A message, a presence diff, a change or a dropped message.
    Record(Found<'a>),
    /// Messages evicted before they were read.
    Gap { seq: i64, first: i64, last: i64 },
    /// Messages for topics this consumer does not listen to, read through up to `seq`.
    Filtered { seq: i64 },
}

impl Entry<'_> {
    pub fn seq(&self) -> i64 {
        match self {
            Entry::Record(r) => r.seq,
            Entry::Gap { seq, .. } | Entry::Filtered { seq } => *seq,
        }
    }
}

/// A message, presence diff or change as read. Its flags are read here, once for both
/// readers: what a flag says is absent is None.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<'a> {
    /// `KIND_MESSAGE`, `KIND_PRESENCE`, `KIND_CHANGE` or `KIND_DROPPED`.
    pub kind: u8,
    pub flags: u8,
    pub seq: i64,
    pub committed_us: i64,
    id: &'a [u8; 16],
    origin: i64,
    pub topic: &'a [u8],
    pub event: &'a [u8],
    payload: &'a [u8],
}

impl<'a> Found<'a> {
    pub fn private(&self) -> bool {
        self.flags & F_PRIVATE != 0
    }
    /// The payload is bytes, not JSON text.
    pub fn binary(&self) -> bool {
        self.flags & F_BINARY != 0
    }
    /// The payload (a change's `data`; None: NULL, a change whose table was not asked for).
    pub fn payload(&self) -> Option<&'a [u8]> {
        (self.flags & F_PAYLOAD != 0).then_some(self.payload)
    }
    pub fn id(&self) -> Option<&'a [u8; 16]> {
        (self.flags & F_ID != 0).then_some(self.id)
    }
    /// The connection a client broadcast came from.
    pub fn origin(&self) -> Option<i64> {
        (self.flags & F_ORIGIN != 0).then_some(self.origin)
    }
}

/// What is wrong with a value that is not a packed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// It ends at byte `len` where `wanted` more were expected (from byte `at`).
    Truncated {
        at: usize,
        wanted: usize,
        len: usize,
    },
    /// It does not start with `MAGIC`.
    NotPacked,
    /// Entry `entry` (counted from 1), at byte `at`, has an unknown kind.
    UnknownKind { entry: usize, at: usize, kind: u8 },
    /// `bytes` bytes follow the last entry.
    Trailing { bytes: usize },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Truncated { wanted, len, .. } => {
                write!(f, "it ends at byte {len} where {wanted} more were expected")
            }
            ReadError::NotPacked => write!(f, "it does not start with \"RTP1\""),
            ReadError::UnknownKind { entry, kind, .. } => {
                write!(f, "entry {entry} has unknown kind {kind}")
            }
            ReadError::Trailing { bytes } => write!(f, "{bytes} bytes follow the last entry"),
        }
    }
}

/// Reads a packed batch's entries, in order.
pub fn read(value: &[u8]) -> Result<Vec<Entry<'_>>, ReadError> {
    let mut r = Reader {
        at: 0,
        bytes: value,
    };
    if r.take(4)? != MAGIC {
        return Err(ReadError::NotPacked);
    }
    let count = r.u32()? as usize;
    // Every entry takes at least 10 bytes: a count beyond that is not believed (and does not
    // size an allocation).
    let mut out = Vec::with_capacity(count.min(r.left() / 10));
    for i in 0..count {
        let at = r.at;
        let kind = r.u8()?;
        let flags = r.u8()?;
        let seq = r.i64()?;
        out.push(match kind {
            KIND_GAP => Entry::Gap {
                seq,
                first: r.i64()?,
                last: r.i64()?,
            },
            KIND_FILTERED => Entry::Filtered { seq },
            KIND_MESSAGE | KIND_PRESENCE | KIND_CHANGE | KIND_DROPPED => Entry::Record(Found {
                kind,
                flags,
                seq,
                committed_us: r.i64()?,
                id: r.take(16)?.try_into().expect("16 bytes"),
                origin: r.i64()?,
                topic: r.str()?,
                event: r.str()?,
                payload: r.str()?,
            }),
            kind => {
                return Err(ReadError::UnknownKind {
                    entry: i + 1,
                    at,
                    kind,
                })
            }
        });
    }
    if r.left() != 0 {
        return Err(ReadError::Trailing { bytes: r.left() });
    }
    Ok(out)
}

struct Reader<'a> {
    at: usize,
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        if n > self.left() {
            return Err(ReadError::Truncated {
                at: self.at,
                wanted: n,
                len: self.bytes.len(),
            });
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, ReadError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, ReadError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, ReadError> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self) -> Result<&'a [u8], ReadError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// A batch being packed.
pub struct Writer {
    buf: Vec<u8>,
    count: u32,
    last: Option<i64>,
}

impl Default for Writer {
    fn default() -> Self {
        let mut buf = Vec::with_capacity(4096);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&0u32.to_le_bytes());
        Writer {
            buf,
            count: 0,
            last: None,
        }
    }
}

/// A message, presence diff or change to write (`Writer::record`).
pub struct Record<'a> {
    /// `KIND_MESSAGE`, `KIND_PRESENCE`, `KIND_CHANGE` or `KIND_DROPPED`.
    pub kind: u8,
    /// `F_PRIVATE` and `F_BINARY`; the presence flags are set from the fields below.
    pub flags: u8,
    pub seq: i64,
    pub committed_us: i64,
    pub id: Option<&'a [u8; 16]>,
    /// 0: none.
    pub origin: i64,
    pub topic: &'a [u8],
    pub event: &'a [u8],
    pub payload: Option<&'a [u8]>,
}

impl Writer {
    fn head(&mut self, kind: u8, flags: u8, seq: i64) {
        self.count += 1;
        self.last = Some(seq);
        self.buf.push(kind);
        self.buf.push(flags);
        self.buf.extend_from_slice(&seq.to_le_bytes());
    }

    fn str(&mut self, s: &[u8]) {
        self.buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(s);
    }

    pub fn record(&mut self, r: Record<'_>) {
        let flags = r.flags
            | if r.id.is_some() { F_ID } else { 0 }
            | if r.origin != 0 { F_ORIGIN } else { 0 }
            | if r.payload.is_some() { F_PAYLOAD } else { 0 };
        let payload = r.payload.unwrap_or_default();
        self.buf
            .reserve(2 + 8 + 8 + 16 + 8 + 12 + r.topic.len() + r.event.len() + payload.len());
        self.head(r.kind, flags, r.seq);
        self.buf.extend_from_slice(&r.committed_us.to_le_bytes());
        self.buf.extend_from_slice(r.id.unwrap_or(&[0; 16]));
        self.buf.extend_from_slice(&r.origin.to_le_bytes());
        self.str(r.topic);
        self.str(r.event);
        self.str(payload);
    }

    /// Messages `first`..=`last` were evicted (the entry's sequence is `last`).
    pub fn gap(&mut self, first: i64, last: i64) {
        self.head(KIND_GAP, 0, last);
        self.buf.extend_from_slice(&first.to_le_bytes());
        self.buf.extend_from_slice(&last.to_le_bytes());
    }

    /// Messages of other consumers' topics were read through up to `seq`.
    pub fn filtered(&mut self, seq: i64) {
        self.head(KIND_FILTERED, 0, seq);
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The sequence of the last entry written.
    pub fn last_seq(&self) -> Option<i64> {
        self.last
    }

    /// The finished value.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf[4..8].copy_from_slice(&self.count.to_le_bytes());
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the writer writes, the reader reads back, entry by entry, flags included: the
    /// two sides of the format agree.
    #[test]
    fn every_kind_written_is_read_back_as_written() {
        let id = [7u8; 16];
        let mut w = Writer::default();
        assert!(w.is_empty());
        w.record(Record {
            kind: KIND_MESSAGE,
            flags: F_PRIVATE,
            seq: 1,
            committed_us: 1_700_000_000_000_000,
            id: Some(&id),
            origin: 42,
            topic: b"room:1",
            event: b"chat",
            payload: Some(br#"{"a":1}"#),
        });
        w.record(Record {
            kind: KIND_MESSAGE,
            flags: F_BINARY,
            seq: 2,
            committed_us: 5,
            id: None,
            origin: 0,
            topic: b"bin",
            event: b"e",
            payload: Some(&[0, 255, 1]),
        });
        w.record(Record {
            kind: KIND_CHANGE,
            flags: 0,
            seq: 3,
            committed_us: 6,
            id: None,
            origin: 0,
            topic: b"public.todos",
            event: b"",
            payload: None,
        });
        w.gap(4, 9);
        w.filtered(12);
        assert_eq!(w.last_seq(), Some(12));
        let value = w.finish();
        let got = read(&value).unwrap();
        assert_eq!(got.len(), 5);
        let Entry::Record(m) = &got[0] else {
            panic!("{:?}", got[0])
        };
        assert_eq!(
            (m.kind, m.seq, m.committed_us),
            (KIND_MESSAGE, 1, 1_700_000_000_000_000)
        );
        assert_eq!((m.topic, m.event), (&b"room:1"[..], &b"chat"[..]));
        assert!(m.private() && !m.binary());
        assert_eq!(m.id(), Some(&id));
        assert_eq!(m.origin(), Some(42));
        assert_eq!(m.payload(), Some(&br#"{"a":1}"#[..]));
        let Entry::Record(bin) = &got[1] else {
            panic!("{:?}", got[1])
        };
        assert!(bin.binary() && !bin.private());
        assert_eq!((bin.id(), bin.origin()), (None, None));
        assert_eq!(bin.payload(), Some(&[0, 255, 1][..]));
        let Entry::Record(change) = &got[2] else {
            panic!("{:?}", got[2])
        };
        assert_eq!((change.kind, change.flags), (KIND_CHANGE, 0));
        assert_eq!(change.payload(), None, "absent, not empty");
        assert_eq!(
            got[3],
            Entry::Gap {
                seq: 9,
                first: 4,
                last: 9
            }
        );
        assert_eq!(got[4], Entry::Filtered { seq: 12 });
        assert_eq!(
            got.iter().map(Entry::seq).collect::<Vec<_>>(),
            [1, 2, 3, 9, 12]
        );
    }

    #[test]
    fn a_malformed_value_says_what_and_where() {
        assert_eq!(
            read(b""),
            Err(ReadError::Truncated {
                at: 0,
                wanted: 4,
                len: 0
            })
        );
        assert_eq!(read(b"RTP2\0\0\0\0"), Err(ReadError::NotPacked));
        let mut unknown = Writer::default().finish();
        unknown[4] = 1;
        unknown.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            read(&unknown),
            Err(ReadError::UnknownKind {
                entry: 1,
                at: 8,
                kind: 9
            })
        );
        assert_eq!(
            read(&unknown).unwrap_err().to_string(),
            "entry 1 has unknown kind 9"
        );
        let mut trailing = Writer::default().finish();
        trailing.push(0);
        assert_eq!(read(&trailing), Err(ReadError::Trailing { bytes: 1 }));
        // A count far beyond the bytes there: truncated, and no allocation of its size.
        let mut counted = Writer::default().finish();
        counted[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read(&counted), Err(ReadError::Truncated { .. })));
    }
}
