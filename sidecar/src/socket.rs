//! One WebSocket connection's loop: read, write, heartbeat, idle and shutdown.
//!
//! A single task owns the connection. Each client frame is parsed once into a `Command` and
//! handed to the connection's `Channels`, which answer it into their outbound buffer (so a
//! reply always precedes broadcasts on the channel it opened); hub frames come from a
//! bounded queue. Each pass writes both, batching whatever is ready into one flush. The
//! loop ends on close, error, idle timeout, a full queue (the client is too slow), a join
//! rate limit, or server shutdown, each with a close reason (`reason::Disconnect`), and
//! leaves every channel on the way out.

use crate::address::AddressKey;
use crate::channels::Channels;
use crate::command::{self, Frame};
use crate::frame::{self, Vsn};
use crate::jwt::{self, Claims};
use crate::outbound;
use crate::reason::Disconnect;
use crate::state::Shared;
use futures_util::{SinkExt, StreamExt};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// Frames written per flush at most, so one busy connection cannot hog its task.
const WRITE_BATCH: usize = 256;
/// How long a closing connection may take to send its close frame.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

pub async fn serve<S>(
    ws: WebSocketStream<S>,
    shared: Arc<Shared>,
    vsn: Vsn,
    socket_claims: Claims,
    headers: String,
    address: AddressKey,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (tx, rx) = outbound::bounded(
        shared.cfg.max_outbound_frames,
        shared.cfg.max_outbound_bytes,
    );
    let mut conn = Channels::new(shared.clone(), vsn, socket_claims, headers, tx, address);
    let ttl = Duration::from_secs(shared.cfg.authorization_ttl_secs.max(1));
    let mut recheck = tokio::time::interval_at((Instant::now() + ttl).into(), ttl);
    // `connections` was counted at upgrade (server.rs); it is given back when this ends.
    shared.metrics.connections_total.increment(1);
    let (mut sink, mut stream) = ws.split();
    let mut shutdown = shared.shutdown.clone();
    let idle_timeout = shared.cfg.idle_timeout();
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);

    // The soonest token expiry among the channels; the timer is moved only when it changes,
    // not on every pass of the loop (a pass per batch of frames written).
    let expiry = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(expiry);
    let mut expiry_exp = i64::MAX;

    let close = loop {
        let soonest = conn.soonest_expiry();
        if soonest != expiry_exp {
            expiry_exp = soonest;
            let secs = (soonest.saturating_sub(jwt::now())).clamp(0, 86_400) as u64;
            expiry
                .as_mut()
                .reset((Instant::now() + Duration::from_secs(secs)).into());
        }
        // The order is a decision (tested by `recheck_is_not_starved_by_a_full_queue`):
        // shutdown and the slow-client cut-off first; then verdicts, re-checks and token
        // expiry, so revocation takes effect even while the outbound queue never empties;
        // then the client's frames; the outbound queue last (it is drained below anyway).
        tokio::select! {
            biased;
            _ = shutdown.changed() => break Some(Disconnect::ShuttingDown),
            _ = rx.overflowed() => break Some(too_slow_close(&shared)),
            Some(answer) = conn.next_answer() => conn.on_answer(answer),
            _ = recheck.tick() => conn.recheck_all(),
            _ = &mut expiry, if conn.has_channels() => {
                conn.expire_tokens();
                expiry_exp = i64::MIN;
            }
            frame = stream.next() => {
                idle.as_mut().reset((Instant::now() + idle_timeout).into());
                match frame {
                    Some(Ok(msg)) => match read(&conn, vsn, msg) {
                        Read::Frame(f) => {
                            if let Err(why) = conn.handle(f) {
                                break Some(why);
                            }
                        }
                        Read::Nothing => {}
                        Read::Close(why) => break Some(why),
                    },
                    Some(Err(WsError::Capacity(e))) => {
                        tracing::debug!(conn = conn.id(), error = %e, "frame too large");
                        break Some(Disconnect::FrameTooLarge);
                    }
                    Some(Err(e)) => {
                        tracing::debug!(conn = conn.id(), error = %e, "websocket error");
                        break Some(Disconnect::InvalidFrame);
                    }
                    None => break None,
                }
            }
            _ = &mut idle => break Some(Disconnect::IdleTimeout),
            Some(msg) = rx.recv() => conn.out.push(msg),
        }
        // Write what handling produced plus whatever the hub has queued, then flush once.
        while conn.out.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(msg) => conn.out.push(msg),
                Err(_) => break,
            }
        }
        if !conn.out.is_empty() {
            let batch = std::mem::take(&mut conn.out);
            let write = async {
                for msg in batch {
                    sink.feed(msg).await?;
                }
                sink.flush().await
            };
            // A client that stops reading blocks this write; it must not block being cut off.
            tokio::select! {
                r = write => if r.is_err() { break None; },
                _ = rx.overflowed() => break Some(too_slow_close(&shared)),
                _ = shutdown.changed() => break Some(Disconnect::ShuttingDown),
            }
        }
    };

    conn.leave_all();
    drop(rx);
    // A close frame with the reason, unless the client is not reading at all: then the
    // connection is just dropped after a grace period.
    let last_words = std::mem::take(&mut conn.out);
    let goodbye = async {
        // Replies produced by the frame that ended the connection (a rate-limit error, say).
        for msg in last_words {
            let _ = sink.feed(msg).await;
        }
        if let Some(why) = close {
            let _ = sink
                .send(Message::Close(Some(CloseFrame {
                    code: why.code(),
                    reason: why.text().into(),
                })))
                .await;
        }
        let _ = sink.close().await;
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, goodbye).await;
    shared.metrics.connections.fetch_sub(1, Relaxed);
}

fn too_slow_close(shared: &Shared) -> Disconnect {
    shared.metrics.slow_disconnects_total.increment(1);
    Disconnect::TooSlow
}

/// What one WebSocket message amounts to.
enum Read {
    Frame(Frame),
    /// A ping or pong (tungstenite answers pings), or a malformed frame, which Supabase
    /// drops (MalformedWebSocketMessage) while keeping the socket.
    Nothing,
    Close(Disconnect),
}

fn read(conn: &Channels, vsn: Vsn, msg: Message) -> Read {
    let parsed = match msg {
        Message::Text(t) => command::from_text(vsn, t.as_str()),
        Message::Binary(b) if vsn == Vsn::V2 => command::from_binary(&b),
        Message::Binary(_) => Err(frame::DecodeError::Binary(
            "binary frames need serializer 2.0.0",
        )),
        Message::Close(_) => return Read::Close(Disconnect::ClientClosed),
        _ => return Read::Nothing,
    };
    match parsed {
        Ok(f) => Read::Frame(f),
        Err(e) => {
            conn.metrics().malformed_frames_total.increment(1);
            tracing::debug!(conn = conn.id(), error = %e, "malformed frame");
            Read::Nothing
        }
    }
}
