//! One connection's channels and their lifecycle: join (public at once, private once the
//! batched verdicts are back), re-checks (every AUTHORIZATION_TTL_SECS and on a new token),
//! token expiry, and leave. Each client command is dispatched here. `join` checks and admits
//! a join, `channel` is one joined channel (what leaving stops, its re-checks and token),
//! `pushes` its client broadcasts and presence pushes; what an extension does on a channel
//! lives in its own file (`broadcast`, `postgres_changes`, `presence`, `history`), and "ask
//! once, hold pushes, release in order" in `held`.
//!
//! Everything runs in the connection's own task (`socket`). A question for the database (a
//! join's verdicts, bindings' check and interest upload; a re-check; a write or presence
//! verdict; a retry's timer) is a future this connection holds and its socket loop polls
//! (`next_answer`), made at the ask and dropped with the socket: no task is spawned for it
//! and nothing travels but the answer (`Answer`). A pending join's state stays here. So a
//! channel's table entry, its hub subscription and the frames sent about it change in one
//! place, in order.

mod channel;
mod join;
mod lifetime;
mod pending_join;
mod pushes;
#[cfg(test)]
mod tests;

use crate::address::{AddressKey, Block};
pub use channel::Channel;
use pending_join::PendingJoin;

use crate::authorizer::{Access, Identity, Verdict};
use crate::command::{Command, Frame};
use crate::frame::{self, Inbound, Vsn};
use crate::hub::ConnId;
use crate::interest::{Held, NotReady};
use crate::jwt::{self, Claims};
use crate::metrics::Metrics;
use crate::out;
use crate::out::{Link, Reach};
use crate::postgres_changes::bounds::Weight;
use crate::postgres_changes::subscribable::Checked;
use crate::rate::Rate;
use crate::reason::{ChannelClosed, Disconnect, Notice, Refusal};
use crate::state::Shared;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio_tungstenite::tungstenite::Message;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What came back from the database for this connection.
pub enum Answer {
    /// A waiting join's verdicts (public: allowed) and its bindings' check, which also says
    /// whether its keys' upload failed.
    Join {
        topic: String,
        access: Access,
        checked: Checked,
        /// Its bindings' tables, held once they passed the check.
        tables: Option<Held>,
        /// Whether its topic and tables are listened to in the database.
        listened: Result<(), NotReady>,
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
    /// This connection to presence's budgets: its address and its tracks this second.
    presence_source: crate::presence::budget::Source,
    /// This connection's share of its address's Postgres Changes bindings
    /// (MAX_BINDINGS_PER_ADDRESS): its channels' and its pending joins' together, kept so by
    /// `recount_bindings` and given back when the connection's channels are dropped. None
    /// for a backend's connection, which no per-address limit counts.
    address_bindings: Option<crate::tally::Charge<AddressKey>>,
    /// The same for its pattern conditions (MAX_PATTERNS_PER_ADDRESS).
    address_patterns: Option<crate::tally::Charge<AddressKey>>,
    /// Its shares of its address's wider blocks' bindings and pattern conditions
    /// (MAX_BINDINGS_PER_IPV6_56 and friends), kept as the address's are; none for a backend.
    block_bindings: Vec<(crate::tally::Charge<Block>, crate::tally::Charge<Block>)>,
    /// Its share of the sidecar's schema-wide bindings (MAX_SCHEMA_WIDE_BINDINGS), a
    /// backend's too.
    schema_wide: crate::tally::Charge<()>,
}

impl Channels {
    /// A new connection's (empty) channels.
    pub fn new(
        shared: Arc<Shared>,
        vsn: Vsn,
        socket_claims: Claims,
        headers: String,
        tx: out::Sender,
        address: Option<AddressKey>,
    ) -> Self {
        let id = NEXT_ID.fetch_add(1, Relaxed);
        let link = Link::new(id, vsn, shared.origin(id), tx);
        let address_bindings = address.map(|a| shared.bindings_by_address.charge(a));
        let address_patterns = address.map(|a| shared.patterns_by_address.charge(a));
        let block_bindings = address
            .map(|a| a.blocks())
            .unwrap_or_default()
            .into_iter()
            .map(|b| {
                (
                    shared.bindings_by_block.charge(b),
                    shared.patterns_by_block.charge(b),
                )
            })
            .collect();
        let schema_wide = shared.schema_wide_bindings.charge(());
        Channels {
            address_bindings,
            address_patterns,
            block_bindings,
            schema_wide,
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
            presence_source: crate::presence::budget::Source::new(address),
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

    fn push_notice(&mut self, reach: &Reach, notice: &Notice) {
        self.push_system(reach, notice.status(), &notice.text());
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

    /// Leaves every channel without a word (the socket is closing).
    pub fn leave_all(&mut self) {
        for (topic, mut ch) in std::mem::take(&mut self.channels) {
            self.unsubscribe(&topic, &mut ch);
        }
        // Its pending joins' answers are never polled again: their bindings go too.
        self.pending_joins.clear();
        self.recount_bindings();
    }

    /// What the bindings of this connection's channels and pending joins hold (a rejoin's
    /// old channel and its pending join both count until the join is answered).
    fn bindings_held(&self) -> Weight {
        let joined: Weight = self.channels.values().map(|c| c.bindings).sum();
        joined + self.pending_joins.values().map(|j| j.bindings).sum()
    }

    /// Brings the connection's shares of its address's bindings and patterns to what it
    /// holds now, after a channel or a pending join came or went (giving back never needs
    /// room).
    fn recount_bindings(&mut self) {
        let held = self.bindings_held();
        if let Some(share) = &mut self.address_bindings {
            share.set(held.bindings);
        }
        if let Some(share) = &mut self.address_patterns {
            share.set(held.patterns);
        }
        for (bindings, patterns) in &mut self.block_bindings {
            bindings.set(held.bindings);
            patterns.set(held.patterns);
        }
        self.schema_wide.set(held.schema_wide);
    }

    /// Makes the connection's shares of its address's bindings and patterns, and of the
    /// sidecar's schema-wide bindings, `to`, unless a total with `counted` in place of its
    /// share would pass MAX_BINDINGS_PER_ADDRESS, MAX_PATTERNS_PER_ADDRESS or
    /// MAX_SCHEMA_WIDE_BINDINGS: then none changes. A backend's connection has no address
    /// shares, and may use the whole of MAX_SCHEMA_WIDE_BINDINGS.
    fn charge_address(&mut self, to: Weight, counted: Weight) -> Result<(), Refusal> {
        let cfg = &self.shared.cfg;
        let (bindings_limit, patterns_limit) =
            (cfg.max_bindings_per_address, cfg.max_patterns_per_address);
        let backend = self.address_bindings.is_none();
        let total = cfg.max_schema_wide_bindings as u64;
        let wide_limit = if backend {
            total
        } else {
            cfg.clients_share(total)
        } as usize;
        let wide_before = self.schema_wide.amount();
        if let Err(total) =
            self.schema_wide
                .set_within(to.schema_wide, counted.schema_wide, wide_limit)
        {
            return Err(Refusal::SchemaWideBindings {
                total,
                limit: wide_limit,
            });
        }
        let (Some(bindings), Some(patterns)) =
            (&mut self.address_bindings, &mut self.address_patterns)
        else {
            return Ok(());
        };
        let before = bindings.amount();
        if let Err(total) = bindings.set_within(to.bindings, counted.bindings, bindings_limit) {
            self.schema_wide.set(wide_before);
            return Err(Refusal::BindingsPerAddress {
                total,
                limit: bindings_limit,
            });
        }
        let patterns_before = patterns.amount();
        if let Err(total) = patterns.set_within(to.patterns, counted.patterns, patterns_limit) {
            bindings.set(before);
            self.schema_wide.set(wide_before);
            return Err(Refusal::PatternsPerAddress {
                total,
                limit: patterns_limit,
            });
        }
        // And each wider block of the address; a refusal by one puts every share back.
        let mut refused = None;
        let mut moved = 0;
        for (block_bindings, block_patterns) in &mut self.block_bindings {
            let block = *block_bindings.key();
            let ((b_limit, b_setting), (p_limit, p_setting)) = cfg.max_bindings_per_block(&block);
            let was = (block_bindings.amount(), block_patterns.amount());
            let over = match block_bindings.set_within(to.bindings, counted.bindings, b_limit) {
                Err(total) => Some(("bindings", total, b_limit, b_setting)),
                Ok(()) => match block_patterns.set_within(to.patterns, counted.patterns, p_limit) {
                    Err(total) => {
                        block_bindings.set(was.0);
                        Some(("pattern conditions", total, p_limit, p_setting))
                    }
                    Ok(()) => None,
                },
            };
            if let Some((what, total, limit, setting)) = over {
                refused = Some(Refusal::BindingsPerBlock {
                    what,
                    block: block.to_string(),
                    total,
                    limit,
                    setting,
                });
                break;
            }
            moved += 1;
        }
        if let Some(why) = refused {
            let held = (before, patterns_before, wide_before);
            self.put_back(moved, held);
            return Err(why);
        }
        Ok(())
    }

    /// Puts the shares `charge_address` moved back to what they were: the address's, the
    /// sidecar's schema-wide, and the first `moved` blocks' (each back to the address's).
    fn put_back(&mut self, moved: usize, (bindings, patterns, wide): (usize, usize, usize)) {
        if let Some(share) = &mut self.address_bindings {
            share.set(bindings);
        }
        if let Some(share) = &mut self.address_patterns {
            share.set(patterns);
        }
        self.schema_wide.set(wide);
        for (b, p) in self.block_bindings.iter_mut().take(moved) {
            b.set(bindings);
            p.set(patterns);
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
            // Phoenix answers a leave of a topic the socket has no channel on with ok (the
            // channel is already gone: after a refused join, Supabase's Kotlin client sends
            // exactly that); any other push there is refused.
            if matches!(command, Command::Leave) {
                self.push_text(frame::reply(self.link.vsn, &m, "ok", json!({})));
            } else {
                self.refuse(&m, Refusal::UnmatchedTopic);
            }
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
            Command::Broadcast(Err(why)) => self.refuse(&m, Refusal::UnableToBroadcast(why)),
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

    /// Applies what the database answered.
    pub fn on_answer(&mut self, answer: Answer) {
        match answer {
            Answer::Join {
                topic,
                access,
                checked,
                tables,
                listened,
            } => {
                let Some(mut join) = self.pending_joins.remove(&topic) else {
                    return;
                };
                if let Some(tables) = tables {
                    join.held.absorb(tables);
                }
                if let Some(f) = access.failure() {
                    // The database could not answer: not a denial, and said as Supabase says it.
                    self.join_error(&join.m, Refusal::Database(f.clone()));
                } else if access.readable() {
                    let verdicts = (
                        access.broadcast_read.allowed(),
                        access.presence_read.as_ref().map(Verdict::allowed),
                    );
                    match (checked, listened) {
                        (Checked::Failed(f), _) | (_, Err(NotReady::Failed(f))) => {
                            self.join_error(&join.m, Refusal::Database(f))
                        }
                        (_, Err(NotReady::Refused(key, why))) => {
                            self.join_error(&join.m, Refusal::NotListened(key.to_string(), why))
                        }
                        (Checked::Ok(bindings, unserved), Ok(())) => {
                            self.complete_join(join, verdicts, (bindings, unserved))
                        }
                    }
                } else {
                    let role_refusal = access.role_refusal().map(str::to_owned);
                    let why = Refusal::ReadDenied {
                        topic: join.sub_topic,
                        role_refusal,
                    };
                    self.join_error(&join.m, why);
                }
                // Admitted or refused, the pending join's bindings are now its channel's
                // or nobody's.
                self.recount_bindings();
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

    /// Leaves a channel; with a reason, tells the client first (system error).
    fn leave(&mut self, topic: &str, reason: Option<ChannelClosed>) {
        if let Some(mut ch) = self.channels.remove(topic) {
            if let Some(r) = reason {
                self.push_system(&ch.reach, "error", &r.text());
            }
            self.push_text(ch.reach.close_text());
            self.unsubscribe(topic, &mut ch);
            self.recount_bindings();
        }
    }
}

/// Who a channel's verdicts are asked for: its token's role and claims, and the socket's
/// headers (`request.headers`).
fn identity(claims: &Claims, headers: &str, address: Option<AddressKey>) -> Arc<Identity> {
    Arc::new(Identity {
        role: claims.role.clone(),
        claims: claims.all.to_string(),
        headers: headers.to_owned(),
        address,
    })
}
