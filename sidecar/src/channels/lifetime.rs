//! A joined channel's lifetime: what leaving it stops, and its verdicts kept current
//! (re-checked every AUTHORIZATION_TTL_SECS and at a new token, at most one check in flight;
//! a database that cannot answer is retried, never a revocation).

use super::channel::Channel;
use super::{identity, Answer, Channels};
use crate::authorizer::{self, Access};
use crate::frame::Inbound;
use crate::reason::{ChannelClosed, Notice};
use std::time::Duration;

impl Channels {
    /// Stops everything the channel receives, makes its member leave and gives back its
    /// place in the counts. Returns the queue position of the first change it held behind a
    /// pending check, which was never sent (`crate::out`, its slots), if any.
    pub(super) fn unsubscribe(&self, topic: &str, ch: &mut Channel) -> Option<i64> {
        // First: nothing passes the gate (and counts as sent) once what is held is counted.
        let through = ch.reach.close_gate();
        ch.broadcast.stop(&self.shared.hub, &ch.reach, &ch.key);
        if ch.postgres_changes {
            self.shared.changes.remove(self.link.id, topic);
        }
        // What it holds behind a pending check is the left channel's (`crate::out`, its slots).
        let unsent = ch.reach.close_hold(through.unwrap_or(i64::MIN));
        ch.presence.stop(&self.shared.presence, &ch.reach, &ch.key);
        self.shared.metrics.channels.decrement(1.0);
        unsent
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
    pub(super) fn recheck(&mut self, topic: &str) {
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

    pub(super) fn apply_recheck(&mut self, topic: &str, generation: u64, access: Access) {
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
            let notice = Notice::RecheckFailed {
                why: f.reason(),
                backoff_secs: backoff.as_secs(),
            };
            self.push_notice(&reach, &notice);
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
        if !read {
            // Presence read keeps the channel, but a history still being sent is a
            // broadcast read: it stops at its next frame (`history::pace`).
            ch.reach.close_gate();
        }
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

    pub(super) fn refresh_token(&mut self, m: &Inbound, token: Option<String>) {
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
                        ch.who = identity(&c, &self.headers, self.presence_source.address);
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
