//! The bytes of client frames being read (MAX_READING_BYTES_PER_ADDRESS, MAX_READING_BYTES).
//!
//! tungstenite gathers a message whole before it hands it over, up to MAX_FRAME_SIZE (5 MB);
//! a connection that sends the start of a large message and the rest slowly, or never, holds
//! what was read until its idle timeout. The meter sits under tungstenite, on the bytes it
//! reads (`out::Duplex`): it follows the frames' headers, and when a data frame announces
//! its length it takes the message's bytes so far, past a first `FREE` per message that every
//! connection may use without asking (joins, heartbeats and ordinary broadcasts never touch
//! the shared bounds), from its connection's `Hold` of the reading `ByteBudget`. A take that
//! does not fit fails the read: the socket loop closes that connection with the bound's
//! reason (`reason::Disconnect::Reading`), before its bytes are read, and no other connection
//! waits for it. A message that passes MAX_FRAME_SIZE is left to tungstenite, which refuses
//! it (close 1009) without the meter taking anything for it.
//!
//! A message's bytes are given back at the next read after it is whole: tungstenite reads
//! again only once the socket loop has taken the message (or when it needs more for the next
//! one), so what is held covers every message tungstenite has not handed over. The meter
//! has no IO (`Meter::read` is given the bytes), so it is tested on byte sequences.

use crate::byte_budget::{Hold, Over};

/// Bytes of each message read without taking from the shared bounds.
pub const FREE: usize = 64 * 1024;

/// Why a read failed: carried in the `io::Error` tungstenite reports to the socket loop.
#[derive(Debug)]
pub struct Refused(pub Over);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "frames being read passed their bound ({:?})", self.0)
    }
}

impl std::error::Error for Refused {}

impl Refused {
    /// The `Refused` inside an error tungstenite reported, if it is one.
    pub fn of(e: &std::io::Error) -> Option<Over> {
        e.get_ref()?.downcast_ref::<Refused>().map(|r| r.0)
    }
}

/// Where the meter is in the stream of a connection's frames.
#[derive(Clone, Copy, Debug)]
enum At {
    /// Reading a frame header: `have` of its bytes so far.
    Header { have: usize },
    /// Inside a frame's payload: `left` bytes to go.
    Payload { left: u64 },
}

/// One connection's meter.
pub struct Meter {
    hold: Hold,
    /// Past this a message is tungstenite's to refuse (MAX_FRAME_SIZE).
    max_message: u64,
    at: At,
    header: [u8; 14],
    /// The frame being read is a data frame (not a ping, pong or close) and ends a message.
    data: bool,
    fin: bool,
    /// Payload bytes of the message being read, its frames so far.
    message: u64,
    /// Taken for messages already whole, given back at the next read.
    whole: usize,
}

impl Meter {
    pub fn new(hold: Hold, max_message: usize) -> Meter {
        Meter {
            hold,
            max_message: max_message as u64,
            at: At::Header { have: 0 },
            header: [0; 14],
            data: false,
            fin: false,
            message: 0,
            whole: 0,
        }
    }

    /// A read is about to happen: the messages already whole have been taken.
    pub fn reading(&mut self) {
        if self.whole > 0 {
            self.whole = 0;
            let _ = self.hold.set(self.charge());
        }
    }

    /// Follows `bytes`, just read; Err when a frame they announce does not fit.
    pub fn read(&mut self, mut bytes: &[u8]) -> Result<(), Over> {
        while !bytes.is_empty() {
            match self.at {
                At::Header { have } => {
                    self.header[have] = bytes[0];
                    bytes = &bytes[1..];
                    let have = have + 1;
                    match header_length(&self.header[..have]) {
                        Some(n) if n == have => self.frame_starts()?,
                        _ => self.at = At::Header { have },
                    }
                }
                At::Payload { left } => {
                    let n = (bytes.len() as u64).min(left);
                    bytes = &bytes[n as usize..];
                    self.at = At::Payload { left: left - n };
                    if left == n {
                        self.frame_ends();
                    }
                }
            }
        }
        Ok(())
    }

    /// What is held for the message being read: its bytes past `FREE`, while tungstenite
    /// may still take it whole.
    fn charge(&self) -> usize {
        if self.message > self.max_message {
            return self.whole;
        }
        self.whole + (self.message as usize).saturating_sub(FREE)
    }

    fn frame_starts(&mut self) -> Result<(), Over> {
        let h = &self.header;
        let opcode = h[0] & 0x0f;
        self.fin = h[0] & 0x80 != 0;
        self.data = opcode < 8;
        let length = payload_length(h);
        if self.data {
            self.message = self.message.saturating_add(length);
            self.hold.set(self.charge())?;
        }
        self.at = At::Payload { left: length };
        if length == 0 {
            self.frame_ends();
        }
        Ok(())
    }

