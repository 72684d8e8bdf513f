//! One WebSocket connection: its channels, the client's frames, and the frames queued for it.
//!
//! A single task owns the connection. It answers the client's frames directly (so a reply
//! always precedes broadcasts on the channel it opened) and writes hub frames from a bounded
//! queue, batching whatever is ready into one flush. It ends on close, error, idle timeout,
//! a full queue (the client is too slow), a rate limit, or server shutdown, each with a close
//! reason, and unsubscribes every channel on the way out.

use crate::authorizer::{self, Access, Identity};
use crate::channel::{self, JoinConfig};
use crate::command::{self, ClientBroadcast, Command, Frame};
use crate::frame::{self, Inbound, Vsn};
use crate::hub::{ConnId, Subscriber, TopicKey};
use crate::jwt::{self, Claims, JwtError};
use crate::publish::{self, AckTo, Failure, Publish};
use crate::reason::{ChannelClosed, Disconnect, Refusal};
use crate::state::Shared;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Frames written per flush at most, so one busy connection cannot hog its task.
const WRITE_BATCH: usize = 256;
/// How long a closing connection may take to send its close frame.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

struct Channel {
    key: TopicKey,
    join_ref: Option<String>,
    /// Reply to this channel's broadcasts once they are committed.
    ack: bool,
    /// Write verdict of a private channel (public channels: anyone may send).
    writable: bool,
    /// Deliver the client's own broadcasts back to it (`config.broadcast.self`).
    self_broadcast: bool,
    /// Broadcast read verdict: the channel is subscribed in the hub only while it holds.
    /// (A private join may be admitted on presence read alone; it then gets no broadcasts.)
    broadcast_read: bool,
    presence: bool,
    claims: Claims,
    /// The private channel's re-checks; see `Checks`.
    checks: Checks,
}

/// At most one authorization check is in flight per channel, and a verdict applies only to
/// the identity it was computed for. Token refreshes and TTL ticks that arrive meanwhile
/// coalesce into one more check after it; a late verdict for an older token is discarded.
#[derive(Default)]
struct Checks {
    /// Changes whenever the channel's identity (token) changes; verdicts carry it.
    generation: u64,
    in_flight: bool,
    again: bool,
    /// Delay before retrying after the database failed to answer (doubles, up to 30 s).
    backoff: Option<Duration>,
}

/// Verdicts for a private channel, back from the batched authorizer.
enum AuthDone {
    /// A private join and its verdicts.
    Join(Box<PendingJoin>, Access),
    Recheck {
        topic: String,
        generation: u64,
        access: Access,
    },
    /// A re-check that failed for want of the database is due again.
    Retry { topic: String, generation: u64 },
}

/// A private join waiting for its verdicts.
struct PendingJoin {
    m: Inbound,
    config: JoinConfig,
    claims: Claims,
    sub_topic: String,
}

/// Per-second counter for the connection's rate limits.
struct Rate {
    window: Instant,
    count: u32,
}

impl Rate {
    fn new() -> Self {
        Rate {
            window: Instant::now(),
            count: 0,
        }
    }

    /// Counts one event; false once more than `limit` happened within the current second.
    fn allow(&mut self, limit: u32) -> bool {
        if self.window.elapsed() >= Duration::from_secs(1) {
            self.window = Instant::now();
            self.count = 0;
        }
        self.count += 1;
        self.count <= limit
    }
}

/// Why the connection ends, sent to the client as the close frame.
struct Close(Disconnect);

struct Conn {
    id: ConnId,
    vsn: Vsn,
    shared: Arc<Shared>,
    socket_claims: Claims,
    channels: HashMap<String, Channel>,
    tx: mpsc::Sender<Message>,
    too_slow: Arc<Notify>,
    joins: Rate,
    events: Rate,
    /// Replies and pushes produced while handling one client frame.
    out: Vec<Message>,
    /// The socket's `x-` request headers as JSON, for `request.headers` in policies.
    headers: String,
    auth_done: mpsc::UnboundedSender<AuthDone>,
    /// Topics of private joins waiting for their verdicts (they count against the channel
    /// limit; a second join of the same topic meanwhile is refused).
    pending_joins: std::collections::HashSet<String>,
    /// Source of check generations, unique within the connection.
    next_generation: u64,
}

