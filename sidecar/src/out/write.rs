//! The socket's write side as the sidecar drives it itself: WebSocket frames as the bytes a
//! server puts on the wire, written with one system call straight from whoever has them (the
//! hub's fan-out with `send(2)`, without waking the connection's task; the task itself with a
//! vectored write through tokio), and the read side handed to tungstenite as before.
//!
//! Why: at 500 messages/s to 1,000 subscribers of one channel (`pgbench/RESULTS.md`, issue
//! 28) the sidecar's CPU went 57% to the `sendto` of each connection's batch and most of the
//! rest to what surrounded it: waking the connection's task, its `select!` passes, and
//! tungstenite copying each frame into the connection's write buffer behind a lock. A
//! server's frames are not masked, so a frame is a few header bytes plus the payload every
//! subscriber shares: written as `[header, payload]` slices, nothing is copied.
//!
//! tungstenite still reads and parses the client's frames, and answers pings and closes;
//! what it writes (`duplex::Duplex`) joins the connection's outbound queue at a frame
//! boundary, so it never lands inside a frame of ours.

use bytes::Bytes;
use std::io::{self, IoSlice};
use std::sync::Arc;
use tokio::net::tcp::OwnedWriteHalf;
use tokio_tungstenite::tungstenite::Message;

/// Where frames are written without waiting: a connected socket's write half, or a test's.
pub trait Socket: Send + Sync {
    /// Writes what it can now from `bufs`, in order; `WouldBlock` when nothing fits.
    /// Through tokio: a `WouldBlock` clears the readiness the connection's task waits on.
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Writes what it can now from `buf`, for a writer that never waits on the socket (the
    /// hub's fan-out): what it cannot write it queues for the connection's task, which
    /// writes through `try_write_vectored` and so keeps tokio's readiness right itself.
    fn send_now(&self, buf: &[u8]) -> io::Result<usize> {
        self.try_write_vectored(&[IoSlice::new(buf)])
    }
}

impl Socket for OwnedWriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        OwnedWriteHalf::try_write_vectored(self, bufs)
    }

    /// `send(2)` on the socket itself. Why not tokio's write: at 300 msg/s to 1,000
    /// subscribers 84% of the sidecar's CPU was the kernel's `writev` of each connection's
    /// batch, 6.6% of it the file layer `writev` passes through before TCP (`vfs_writev`,
    /// `fdget_pos`), and outside it tokio's readiness check around each write (`try_io`, a
    /// cache line per socket) 4% (`pgbench/RESULTS.md`, issue 28). The hub holds the write half,
    /// so the descriptor stays open while it writes; the socket is non-blocking (tokio's),
    /// and MSG_NOSIGNAL makes a closed peer an `EPIPE` for the connection's task to meet.
    fn send_now(&self, buf: &[u8]) -> io::Result<usize> {
        let socket = socket2::SockRef::from(self.as_ref());
        socket.send_with_flags(buf, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
    }
}

/// A server frame's header: FIN, the opcode, no mask, the length. At most 10 bytes.
#[derive(Clone, Copy)]
pub struct Header {
    bytes: [u8; 10],
    len: u8,
}

