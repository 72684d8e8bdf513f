//! The broadcast extension of a channel: whether the hub delivers to it (the read verdict),
//! whether the client may send on it (the write verdict), and the client's `broadcast`
//! pushes, relayed through the database (`relay`) so every sidecar sees them in the
//! queue's one order, then fanned out like any message, minus the sender unless it joined
//! with `self: true`. With `ack: true` the reply comes once the push has committed.

use crate::command::ClientBroadcast;
use crate::frame::Inbound;
use crate::held::Held;
use crate::hub::{Hub, Subscriber, TopicKey};
use crate::join_config::JoinConfig;
use crate::out::{Link, Reach};
use crate::reason::Refusal;
use crate::relay::{self, AckTo, Failure};
use crate::state::Shared;
use tokio::sync::mpsc;

/// One channel's broadcast settings and verdicts.
#[derive(Debug)]
pub struct State {
    /// Reply to the client's broadcasts once they are committed (`config.broadcast.ack`).
    pub ack: bool,
    /// Deliver the client's own broadcasts back to it (`config.broadcast.self`).
    pub self_broadcast: bool,
    /// Read verdict: the channel is subscribed in the hub only while it holds. (A private
    /// join may be admitted on presence read alone; it then gets no broadcasts.)
    pub read: bool,
    /// Write verdict of a private channel, None until asked at its first push (public
    /// channels: anyone may send).
    pub write: Option<bool>,
    /// The client's broadcasts waiting for the write verdict.
    pub held: Held<ClientBroadcast>,
}

impl State {
    pub fn new(config: &JoinConfig, read: bool, write: Option<bool>) -> Self {
        State {
            ack: config.ack,
            self_broadcast: config.self_broadcast,
            read,
            write,
            held: Held::default(),
        }
    }

    /// Starts delivery to the channel, if it may read (behind its gate while its history
    /// is sent, if `reach` has one).
    pub fn start(&self, hub: &Hub, link: &Link, reach: &Reach, key: &TopicKey) {
        if self.read {
            let sub = Subscriber {
                reach: reach.clone(),
                origin: link.origin,
                self_broadcast: self.self_broadcast,
            };
            hub.subscribe(key.clone(), sub);
        }
    }

    /// Stops delivery to the channel.
    pub fn stop(&self, hub: &Hub, reach: &Reach, key: &TopicKey) {
        if self.read {
            hub.unsubscribe(key, reach.conn);
        }
    }

    /// Applies a re-checked read verdict: delivery starts or stops when it changed. The
    /// write verdict is asked again at the next push (so a revoked write takes effect
    /// within the same time to live).
    pub fn apply(&mut self, read: bool, hub: &Hub, link: &Link, reach: &Reach, key: &TopicKey) {
        if key.private {
            self.write = None;
        }
        if read == self.read {
            return;
        }
        if read {
            self.read = true;
            self.start(hub, link, reach, key);
        } else {
            self.stop(hub, reach, key);
            self.read = false;
        }
    }
}

/// A client's broadcast push on the channel of `key`: handed to the relay, or refused.
pub fn push(
    shared: &Shared,
    author: relay::Author,
    reach: &Reach,
    key: &TopicKey,
    state: &State,
    m: &Inbound,
    b: ClientBroadcast,
) -> Result<(), Refusal> {
    let ClientBroadcast {
        event,
        payload,
        persist,
    } = b;
    let persist = persist
        .and_then(|ttl| crate::persist::check(ttl, key.private))
        .map_err(Refusal::Persist)?;
    if key.private && state.write != Some(true) {
        // Supabase drops these silently; an error reply says why instead.
        return Err(Refusal::WriteDenied {
            topic: key.topic.clone(),
        });
    }
    let reply = AckTo::Socket {
        to: reach.answering(m),
        ack: state.ack,
        persist: persist.is_some(),
    };
    let held = match relay::hold_bytes(
        &shared.relay_bytes,
        author.address,
        &key.topic,
        &event,
        &payload,
        &shared.metrics,
    ) {
        Ok(held) => held,
        Err(busy) => {
            // Answered like any failed relay (an error reply, or a system message without ack).
            reply.settle(Err(busy));
            shared.metrics.client_broadcast_failures_total.increment(1);
            return Ok(());
        }
    };
    let broadcast = relay::Broadcast {
        origin: author.origin,
        topic: key.topic.clone(),
        event,
        private: key.private,
        payload,
        persist,
        sender: author.sender,
        id: None,
        reply,
        held,
    };
    if let Some(known) = relay::known_full(&shared.persist_full, &broadcast, &shared.metrics) {
        relay::settle(vec![broadcast], Err(known), &shared.metrics);
        return Ok(());
    }
    if let Err(mpsc::error::TrySendError::Full(b)) = shared.relay.try_send(broadcast) {
        // Answered like any failed relay (an error reply, or a system message without ack).
        let busy = Failure::Unavailable("too many broadcasts are waiting for the database; retry");
        relay::settle(vec![b], Err(busy), &shared.metrics);
    }
    Ok(())
}
