//! The byte layout of one message record, as it sits in a transaction's local buffer and,
//! after commit, in the shared ring.
//!
//! A record is a fixed 56-byte header followed by the topic, the event and the payload bytes,
//! unpadded. Records are copied into the ring with wrap-around, so nothing here depends on
//! alignment: headers are always decoded from a copy.

/// Set while the sending transaction has not yet committed or aborted.
pub const STATE_PENDING: u8 = 1;
/// The transaction committed; the record is (or is about to be) numbered and delivered.
pub const STATE_COMMITTED: u8 = 2;
/// The transaction aborted after reserving space; readers skip the record.
pub const STATE_ABORTED: u8 = 3;

pub const FLAG_PRIVATE: u8 = 1;
pub const FLAG_BINARY: u8 = 2;
/// A captured row change (`capture.rs`), decoded when drained (`change.rs`).
pub const FLAG_CHANGE: u8 = 4;
/// A client broadcast sent with `persist`: Supabase's replay includes it, as it includes
/// the database's messages (`history.rs`); the sidecar also keeps it in
/// `realtime.persisted_messages` for its ttl.
pub const FLAG_PERSIST: u8 = 8;
/// A presence diff (`presence.rs`): drained as kind 'presence', never a broadcast.
pub const FLAG_PRESENCE: u8 = 16;
/// A message that could not be sent, in its place and with its sequence number
/// (`dropped.rs`): its topic and event, and a payload `{"reason", "size"}` (a dropped change
/// keeps only its table's part of the payload). Drained as kind 'dropped', which the
/// sidecar tells the topic's subscribers as a `system` message; never a broadcast.
pub const FLAG_DROPPED: u8 = 32;
/// A relayed message whose sender named its id (`POST /api/broadcast`'s `id`, which
/// Supabase delivers as `meta.id`). Readers report it with no origin, as a database
/// message: its id is shown live, and there is no sending connection to leave out (a REST
/// request has none). It stays a relayed message to the queue: a replay leaves it out.
pub const FLAG_ID_SHOWN: u8 = 64;

pub const HEADER_LEN: usize = 56;
/// Where `committed_at` sits in an encoded header.
pub const COMMITTED_AT: std::ops::Range<usize> = 24..32;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordHeader {
    /// Total record length, header included.
    pub len: u32,
    pub state: u8,
    pub flags: u8,
    pub topic_len: u16,
    pub event_len: u16,
    pub payload_len: u32,
    /// Assigned when the record is published; 0 before that.
    pub seq: u64,
    /// Commit time of the sending transaction (Postgres TimestampTz, µs since 2000-01-01);
    /// while PENDING, the first record of a transaction holds its reservation time instead.
    pub committed_at: i64,
    /// The message id (a v4 uuid), delivered to clients as `meta.id`.
    pub id: [u8; 16],
    /// Who sent it: 0 for the database, else the sidecar connection that relayed a client's
    /// broadcast (so that sidecar can leave the sender out when `self` is false).
    pub origin: u64,
}

