//! One WebSocket connection's loop: read, write, heartbeat, idle and shutdown.
//!
//! A single task owns the connection's reading. Each client frame is parsed once into a
//! `Command` and handed to the connection's `Channels`, which answer it into their outbound
//! buffer; those replies are put ahead of anything queued meanwhile (so a reply always
//! precedes broadcasts on the channel it opened). Everything else comes through the bounded
//! outbound queue, which the hub's fan-out writes to the socket itself while nothing is
//! waiting (`crate::out`); the task writes what the socket would not take, when it
//! becomes writable, and whatever other pushers queued, in one vectored write per pass.
//! The loop ends on close, error, idle timeout, a full queue (the client is too slow), a
//! join rate limit, or server shutdown, each with a close reason (`reason::Disconnect`),
//! and leaves every channel on the way out.

use crate::address::AddressKey;
use crate::channels::Channels;
use crate::command::{self, Frame};
use crate::frame::{self, Vsn};
use crate::jwt::{self, Claims};
use crate::out::{self, Duplex, Written};
use crate::postgres_changes::bounds::Bounds;
use crate::reading::{Meter, Refused};
use crate::reason::Disconnect;
use crate::state::Shared;
use bytes::Bytes;
use futures_util::StreamExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// Frames written per pass of the loop at most, so that a connection whose queue never
/// empties is still re-checked and reads its client between passes.
const WRITE_BATCH: usize = 256;
/// How long a closing connection may take to send its close frame.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Serves one upgraded connection: `ahead` is what the HTTP server read past the upgrade
/// request (the client's first frames, if it sent them at once); `address` is what its
/// per-address limits count it against, none for a backend's connection (`Claims::is_backend`).
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    tcp: TcpStream,
    ahead: Bytes,
    ws_config: WebSocketConfig,
    shared: Arc<Shared>,
    vsn: Vsn,
    socket_claims: Claims,
    headers: String,
    address: Option<AddressKey>,
) {
    let (tx, rx) = out::connection(
        shared.cfg.max_outbound_frames,
        shared.cfg.max_outbound_bytes,
        shared.outbound.clone(),
        address,
    );
    let (reader, writer) = tcp.into_split();
    let socket = Arc::new(writer);
    rx.attach(socket.clone());
    // The client's frames being read are held against its address's and the sidecar's
    // bounds (`reading`).
    let meter = Meter::new(shared.reading.holder(address), shared.cfg.max_frame_size);
    let mut stream = WebSocketStream::from_raw_socket(
        Duplex::new(ahead, reader, rx.raw(), meter),
        Role::Server,
        Some(ws_config),
    )
    .await;
    let mut conn = Channels::new(shared.clone(), vsn, socket_claims, headers, tx, address);
    let bounds = Bounds::of(&shared.cfg);
    let ttl = Duration::from_secs(shared.cfg.authorization_ttl_secs.max(1));
    let mut recheck = tokio::time::interval_at((Instant::now() + ttl).into(), ttl);
    // `connections` was counted at upgrade (server.rs); it is given back when this ends.
    shared.metrics.connections_total.increment(1);
    let mut shutdown = shared.shutdown.clone();
    let idle_timeout = shared.cfg.idle_timeout();
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);

    // The soonest token expiry among the channels; the timer is moved only when it changes,
    // not on every pass of the loop (a pass per batch of frames written).
    let expiry = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(expiry);
    let mut expiry_exp = i64::MAX;
    // The socket would not take more: then the loop waits for it to become writable instead
    // of for more to be queued, and serves everything else meanwhile (issue 39, L10: it
    // waited for writability alone, so a client that stopped reading kept its slot past its
    // idle timeout and its token's expiry, and its channels' re-checks stopped).
    let mut blocked = false;

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
        // then the client's frames; the outbound queue last (it is drained below anyway),
        // or while the socket is blocked, its room.
        tokio::select! {
            biased;
            _ = shutdown.changed() => break Some(Disconnect::ShuttingDown),
            _ = rx.overflowed() => break Some(too_slow_close(&shared, &rx)),
            // Each branch that may answer the client holds direct writes first (`hold`),
            // so that nothing of a channel it opens is written before its reply.
            Some(answer) = conn.next_answer() => {
                rx.hold();
                conn.on_answer(answer)
            }
            _ = recheck.tick() => {
                rx.hold();
                conn.recheck_all()
            }
            _ = &mut expiry, if conn.has_channels() => {
                rx.hold();
                conn.expire_tokens();
                expiry_exp = i64::MIN;
            }
            frame = stream.next() => {
                rx.hold();
                idle.as_mut().reset((Instant::now() + idle_timeout).into());
                match frame {
                    Some(Ok(msg)) => match read(&conn, vsn, msg, &bounds) {
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
                    Some(Err(WsError::Io(e))) if Refused::of(&e).is_some() => {
                        let over = Refused::of(&e).expect("matched above");
                        shared.metrics.reading_refusals_total.increment(1);
                        break Some(Disconnect::reading(over));
                    }
                    Some(Err(e)) => {
                        tracing::debug!(conn = conn.id(), error = %e, "websocket error");
                        break Some(Disconnect::InvalidFrame);
                    }
                    None => break None,
                }
            }
            _ = &mut idle => break Some(Disconnect::IdleTimeout),
            r = socket.writable(), if blocked => if r.is_err() { break None; },
            _ = rx.pending(), if !blocked => {}
        }
        // What handling produced goes ahead of what was queued meanwhile; then what waits
        // is written, as far as the socket takes it, up to a batch per pass.
        rx.put_first(std::mem::take(&mut conn.out));
        match rx.write_some(WRITE_BATCH) {
            Ok(Written::All | Written::More) => blocked = false,
            Ok(Written::Blocked) => blocked = true,
            Err(_) => break None,
        }
    };

    conn.leave_all();
    // A close frame with the reason, unless the client is not reading at all: then the
    // connection is just dropped after a grace period. Queued frames are dropped, not the
    // tail of one written in part (the stream ends at a frame boundary).
    rx.discard_queued();
    // Replies produced by the frame that ended the connection (a rate-limit error, say).
    rx.put_first(std::mem::take(&mut conn.out));
    let goodbye = async {
        write_all(&rx, &socket).await?;
        // A client's close was answered by tungstenite already.
        if let Some(why) = close.filter(|why| *why != Disconnect::ClientClosed) {
            rx.raw()
                .push(out::close_frame(why.code().into(), why.text()));
            write_all(&rx, &socket).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, goodbye).await;
    drop(stream);
    drop(rx);
    shared.metrics.connections.fetch_sub(1, Relaxed);
}

/// Writes everything waiting in the outbound queue, waiting for room as the socket needs.
async fn write_all(
    rx: &out::Receiver,
    socket: &tokio::net::tcp::OwnedWriteHalf,
) -> std::io::Result<()> {
    loop {
        match rx.write_some(usize::MAX)? {
            Written::All => return Ok(()),
            Written::Blocked => socket.writable().await?,
            Written::More => {}
        }
    }
}

fn too_slow_close(shared: &Shared, rx: &out::Receiver) -> Disconnect {
    shared.metrics.slow_disconnects_total.increment(1);
    Disconnect::too_slow(rx.cut_by())
}

/// What one WebSocket message amounts to.
enum Read {
    Frame(Frame),
    /// A ping or pong (tungstenite answers pings), or a malformed frame, which Supabase
    /// drops (MalformedWebSocketMessage) while keeping the socket.
    Nothing,
    Close(Disconnect),
}

fn read(conn: &Channels, vsn: Vsn, msg: Message, bounds: &Bounds) -> Read {
    let parsed = match msg {
        Message::Text(t) => command::from_text(vsn, t.as_str(), bounds),
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
