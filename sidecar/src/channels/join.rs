//! A join: its checks, in the order Supabase makes them (rate, topic, token and expiry,
//! Postgres Changes and history config, a join in progress, the channel limit), then, for a
//! public channel without bindings, admission at once; otherwise its questions to the
//! database (verdicts, the bindings' check, the upload of its keys) are asked and the join
//! waits here (`PendingJoin`) for their answer. Admission starts every extension of the
//! channel (broadcast delivery, Postgres Changes, history, presence) and answers the join.

use super::channel::{Channel, Checks};
use super::pending_join::PendingJoin;
use super::{identity, Answer, Channels};
use crate::authorizer::{self, Access};
use crate::broadcast;
use crate::client_text;
use crate::frame::{self, Inbound};
use crate::history::{self, ask::Ask};
use crate::hub::TopicKey;
use crate::interest;
use crate::join_config::{self, JoinConfig};
use crate::jwt::{self, JwtError};
use crate::postgres_changes::binding::pattern_over;
use crate::postgres_changes::bounds::{Bounds, Weight};
use crate::postgres_changes::subscribable::{self, Checked};
use crate::postgres_changes::{self, subscribers, Binding, BindingError, Unserved};
use crate::presence::channel::{self as presence_channel, ChannelPresence};
use crate::reason::{Disconnect, Notice, Refusal};
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;

/// Bindings a join is told of one by one when they cannot be served; past these, one more
/// `system` message counts the rest.
const MAX_UNSERVED_NOTICES: usize = 10;

impl Channels {
    /// Counts a join against its address's, its blocks' and the sidecar's rates, or refuses
    /// it (then nothing is counted).
    fn join_rates(&self) -> Result<(), Refusal> {
        let (shared, cfg) = (&self.shared, &self.shared.cfg);
        let address = self.presence_source.address;
        let blocks = address.map(|a| a.blocks()).unwrap_or_default();
        if let Some(a) = &address {
            if shared
                .joins_by_address
                .check(a, 1, cfg.max_joins_per_second_per_address)
                .is_err()
            {
                return Err(Refusal::AddressJoinRateLimitReached);
            }
        }
        for b in &blocks {
            let limit = cfg.max_joins_per_second_per_block(b);
            if shared.joins_by_block.check(b, 1, limit).is_err() {
                return Err(Refusal::BlockJoinRateLimitReached(b.to_string()));
            }
        }
        let total = cfg.max_sidecar_joins_per_second;
        let limit = match address {
            Some(_) => cfg.clients_share(u64::from(total)) as u32,
            None => total,
        };
        if shared.joins_total.check(&(), 1, limit).is_err() {
            return Err(Refusal::SidecarJoinRateLimitReached);
        }
        if let Some(a) = &address {
            shared.joins_by_address.charge(a, 1);
        }
        for b in &blocks {
            shared.joins_by_block.charge(b, 1);
        }
        shared.joins_total.charge(&(), 1);
        Ok(())
    }