impl RecordHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4] = self.state;
        b[5] = self.flags;
        b[6..8].copy_from_slice(&self.topic_len.to_le_bytes());
        b[8..10].copy_from_slice(&self.event_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[COMMITTED_AT].copy_from_slice(&self.committed_at.to_le_bytes());
        b[32..48].copy_from_slice(&self.id);
        b[48..56].copy_from_slice(&self.origin.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Self {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        RecordHeader {
            len: u32_at(0),
            state: b[4],
            flags: b[5],
            topic_len: u16_at(6),
            event_len: u16_at(8),
            payload_len: u32_at(12),
            seq: u64_at(16),
            committed_at: u64_at(24) as i64,
            id: b[32..48].try_into().unwrap(),
            origin: u64_at(48),
        }
    }
}

/// Length of the record that `encode_record` writes for these parts.
pub fn record_len(topic: &str, event: &str, payload_len: usize) -> usize {
    HEADER_LEN + topic.len() + event.len() + payload_len
}

/// Appends one pending record to `out`. Lengths must already have been checked by the caller
/// against the limits in `xact::append`.
pub fn encode_record(
    out: &mut Vec<u8>,
    topic: &str,
    event: &str,
    payload: &[u8],
    flags: u8,
    id: [u8; 16],
    origin: u64,
) {
    let header = RecordHeader {
        len: record_len(topic, event, payload.len()) as u32,
        state: STATE_PENDING,
        flags,
        topic_len: topic.len() as u16,
        event_len: event.len() as u16,
        payload_len: payload.len() as u32,
        seq: 0,
        committed_at: 0,
        id,
        origin,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(topic.as_bytes());
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(payload);
}

/// A decoded view of one contiguous record (as copied out of the ring by a reader).
pub struct MessageView<'a> {
    pub header: RecordHeader,
    pub topic: &'a str,
    pub event: &'a str,
    pub payload: &'a [u8],
}

impl<'a> MessageView<'a> {
    /// Splits `bytes` (exactly one record) into its parts. Topic and event were valid UTF-8
    /// when they were written, so a failure here means shared memory was corrupted.
    pub fn parse(bytes: &'a [u8]) -> Self {
        let header = RecordHeader::decode(&bytes[..HEADER_LEN]);
        let t_end = HEADER_LEN + header.topic_len as usize;
        let e_end = t_end + header.event_len as usize;
        let p_end = e_end + header.payload_len as usize;
        MessageView {
            header,
            topic: std::str::from_utf8(&bytes[HEADER_LEN..t_end]).expect("topic is utf-8"),
            event: std::str::from_utf8(&bytes[t_end..e_end]).expect("event is utf-8"),
            payload: &bytes[e_end..p_end],
        }
    }

    pub fn is_private(&self) -> bool {
        self.header.flags & FLAG_PRIVATE != 0
    }

    pub fn is_binary(&self) -> bool {
        self.header.flags & FLAG_BINARY != 0
    }

    pub fn is_change(&self) -> bool {
        self.header.flags & FLAG_CHANGE != 0
    }

    pub fn is_presence(&self) -> bool {
        self.header.flags & FLAG_PRESENCE != 0
    }

    pub fn is_dropped(&self) -> bool {
        self.header.flags & FLAG_DROPPED != 0
    }

    /// The origin readers report: none for the database's messages and for a relayed one
    /// whose id its sender named (`FLAG_ID_SHOWN`).
    pub fn reported_origin(&self) -> Option<i64> {
        (self.header.origin != 0 && self.header.flags & FLAG_ID_SHOWN == 0)
            .then_some(self.header.origin as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = RecordHeader {
            len: 123,
            state: STATE_COMMITTED,
            flags: FLAG_PRIVATE | FLAG_BINARY,
            topic_len: 7,
            event_len: 3,
            payload_len: 65,
            seq: u64::MAX - 1,
            committed_at: -42,
            id: [9; 16],
            origin: 7 << 32 | 9,
        };
        assert_eq!(RecordHeader::decode(&h.encode()), h);
    }

    #[test]
    fn record_parses_back_into_its_parts() {
        let mut buf = Vec::new();
        encode_record(
            &mut buf,
            "room:1",
            "INSERT",
            b"{\"a\": 1}",
            FLAG_PRIVATE,
            [1; 16],
            5,
        );
        assert_eq!(buf.len(), record_len("room:1", "INSERT", 8));
        let m = MessageView::parse(&buf);
        assert_eq!(m.topic, "room:1");
        assert_eq!(m.event, "INSERT");
        assert_eq!(m.payload, b"{\"a\": 1}");
        assert!(m.is_private());
        assert!(!m.is_binary());
        assert_eq!(m.header.state, STATE_PENDING);
        assert_eq!(m.header.id, [1; 16]);
        assert_eq!(m.header.origin, 5);
    }
}
