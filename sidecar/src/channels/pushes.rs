//! A joined channel's client pushes: broadcasts (relayed, or refused with a reason) and
//! presence `track`/`untrack`. On a private channel the first push that needs a verdict
//! asks it, and the pushes after it wait behind it (`held`), then go on in order.

use super::{Answer, Channels};
use crate::address::AddressKey;
use crate::authorizer::{self, Verdict};
use crate::broadcast;
use crate::byte_budget::Hold;
use crate::command::ClientBroadcast;
use crate::frame::{self, Inbound};
use crate::presence::channel::{Outcome, PresencePush};
use crate::reason::{ChannelClosed, Refusal};
use crate::relay;
use crate::state::Shared;

impl Channels {
    /// A client broadcast on a joined channel: relayed, refused, or held while the write
    /// verdict of a private channel is asked (at its first push, as Supabase asks it); the
    /// pushes held meanwhile keep their order.
    pub(super) fn broadcast_push(&mut self, m: Inbound, b: ClientBroadcast) {
        let Some(ch) = self.channels.get_mut(&m.topic) else {
            return;
        };
        let asking = ch.broadcast.held.is_asking();
        if asking || (ch.key.private && ch.broadcast.write.is_none()) {
            // Held until the verdict is back, its bytes held as a relayed broadcast's are.
            let (budget, metrics) = (&self.shared.relay_bytes, &self.shared.metrics);
            let address = self.presence_source.address;
            let topic = m.topic.clone();
            match relay::hold_bytes(
                budget,
                address,
                &ch.key.topic,
                &b.event,
                &b.payload,
                metrics,
            ) {
                Ok(hold) => ch.broadcast.held.hold(m, b, hold),
                Err(failure) => {
                    let persisted = b.persist != Ok(None);
                    metrics.client_broadcast_failures_total.increment(1);
                    self.refuse_broadcast(&m, &failure.reason(), persisted);
                    return;
                }
            }
            if asking {
                return;
            }
            let generation = ch.checks.generation;
            let (sub_topic, who) = (ch.key.topic.clone(), ch.who.clone());
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
        let author = crate::relay::Author {
            origin: self.link.origin,
            address: self.presence_source.address,
            sender: persisted
                .then(|| {
                    let address = self.presence_source.address;
                    crate::persist::sender(
                        ch.claims.sub.as_deref(),
                        address,
                        ch.claims.is_backend(),
                    )
                })
                .flatten(),
        };
        if let Err(why) = broadcast::push(&self.shared, author, &ch.reach, key, state, &m, b) {
            self.refuse_broadcast(&m, &why.text(), persisted);
        }
    }

    /// An error reply to a client broadcast: Supabase's `reason`, and `error` too for one
    /// that asked to be kept (realtime-js returns that to the app).
    fn refuse_broadcast(&mut self, m: &Inbound, reason: &str, persisted: bool) {
        let reply = crate::relay::refusal(reason, persisted);
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
    pub(super) fn apply_write_verdict(&mut self, topic: &str, generation: u64, write: Verdict) {
        let Some(ch) = self.channels.get_mut(topic) else {
            return;
        };
        let held = ch.broadcast.held.release();
        if generation == ch.checks.generation {
            if let Some(f) = write.failure() {
                for (m, b) in held {
                    let persisted = b.persist != Ok(None);
                    self.refuse_broadcast(&m, &Refusal::Database(f.clone()).text(), persisted);
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
    pub(super) fn presence_push(&mut self, m: Inbound, push: PresencePush) {
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
        if ch.presence.held.is_asking() {
            match presence_hold(&self.shared, self.presence_source.address, &push) {
                Ok(hold) => ch.presence.held.hold(m, push, hold),
                Err(why) => self.refuse(&m, why),
            }
            return;
        }
        let p = &self.shared.presence;
        let source = &mut self.presence_source;
        let outcome = ch.presence.push(p, &ch.reach, &ch.key, &m, push, source);
        match outcome {
            Outcome::Handed => {}
            Outcome::Refused(why) => self.refuse(&m, why),
            Outcome::Close(why) => self.leave(&m.topic, Some(why)),
            Outcome::Ask { read, push } => {
                let hold = match presence_hold(&self.shared, self.presence_source.address, &push) {
                    Ok(hold) => hold,
                    Err(why) => return self.refuse(&m, why),
                };
                let Some(ch) = self.channels.get_mut(&m.topic) else {
                    return;
                };
                let topic = m.topic.clone();
                ch.presence.held.hold(m, push, hold);
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
    pub(super) fn apply_presence_verdicts(
        &mut self,
        topic: &str,
        generation: u64,
        read: Option<Verdict>,
        write: Verdict,
    ) {
        let Some(ch) = self.channels.get_mut(topic) else {
            return;
        };
        let held = ch.presence.held.release();
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
}

/// Holds the bytes of a presence push about to be held for its channel's verdicts (`held`).
fn presence_hold(
    shared: &Shared,
    address: Option<AddressKey>,
    push: &PresencePush,
) -> Result<Hold, Refusal> {
    let bytes = match push {
        PresencePush::Track(meta) => meta.to_string().len(),
        PresencePush::Untrack | PresencePush::Unknown(_) => 0,
    };
    relay::take_bytes(&shared.relay_bytes, address, bytes, &shared.metrics)
        .map_err(Refusal::PresenceHeldBytes)
}
