//! What each channel of this sidecar wants its presence to be, handed from the connections
//! to the presence worker. A channel's presence is a state, not a stream of commands: the
//! connection sets what it wants (tracked with this key and meta, or untracked) and the
//! worker writes whatever changed since it last looked, in one statement for every
//! channel. So a client that re-tracks a cursor 30 times while one write is in the
//! database costs one more write, not 30, and the queue between them can never overflow:
//! it holds at most one entry per channel, and each channel's pushes waiting to be answered
//! are counted (`Reply`, MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL).

use crate::hub::{ConnId, TopicKey};
use crate::out::ReplyTo;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// One channel's presence: the connection and the channel's topic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MemberId {
    pub conn: ConnId,
    pub topic: TopicKey,
}

/// What a channel wants.
#[derive(Clone, Debug, PartialEq)]
pub enum Desired {
    /// Present under `key` with `meta` (a JSON object's text).
    Tracked {
        key: String,
        meta: String,
    },
    Untracked,
}

/// Where the answer to a `track` or `untrack` push goes: a `phx_reply` once the change is
/// committed (or found to change nothing), or an error reply saying why it was not.
///
/// While the database is slow or away, a channel's pushes wait here (in its wish, or in a
/// write in flight, or put back after a lost connection) however many times the wish is
/// replaced. So each one counts against its channel's MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL
/// from the moment it is handed over until it is dropped (answered, or its connection is
/// gone): one counter per channel, wherever its pushes are.
pub struct Reply {
    to: ReplyTo,
    waiting: Arc<AtomicUsize>,
}

impl Reply {
    /// The reply to one more push of the channel whose counter is `waiting`, unless `limit`
    /// of its pushes are waiting already.
    pub fn wait(to: ReplyTo, waiting: &Arc<AtomicUsize>, limit: usize) -> Option<Reply> {
        waiting
            .fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1))
            .ok()?;
        Some(Reply {
            to,
            waiting: waiting.clone(),
        })
    }
}

impl std::ops::Deref for Reply {
    type Target = ReplyTo;
    fn deref(&self) -> &ReplyTo {
        &self.to
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Relaxed);
    }
}

/// A channel's wish, with the pushes waiting to hear how it ended.
pub struct Want {
    pub desired: Desired,
    pub replies: Vec<Reply>,
}

#[derive(Default)]
pub struct Members {
    wants: Mutex<HashMap<MemberId, Want>>,
    /// Wakes the worker when a wish is set.
    pub wake: Notify,
}

impl Members {
    /// Sets what a channel wants; it replaces any wish the worker has not taken yet (whose
    /// pushes are then answered with this one's outcome).
    pub fn set(&self, id: MemberId, desired: Desired, reply: Option<Reply>) {
        let mut wants = self.wants.lock().unwrap();
        let want = wants.entry(id).or_insert_with(|| Want {
            desired: Desired::Untracked,
            replies: Vec::new(),
        });
        want.desired = desired;
        want.replies.extend(reply);
        drop(wants);
        self.wake.notify_one();
    }

    /// Sets a wish unless one is waiting already (which is newer).
    pub fn set_if_absent(&self, id: MemberId, desired: Desired) {
        let mut wants = self.wants.lock().unwrap();
        wants.entry(id).or_insert_with(|| Want {
            desired,
            replies: Vec::new(),
        });
        drop(wants);
        self.wake.notify_one();
    }

    /// Puts back a wish the worker could not write yet; a wish set meanwhile is newer and
    /// stands (and answers these pushes too).
    pub fn restore(&self, id: MemberId, desired: Desired, replies: Vec<Reply>) {
        let mut wants = self.wants.lock().unwrap();
        let want = wants.entry(id).or_insert_with(|| Want {
            desired,
            replies: Vec::new(),
        });
        want.replies.extend(replies);
        drop(wants);
        self.wake.notify_one();
    }

    /// Every wish set since the last call, taken by the worker.
    pub fn take(&self) -> HashMap<MemberId, Want> {
        std::mem::take(&mut *self.wants.lock().unwrap())
    }

    pub fn is_empty(&self) -> bool {
        self.wants.lock().unwrap().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(conn: ConnId) -> MemberId {
        MemberId {
            conn,
            topic: TopicKey {
                private: false,
                topic: "room".into(),
            },
        }
    }

    fn reply_to(tx: &crate::out::Sender, r: &str) -> ReplyTo {
        let link = crate::out::Link::new(1, crate::frame::Vsn::V2, 1, tx.clone());
        ReplyTo {
            reach: link.reach("realtime:room", Some("1")),
            reference: Some(r.into()),
        }
    }

    fn reply(tx: &crate::out::Sender, r: &str) -> Option<Reply> {
        Reply::wait(reply_to(tx, r), &Arc::default(), usize::MAX)
    }

    #[test]
    fn a_channel_counts_its_waiting_pushes_until_each_is_dropped() {
        let (tx, _rx) = crate::out::channel(8);
        let waiting = Arc::default();
        let a = Reply::wait(reply_to(&tx, "a"), &waiting, 2).unwrap();
        let b = Reply::wait(reply_to(&tx, "b"), &waiting, 2).unwrap();
        assert!(Reply::wait(reply_to(&tx, "c"), &waiting, 2).is_none());
        assert_eq!(waiting.load(Relaxed), 2, "a refused push is not counted");
        a.ok();
        drop(a);
        let c = Reply::wait(reply_to(&tx, "c"), &waiting, 2);
        assert!(c.is_some(), "an answered push no longer counts");
        drop((b, c));
        assert_eq!(waiting.load(Relaxed), 0);
    }

    #[test]
    fn the_last_wish_wins_and_every_push_hears_its_outcome() {
        let m = Members::default();
        let (tx, rx) = crate::out::channel(8);
        for (i, meta) in ["{\"x\":1}", "{\"x\":2}", "{\"x\":3}"].iter().enumerate() {
            let desired = Desired::Tracked {
                key: "ann".into(),
                meta: (*meta).into(),
            };
            m.set(id(1), desired, reply(&tx, &i.to_string()));
        }
        m.set(id(2), Desired::Untracked, None);
        let mut wants = m.take();
        assert!(m.is_empty());
        assert_eq!(wants.len(), 2, "one entry per channel");
        let want = wants.remove(&id(1)).unwrap();
        assert_eq!(
            want.desired,
            Desired::Tracked {
                key: "ann".into(),
                meta: "{\"x\":3}".into()
            }
        );
        assert_eq!(want.replies.len(), 3);
        for r in want.replies {
            r.ok();
        }
        let refs: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| {
                let v: serde_json::Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
                assert_eq!(v[4]["status"], "ok");
                v[1].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(refs, vec!["0", "1", "2"]);
    }
}