    fn frame_ends(&mut self) {
        self.at = At::Header { have: 0 };
        if self.data && self.fin {
            self.whole = self.charge();
            self.message = 0;
        }
    }
}

/// A frame header's length, once its first bytes tell it (RFC 6455 5.2: two bytes, then
/// 2 or 8 of extended length, then the 4-byte mask when the mask bit is set).
fn header_length(h: &[u8]) -> Option<usize> {
    if h.len() < 2 {
        return None;
    }
    let extended = match h[1] & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if h[1] & 0x80 != 0 { 4 } else { 0 };
    Some(2 + extended + mask)
}

fn payload_length(h: &[u8]) -> u64 {
    match h[1] & 0x7f {
        126 => u64::from(u16::from_be_bytes([h[2], h[3]])),
        127 => u64::from_be_bytes(h[2..10].try_into().unwrap()),
        n => u64::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::AddressKey;
    use crate::byte_budget::ByteBudget;

    /// A masked client frame: `opcode` with FIN as given, `len` payload bytes.
    fn frame(fin: bool, opcode: u8, len: usize) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 | opcode } else { opcode }];
        match len {
            0..=125 => f.push(0x80 | len as u8),
            126..=65535 => {
                f.push(0x80 | 126);
                f.extend((len as u16).to_be_bytes());
            }
            _ => {
                f.push(0x80 | 127);
                f.extend((len as u64).to_be_bytes());
            }
        }
        f.extend([1, 2, 3, 4]);
        f.extend(std::iter::repeat_n(b'x', len));
        f
    }

    fn address() -> Option<AddressKey> {
        Some(AddressKey::of("192.0.2.1".parse().unwrap()))
    }

    #[test]
    fn small_messages_take_nothing_and_a_large_one_its_bytes_past_free() {
        let budget = ByteBudget::new(1 << 20, 1 << 30);
        let mut m = Meter::new(budget.holder(address()), 5_000_000);
        m.read(&frame(true, 1, 100)).unwrap();
        m.read(&frame(true, 9, 4)).unwrap(); // a ping
        m.reading();
        assert_eq!(budget.held(), 0);
        // The header alone takes the whole frame's bytes, before any of them is read.
        let big = frame(true, 2, FREE + 1000);
        m.read(&big[..14]).unwrap();
        assert_eq!(budget.held(), 1000);
        m.read(&big[14..]).unwrap();
        assert_eq!(budget.held(), 1000);
        // Given back at the next read, once tungstenite has handed the message over.
        m.reading();
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_message_in_fragments_counts_every_fragment_and_not_the_control_frames_between() {
        let budget = ByteBudget::new(1 << 20, 1 << 30);
        let mut m = Meter::new(budget.holder(address()), 5_000_000);
        let mut bytes = frame(false, 1, FREE);
        bytes.extend(frame(true, 10, 3)); // a pong inside the message
        bytes.extend(frame(false, 0, 300));
        bytes.extend(frame(true, 0, 200));
        // Byte by byte: a header may arrive in pieces.
        for b in &bytes {
            m.read(std::slice::from_ref(b)).unwrap();
        }
        assert_eq!(budget.held(), 500);
        m.reading();
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_frame_past_the_bound_fails_the_read_and_one_past_max_frame_size_is_left_to_tungstenite() {
        let budget = ByteBudget::new(100_000, 1 << 30);
        let mut held = Meter::new(budget.holder(address()), 5_000_000);
        held.read(&frame(true, 2, FREE + 90_000)[..14]).unwrap();
        // The same address's second connection: its frame would pass the address's bound.
        let mut second = Meter::new(budget.holder(address()), 5_000_000);
        let announced = frame(true, 2, FREE + 20_000);
        assert_eq!(second.read(&announced[..14]), Err(Over::Address));
        // A frame tungstenite refuses for its size takes nothing.
        let mut huge = Meter::new(budget.holder(address()), 200_000);
        huge.read(&frame(true, 2, 300_000)[..14]).unwrap();
        assert_eq!(budget.held(), 90_000);
        // A small message of that address still needs nothing.
        let mut third = Meter::new(budget.holder(address()), 5_000_000);
        third.read(&frame(true, 1, 1000)).unwrap();
        drop(held);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn two_messages_in_one_read_are_both_held_until_the_next_read() {
        let budget = ByteBudget::new(1 << 20, 1 << 30);
        let mut m = Meter::new(budget.holder(address()), 5_000_000);
        let mut bytes = frame(true, 2, FREE + 10);
        bytes.extend(frame(true, 2, FREE + 20));
        bytes.extend(&frame(true, 2, FREE + 30)[..14]);
        m.read(&bytes).unwrap();
        assert_eq!(budget.held(), 60);
        // The third is still being read: only the whole ones are given back.
        m.reading();
        assert_eq!(budget.held(), 30);
    }
}