impl Header {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// The header and payload of `m` as one unfragmented, unmasked frame; None for what this
/// path does not write (`Message::Frame`, which tungstenite builds only for its own use).
pub fn parts(m: &Message) -> Option<(Header, &[u8])> {
    let (opcode, payload): (u8, &[u8]) = match m {
        Message::Text(t) => (0x1, t.as_bytes()),
        Message::Binary(b) => (0x2, b),
        Message::Ping(b) => (0x9, b),
        Message::Pong(b) => (0xA, b),
        // The close frame is built by `close_frame`; a bare one has no payload.
        Message::Close(_) => return None,
        Message::Frame(_) => return None,
    };
    Some((header(opcode, payload.len()), payload))
}

fn header(opcode: u8, len: usize) -> Header {
    let mut bytes = [0u8; 10];
    bytes[0] = 0x80 | opcode;
    let n = if len < 126 {
        bytes[1] = len as u8;
        2
    } else if len <= u16::MAX as usize {
        bytes[1] = 126;
        bytes[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        4
    } else {
        bytes[1] = 127;
        bytes[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    };
    Header { bytes, len: n }
}

/// The bytes of `m` as a frame on the wire (0 for what this path does not write).
pub fn encoded_len(m: &Message) -> usize {
    parts(m).map_or(0, |(h, p)| h.as_slice().len() + p.len())
}

/// `frames` as frames on the wire, back to back: what every subscriber of a run gets, made
/// once for all of them.
pub fn encode(frames: &[Message]) -> Bytes {
    let mut out = Vec::with_capacity(frames.iter().map(encoded_len).sum());
    for (h, p) in frames.iter().filter_map(parts) {
        out.extend_from_slice(h.as_slice());
        out.extend_from_slice(p);
    }
    Bytes::from(out)
}

/// The payload of `m` as shared bytes (no copy), for a frame left half written.
pub fn payload_bytes(m: &Message) -> Bytes {
    match m {
        Message::Text(t) => AsRef::<Bytes>::as_ref(t).clone(),
        Message::Binary(b) | Message::Ping(b) | Message::Pong(b) => b.clone(),
        Message::Close(_) | Message::Frame(_) => Bytes::new(),
    }
}

/// A whole close frame: the code and the reason (RFC 6455 5.5.1).
pub fn close_frame(code: u16, reason: &str) -> Bytes {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    let h = header(0x8, payload.len());
    let mut frame = h.as_slice().to_vec();
    frame.extend_from_slice(&payload);
    Bytes::from(frame)
}

/// The write half as the outbound queue's socket.
pub fn socket(write: OwnedWriteHalf) -> Arc<dyn Socket> {
    Arc::new(write)
}

/// Frames per vectored write (two slices each: under any system's IOV_MAX).
pub(super) const WRITE_FRAMES: usize = 64;

/// Writes `frames` to `socket` in vectored calls until all are written or the socket takes
/// no more; returns how many frames were written whole, and the unwritten tail of the one
/// written in part, if any.
pub(super) fn direct(
    socket: &dyn Socket,
    frames: &[Message],
) -> io::Result<(usize, Option<Bytes>)> {
    let mut done = 0;
    while done < frames.len() {
        let chunk = &frames[done..frames.len().min(done + WRITE_FRAMES)];
        let mut headers = [None; WRITE_FRAMES];
        for (h, m) in headers.iter_mut().zip(chunk) {
            *h = parts(m).map(|(h, _)| h);
        }
        let mut slices = [IoSlice::new(&[]); WRITE_FRAMES * 2];
        let mut n = 0;
        let mut total = 0;
        for (h, m) in headers.iter().zip(chunk) {
            let (Some(h), Some((_, payload))) = (h, parts(m)) else {
                continue;
            };
            slices[n] = IoSlice::new(h.as_slice());
            slices[n + 1] = IoSlice::new(payload);
            n += 2;
            total += h.as_slice().len() + payload.len();
        }
        let written = match socket.try_write_vectored(&slices[..n]) {
            Ok(w) => w,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((done, None)),
            Err(e) => return Err(e),
        };
        // Whole frames written, then the tail of the one cut, if any.
        let mut left = written;
        for (h, m) in headers.iter().zip(chunk) {
            let Some((_, payload)) = parts(m) else {
                done += 1;
                continue;
            };
            let len = h.map_or(0, |h| h.as_slice().len()) + payload.len();
            if left >= len {
                left -= len;
                done += 1;
                continue;
            }
            return Ok((done + 1, Some(tail(m, left))));
        }
        if written < total {
            return Ok((done, None));
        }
    }
    Ok((done, None))
}

/// Writes `encoded` (the frames `frames`, encoded back to back) in one call; returns as
/// `direct` does.
pub(super) fn encoded(
    socket: &dyn Socket,
    frames: &[Message],
    encoded: &Bytes,
) -> io::Result<(usize, Option<Bytes>)> {
    let written = match socket.send_now(encoded) {
        Ok(w) => w,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((0, None)),
        Err(e) => return Err(e),
    };
    if written == encoded.len() {
        return Ok((frames.len(), None));
    }
    let mut at = 0;
    for (i, m) in frames.iter().enumerate() {
        let end = at + encoded_len(m);
        if written < end {
            if written == at {
                return Ok((i, None));
            }
            return Ok((i + 1, Some(encoded.slice(written..end))));
        }
        at = end;
    }
    Ok((frames.len(), None))
}

/// What is left of frame `m` after its first `written` bytes.
fn tail(m: &Message, written: usize) -> Bytes {
    let (h, _) = parts(m).expect("only frames with parts are written");
    let h = h.as_slice();
    let payload = payload_bytes(m);
    if written < h.len() {
        let mut b = h[written..].to_vec();
        b.extend_from_slice(&payload);
        Bytes::from(b)
    } else {
        payload.slice(written - h.len()..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_follow_rfc_6455_lengths() {
        let hi = Message::text("hi");
        let (h, p) = parts(&hi).unwrap();
        assert_eq!(h.as_slice(), &[0x81, 2]);
        assert_eq!(p, b"hi");
        let big = Message::binary(vec![7u8; 300]);
        let (h, _) = parts(&big).unwrap();
        assert_eq!(h.as_slice(), &[0x82, 126, 1, 44]);
        let huge = Message::binary(vec![0u8; 70_000]);
        let (h, _) = parts(&huge).unwrap();
        assert_eq!(h.as_slice(), &[0x82, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]);
        assert_eq!(
            &close_frame(1000, "ok")[..],
            &[0x88, 4, 0x03, 0xE8, b'o', b'k']
        );
    }

    /// The frames written here read back as the same messages with tungstenite's own
    /// client-side parser.
    #[test]
    fn tungstenite_reads_back_what_is_written() {
        use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};
        let msgs = [
            Message::text("hello"),
            Message::binary(vec![1u8; 200]),
            Message::binary(vec![2u8; 66_000]),
        ];
        let mut wire = Vec::new();
        for m in &msgs {
            let (h, p) = parts(m).unwrap();
            wire.extend_from_slice(h.as_slice());
            wire.extend_from_slice(p);
        }
        wire.extend_from_slice(&close_frame(4000, "bye"));
        let mut ws = WebSocket::from_raw_socket(
            io::Cursor::new(wire),
            Role::Client,
            Some(Default::default()),
        );
        for m in &msgs {
            assert_eq!(&ws.read().unwrap(), m);
        }
        match ws.read().unwrap() {
            Message::Close(Some(c)) => {
                assert_eq!(u16::from(c.code), 4000);
                assert_eq!(c.reason.as_str(), "bye");
            }
            other => panic!("not a close: {other:?}"),
        }
    }
}
