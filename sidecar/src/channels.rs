//! One connection's channels and their lifecycle: join (public at once, private once the
//! batched verdicts are back), re-checks (every AUTHORIZATION_TTL_SECS and on a new token),
//! token expiry, and leave. Each client command is dispatched here; what an extension does
//! on a channel lives in its own file (`broadcast`, `postgres_changes`, `presence`).
//!
//! Everything runs in the connection's own task (`socket`). A question for the database (a
//! join's verdicts, bindings' check and interest upload; a re-check; a write or presence
//! verdict; a retry's timer) is a future this connection holds and its socket loop polls
//! (`next_answer`), made at the ask and dropped with the socket: no task is spawned for it
//! and nothing travels but the answer (`Answer`). A pending join's state stays here. So a
//! channel's table entry, its hub subscription and the frames sent about it change in one
//! place, in order.

use crate::authorizer::{self, Access, Identity, Verdict};
use crate::broadcast;
use crate::command::{ClientBroadcast, Command, Frame};
use crate::frame::{self, Inbound, Vsn};
use crate::gate::Gate;
use crate::history::{self, ask::Ask};
use crate::hub::{ConnId, TopicKey};
use crate::interest::{self, Held};
use crate::join_config::{self, JoinConfig};
use crate::jwt::{self, Claims, JwtError};
use crate::metrics::Metrics;
use crate::outbound;
use crate::postgres_changes::check::{self, Checked};
use crate::postgres_changes::{self, subscribers, Binding};
use crate::presence::channel::{self as presence_channel, ChannelPresence, Outcome, PresencePush};
use crate::rate::Rate;
use crate::reach::{Link, Reach};
use crate::reason::{ChannelClosed, Disconnect, Refusal};
use crate::state::Shared;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A joined channel.
pub struct Channel {
    pub key: TopicKey,
    /// The way to the channel's socket, under its topic and join_ref.
    pub reach: Reach,
    /// The identity its verdicts are for (the socket's token, or the join's or a refresh's).
    pub claims: Claims,
    /// The same identity as verdicts are asked for (with the socket's headers).
    who: Arc<Identity>,
    pub broadcast: broadcast::State,
    /// The channel's presence: key, verdicts, whether it watches and tracks (`presence`).
    pub presence: ChannelPresence,
    /// The channel has Postgres Changes bindings (registered in `Shared::changes`).
    pub postgres_changes: bool,
    /// Its topic and tables, listened to in the database while the channel lives.
    _interest: Held,
    /// The gate its live broadcasts wait behind while its history is sent (`history`).
    history_gate: Option<Arc<Gate>>,
    /// The private channel's re-checks; see `Checks`.
    checks: Checks,
    /// Client broadcasts waiting for the channel's write verdict (asked at the first).
    held_broadcasts: Vec<(Inbound, ClientBroadcast)>,
    asking_write: bool,
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

/// What came back from the database for this connection.
pub enum Answer {
    /// A waiting join's verdicts (public: allowed) and its bindings' check, which also says
    /// whether its keys' upload failed.
    Join {
        topic: String,
        access: Access,
        checked: Checked,
    },
    Recheck {
        topic: String,
        generation: u64,
        access: Access,
    },
    /// A re-check that failed for want of the database is due again.
    Retry { topic: String, generation: u64 },
    /// A private channel's broadcast write verdict, asked at its first client broadcast.
    Write {
        topic: String,
        generation: u64,
        write: Verdict,
    },
    /// A private channel's presence verdicts, asked at its first track (read too when it
    /// was not asked at join).
    Presence {
        topic: String,
        generation: u64,
        read: Option<Verdict>,
        write: Verdict,
    },
}

/// A join waiting for its verdicts (a private channel), its bindings' check or its keys'
/// upload; its bindings are with the check.
struct PendingJoin {
    m: Inbound,
    config: JoinConfig,
    claims: Claims,
    who: Arc<Identity>,
    sub_topic: String,
    /// Its topic and tables, listened to in the database before the join is answered.
    held: Held,
}

/// The connection's questions to the database in flight. Made at the first ask (a
/// connection with public channels only never has one) and freed when the last is answered.
#[derive(Default)]
struct Waits(Option<FuturesUnordered<BoxFuture<'static, Answer>>>);

pub struct Channels {
    link: Link,
    shared: Arc<Shared>,
    socket_claims: Claims,
    channels: HashMap<String, Channel>,
    joins: Rate,
    events: Rate,
    /// Replies and pushes produced while handling commands and verdicts; the socket writes
    /// them before anything the hub queued after.
    pub out: Vec<Message>,
    /// The socket's `x-` request headers as JSON, for `request.headers` in policies.
    headers: String,
    /// Its questions to the database in flight; bounded by its channels (at most a join,
    /// a check, a write and a presence verdict or a retry each) and dropped with it.
    waits: Waits,
    /// Joins waiting for their answers, by topic (they count against the channel limit; a
    /// second join of the same topic meanwhile is refused).
    pending_joins: HashMap<String, PendingJoin>,
    /// Source of check generations, unique within the connection.
    next_generation: u64,
}

impl Channels {
    /// A new connection's (empty) channels.
    pub fn new(
        shared: Arc<Shared>,
        vsn: Vsn,
        socket_claims: Claims,
        headers: String,
        tx: outbound::Sender,
    ) -> Self {
        let id = NEXT_ID.fetch_add(1, Relaxed);
        let link = Link::new(id, vsn, shared.origin(id), tx);
        Channels {
            link,
            shared,
            socket_claims,
            channels: HashMap::new(),
            joins: Rate::default(),
            events: Rate::default(),
            out: Vec::new(),
            headers,
            waits: Waits::default(),
            pending_joins: HashMap::new(),
            next_generation: 1,
        }
    }

    /// Waits for the database to answer this connection; `on_answer` applies it. None at
    /// once when nothing is asked (the socket loop's branch then sleeps this round).
    pub async fn next_answer(&mut self) -> Option<Answer> {
        let waits = self.waits.0.as_mut()?;
        let answer = waits.next().await;
        if waits.is_empty() {
            self.waits.0 = None;
        }
        answer
    }

    /// Asks the database: `question` is polled by this connection's socket loop.
    fn ask(&mut self, question: impl std::future::Future<Output = Answer> + Send + 'static) {
        self.waits
            .0
            .get_or_insert_with(FuturesUnordered::new)
            .push(Box::pin(question));
    }

    pub fn id(&self) -> ConnId {
        self.link.id
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    pub fn has_channels(&self) -> bool {
        !self.channels.is_empty()
    }

    /// The joined channel of a topic (`realtime:...`).
    pub fn get(&self, topic: &str) -> Option<&Channel> {
        self.channels.get(topic)
    }

    /// The soonest `exp` (unix seconds) among the channels' tokens.
    pub fn soonest_expiry(&self) -> i64 {
        self.channels
            .values()
            .map(|c| c.claims.exp)
            .min()
            .unwrap_or(i64::MAX)
    }

    fn push_text(&mut self, text: String) {
        self.out.push(Message::text(text));
    }

    /// A `system` message on a channel, written before anything the outbound queue holds.
    fn push_system(&mut self, reach: &Reach, status: &str, message: &str) {
        self.push_text(reach.system_text(status, message));
    }

    /// Closes channels whose token expired, as Supabase does: a system error, then phx_close.
    pub fn expire_tokens(&mut self) {
        let now = jwt::now();
        let expired: Vec<String> = self
            .channels
            .iter()
            .filter(|(_, c)| c.claims.exp <= now)
            .map(|(t, _)| t.clone())
            .collect();
        for topic in expired {
            let why = ChannelClosed::TokenExpired {
                seconds_ago: now - self.channels[&topic].claims.exp,
            };
            self.leave(&topic, Some(why));
        }
    }

    /// Stops everything the channel receives, makes its member leave and gives back its
    /// place in the counts.
    fn unsubscribe(&self, topic: &str, ch: &mut Channel) {
        if let Some(gate) = &ch.history_gate {
            gate.close();
        }
        ch.broadcast.stop(&self.shared.hub, &ch.reach, &ch.key);
        if ch.postgres_changes {
            self.shared.changes.remove(self.link.id, topic);
        }
        ch.presence.stop(&self.shared.presence, &ch.reach, &ch.key);
        self.shared.metrics.channels.decrement(1.0);
    }

    /// Leaves every channel without a word (the socket is closing).
    pub fn leave_all(&mut self) {
        for (topic, mut ch) in std::mem::take(&mut self.channels) {
            self.unsubscribe(&topic, &mut ch);
        }
    }

    /// Handles one client command. Err ends the connection with that reason.
    pub fn handle(&mut self, f: Frame) -> Result<(), Disconnect> {
        let Frame { head: m, command } = f;
        let command = match command {
            Command::Heartbeat => {
                self.push_text(frame::reply(self.link.vsn, &m, "ok", json!({})));
                return Ok(());
            }
            Command::Join(config) => return self.join(m, *config),
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
                self.push_text(frame::reply(self.link.vsn, &m, "ok", json!({})));
                self.leave(&m.topic, None);
            }
            Command::AccessToken(token) => self.refresh_token(&m, token),
            // A missing or stale join_ref is accepted, as Supabase's patched Phoenix accepts
            // it: SDK clients send such pushes.
            Command::Broadcast(Ok(b)) => self.broadcast_push(m, b),
            Command::Broadcast(Err(why)) => self.refuse(&m, Refusal::UnableToBroadcast(why.into())),
            Command::Presence(push) => self.presence_push(m, push),
            Command::Unknown(other) => self.refuse(&m, Refusal::UnknownEvent(other)),
        }
        Ok(())
    }

    /// An error reply to a push, with its reason.
    fn refuse(&mut self, m: &Inbound, why: Refusal) {
        self.push_text(frame::reply(
            self.link.vsn,
            m,
            "error",
            json!({ "reason": why.text() }),
        ));
    }

    fn join_error(&mut self, m: &Inbound, why: Refusal) {
        self.shared.metrics.join_errors_total.increment(1);
        self.refuse(m, why);
    }

    fn join(&mut self, m: Inbound, mut config: JoinConfig) -> Result<(), Disconnect> {
        if !self.joins.allow(self.shared.cfg.max_joins_per_second) {
            self.join_error(&m, Refusal::ClientJoinRateLimitReached);
            return Err(Disconnect::JoinRateLimit);
        }
        let Some(sub_topic) = m.topic.strip_prefix("realtime:").filter(|s| !s.is_empty()) else {
            self.join_error(&m, Refusal::TopicNameRequired);
            return Ok(());
        };
        // Checked as realtime.send checks it: a topic the database cannot take (a NUL, over
        // 246 bytes) would otherwise fail the batched authorization call it joins.
        if let Err(why) = join_config::validate_sub_topic(sub_topic) {
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
        if let Some(why) = config.postgres_changes_error.clone() {
            self.join_error(&m, Refusal::PostgresChanges(why));
            return Ok(());
        }
        if let Some(Err(why)) = &config.history {
            self.join_error(&m, Refusal::History(why.clone()));
            return Ok(());
        }
        if self.pending_joins.contains_key(&m.topic) {
            self.join_error(&m, Refusal::JoinInProgress);
            return Ok(());
        }
        let rejoin = self.channels.contains_key(&m.topic);
        let in_use = self.channels.len() + self.pending_joins.len();
        if !rejoin && in_use >= self.shared.cfg.max_channels_per_client {
            self.join_error(&m, Refusal::ChannelRateLimitReached);
            return Ok(());
        }
        // The drain returns the topic's messages (and its tables' changes) once they are
        // listened to: a join is answered after that, so it misses nothing committed later.
        let keys = interest::keys_of(&sub_topic, &config.postgres_changes);
        let (held, upload) = self.shared.interest.hold(keys);
        let who = identity(&claims, &self.headers);
        if config.private || !config.postgres_changes.is_empty() || upload.is_some() {
            // Answered when the batched verdicts, the bindings' check and the upload of its
            // keys are done (`on_answer`); the join waits here meanwhile.
            let (auth, checker) = (self.shared.authorize.clone(), self.shared.check.clone());
            let interest = self.shared.interest.clone();
            let deadline = self.shared.cfg.db_call_deadline();
            let bindings = std::mem::take(&mut config.postgres_changes);
            let (private, presence) = (config.private, config.presence);
            let (topic, asked, asking_who) = (m.topic.clone(), sub_topic.clone(), who.clone());
            self.pending_joins.insert(
                m.topic.clone(),
                PendingJoin {
                    m,
                    config,
                    claims,
                    who,
                    sub_topic,
                    held,
                },
            );
            self.ask(async move {
                let who = asking_who;
                let asking = async {
                    if private {
                        authorizer::channel_access(&auth, &who, &asked, presence).await
                    } else {
                        Access::public()
                    }
                };
                let checking = async {
                    if bindings.is_empty() {
                        Checked::Ok(bindings)
                    } else {
                        check::check(&checker, &who.role, bindings).await
                    }
                };
                let listening = async {
                    match upload {
                        Some(round) => interest.ready(round, deadline).await,
                        None => Ok(()),
                    }
                };
                let (access, checked, listened) = tokio::join!(asking, checking, listening);
                let checked = match (checked, listened) {
                    (Checked::Ok(_), Err(f)) => Checked::Failed(f),
                    (checked, _) => checked,
                };
                Answer::Join {
                    topic,
                    access,
                    checked,
                }
            });
            return Ok(());
        }
        let join = PendingJoin {
            m,
            config,
            claims,
            who,
            sub_topic,
            held,
        };
        self.complete_join(join, (true, None), Vec::new());
        Ok(())
    }

    /// Admits a join with its broadcast read verdict, its presence read verdict (a private
    /// join that enabled presence), its checked Postgres Changes bindings and its keys,
    /// already listened to in the database: registered before the reply, so a client that
    /// saw the reply gets every message and change committed after it.
    fn complete_join(
        &mut self,
        join: PendingJoin,
        (read, presence_read): (bool, Option<bool>),
        bindings: Vec<Binding>,
    ) {
        let PendingJoin {
            m,
            config,
            claims,
            who,
            sub_topic,
            held,
        } = join;
        let mut ask = config.history.clone().and_then(Result::ok);
        if let (Some(Ask::Resume { epoch, seq }), Some(old)) =
            (&mut ask, self.channels.get(&m.topic))
        {
            // A second join of a channel this socket has (realtime-js may send two on a
            // reconnect, both with the payload of before): resume after what this socket
            // was already sent, not before it.
            if let Some((e, s)) = old.history_gate.as_ref().and_then(|g| g.last_sent()) {
                if e == *epoch {
                    *seq = (*seq).max(s);
                }
            }
        }
        if ask.is_some() && !read {
            // Admitted on presence read alone, it gets no broadcasts: nor their history.
            let why = Refusal::ReadDenied {
                topic: sub_topic,
                role_refusal: None,
            };
            self.join_error(&m, why);
            return;
        }
        let key = TopicKey {
            private: config.private,
            topic: sub_topic,
        };
        if let Some(mut old) = self.channels.remove(&m.topic) {
            self.unsubscribe(&m.topic, &mut old);
        }
        // A private channel's write verdict is asked at its first push.
        let write = (!config.private).then_some(true);
        let broadcast = broadcast::State::new(&config, read, write);
        let gate = ask
            .as_ref()
            .map(|_| Gate::new(self.shared.cfg.max_outbound_frames));
        let reach = self.link.reach(&m.topic, m.join_ref.as_deref());
        broadcast.start(&self.shared.hub, &self.link, &reach, &key, gate.clone());
        self.shared.metrics.channels.increment(1.0);
        self.shared.metrics.joins_total.increment(1);
        let replied = postgres_changes::reply(&bindings);
        let has_changes = !bindings.is_empty();
        if has_changes {
            self.shared.changes.add(subscribers::Subscriber {
                reach: reach.clone(),
                bindings,
                role: claims.role.clone(),
                claims: claims.all.to_string(),
            });
        }
        self.push_text(frame::reply(
            self.link.vsn,
            &m,
            "ok",
            json!({ "postgres_changes": replied }),
        ));
        if has_changes {
            self.push_text(frame::system_of(
                reach.vsn,
                reach.join_ref(),
                &reach.topic,
                "postgres_changes",
                "ok",
                "Subscribed to PostgreSQL",
            ));
        }
        if config.replication_ready {
            // Supabase's opt-in signal that its replication stream is up: here, that the
            // drain connection is. (While it is down nothing is lost: the queue keeps what
            // commits and the drainer delivers it when it is back.)
            let (status, message) = if self.shared.metrics.db_up.load(Relaxed) == 1 {
                ("ok", "Replication connection established")
            } else {
                (
                    "error",
                    "Replication connection is not established yet; changes are kept and delivered once it is",
                )
            };
            self.push_system(&reach, status, message);
        }
        if let (Some(ask), Some(gate)) = (ask, &gate) {
            // After the reply (in `out`, written first), the history and then the held live
            // frames arrive through the outbound queue.
            let request = history::fetch::Request {
                ask,
                key: key.clone(),
                reach: reach.clone(),
                gate: gate.clone(),
                carry: None,
            };
            if let Err(e) = self.shared.history.try_send(request) {
                let request = match e {
                    mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
                };
                history::fetch::unavailable(request, &self.shared.metrics);
            }
        }
        // After the reply (in `out`, written first), the presence state arrives through the
        // outbound queue, then its diffs.
        let presence_key = match config.presence_key.as_str() {
            "" => presence_channel::generated_key(self.shared.instance),
            k => k.to_owned(),
        };
        let mut presence =
            ChannelPresence::new(presence_key, config.presence, config.private, presence_read);
        presence.start(&self.shared.presence, &reach, &key);
        let generation = self.next_generation;
        self.next_generation += 1;
        let channel = Channel {
            key,
            reach,
            broadcast,
            presence,
            postgres_changes: has_changes,
            _interest: held,
            history_gate: gate,
            claims,
            who,
            checks: Checks {
                generation,
                ..Checks::default()
            },
            held_broadcasts: Vec::new(),
            asking_write: false,
        };
        self.channels.insert(m.topic, channel);
    }

    /// Re-checks every private channel (the TTL passed).
    pub fn recheck_all(&mut self) {
        let topics: Vec<String> = self.channels.keys().cloned().collect();
        for t in topics {
            self.recheck(&t);
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
        let (sub_topic, presence, who) =
            (ch.key.topic.clone(), ch.presence.enabled, ch.who.clone());
        let auth = self.shared.authorize.clone();
        let topic = topic.to_owned();
        self.ask(async move {
            let access = authorizer::channel_access(&auth, &who, &sub_topic, presence).await;
            Answer::Recheck {
                topic,
                generation,
                access,
            }
        });
    }

    /// Applies what the database answered.
    pub fn on_answer(&mut self, answer: Answer) {
        match answer {
            Answer::Join {
                topic,
                access,
                checked,
            } => {
                let Some(join) = self.pending_joins.remove(&topic) else {
                    return;
                };
                if let Some(f) = access.failure() {
                    // The database could not answer: not a denial, and said as Supabase says it.
                    self.join_error(&join.m, Refusal::Database(f.clone()));
                } else if access.readable() {
                    let verdicts = (
                        access.broadcast_read.allowed(),
                        access.presence_read.as_ref().map(Verdict::allowed),
                    );
                    match checked {
                        Checked::Ok(bindings) => self.complete_join(join, verdicts, bindings),
                        Checked::Refused(why) => {
                            self.join_error(&join.m, Refusal::PostgresChanges(why))
                        }
                        Checked::Failed(f) => self.join_error(&join.m, Refusal::Database(f)),
                    }
                } else {
                    let role_refusal = access.role_refusal().map(str::to_owned);
                    let why = Refusal::ReadDenied {
                        topic: join.sub_topic,
                        role_refusal,
                    };
                    self.join_error(&join.m, why);
                }
            }
            Answer::Recheck {
                topic,
                generation,
                access,
            } => self.apply_recheck(&topic, generation, access),
            Answer::Presence {
                topic,
                generation,
                read,
                write,
            } => self.apply_presence_verdicts(&topic, generation, read, write),
            Answer::Write {
                topic,
                generation,
                write,
            } => self.apply_write_verdict(&topic, generation, write),
            Answer::Retry { topic, generation } => {
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
            let reach = ch.reach.clone();
            let msg = format!(
                "Realtime could not re-check this channel's permissions ({}); retrying in {} s",
                f.reason(),
                backoff.as_secs()
            );
            self.push_system(&reach, "error", &msg);
            let topic = topic.to_owned();
            self.ask(async move {
                tokio::time::sleep(backoff).await;
                Answer::Retry { topic, generation }
            });
            return;
        }
        ch.checks.backoff = None;
        if !access.readable() {
            let why = ChannelClosed::NoLongerPermitted {
                topic: ch.key.topic.clone(),
            };
            self.leave(topic, Some(why));
            return;
        }
        let read = access.broadcast_read.allowed();
        let hub = &self.shared.hub;
        ch.broadcast
            .apply(read, hub, &self.link, &ch.reach, &ch.key);
        if let Some(read) = &access.presence_read {
            let p = &self.shared.presence;
            ch.presence.set_read(read.allowed(), p, &ch.reach, &ch.key);
        }
        // Presence write is asked again at the next track: revoking it takes effect
        // within the same time to live.
        ch.presence.write = None;
        if again {
            self.recheck(topic);
        }
    }

    /// Leaves a channel; with a reason, tells the client first (system error).
    fn leave(&mut self, topic: &str, reason: Option<ChannelClosed>) {
        if let Some(mut ch) = self.channels.remove(topic) {
            if let Some(r) = reason {
                self.push_system(&ch.reach, "error", &r.text());
            }
            self.push_text(ch.reach.close_text());
            self.unsubscribe(topic, &mut ch);
        }
    }

    /// A client broadcast on a joined channel: relayed, refused, or held while the write
    /// verdict of a private channel is asked (at its first push, as Supabase asks it); the
    /// pushes held meanwhile keep their order.
    fn broadcast_push(&mut self, m: Inbound, b: ClientBroadcast) {
        let Some(ch) = self.channels.get_mut(&m.topic) else {
            return;
        };
        if ch.asking_write {
            ch.held_broadcasts.push((m, b));
            return;
        }
        if ch.key.private && ch.broadcast.write.is_none() {
            ch.asking_write = true;
            let generation = ch.checks.generation;
            let (sub_topic, who) = (ch.key.topic.clone(), ch.who.clone());
            let topic = m.topic.clone();
            ch.held_broadcasts.push((m, b));
            let auth = self.shared.authorize.clone();
            self.ask(async move {
                let write = authorizer::write_access(&auth, &who, &sub_topic).await;
                Answer::Write {
                    topic,
                    generation,
                    write,
                }
            });
            return;
        }
        let (key, state) = (&ch.key, &ch.broadcast);
        let persisted = b.persist != Ok(None);
        if let Err(why) = broadcast::push(&self.shared, &self.link, &ch.reach, key, state, &m, b) {
            self.refuse_broadcast(&m, &why, persisted);
        }
    }

    /// An error reply to a client broadcast: Supabase's `reason`, and `error` too for one
    /// that asked to be kept (realtime-js returns that to the app).
    fn refuse_broadcast(&mut self, m: &Inbound, why: &Refusal, persisted: bool) {
        let reply = crate::relay::refusal(&why.text(), persisted);
        self.push_text(frame::encode(
            self.link.vsn,
            m.join_ref.as_deref(),
            m.reference.as_deref(),
            &m.topic,
            "phx_reply",
            &reply,
        ));
    }

    /// A private channel's write verdict is back: the broadcasts held for it are handled in
    /// order (a database failure refuses them, saying so).
    fn apply_write_verdict(&mut self, topic: &str, generation: u64, write: Verdict) {
        let Some(ch) = self.channels.get_mut(topic) else {
            return;
        };
        ch.asking_write = false;
        let held = std::mem::take(&mut ch.held_broadcasts);
        if generation == ch.checks.generation {
            if let Some(f) = write.failure() {
                for (m, b) in held {
                    let persisted = b.persist != Ok(None);
                    self.refuse_broadcast(&m, &Refusal::Database(f.clone()), persisted);
                }
                return;
            }
            ch.broadcast.write = Some(write.allowed());
        }
        // (A verdict for a replaced token is dropped; the held pushes ask again.)
        for (m, b) in held {
            self.broadcast_push(m, b);
        }
    }

    /// A `presence` push (track or untrack) on a joined channel: counted against the
    /// client's presence limit, then handled in order behind any push still waiting for
    /// the channel's presence verdicts.
    fn presence_push(&mut self, m: Inbound, push: PresencePush) {
        let limit = self.shared.cfg.max_client_presence_events_per_second;
        let Some(ch) = self.channels.get_mut(&m.topic) else {
            return;
        };
        if !ch.presence.allow(limit) {
            self.leave(&m.topic, Some(ChannelClosed::ClientPresenceRateLimit));
            return;
        }
        self.presence_apply(m, push);
    }

    fn presence_apply(&mut self, m: Inbound, push: PresencePush) {
        let Some(ch) = self.channels.get_mut(&m.topic) else {
            return;
        };
        if ch.presence.asking {
            ch.presence.held.push((m, push));
            return;
        }
        let p = &self.shared.presence;
        let outcome = ch.presence.push(p, &ch.reach, &ch.key, &m, push);
        match outcome {
            Outcome::Handed => {}
            Outcome::Refused(why) => self.refuse(&m, why),
            Outcome::Close(why) => self.leave(&m.topic, Some(why)),
            Outcome::Ask { read, push } => {
                ch.presence.asking = true;
                let topic = m.topic.clone();
                ch.presence.held.push((m, push));
                let generation = ch.checks.generation;
                let (sub_topic, who) = (ch.key.topic.clone(), ch.who.clone());
                let auth = self.shared.authorize.clone();
                self.ask(async move {
                    let (read, write) =
                        authorizer::presence_access(&auth, &who, &sub_topic, read).await;
                    Answer::Presence {
                        topic,
                        generation,
                        read,
                        write,
                    }
                });
            }
        }
    }

    /// A private channel's presence verdicts are back: the pushes held for them are handled
    /// in order (a database failure fails its tracks; untracks need no verdict).
    fn apply_presence_verdicts(
        &mut self,
        topic: &str,
        generation: u64,
        read: Option<Verdict>,
        write: Verdict,
    ) {
        let Some(ch) = self.channels.get_mut(topic) else {
            return;
        };
        ch.presence.asking = false;
        let held = std::mem::take(&mut ch.presence.held);
        let failure = [read.as_ref(), Some(&write)]
            .into_iter()
            .flatten()
            .find_map(Verdict::failure)
            .cloned();
        if generation == ch.checks.generation {
            if let Some(f) = failure {
                for (m, push) in held {
                    match push {
                        PresencePush::Track(_) => self.refuse(&m, Refusal::Database(f.clone())),
                        other => self.presence_apply(m, other),
                    }
                }
                return;
            }
            if let Some(read) = read {
                let p = &self.shared.presence;
                ch.presence.set_read(read.allowed(), p, &ch.reach, &ch.key);
            }
            ch.presence.write = Some(write.allowed());
        }
        // (Verdicts for a replaced token are dropped; the held pushes ask again.)
        for (m, push) in held {
            self.presence_apply(m, push);
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
                        if ch.postgres_changes {
                            let claims = c.all.to_string();
                            self.shared.changes.set_identity(
                                self.link.id,
                                &m.topic,
                                &c.role,
                                &claims,
                            );
                        }
                        ch.who = identity(&c, &self.headers);
                        ch.claims = c;
                        if ch.key.private {
                            // Asked again, for the new identity, at the next push.
                            ch.presence.write = None;
                            ch.broadcast.write = None;
                        }
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
}

/// Who a channel's verdicts are asked for: its token's role and claims, and the socket's
/// headers (`request.headers`).
fn identity(claims: &Claims, headers: &str) -> Arc<Identity> {
    Arc::new(Identity {
        role: claims.role.clone(),
        claims: claims.all.to_string(),
        headers: headers.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authorizer::{AuthRequest, Verdict};
    use crate::command;
    use crate::db_worker::DbFailure;
    use crate::hub::{Payload, QueueMessage};
    use crate::presence::members::Desired;
    use crate::state::testing::{self, Backends};
    use serde_json::Value;

    /// One connection's channels, with the hub's queue to it, and the answers its waits
    /// gave while the test polled them.
    struct Conn {
        c: Channels,
        ready: std::collections::VecDeque<Answer>,
        hub_rx: outbound::Receiver,
        be: Backends,
    }

    fn claims(sub: &str) -> Claims {
        let all = json!({"role": "authenticated", "sub": sub, "exp": jwt::now() + 3600});
        Claims {
            role: "authenticated".into(),
            exp: jwt::now() + 3600,
            sub: Some(sub.into()),
            all,
        }
    }

    fn conn() -> Conn {
        conn_with(&[])
    }

    /// A connection of a sidecar started with `flags`.
    fn conn_with(flags: &[&str]) -> Conn {
        let (shared, be) = testing::shared(flags);
        let (tx, hub_rx) = crate::outbound::channel(16);
        let c = Channels::new(shared, Vsn::V2, claims("u1"), "{}".into(), tx);
        Conn {
            c,
            ready: Default::default(),
            hub_rx,
            be,
        }
    }

    impl Conn {
        fn send(&mut self, frame: Value) -> Result<(), Disconnect> {
            let f = command::from_text(Vsn::V2, &frame.to_string()).expect("a valid frame");
            let handled = self.c.handle(f);
            self.poll_waits();
            handled
        }

        /// Polls the connection's waits once, as the socket loop does after each frame:
        /// their requests reach the backends; an answer already there is kept for `next`.
        fn poll_waits(&mut self) {
            use futures_util::FutureExt;
            while let Some(Some(a)) = self.c.next_answer().now_or_never() {
                self.ready.push_back(a);
            }
        }

        /// The next answer of the database to this connection (waiting for it).
        async fn next(&mut self) -> Answer {
            match self.ready.pop_front() {
                Some(a) => a,
                None => self.c.next_answer().await.expect("a question in flight"),
            }
        }

        /// What the connection wrote since last asked, as (topic, event, payload).
        fn written(&mut self) -> Vec<(String, String, Value)> {
            std::mem::take(&mut self.c.out)
                .into_iter()
                .map(|m| {
                    let v: Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
                    let s = |i: usize| v[i].as_str().unwrap_or_default().to_owned();
                    (s(2), s(3), v[4].clone())
                })
                .collect()
        }

        /// Plays the authorizer: answers the next `n` requests with `verdict`, then hands
        /// the verdicts that came back to the channels, as the socket loop does.
        async fn authorize(&mut self, n: usize, verdict: impl Fn(&AuthRequest) -> Verdict) {
            self.poll_waits();
            for _ in 0..n {
                let r = self.be.authorize.recv().await.expect("a request");
                let v = verdict(&r);
                r.reply.send(v).unwrap();
            }
            let a = self.next().await;
            self.c.on_answer(a);
        }

        /// Whether a message sent to `topic` now reaches this connection through the hub.
        fn delivered(&mut self, topic: &str, private: bool) -> bool {
            self.c.shared.hub.dispatch(&QueueMessage {
                topic: topic.into(),
                event: "e".into(),
                payload: Payload::Json("{}".into()),
                private,
                id: None,
                origin: None,
                epoch: 5,
                seq: 1,
                replayed: false,
            });
            std::iter::from_fn(|| self.hub_rx.try_recv().ok()).count() > 0
        }

        /// The sequences of the public messages of `topic` this connection got, of those
        /// dispatched now with `seqs`.
        fn got(&mut self, topic: &str, seqs: &[i64]) -> Vec<i64> {
            for &seq in seqs {
                self.c.shared.hub.dispatch(&QueueMessage {
                    topic: topic.into(),
                    event: "e".into(),
                    payload: Payload::Json("{}".into()),
                    private: false,
                    id: None,
                    origin: None,
                    epoch: 5,
                    seq,
                    replayed: false,
                });
            }
            std::iter::from_fn(|| self.hub_rx.try_recv().ok())
                .map(|m| {
                    let Message::Binary(b) = m else {
                        panic!("a 2.0.0 broadcast")
                    };
                    let meta_at = 5 + b[1] as usize + b[2] as usize;
                    let meta: Value =
                        serde_json::from_slice(&b[meta_at..meta_at + b[3] as usize]).unwrap();
                    meta["seq"].as_i64().unwrap()
                })
                .collect()
        }
    }

    fn join(topic: &str, private: bool) -> Value {
        json!(["1", "1", topic, "phx_join", {"config": {"private": private, "broadcast": {"ack": true}}}])
    }

    fn status(payload: &Value) -> (&str, &str) {
        (
            payload["status"].as_str().unwrap_or_default(),
            payload["response"]["reason"].as_str().unwrap_or_default(),
        )
    }

    /// Read allowed, write as given.
    fn reader(write: bool) -> impl Fn(&AuthRequest) -> Verdict {
        move |r| match r.write && !write {
            true => Verdict::Denied(None),
            false => Verdict::Allowed,
        }
    }

    #[tokio::test]
    async fn a_public_join_is_answered_at_once_and_delivered_to_until_left() {
        let mut t = conn();
        t.send(join("realtime:room", false)).unwrap();
        let w = t.written();
        assert_eq!(w.len(), 1);
        assert_eq!(
            (w[0].1.as_str(), status(&w[0].2)),
            ("phx_reply", ("ok", ""))
        );
        assert_eq!(w[0].2["response"], json!({"postgres_changes": []}));
        assert!(
            t.be.authorize.try_recv().is_err(),
            "public joins ask no one"
        );
        assert!(t.delivered("room", false));
        assert!(!t.delivered("room", true), "private messages stay private");
        assert_eq!(t.c.metrics().value("realtime_channels"), Some(1.0));
        t.send(json!(["1", "2", "realtime:room", "phx_leave", {}]))
            .unwrap();
        let events: Vec<String> = t.written().into_iter().map(|w| w.1).collect();
        assert_eq!(events, vec!["phx_reply", "phx_close"]);
        assert!(!t.delivered("room", false));
        assert_eq!(t.c.metrics().value("realtime_channels"), Some(0.0));
    }

    #[tokio::test]
    async fn a_resuming_join_holds_live_messages_until_its_history_is_sent() {
        let mut t = conn();
        let resume = json!({"config": {"broadcast": {"resume": {"epoch": "5", "seq": 10}}}});
        t.send(json!(["1", "1", "realtime:room", "phx_join", resume]))
            .unwrap();
        assert_eq!(status(&t.written()[0].2), ("ok", ""));
        let req = t.be.history.try_recv().expect("a history request");
        assert_eq!(req.ask, history::ask::Ask::Resume { epoch: 5, seq: 10 });
        // Live messages 11 and 12 come while the history is read: held, not sent.
        assert!(t.got("room", &[11, 12]).is_empty());
        // The history went through 11: 12 follows it, once; 11 again (a drainer behind the
        // history) does not, 13 does.
        req.gate.open(5, (11, vec![]), None, &req.reach);
        assert_eq!(t.got("room", &[11, 13]), vec![12, 13]);
        // The same join again on this socket (realtime-js may send two on a reconnect,
        // both naming the older position): it resumes after what this socket was sent.
        t.send(json!(["1", "2", "realtime:room", "phx_join", resume]))
            .unwrap();
        assert_eq!(status(&t.written()[0].2), ("ok", ""));
        let again = t.be.history.try_recv().expect("a history request");
        assert_eq!(again.ask, history::ask::Ask::Resume { epoch: 5, seq: 13 });
        assert!(req.gate.is_closed(), "the replaced channel's gate");
        // Leaving closes the gate: the history still being sent stops.
        t.send(json!(["1", "3", "realtime:room", "phx_leave", {}]))
            .unwrap();
        assert!(again.gate.is_closed());
    }

    #[tokio::test]
    async fn history_is_refused_to_a_join_without_broadcast_read_and_to_bad_positions() {
        let mut t = conn();
        let ask = json!({"config": {"private": true, "presence": {"enabled": true},
                         "broadcast": {"replay": {"since": 1}}}});
        t.send(json!(["1", "1", "realtime:room", "phx_join", ask]))
            .unwrap();
        // Presence read alone admits a private join, but not its replay.
        t.authorize(2, |r| match r.extension {
            "presence" => Verdict::Allowed,
            _ => Verdict::Denied(None),
        })
        .await;
        assert_eq!(
            status(&t.written()[0].2),
            (
                "error",
                "Unauthorized: You do not have permissions to read from this Channel topic: room"
            )
        );
        assert!(t.be.history.try_recv().is_err());
        let bad = json!({"config": {"broadcast": {"resume": {"epoch": "5", "seq": -3}}}});
        t.send(json!(["1", "2", "realtime:b", "phx_join", bad]))
            .unwrap();
        let w = t.written();
        assert!(status(&w[0].2).1.starts_with("UnableToResume: "), "{w:?}");
        let public_replay = json!({"config": {"broadcast": {"replay": {"since": 1}}}});
        t.send(json!(["1", "3", "realtime:c", "phx_join", public_replay]))
            .unwrap();
        assert_eq!(
            status(&t.written()[0].2).1,
            "UnableToReplayMessages: Replay is not allowed for public channels"
        );
        assert!(!t.c.has_channels());
    }

    #[tokio::test]
    async fn a_private_join_waits_for_its_read_verdict_and_write_is_asked_at_the_first_push() {
        let mut t = conn();
        t.send(join("realtime:room", true)).unwrap();
        assert!(t.written().is_empty(), "answered only with the verdicts");
        // Meanwhile a second join of the topic is refused, not queued twice.
        t.send(join("realtime:room", true)).unwrap();
        let w = t.written();
        assert!(status(&w[0].2).1.starts_with("JoinInProgress"), "{w:?}");
        // One verdict per join: read (write waits for a push, as Supabase asks it).
        t.authorize(1, |r| {
            assert_eq!(
                (r.who.role.as_str(), r.topic.as_str(), r.write),
                ("authenticated", "room", false)
            );
            assert!(r.who.claims.contains(r#""sub":"u1""#));
            reader(false)(r)
        })
        .await;
        let w = t.written();
        assert_eq!(status(&w[0].2), ("ok", ""));
        assert!(t.delivered("room", true));
        assert!(!t.delivered("room", false));
        // Two pushes: the first asks the write verdict, the second waits behind it; both
        // are refused, in order, and nothing is relayed.
        for r in ["3", "4"] {
            let push = json!(["1", r, "realtime:room", "broadcast", {"event": "e", "payload": {}}]);
            t.send(push).unwrap();
        }
        assert!(
            t.written().is_empty(),
            "held until the write verdict is back"
        );
        t.authorize(1, |r| {
            assert!(r.write);
            reader(false)(r)
        })
        .await;
        let w = t.written();
        assert_eq!(w.len(), 2);
        assert_eq!(status(&w[1].2).0, "error");
        assert_eq!(
            status(&w[0].2),
            (
                "error",
                "Unauthorized: You do not have permissions to write to this Channel topic: room"
            )
        );
        assert!(
            t.be.relay.try_recv().is_err(),
            "a refused push is not relayed"
        );
    }

    #[tokio::test]
    async fn a_denied_join_and_a_failed_one_are_told_apart() {
        let mut t = conn();
        t.send(join("realtime:a", true)).unwrap();
        t.authorize(1, |_| Verdict::Denied(None)).await;
        let w = t.written();
        assert_eq!(
            status(&w[0].2),
            (
                "error",
                "Unauthorized: You do not have permissions to read from this Channel topic: a"
            )
        );
        t.send(join("realtime:b", true)).unwrap();
        t.authorize(1, |_| Verdict::Failed(DbFailure::Unreachable))
            .await;
        let w = t.written();
        assert!(
            status(&w[0].2).1.starts_with("UnableToConnectToProject"),
            "{w:?}"
        );
        assert!(!t.c.has_channels());
        assert_eq!(t.c.metrics().value("realtime_join_errors_total"), Some(2.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_revoked_read_closes_the_channel_and_a_blip_does_not() {
        let mut t = conn();
        t.send(join("realtime:room", true)).unwrap();
        t.authorize(1, reader(true)).await;
        t.written();
        // The database cannot answer the re-check: the channel stays and is told.
        t.c.recheck_all();
        t.authorize(1, |_| Verdict::Failed(DbFailure::QueryCanceled))
            .await;
        let w = t.written();
        assert_eq!(w[0].1, "system");
        assert!(w[0].2["message"]
            .as_str()
            .unwrap()
            .contains("could not re-check"));
        assert!(t.delivered("room", true));
        // The retry is due after the backoff (1 s; the test's clock skips it), and this
        // time read is revoked.
        let retry = t.next().await;
        assert!(matches!(retry, Answer::Retry { .. }));
        t.c.on_answer(retry);
        t.authorize(1, |_| Verdict::Denied(None)).await;
        let w = t.written();
        let events: Vec<&str> = w.iter().map(|w| w.1.as_str()).collect();
        assert_eq!(events, vec!["system", "phx_close"]);
        assert_eq!(
            w[0].2["message"],
            "You no longer have permission to read from this Channel topic: room"
        );
        assert!(!t.delivered("room", true));
        assert!(!t.c.has_channels());
    }

    #[tokio::test]
    async fn a_verdict_for_a_replaced_token_is_never_applied() {
        let mut t = conn();
        t.send(join("realtime:room", true)).unwrap();
        t.authorize(1, reader(true)).await;
        t.written();
        t.c.recheck_all();
        // A new token arrives while the re-check for the old one is in flight.
        let new = testing::token(
            &json!({"role": "authenticated", "sub": "u2", "exp": jwt::now() + 3600}),
        );
        t.send(json!(["1", "4", "realtime:room", "access_token", {"access_token": new}]))
            .unwrap();
        // The old token's check says no: discarded, and the new token is checked instead.
        t.authorize(1, |r| {
            assert!(r.who.claims.contains("u1"));
            Verdict::Denied(None)
        })
        .await;
        assert!(t.written().is_empty(), "{:?}", t.c.out);
        assert!(t.c.get("realtime:room").is_some());
        t.authorize(1, |r| {
            assert!(
                r.who.claims.contains("u2"),
                "the replacing token is checked"
            );
            Verdict::Allowed
        })
        .await;
        assert!(t.delivered("room", true));
    }

    #[tokio::test]
    async fn a_push_without_join_ref_is_relayed_as_this_connection() {
        let mut t = conn();
        t.send(join("realtime:room", false)).unwrap();
        t.written();
        // realtime-js sends pushes with a missing or stale join_ref: accepted.
        t.send(
            json!([null, "5", "realtime:room", "broadcast", {"event": "e", "payload": {"n": 1}}]),
        )
        .unwrap();
        assert!(t.written().is_empty(), "answered when the relay settles it");
        let b = t.be.relay.try_recv().expect("relayed");
        assert_eq!((b.topic.as_str(), b.event.as_str()), ("room", "e"));
        assert_eq!(b.payload, Payload::Json(r#"{"n":1}"#.into()));
        assert_eq!(b.origin, t.c.shared.origin(t.c.id()));
        // A push on a topic not joined is refused.
        t.send(json!(["1", "6", "realtime:other", "broadcast", {"event": "e"}]))
            .unwrap();
        assert_eq!(status(&t.written()[0].2), ("error", "unmatched topic"));
    }

    #[tokio::test]
    async fn postgres_changes_joins_are_answered_once_checked_and_registered_until_left() {
        let mut t = conn();
        let with = |bindings: Value| json!(["1", "1", "realtime:db", "phx_join", {"config": {"postgres_changes": bindings}}]);
        // Refused at once: a filter this server does not evaluate.
        t.send(with(json!([{"event": "*", "schema": "public", "table": "todos", "filter": "title=match.a"}])))
            .unwrap();
        let w = t.written();
        assert!(
            status(&w[0].2)
                .1
                .starts_with("PostgresChangesFilterNotSupported: binding 1: operator \"match\""),
            "{w:?}"
        );
        // Refused after the check: what the database said, named.
        t.send(with(
            json!([{"event": "INSERT", "schema": "public", "table": "nope"}]),
        ))
        .unwrap();
        assert!(t.written().is_empty(), "no answer before the check");
        let r = t.be.check.recv().await.unwrap();
        let why = "table public.nope does not exist".to_owned();
        r.reply
            .send(Checked::Refused(
                crate::postgres_changes::BindingError::Rejected { at: 1, why },
            ))
            .unwrap();
        let done = t.next().await;
        t.c.on_answer(done);
        let w = t.written();
        assert_eq!(
            status(&w[0].2).1,
            "InvalidPostgresChanges: binding 1: table public.nope does not exist"
        );
        assert!(!t.c.has_channels());
        // Admitted: the reply echoes the binding with its id, then "Subscribed to
        // PostgreSQL"; the channel is registered before either is written.
        t.send(with(
            json!([{"event": "INSERT", "schema": "public", "table": "todos"}]),
        ))
        .unwrap();
        let r = t.be.check.recv().await.unwrap();
        assert_eq!(r.role, "authenticated");
        let id = r.bindings[0].id;
        r.reply.send(Checked::Ok(r.bindings)).unwrap();
        let done = t.next().await;
        t.c.on_answer(done);
        let w = t.written();
        assert_eq!(w[0].1, "phx_reply");
        assert_eq!(
            w[0].2["response"]["postgres_changes"],
            json!([{"id": id, "event": "INSERT", "schema": "public", "table": "todos"}])
        );
        assert_eq!(w[1].1, "system");
        assert_eq!(
            w[1].2,
            json!({"extension": "postgres_changes", "status": "ok", "message": "Subscribed to PostgreSQL", "channel": "db"})
        );
        let registered = t.c.shared.changes.of("public", "todos", None);
        assert_eq!(registered.len(), 1);
        assert!(registered[0].claims.contains("\"sub\":\"u1\""));
        // A new token is the identity changes are checked for from then on.
        let token = testing::token(&json!({"role": "anon", "sub": "u9", "exp": jwt::now() + 60}));
        t.send(json!(["1", "2", "realtime:db", "access_token", {"access_token": token}]))
            .unwrap();
        assert_eq!(
            t.c.shared.changes.of("public", "todos", None)[0].role,
            "anon"
        );
        t.send(json!(["1", "3", "realtime:db", "phx_leave", {}]))
            .unwrap();
        assert!(t.c.shared.changes.is_empty());
    }

    fn presence_join(topic: &str, private: bool, enabled: bool) -> Value {
        json!(["1", "1", topic, "phx_join",
               {"config": {"private": private, "presence": {"key": "ann", "enabled": enabled}}}])
    }

    fn track(topic: &str, reference: &str, meta: Value) -> Value {
        json!(["1", reference, topic, "presence", {"type": "presence", "event": "track", "payload": meta}])
    }

    /// The (event, payload) of what the connection's outbound queue holds.
    fn queued(t: &mut Conn) -> Vec<(String, Value)> {
        std::iter::from_fn(|| t.hub_rx.try_recv().ok())
            .map(|m| {
                let v: Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
                (v[3].as_str().unwrap().to_owned(), v[4].clone())
            })
            .collect()
    }

    #[tokio::test]
    async fn a_presence_join_gets_its_state_after_the_reply_and_its_track_becomes_a_wish() {
        let mut t = conn();
        t.send(presence_join("realtime:room", false, true)).unwrap();
        let w = t.written();
        assert_eq!(
            (w[0].1.as_str(), status(&w[0].2)),
            ("phx_reply", ("ok", ""))
        );
        let p = t.c.shared.presence.clone();
        let loads = p.views.take_loads();
        assert_eq!(loads.len(), 1, "the topic's view is loaded");
        assert!(queued(&mut t).is_empty(), "no state before it is loaded");
        p.views.loaded(&loads[0].0, loads[0].1, vec![]);
        assert_eq!(queued(&mut t), vec![("presence_state".into(), json!({}))]);
        t.send(track("realtime:room", "2", json!({"online_at": 1})))
            .unwrap();
        assert!(t.written().is_empty(), "answered once written");
        let wants = p.members.take();
        let (id, want) = wants.into_iter().next().unwrap();
        assert_eq!(id.topic.topic, "room");
        assert_eq!(
            want.desired,
            Desired::Tracked {
                key: "ann".into(),
                meta: r#"{"online_at":1}"#.into()
            }
        );
        // Leaving untracks; the view forgets the topic.
        t.send(json!(["1", "3", "realtime:room", "phx_leave", {}]))
            .unwrap();
        assert_eq!(
            p.members.take().into_values().next().unwrap().desired,
            Desired::Untracked
        );
        assert!(p.views.members(&loads[0].0).is_none());
    }

    #[tokio::test]
    async fn a_private_track_asks_presence_write_once_and_a_denied_one_is_refused() {
        let mut t = conn();
        t.send(presence_join("realtime:room", true, false)).unwrap();
        t.authorize(1, reader(true)).await;
        assert_eq!(status(&t.written()[0].2), ("ok", ""));
        // Presence was not enabled at join: the first track asks presence read and write;
        // a second track meanwhile waits behind it.
        t.send(track("realtime:room", "2", json!({"n": 1})))
            .unwrap();
        t.send(track("realtime:room", "3", json!({"n": 2})))
            .unwrap();
        let p = t.c.shared.presence.clone();
        assert!(p.members.is_empty(), "held until the verdicts are back");
        t.authorize(2, |r| {
            assert_eq!(r.extension, "presence");
            Verdict::Allowed
        })
        .await;
        let want = p.members.take().into_values().next().unwrap();
        assert_eq!(want.replies.len(), 2, "both pushes, in order, one wish");
        assert_eq!(
            want.desired,
            Desired::Tracked {
                key: "ann".into(),
                meta: r#"{"n":2}"#.into()
            }
        );
        assert_eq!(
            p.views.take_loads().len(),
            1,
            "the track enabled presence (read allowed)"
        );
        t.send(track("realtime:room", "4", json!({"n": 3})))
            .unwrap();
        assert!(t.be.authorize.try_recv().is_err(), "the verdict is kept");
        // Another channel whose presence write is denied.
        t.send(presence_join("realtime:other", true, true)).unwrap();
        t.authorize(2, reader(true)).await;
        t.written();
        t.send(track("realtime:other", "5", json!({}))).unwrap();
        t.authorize(1, |r| match r.write {
            true => Verdict::Denied(None),
            false => Verdict::Allowed,
        })
        .await;
        let w = t.written();
        assert_eq!(
            status(&w[0].2),
            (
                "error",
                "Unauthorized: You do not have permissions to track presence on this Channel topic: other"
            )
        );
    }

    #[tokio::test]
    async fn bad_presence_pushes_get_error_replies_and_the_rate_limit_closes_the_channel() {
        let mut t = conn_with(&["--max-client-presence-events-per-second", "3"]);
        t.send(presence_join("realtime:room", false, false))
            .unwrap();
        t.written();
        t.send(track("realtime:room", "2", json!([1]))).unwrap();
        assert_eq!(
            status(&t.written()[0].2),
            ("error", "Presence track payload must be a map")
        );
        t.send(json!(["1", "3", "realtime:room", "presence", {"event": "sync"}]))
            .unwrap();
        assert!(status(&t.written()[0].2)
            .1
            .starts_with("UnknownPresenceEvent"));
        // The third push this second is within the limit of 3; the fourth closes the channel.
        t.send(track("realtime:room", "4", json!({}))).unwrap();
        assert!(t.written().is_empty());
        t.send(track("realtime:room", "5", json!({}))).unwrap();
        let w = t.written();
        let events: Vec<&str> = w.iter().map(|w| w.1.as_str()).collect();
        assert_eq!(events, vec!["system", "phx_close"]);
        assert_eq!(w[0].2["message"], "Client presence rate limit exceeded");
        assert!(!t.c.has_channels());
    }

    #[tokio::test]
    async fn a_revoked_presence_read_stops_presence_and_the_sidecar_limit_closes_a_tracking_channel(
    ) {
        let mut t = conn_with(&["--max-presence-events-per-second", "2"]);
        t.send(presence_join("realtime:room", true, true)).unwrap();
        t.authorize(2, reader(true)).await;
        t.written();
        let p = t.c.shared.presence.clone();
        let (key, load) = p.views.take_loads().pop().expect("presence read: watching");
        p.views.loaded(&key, load, vec![]);
        assert_eq!(queued(&mut t)[0].0, "presence_state");
        // The re-check keeps broadcast read and revokes presence read: the channel stays,
        // and stops receiving presence (its view is dropped: no one here watches).
        t.c.recheck_all();
        t.authorize(2, |r| match r.extension {
            "presence" => Verdict::Denied(None),
            _ => Verdict::Allowed,
        })
        .await;
        assert!(t.c.get("realtime:room").is_some());
        assert!(p.views.members(&key).is_none());
        // The sidecar takes 2 tracks a second: the third closes its channel.
        t.send(presence_join("realtime:a", false, false)).unwrap();
        t.send(presence_join("realtime:b", false, false)).unwrap();
        t.written();
        t.send(track("realtime:a", "5", json!({}))).unwrap();
        t.send(track("realtime:b", "6", json!({}))).unwrap();
        t.send(track("realtime:a", "7", json!({"n": 2}))).unwrap();
        let w = t.written();
        assert_eq!(w[0].2["message"], "Too many presence messages per second");
        assert_eq!(w[1].1, "phx_close");
        assert!(t.c.get("realtime:a").is_none() && t.c.get("realtime:b").is_some());
    }

    #[tokio::test]
    async fn too_many_joins_a_second_close_the_socket() {
        let (shared, _be) = testing::shared(&["--max-joins-per-second", "2"]);
        let (tx, _hub_rx) = crate::outbound::channel(16);
        let mut c = Channels::new(shared, Vsn::V2, claims("u1"), "{}".into(), tx);
        let mut send = |topic: &str| {
            let f = command::from_text(Vsn::V2, &join(topic, false).to_string()).unwrap();
            c.handle(f)
        };
        assert_eq!(send("realtime:a"), Ok(()));
        assert_eq!(send("realtime:b"), Ok(()));
        assert_eq!(send("realtime:c"), Err(Disconnect::JoinRateLimit));
    }
}
