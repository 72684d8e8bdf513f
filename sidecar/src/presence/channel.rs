//! A channel's presence: its member key, whether it receives the topic's presence (asked at
//! join with `presence.enabled`, or enabled by its first `track`, as Supabase does), its
//! presence verdicts on a private channel (read asked with the join's verdicts when
//! presence is enabled, write asked at the first track, as Supabase asks them), the
//! client's `track` and `untrack` pushes with their limits, and what leaving does (the
//! member leaves).

use super::budget::Source;
use super::members::{Desired, MemberId, Reply};
use super::Presence;
use crate::frame::Inbound;
use crate::held::Held;
use crate::hub::TopicKey;
use crate::out::Reach;
use crate::rate::Rate;
use crate::reason::{ChannelClosed, Refusal};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// A `presence` push, parsed once (`command`).
#[derive(Clone, Debug, PartialEq)]
pub enum PresencePush {
    /// `track` with its payload (the member's meta; Phoenix needs an object).
    Track(Value),
    Untrack,
    /// Any other event (lowercased, as Supabase compares it), or none.
    Unknown(String),
}

impl PresencePush {
    /// Reads realtime-js's `{type: "presence", event, payload}`.
    pub fn parse(payload: &Value) -> PresencePush {
        let event = payload
            .get("event")
            .and_then(Value::as_str)
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        match event.as_str() {
            "track" => PresencePush::Track(
                payload
                    .get("payload")
                    .cloned()
                    .unwrap_or_else(|| Value::Object(Default::default())),
            ),
            "untrack" => PresencePush::Untrack,
            _ => PresencePush::Unknown(event),
        }
    }
}

/// What the connection does with a push.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Handed to the worker, which answers it.
    Handed,
    /// Answered now with an error reply with this reason.
    Refused(Refusal),
    /// The channel is closed with this reason (a limit, as Supabase closes it).
    Close(ChannelClosed),
    /// Held until the presence verdicts of a private channel are back (`read`: ask presence
    /// read too, it was not asked at join); the push is handed back to be held.
    Ask { read: bool, push: PresencePush },
}

static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A member key for a join that named none, unique across sidecars and restarts (Supabase
/// makes a UUID): the process's instance, the time and a counter, shaped as a UUID.
pub fn generated_key(instance: u32) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = NEXT_KEY.fetch_add(1, Relaxed);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        instance,
        (nanos >> 48) & 0xffff,
        (nanos >> 32) & 0xffff,
        n & 0xffff,
        ((nanos & 0xffff_ffff) << 16) | ((n >> 16) & 0xffff)
    )
}

/// One channel's presence.
#[derive(Debug)]
pub struct ChannelPresence {
    pub key: String,
    /// The channel receives the topic's presence (when it may read it).
    pub enabled: bool,
    /// Presence read; None until asked (private channels only: public ones may).
    pub read: Option<bool>,
    /// Presence write; None until asked at a track (private channels only).
    pub write: Option<bool>,
    /// Pushes waiting for the presence verdicts being asked.
    pub held: Held<PresencePush>,
    watching: bool,
    /// A track was handed to the worker: leaving the channel untracks.
    tracked: bool,
    rate: Rate,
    /// This channel's pushes waiting for their answer (`members::Reply`).
    waiting: Arc<AtomicUsize>,
}

impl ChannelPresence {
    /// `read`: the presence read verdict asked at join, if it was (private channels).
    pub fn new(key: String, enabled: bool, private: bool, read: Option<bool>) -> Self {
        let (read, write) = if private {
            (read, None)
        } else {
            (Some(true), Some(true))
        };
        ChannelPresence {
            key,
            enabled,
            read,
            write,
            held: Held::default(),
            watching: false,
            tracked: false,
            rate: Rate::default(),
            waiting: Arc::default(),
        }
    }

    /// Starts receiving the topic's presence if enabled and readable: the state now (or
    /// once loaded), then diffs.
    pub fn start(&mut self, p: &Presence, reach: &Reach, key: &TopicKey) {
        if self.watching || !self.enabled || self.read != Some(true) {
            return;
        }
        self.watching = true;
        p.views.watch(key, reach.clone());
    }

    fn stop_watching(&mut self, p: &Presence, reach: &Reach, key: &TopicKey) {
        if self.watching {
            self.watching = false;
            p.views.unwatch(key, reach.conn);
        }
    }

    /// A re-checked (or newly asked) read verdict: presence starts or stops.
    pub fn set_read(&mut self, read: bool, p: &Presence, reach: &Reach, key: &TopicKey) {
        self.read = Some(read);
        if read {
            self.start(p, reach, key);
        } else {
            self.stop_watching(p, reach, key);
        }
    }

