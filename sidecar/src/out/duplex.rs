//! The stream tungstenite is given for a connection: the socket's read half, and the
//! connection's outbound queue for what tungstenite itself writes (`write` has why the sidecar
//! writes frames itself).

use super::queue;
use bytes::Bytes;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;

/// What tungstenite reads from and writes to: the socket's read half (after the bytes the
/// HTTP upgrade read ahead), and the connection's outbound queue for what it writes (pongs,
/// the answer to a client's close), so that its frames keep to frame boundaries.
pub struct Duplex {
    ahead: Bytes,
    read: OwnedReadHalf,
    out: queue::Raw,
}

impl Duplex {
    pub fn new(ahead: Bytes, read: OwnedReadHalf, out: queue::Raw) -> Self {
        Duplex { ahead, read, out }
    }
}

impl AsyncRead for Duplex {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.ahead.is_empty() {
            let n = self.ahead.len().min(buf.remaining());
            let taken = self.ahead.split_to(n);
            buf.put_slice(&taken);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl AsyncWrite for Duplex {
    /// Taken whole into the outbound queue (written by the connection's task, or at once
    /// if nothing is waiting): tungstenite hands whole frames, and a part taken would let
    /// another frame in between.
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.out.push(Bytes::copy_from_slice(buf)) {
            Poll::Ready(Ok(buf.len()))
        } else {
            Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()))
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