    pub(super) fn join(&mut self, m: Inbound, mut config: JoinConfig) -> Result<(), Disconnect> {
        if !self.joins.allow(self.shared.cfg.max_joins_per_second) {
            self.join_error(&m, Refusal::ClientJoinRateLimitReached);
            return Err(Disconnect::JoinRateLimit);
        }
        // And per client address and its wider blocks, over all their connections (a
        // backend's are not counted), and per sidecar (clients leave backends their part).
        if let Err(why) = self.join_rates() {
            self.join_error(&m, why);
            return Ok(());
        }
        let Some(sub_topic) = m.topic.strip_prefix("realtime:").filter(|s| !s.is_empty()) else {
            self.join_error(&m, Refusal::TopicNameRequired);
            return Ok(());
        };
        // Where Supabase checks it: before the limits and the token.
        if self.shared.cfg.private_only && !config.private {
            self.join_error(&m, Refusal::PrivateOnly);
            return Ok(());
        }
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
        // A regular expression over its length is one binding's problem, not the join's.
        let pattern_limit = self.shared.cfg.max_filter_pattern_length;
        for b in std::mem::take(&mut config.postgres_changes) {
            match pattern_over(&b, pattern_limit) {
                Some(why) => config.postgres_changes_unserved.push(Unserved::of(&b, why)),
                None => config.postgres_changes.push(b),
            }
        }
        if let Some(Err(bad)) = m.join_ref.as_deref().map(client_text::join_ref) {
            self.join_error(&m, Refusal::InvalidJoinRef(bad));
            return Ok(());
        }
        // Before any key is held or anything is asked of the database.
        if let Err(why) = Bounds::of(&self.shared.cfg).check(&config.postgres_changes) {
            self.join_error(&m, Refusal::PostgresChanges(why));
            return Ok(());
        }
        // Every binding of a schema-wide channel runs against every drained change, and every
        // pattern condition is asked about every changed value of its table: bounded per
        // connection too, not only per join (a rejoin replaces its channel's).
        let weight = Weight::of(&config.postgres_changes);
        let on_connection: Weight = self
            .channels
            .iter()
            .filter(|(t, _)| **t != m.topic)
            .map(|(_, c)| c.bindings)
            .chain(self.pending_joins.values().map(|j| j.bindings))
            .sum();
        let total = on_connection + weight;
        let cfg = &self.shared.cfg;
        let over = if weight.bindings > 0 && total.bindings > cfg.max_bindings_per_connection {
            Some((
                "bindings",
                total.bindings,
                cfg.max_bindings_per_connection,
                "MAX_BINDINGS_PER_CONNECTION",
            ))
        } else if weight.patterns > 0 && total.patterns > cfg.max_patterns_per_connection {
            Some((
                "pattern conditions",
                total.patterns,
                cfg.max_patterns_per_connection,
                "MAX_PATTERNS_PER_CONNECTION",
            ))
        } else {
            None
        };
        if let Some((what, total, limit, setting)) = over {
            let why = BindingError::OverLimit(format!(
                "the connection's channels would have {what}: {total}; the limit is {limit} ({setting})"
            ));
            self.join_error(&m, Refusal::PostgresChanges(why));
            return Ok(());
        }
        let key_limit = self.shared.cfg.max_presence_key_bytes;
        let key = client_text::text("the presence key", &config.presence_key, key_limit);
        if let Err(bad) = key {
            self.join_error(&m, Refusal::InvalidPresenceKey(bad));
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
        // And per client address, over all its connections: the anon key is public, so
        // MAX_CONNECTIONS_PER_ADDRESS sockets of MAX_BINDINGS_PER_CONNECTION each would
        // otherwise be one client's. Judged as above (a rejoin by its difference); what the
        // connection holds meanwhile is everything, its old channel's bindings too, until
        // the join is answered (`recount_bindings`). The last check: a join with bindings
        // that passes it always waits as a pending join, which holds what this takes.
        // A backend's connection has no address share to judge (`Claims::is_backend`). And
        // per sidecar, its schema-wide bindings (MAX_SCHEMA_WIDE_BINDINGS), a backend's too.
        if weight.bindings > 0 {
            let held = self.bindings_held();
            let replaced = self
                .channels
                .get(&m.topic)
                .map_or(Weight::default(), |c| c.bindings);
            let counted = held - replaced + weight;
            if let Err(refusal) = self.charge_address(held + weight, counted) {
                self.join_error(&m, refusal);
                return Ok(());
            }
        }
        // The drain returns the topic's messages (and its tables' changes) once they are
        // listened to: a join is answered after that, so it misses nothing committed later.
        // The topic is held at once (checked above); the tables only once the database's
        // check passed them, so no unchecked name is ever uploaded.
        let topic_key = vec![interest::Key::Topic(sub_topic.clone())];
        let (held, upload) = self.shared.interest.hold(topic_key.clone());
        let who = identity(&claims, &self.headers, self.presence_source.address);
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
                    bindings: weight,
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
                        Checked::Ok(bindings, Vec::new())
                    } else {
                        subscribable::check(&checker, &who.role, bindings).await
                    }
                };
                let listening = async {
                    match upload {
                        Some(round) => interest.ready(round, &topic_key, deadline).await,
                        None => Ok(()),
                    }
                };
                // The tables' keys after the check: one more upload round for a join that
                // names a table no channel here holds yet.
                let checking = async {
                    let checked = checking.await;
                    let Checked::Ok(bindings, _) = &checked else {
                        return (checked, None, Ok(()));
                    };
                    let (tables, round) = interest.hold(interest::table_keys(bindings));
                    let listened = match round {
                        Some(round) => tables.ready(round, deadline).await,
                        None => Ok(()),
                    };
                    (checked, Some(tables), listened)
                };
                let (access, (checked, tables, tables_listened), topic_listened) =
                    tokio::join!(asking, checking, listening);
                Answer::Join {
                    topic,
                    access,
                    checked,
                    tables,
                    listened: topic_listened.and(tables_listened),
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
            bindings: Weight::default(),
        };
        self.complete_join(join, (true, None), (Vec::new(), Vec::new()));
        Ok(())
    }

    /// Admits a join with its broadcast read verdict, its presence read verdict (a private
    /// join that enabled presence), its checked Postgres Changes bindings (and those the
    /// check refused) and its keys, already listened to in the database: registered before
    /// the reply, so a client that saw the reply gets every message and change committed
    /// after it.
    pub(super) fn complete_join(
        &mut self,
        join: PendingJoin,
        (read, presence_read): (bool, Option<bool>),
        (bindings, refused): (Vec<Binding>, Vec<Unserved>),
    ) {
        let PendingJoin {
            m,
            mut config,
            claims,
            who,
            sub_topic,
            held,
            bindings: _,
        } = join;
        let mut ask = config.history.clone().and_then(Result::ok);
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
            let unsent = self.unsubscribe(&m.topic, &mut old);
            // A second join of a channel this socket has (realtime-js sends one after a
            // join timed out, with the payload of before): resume after what this socket
            // was already sent, not before it; but before the first change the old channel
            // still held behind a pending check, which it dropped unsent with whatever
            // waited behind it (read after its gate closed, so nothing passes meanwhile).
            let sent = old.reach.last_sent();
            if let (Some(Ask::Resume { epoch, seq }), Some((e, s))) = (&mut ask, sent) {
                if e == *epoch {
                    let s = unsent.map_or(s, |u| s.min(u - 1));
                    *seq = (*seq).max(s);
                }
            }
        }
        // A private channel's write verdict is asked at its first push.
        let write = (!config.private).then_some(true);
        let broadcast = broadcast::State::new(&config, read, write);
        let cfg = &self.shared.cfg;
        let mut reach = self.link.reach(&m.topic, m.join_ref.as_deref());
        if ask.is_some() {
            reach = reach.gated(cfg.max_outbound_frames, cfg.max_outbound_bytes);
        }
        broadcast.start(&self.shared.hub, &self.link, &reach, &key);
        self.shared.metrics.channels.increment(1.0);
        self.shared.metrics.joins_total.increment(1);
        // What did not parse and what the check refused, in the client's order.
        let mut unserved = std::mem::take(&mut config.postgres_changes_unserved);
        unserved.extend(refused);
        unserved.sort_by_key(|u| u.at);
        let replied = postgres_changes::reply(&bindings, &unserved);
        let has_changes = !bindings.is_empty();
        let weight = Weight::of(&bindings);
        // A channel whose position covers its changes resumes them with its broadcasts:
        // its live changes then wait behind the same gate, and the history checks its
        // changes for the identity it joined with (`history::worker`).
        let positions = has_changes && config.change_positions;
        let resumed_changes = (positions && reach.is_gated()).then(|| history::Changes {
            bindings: bindings.clone(),
            role: claims.role.clone(),
            claims: claims.all.to_string(),
        });
        if has_changes {
            // Changes the history does not resend do not wait for it.
            let reach = if positions {
                reach.clone()
            } else {
                reach.ungated()
            };
            self.shared.changes.add(subscribers::Subscriber {
                reach,
                bindings,
                role: claims.role.clone(),
                claims: claims.all.to_string(),
                positions,
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
        // Supabase's system error for each binding not served, with its id so the app can
        // tell which; past MAX_UNSERVED_NOTICES one message says how many more (a join of
        // MAX_BINDINGS_PER_JOIN bad bindings must not make as many frames).
        let sub = frame::sub_topic(&reach.topic);
        let more = unserved.len().saturating_sub(MAX_UNSERVED_NOTICES);
        let told = unserved.iter().take(MAX_UNSERVED_NOTICES).map(|u| {
            json!({"extension": "postgres_changes", "status": "error", "message": u.message(),
                   "channel": sub, "id": u.id})
        });
        let summary = (more > 0).then(|| {
            let message = format!("{more} more postgres_changes bindings of this channel cannot be served; the first {MAX_UNSERVED_NOTICES} were told why");
            json!({"extension": "postgres_changes", "status": "error", "message": message, "channel": sub})
        });
        self.shared
            .metrics
            .postgres_changes_unserved_total
            .increment(unserved.len() as u64);
        for payload in told.chain(summary) {
            let text = frame::encode(
                reach.vsn,
                reach.join_ref(),
                None,
                &reach.topic,
                "system",
                &payload,
            );
            self.push_text(text);
        }
        if config.replication_ready {
            // Supabase's opt-in signal that its replication stream is up: here, that the
            // drain connection is. (While it is down nothing is lost: the queue keeps what
            // commits and the drainer delivers it when it is back.)
            let up = self.shared.metrics.db_up.load(Relaxed) == 1;
            self.push_notice(&reach, &Notice::ReplicationReady { up });
        }
        if let Some(ask) = ask {
            // After the reply (in `out`, written first), the history and then the held live
            // frames arrive through the outbound queue.
            let request = history::Request {
                ask,
                key: key.clone(),
                reach: reach.clone(),
                carry: None,
                changes: resumed_changes,
                permit: None,
            };
            // Read now, or after some of its address's histories end, or (its address's
            // line full) not at all, the channel told so (`history::line`).
            let address = self.presence_source.address;
            self.shared.resumes.admit(address, request);
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
            bindings: weight,
            _interest: held,
            claims,
            who,
            checks: Checks {
                generation,
                ..Checks::default()
            },
        };
        self.channels.insert(m.topic, channel);
        // A rejoin's old channel is gone: its bindings with it.
        self.recount_bindings();
    }
}