    /// The channel is gone: it stops receiving presence and its member leaves.
    pub fn stop(&mut self, p: &Presence, reach: &Reach, key: &TopicKey) {
        self.stop_watching(p, reach, key);
        if self.tracked {
            self.tracked = false;
            let id = MemberId {
                conn: reach.conn,
                topic: key.clone(),
            };
            p.members.set(id, Desired::Untracked, None);
        }
    }

    /// Counts a push against the client's presence limit (Supabase's
    /// `ClientPresenceRateLimitReached`, which closes the channel).
    pub fn allow(&mut self, limit: u32) -> bool {
        self.rate.allow(limit)
    }

    /// Handles a `track` or `untrack` push of this channel (the rate was counted).
    pub fn push(
        &mut self,
        p: &Presence,
        reach: &Reach,
        key: &TopicKey,
        m: &Inbound,
        push: PresencePush,
        source: &mut Source,
    ) -> Outcome {
        let id = MemberId {
            conn: reach.conn,
            topic: key.clone(),
        };
        // A push waits for its answer until its change is committed: while the database is
        // slow or away the channel's pushes pile up, so past the limit one is refused at once
        // and its wish is not set (a later push, or leaving the channel, still is).
        let limit = p.max_pushes_waiting;
        let waiting = Refusal::PresencePushesWaiting { limit };
        let reply = || Reply::wait(reach.answering(m), &self.waiting, limit);
        match push {
            PresencePush::Unknown(event) => Outcome::Refused(Refusal::UnknownPresenceEvent(event)),
            PresencePush::Untrack => {
                // Allowed by every rate and budget, as in Supabase: it only ever removes. A
                // later track is a new member again (MAX_PRESENCE_MEMBERS_PER_TOPIC).
                let Some(reply) = reply() else {
                    return Outcome::Refused(waiting);
                };
                self.tracked = false;
                p.members.set(id, Desired::Untracked, Some(reply));
                Outcome::Handed
            }
            PresencePush::Track(meta) => {
                if !meta.is_object() {
                    return Outcome::Refused(Refusal::PresenceNotAMap);
                }
                // Authorization before the payload's size, as Supabase checks them.
                match self.write {
                    None => {
                        let read = self.read.is_none();
                        let push = PresencePush::Track(meta);
                        return Outcome::Ask { read, push };
                    }
                    Some(false) => {
                        let topic = key.topic.clone();
                        return Outcome::Refused(Refusal::PresenceWriteDenied { topic });
                    }
                    Some(true) => {}
                }
                let meta = meta.to_string();
                // The key travels with the meta in every state and diff of the member: a
                // long key (up to MAX_PRESENCE_KEY_BYTES) counts against the size too.
                if meta.len() + self.key.len() > p.max_meta_bytes {
                    return Outcome::Close(ChannelClosed::TrackTooLarge);
                }
                // A new member, into a topic already full (a re-track replaces this channel's
                // own meta, so it is never refused here).
                let limit = p.max_members_per_topic;
                if !self.tracked && p.views.count(key).is_some_and(|n| n >= limit) {
                    return Outcome::Refused(Refusal::PresenceTopicFull { limit });
                }
                // Before the budgets, so that a refused push spends none of them.
                let Some(reply) = reply() else {
                    return Outcome::Refused(waiting);
                };
                if let Err(why) = p.budgets.admit(source) {
                    return Outcome::Refused(why);
                }
                // A track enables presence on the channel (Supabase then syncs the state).
                self.enabled = true;
                self.start(p, reach, key);
                self.tracked = true;
                let desired = Desired::Tracked {
                    key: self.key.clone(),
                    meta,
                };
                p.members.set(id, desired, Some(reply));
                p.metrics.presence_tracks_total.increment(1);
                Outcome::Handed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pushes_are_read_as_realtime_js_sends_them() {
        let track = json!({"type": "presence", "event": "TRACK", "payload": {"online_at": 1}});
        assert_eq!(
            PresencePush::parse(&track),
            PresencePush::Track(json!({"online_at": 1}))
        );
        assert_eq!(
            PresencePush::parse(&json!({"type": "presence", "event": "track"})),
            PresencePush::Track(json!({})),
            "no payload is an empty meta, as in Supabase"
        );
        assert_eq!(
            PresencePush::parse(&json!({"type": "presence", "event": "untrack"})),
            PresencePush::Untrack
        );
        assert_eq!(
            PresencePush::parse(&json!({"event": "sync"})),
            PresencePush::Unknown("sync".into())
        );
    }

    #[test]
    fn generated_keys_differ() {
        let a = generated_key(7);
        let b = generated_key(7);
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_ne!(generated_key(7)[..8], generated_key(8)[..8]);
    }
}