pub async fn serve<S>(
    ws: WebSocketStream<S>,
    shared: Arc<Shared>,
    vsn: Vsn,
    socket_claims: Claims,
    headers: String,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (tx, mut rx) = mpsc::channel(shared.cfg.max_outbound_frames);
    let (auth_done, mut auth_rx) = mpsc::unbounded_channel();
    let mut conn = Conn {
        id: NEXT_ID.fetch_add(1, Relaxed),
        vsn,
        shared: shared.clone(),
        socket_claims,
        channels: HashMap::new(),
        tx,
        too_slow: Arc::new(Notify::new()),
        joins: Rate::new(),
        events: Rate::new(),
        out: Vec::new(),
        headers,
        auth_done,
        pending_joins: Default::default(),
        next_generation: 1,
    };
    let ttl = Duration::from_secs(shared.cfg.authorization_ttl_secs.max(1));
    let mut recheck = tokio::time::interval_at((Instant::now() + ttl).into(), ttl);
    let m = &shared.metrics;
    // `connections` was counted at upgrade (server.rs); it is given back when this ends.
    m.connections_total.fetch_add(1, Relaxed);
    let (mut sink, mut stream) = ws.split();
    let mut shutdown = shared.shutdown.clone();
    let idle_timeout = shared.cfg.idle_timeout();
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    let too_slow = conn.too_slow.clone();

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
            _ = shutdown.changed() => break Some(Close(Disconnect::ShuttingDown)),
            _ = too_slow.notified() => break Some(too_slow_close(&shared)),
            Some(done) = auth_rx.recv() => conn.on_auth(done),
            _ = recheck.tick() => {
                let topics: Vec<String> = conn.channels.keys().cloned().collect();
                for t in topics {
                    conn.recheck(&t);
                }
            }
            _ = &mut expiry, if conn.has_channels() => {
                conn.expire_tokens();
                expiry_exp = i64::MIN;
            }
            frame = stream.next() => {
                idle.as_mut().reset((Instant::now() + idle_timeout).into());
                match frame {
                    Some(Ok(msg)) => {
                        if let Err(c) = conn.handle(msg) {
                            break Some(c);
                        }
                    }
                    Some(Err(WsError::Capacity(e))) => {
                        tracing::debug!(conn = conn.id, error = %e, "frame too large");
                        break Some(Close(Disconnect::FrameTooLarge));
                    }
                    Some(Err(e)) => {
                        tracing::debug!(conn = conn.id, error = %e, "websocket error");
                        break Some(Close(Disconnect::InvalidFrame));
                    }
                    None => break None,
                }
            }
            _ = &mut idle => break Some(Close(Disconnect::IdleTimeout)),
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
                _ = too_slow.notified() => break Some(too_slow_close(&shared)),
                _ = shutdown.changed() => break Some(Close(Disconnect::ShuttingDown)),
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
        if let Some(Close(why)) = close {
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

fn too_slow_close(shared: &Shared) -> Close {
    shared.metrics.slow_disconnects_total.fetch_add(1, Relaxed);
    Close(Disconnect::TooSlow)
}

impl Conn {
    fn has_channels(&self) -> bool {
        !self.channels.is_empty()
    }

    /// The soonest `exp` (unix seconds) among the channels' tokens.
    fn soonest_expiry(&self) -> i64 {
        self.channels
            .values()
            .map(|c| c.claims.exp)
            .min()
            .unwrap_or(i64::MAX)
    }

    fn push_text(&mut self, text: String) {
        self.out.push(Message::text(text));
    }

    fn push_system(&mut self, topic: &str, join_ref: Option<&str>, status: &str, message: &str) {
        self.push_text(frame::system(self.vsn, join_ref, topic, status, message));
    }

    fn push_close(&mut self, topic: &str, join_ref: Option<&str>) {
        self.push_text(frame::encode(
            self.vsn,
            join_ref,
            None,
            topic,
            "phx_close",
            &json!({}),
        ));
    }

    /// Closes channels whose token expired, as Supabase does: a system error, then phx_close.
    fn expire_tokens(&mut self) {
        let now = jwt::now();
        let expired: Vec<String> = self
            .channels
            .iter()
            .filter(|(_, c)| c.claims.exp <= now)
            .map(|(t, _)| t.clone())
            .collect();
        for topic in expired {
            let ch = self.channels.remove(&topic).expect("listed above");
            let why = ChannelClosed::TokenExpired {
                seconds_ago: now - ch.claims.exp,
            };
            self.push_system(&topic, ch.join_ref.as_deref(), "error", &why.text());
            self.push_close(&topic, ch.join_ref.as_deref());
            self.unsubscribe(&ch);
        }
    }

    fn unsubscribe(&self, ch: &Channel) {
        if ch.broadcast_read {
            self.shared.hub.unsubscribe(&ch.key, self.id);
        }
        self.shared.metrics.channels.fetch_sub(1, Relaxed);
    }

    fn subscriber(&self, join_ref: Option<String>, self_broadcast: bool) -> Subscriber {
        Subscriber {
            conn: self.id,
            vsn: self.vsn,
            join_ref,
            origin: self.shared.origin(self.id),
            self_broadcast,
            tx: self.tx.clone(),
            too_slow: self.too_slow.clone(),
        }
    }

    fn leave_all(&mut self) {
        for (_, ch) in std::mem::take(&mut self.channels) {
            self.unsubscribe(&ch);
        }
    }

    fn handle(&mut self, msg: Message) -> Result<(), Close> {
        let parsed = match msg {
            Message::Text(t) => command::from_text(self.vsn, t.as_str()),
            Message::Binary(b) if self.vsn == Vsn::V2 => command::from_binary(&b),
            Message::Binary(_) => Err(frame::DecodeError::Binary(
                "binary frames need serializer 2.0.0",
            )),
            Message::Close(_) => return Err(Close(Disconnect::ClientClosed)),
            // Pings are answered by tungstenite; pongs need nothing.
            _ => return Ok(()),
        };
        let Frame { head: m, command } = match parsed {
            Ok(f) => f,
            Err(e) => {
                // Supabase's MalformedWebSocketMessage: the message is dropped, the socket kept.
                self.shared
                    .metrics
                    .malformed_frames_total
                    .fetch_add(1, Relaxed);
                tracing::debug!(conn = self.id, error = %e, "malformed frame");
                return Ok(());
            }
        };
        let command = match command {
            Command::Heartbeat => {
                self.push_text(frame::reply(self.vsn, &m, "ok", json!({})));
                return Ok(());
            }
            Command::Join(config) => return self.join(m, config),
            other => other,
        };
        if !self.channels.contains_key(&m.topic) {
            self.refuse(&m, Refusal::UnmatchedTopic);
            return Ok(());
        }
        if !self.events.allow(self.shared.cfg.max_events_per_second) {
            self.leave(&m.topic, Some(ChannelClosed::TooManyMessages));
            return Ok(());
        }
        match command {
            Command::Heartbeat | Command::Join(_) => unreachable!("handled above"),
            Command::Leave => {
                self.push_text(frame::reply(self.vsn, &m, "ok", json!({})));
                self.leave(&m.topic, None);
            }
            Command::AccessToken(token) => self.refresh_token(&m, token),
            // A missing or stale join_ref is accepted, as Supabase's patched Phoenix accepts
            // it: SDK clients send such pushes.
            Command::Broadcast(Ok(b)) => self.client_broadcast(&m, b),
            Command::Broadcast(Err(why)) => self.refuse(&m, Refusal::UnableToBroadcast(why.into())),
            Command::Presence => self.refuse(&m, Refusal::PresenceNotSupported),
            Command::Unknown(other) => self.refuse(&m, Refusal::UnknownEvent(other)),
        }
        Ok(())
    }

    /// An error reply to a push, with its reason.
    fn refuse(&mut self, m: &Inbound, why: Refusal) {
        self.push_text(frame::reply(
            self.vsn,
            m,
            "error",
            json!({ "reason": why.text() }),
        ));
    }

    fn join_error(&mut self, m: &Inbound, why: Refusal) {
        self.shared.metrics.join_errors_total.fetch_add(1, Relaxed);
        self.refuse(m, why);
    }

    fn join(&mut self, m: Inbound, config: JoinConfig) -> Result<(), Close> {
        if !self.joins.allow(self.shared.cfg.max_joins_per_second) {
            self.join_error(&m, Refusal::ClientJoinRateLimitReached);
            return Err(Close(Disconnect::JoinRateLimit));
        }
        let Some(sub_topic) = m.topic.strip_prefix("realtime:").filter(|s| !s.is_empty()) else {
            self.join_error(&m, Refusal::TopicNameRequired);
            return Ok(());
        };
        // Checked as realtime.send checks it: a topic the database cannot take (a NUL, over
        // 246 bytes) would otherwise fail the batched authorization call it joins.
        if let Err(why) = channel::validate_sub_topic(sub_topic) {
            self.join_error(&m, Refusal::InvalidTopic(why));
            return Ok(());
        }
        let sub_topic = sub_topic.to_owned();
        let claims = match config.access_token.as_deref() {
            Some(t) if !t.starts_with("sb_") => match self.shared.verifier.verify(t) {
                Ok(c) => c,
                Err(e) => {
                    self.join_error(&m, Refusal::Jwt(e));
                    return Ok(());
                }
            },
            _ => self.socket_claims.clone(),
        };
        if claims.exp <= jwt::now() {
            let seconds_ago = jwt::now() - claims.exp;
            self.join_error(&m, Refusal::Jwt(JwtError::Expired { seconds_ago }));
            return Ok(());
        }
        if config.has_postgres_changes {
            self.join_error(&m, Refusal::PostgresChangesNotSupported);
            return Ok(());
        }
        if self.pending_joins.contains(&m.topic) {
            self.join_error(&m, Refusal::JoinInProgress);
            return Ok(());
        }
        let rejoin = self.channels.contains_key(&m.topic);
        let in_use = self.channels.len() + self.pending_joins.len();
        if !rejoin && in_use >= self.shared.cfg.max_channels_per_client {
            self.join_error(&m, Refusal::ChannelRateLimitReached);
            return Ok(());
        }
        if config.private {
            // Answered when the batched verdicts arrive (`on_auth`), in this same task.
            self.pending_joins.insert(m.topic.clone());
            let who = self.identity(&claims);
            let (auth, done) = (self.shared.authorize.clone(), self.auth_done.clone());
            tokio::spawn(async move {
                let access =
                    authorizer::channel_access(&auth, &who, &sub_topic, config.presence).await;
                let join = PendingJoin {
                    m,
                    config,
                    claims,
                    sub_topic,
                };
                let _ = done.send(AuthDone::Join(Box::new(join), access));
            });
            return Ok(());
        }
        self.complete_join(m, config, claims, sub_topic, true, true);
        Ok(())
    }

    fn complete_join(
        &mut self,
        m: Inbound,
        config: JoinConfig,
        claims: Claims,
        sub_topic: String,
        broadcast_read: bool,
        writable: bool,
    ) {
        let key = TopicKey {
            private: config.private,
            topic: sub_topic,
        };
        if let Some(old) = self.channels.remove(&m.topic) {
            self.unsubscribe(&old);
        }
        if broadcast_read {
            let sub = self.subscriber(m.join_ref.clone(), config.self_broadcast);
            self.shared.hub.subscribe(key.clone(), sub);
        }
        self.shared.metrics.channels.fetch_add(1, Relaxed);
        self.shared.metrics.joins_total.fetch_add(1, Relaxed);
        self.push_text(frame::reply(
            self.vsn,
            &m,
            "ok",
            json!({"postgres_changes": []}),
        ));
        let generation = self.next_generation;
        self.next_generation += 1;
        let channel = Channel {
            key,
            join_ref: m.join_ref.clone(),
            ack: config.ack,
            self_broadcast: config.self_broadcast,
            writable,
            broadcast_read,
            presence: config.presence,
            claims,
            checks: Checks {
                generation,
                ..Checks::default()
            },
        };
        self.channels.insert(m.topic, channel);
    }

    fn identity(&self, claims: &Claims) -> Identity {
        Identity {
            role: claims.role.clone(),
            claims: claims.all.to_string(),
            headers: self.headers.clone(),
        }
    }

    /// Checks a private channel's verdicts again (new token, the TTL passed, or a retry),
    /// unless a check is in flight: then one more runs after it.
    fn recheck(&mut self, topic: &str) {
        let Some(ch) = self.channels.get_mut(topic) else {
            return;
        };
        if !ch.key.private {
            return;
        }
        if ch.checks.in_flight {
            ch.checks.again = true;
            return;
        }
        ch.checks.in_flight = true;
        let generation = ch.checks.generation;
        let (sub_topic, presence, claims) = (ch.key.topic.clone(), ch.presence, ch.claims.clone());
        let who = self.identity(&claims);
        let (auth, done) = (self.shared.authorize.clone(), self.auth_done.clone());
        let topic = topic.to_owned();
        tokio::spawn(async move {
            let access = authorizer::channel_access(&auth, &who, &sub_topic, presence).await;
            let _ = done.send(AuthDone::Recheck {
                topic,
                generation,
                access,
            });
        });
    }

    fn on_auth(&mut self, done: AuthDone) {
        match done {
            AuthDone::Join(join, access) => {
                let PendingJoin {
                    m,
                    config,
                    claims,
                    sub_topic,
                } = *join;
                self.pending_joins.remove(&m.topic);
                if let Some(f) = access.failure() {
                    // The database could not answer: not a denial, and said as Supabase says it.
                    self.join_error(&m, Refusal::Database(f.clone()));
                } else if access.readable() {
                    let (read, write) = (access.broadcast_read.allowed(), access.write.allowed());
                    self.complete_join(m, config, claims, sub_topic, read, write);
                } else {
                    let role_refusal = access.role_refusal().map(str::to_owned);
                    let why = Refusal::ReadDenied {
                        topic: sub_topic,
                        role_refusal,
                    };
                    self.join_error(&m, why);
                }
            }
            AuthDone::Recheck {
                topic,
                generation,
                access,
            } => self.apply_recheck(&topic, generation, access),
            AuthDone::Retry { topic, generation } => {
                if self
                    .channels
                    .get(&topic)
                    .is_some_and(|c| c.checks.generation == generation)
                {
                    self.recheck(&topic);
                }
            }
        }
    }

    fn apply_recheck(&mut self, topic: &str, generation: u64, access: Access) {
        let Some(ch) = self.channels.get_mut(topic) else {
            return;
        };
        ch.checks.in_flight = false;
        let again = std::mem::take(&mut ch.checks.again);
        if generation != ch.checks.generation {
            // Computed for a token the channel no longer holds: never applied. The token that
            // replaced it has not been checked yet (its refresh found this check in flight).
            self.recheck(topic);
            return;
        }
        if let Some(f) = access.failure() {
            // A database blip is not a revocation: keep the channel, say so, retry later.
            let backoff = ch.checks.backoff.map_or(Duration::from_secs(1), |b| {
                (b * 2).min(Duration::from_secs(30))
            });
            ch.checks.backoff = Some(backoff);
            let join_ref = ch.join_ref.clone();
            let msg = format!(
                "Realtime could not re-check this channel's permissions ({}); retrying in {} s",
                f.reason(),
                backoff.as_secs()
            );
            self.push_system(topic, join_ref.as_deref(), "error", &msg);
            let done = self.auth_done.clone();
            let topic = topic.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(backoff).await;
                let _ = done.send(AuthDone::Retry { topic, generation });
            });
            return;
        }
        ch.checks.backoff = None;
        ch.writable = access.write.allowed();
        if !access.readable() {
            let why = ChannelClosed::NoLongerPermitted {
                topic: ch.key.topic.clone(),
            };
            self.leave(topic, Some(why));
            return;
        }
        let read = access.broadcast_read.allowed();
        if read != ch.broadcast_read {
            ch.broadcast_read = read;
            if read {
                let (key, join_ref, own) = (ch.key.clone(), ch.join_ref.clone(), ch.self_broadcast);
                let sub = self.subscriber(join_ref, own);
                self.shared.hub.subscribe(key, sub);
            } else {
                self.shared.hub.unsubscribe(&ch.key, self.id);
            }
        }
        if again {
            self.recheck(topic);
        }
    }

    /// Leaves a channel; with a reason, tells the client first (system error).
    fn leave(&mut self, topic: &str, reason: Option<ChannelClosed>) {
        if let Some(ch) = self.channels.remove(topic) {
            if let Some(r) = reason {
                self.push_system(topic, ch.join_ref.as_deref(), "error", &r.text());
            }
            self.push_close(topic, ch.join_ref.as_deref());
            self.unsubscribe(&ch);
        }
    }

    fn refresh_token(&mut self, m: &Inbound, token: Option<String>) {
        let Some(token) = token.as_deref() else {
            return;
        };
        if token.starts_with("sb_") {
            return;
        }
        match self.shared.verifier.verify(token) {
            Ok(c) => {
                let generation = self.next_generation;
                if let Some(ch) = self.channels.get_mut(&m.topic) {
                    if ch.claims != c {
                        ch.claims = c;
                        // Verdicts still in flight were for the old token.
                        ch.checks.generation = generation;
                        self.next_generation += 1;
                        self.recheck(&m.topic);
                    }
                }
            }
            Err(e) => self.leave(&m.topic, Some(ChannelClosed::TokenRefused(e))),
        }
    }

    /// A client's broadcast: relayed through the database so that every sidecar sees it in
    /// the queue's one order, then fanned out like any message (minus the sender unless it
    /// joined with `self: true`). With `ack: true` the reply comes once it has committed.
    fn client_broadcast(&mut self, m: &Inbound, b: ClientBroadcast) {
        let ClientBroadcast { event, payload } = b;
        let ch = &self.channels[&m.topic];
        if ch.key.private && !ch.writable {
            // Supabase drops these silently; an error reply says why instead.
            let why = Refusal::WriteDenied {
                topic: ch.key.topic.clone(),
            };
            self.refuse(m, why);
            return;
        }
        let reply = AckTo::Socket {
            tx: self.tx.clone(),
            vsn: self.vsn,
            join_ref: m.join_ref.clone(),
            reference: m.reference.clone(),
            topic: m.topic.clone(),
            ack: ch.ack,
        };
        let publish = Publish {
            origin: self.shared.origin(self.id),
            topic: ch.key.topic.clone(),
            event,
            private: ch.key.private,
            payload,
            reply,
        };
        if let Err(mpsc::error::TrySendError::Full(p)) = self.shared.publish.try_send(publish) {
            let busy =
                Failure::Unavailable("too many broadcasts are waiting for the database; retry");
            publish::settle(vec![p], Err(busy), &self.shared.metrics);
        }
    }
}
