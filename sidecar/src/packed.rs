//! A batch of `realtime.drain_packed` read in place into the drain's typed rows (`rows::Read`).
//!
//! The extension packs a drained batch into one `bytea` (its layout is documented in
//! `extension/src/packed.rs`; version "RTP1", integers little-endian):
//!
//! ```text
//! value = "RTP1" count:u32 entry{count}
//! entry = kind:u8 flags:u8 seq:i64 body
//!   kind 1 message, 2 presence, 3 change:
//!         committed_us:i64 id:[16]u8 origin:i64 topic:str event:str payload:str
//!   kind 4 gap: lost_first:i64 lost_last:i64
//!   kind 5 filtered: (nothing)
//! str   = len:u32 bytes
//! flags = 1 private | 2 binary payload | 4 payload present | 8 id present | 16 origin present
//! ```
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

const MAGIC: &[u8; 4] = b"RTP1";

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

/// Reads a packed batch. Err says what is wrong and where.
pub fn read(value: &[u8], how: As) -> Result<Vec<Read<'_>>, String> {
    let mut r = Reader {
        at: 0,
        bytes: value,
    };
    read_entries(&mut r, how).map_err(|why| format!("malformed packed drain batch: {why}"))
}

fn read_entries<'r>(r: &mut Reader<'r>, how: As) -> Result<Vec<Read<'r>>, String> {
    if r.take(4)? != MAGIC {
        return Err("it does not start with \"RTP1\" (an extension of another version?)".into());
    }
    let count = r.u32()? as usize;
    // Every entry takes at least 10 bytes: a count beyond that is not believed (and does not
    // size an allocation).
    let mut out = Vec::with_capacity(count.min(r.left() / 10));
    for i in 0..count {
        let entry_at = r.at;
        let kind = r.u8()?;
        let flags = r.u8()?;
        let seq = r.i64()?;
        let entry = match kind {
            KIND_GAP => Entry::Gap {
                first: r.i64()?,
                last: r.i64()?,
            },
            KIND_FILTERED => Entry::Filtered,
            KIND_MESSAGE | KIND_PRESENCE | KIND_CHANGE => {
                let committed_us = r.i64()?;
                let id = r.take(16)?;
                let origin = r.i64()?;
                let topic = r.text()?;
                let event = r.text()?;
                let payload = r.str()?;
                let payload = (flags & F_PAYLOAD != 0).then_some(payload);
                let private = flags & F_PRIVATE != 0;
                match kind {
                    KIND_CHANGE => Entry::Change {
                        committed_us,
                        table: Some(topic),
                        data: payload.map(utf8).transpose()?,
                    },
                    KIND_PRESENCE => Entry::Presence {
                        committed_us,
                        key: TopicKey {
                            topic: topic.to_owned(),
                            private,
                        },
                        diff: payload.map(utf8).transpose()?,
                    },
                    _ => {
                        let origin = (flags & F_ORIGIN != 0).then_some(origin);
                        let keeps_id = flags & F_ID != 0 && (origin.is_none() || how.client_ids);
                        Entry::Message {
                            committed_us,
                            message: QueueMessage {
                                topic: topic.to_owned(),
                                event: event.to_owned(),
                                payload: match payload {
                                    Some(p) if flags & F_BINARY != 0 => {
                                        Payload::Binary(Bytes::copy_from_slice(p))
                                    }
                                    Some(p) => Payload::Json(utf8(p)?.to_owned()),
                                    None => Payload::Json("null".into()),
                                },
                                private,
                                id: keeps_id.then(|| uuid_text(id)),
                                origin,
                                epoch: how.epoch,
                                seq,
                                replayed: how.replayed,
                            },
                        }
                    }
                }
            }
            other => {
                return Err(format!(
                    "entry {} (at byte {entry_at}) has unknown kind {other}",
                    i + 1
                ))
            }
        };
        out.push(Read { seq, entry });
    }
    if r.left() != 0 {
        return Err(format!("{} bytes follow the last entry", r.left()));
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

struct Reader<'a> {
    at: usize,
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.left() {
            return Err(format!(
                "truncated: {n} bytes wanted at byte {}, {} left",
                self.at,
                self.left()
            ));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self) -> Result<i64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(i64::from_le_bytes(a))
    }
    fn str(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Result<&'a str, String> {
        utf8(self.str()?)
    }
}

#[cfg(test)]
mod tests;
