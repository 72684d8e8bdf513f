//! A batch of `realtime.drain_packed` read in place into the drain's typed rows (`rows::Read`).
//!
//! The extension packs a drained batch into one `bytea`; the layout, its writer and its
//! reader are defined once for both sides in the `realtime-packed` crate
//! (`extension/packed/src/lib.rs`).
//!
//! Instead of twelve columns a message through the executor, the wire and a parse per
//! column, a batch is one value read with bounds checks and no copy of what the drainer only
//! looks at: a change's table and data and a presence diff are borrowed from the value. A
//! broadcast becomes the hub's `QueueMessage`, which owns its strings. Anything malformed
//! (truncated, an unknown kind, text that is not UTF-8, bytes after the last entry) is an
//! error naming what and where, never a panic.

use crate::hub::{Payload, QueueMessage, TopicKey};
use crate::rows::{As, Entry, Read};
use bytes::Bytes;
use realtime_packed::{Entry as Packed, ReadError, KIND_CHANGE, KIND_DROPPED, KIND_PRESENCE};

/// Reads a packed batch. Err says what is wrong and where.
pub fn read(value: &[u8], how: As) -> Result<Vec<Read<'_>>, String> {
    read_entries(value, how).map_err(|why| format!("malformed packed drain batch: {why}"))
}

fn read_entries(value: &[u8], how: As) -> Result<Vec<Read<'_>>, String> {
    let entries = realtime_packed::read(value).map_err(|e| match e {
        ReadError::Truncated { at, wanted, len } => {
            format!(
                "truncated: {wanted} bytes wanted at byte {at}, {} left",
                len - at
            )
        }
        ReadError::NotPacked => {
            "it does not start with \"RTP1\" (an extension of another version?)".into()
        }
        ReadError::UnknownKind { entry, at, kind } => {
            format!("entry {entry} (at byte {at}) has unknown kind {kind}")
        }
        ReadError::Trailing { .. } => e.to_string(),
    })?;
    let mut out = Vec::with_capacity(entries.len());
    for raw in entries {
        let seq = raw.seq();
        let entry = match raw {
            Packed::Gap { first, last, .. } => Entry::Gap { first, last },
            Packed::Filtered { .. } => Entry::Filtered,
            Packed::Record(r) => {
                let topic = utf8(r.topic)?;
                let payload = r.payload();
                match r.kind {
                    KIND_CHANGE => Entry::Change {
                        committed_us: r.committed_us,
                        table: Some(topic),
                        data: payload.map(utf8).transpose()?,
                    },
                    KIND_PRESENCE => Entry::Presence {
                        committed_us: r.committed_us,
                        key: TopicKey {
                            topic: topic.to_owned(),
                            private: r.private(),
                        },
                        diff: payload.map(utf8).transpose()?,
                    },
                    _ => {
                        let origin = r.origin();
                        let id = r.id().filter(|_| origin.is_none() || how.client_ids);
                        Entry::Message {
                            committed_us: r.committed_us,
                            message: QueueMessage {
                                topic: topic.to_owned(),
                                event: utf8(r.event)?.to_owned(),
                                payload: match payload {
                                    Some(p) if r.binary() => {
                                        Payload::Binary(Bytes::copy_from_slice(p))
                                    }
                                    Some(p) => Payload::Json(utf8(p)?.to_owned()),
                                    None => Payload::Json("null".into()),
                                },
                                private: r.private(),
                                id: id.map(|id| uuid_text(id)),
                                origin,
                                epoch: how.epoch,
                                seq,
                                replayed: how.replayed,
                                dropped: r.kind == KIND_DROPPED,
                            },
                        }
                    }
                }
            }
        };
        out.push(Read { seq, entry });
    }
    Ok(out)
}

fn utf8(b: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(b).map_err(|e| format!("a text field is not valid UTF-8 ({e})"))
}

/// A uuid's 16 bytes as Postgres prints them (lowercase, hyphenated).
fn uuid_text(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(HEX[(byte >> 4) as usize] as char);
        s.push(HEX[(byte & 0xf) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests;
