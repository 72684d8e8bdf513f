//! The stream tungstenite is given for a connection: the socket's read half, and the
//! connection's outbound queue for what tungstenite itself writes (`write` has why the sidecar
//! writes frames itself).

use super::queue;
use crate::reading::{Meter, Refused};
use bytes::Bytes;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;

/// What tungstenite reads from and writes to: the socket's read half (after the bytes the
/// HTTP upgrade read ahead), and the connection's outbound queue for what it writes (pongs,
/// the answer to a client's close), so that its frames keep to frame boundaries. What is read
/// passes the connection's `Meter` (`reading`): a frame past the reading bounds fails the read.
pub struct Duplex {
    ahead: Bytes,
    read: OwnedReadHalf,
    out: queue::Raw,
    meter: Meter,
}

impl Duplex {
    pub fn new(ahead: Bytes, read: OwnedReadHalf, out: queue::Raw, meter: Meter) -> Self {
        Duplex {
            ahead,
            read,
            out,
            meter,
        }
    }
}

impl AsyncRead for Duplex {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.meter.reading();
        let from = buf.filled().len();
        if !this.ahead.is_empty() {
            let n = this.ahead.len().min(buf.remaining());
            let taken = this.ahead.split_to(n);
            buf.put_slice(&taken);
        } else {
            match Pin::new(&mut this.read).poll_read(cx, buf) {
                Poll::Ready(Ok(())) => {}
                pending_or_failed => return pending_or_failed,
            }
        }
        match this.meter.read(&buf.filled()[from..]) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(over) => Poll::Ready(Err(io::Error::other(Refused(over)))),
        }
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
