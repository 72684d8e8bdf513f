//! Topics the database just found at their quota of persisted messages
//! (MAX_PERSISTED_MESSAGES_PER_TOPIC, MAX_PERSISTED_BYTES_PER_TOPIC; `sql/persisted.sql`).
//!
//! The quota is judged in `realtime.relay_batch`, under the topic's lock, by counting what
//! the topic keeps; a batch holding a message past it fails whole and the relay splits it
//! down to that message. A user pushing kept messages into a full topic as fast as a
//! connection is let made every push such a failure and its splitting, in the database (the
//! soak's persister: a quarter of a core of Postgres at 200 pushes a second), and delayed
//! whichever other clients' broadcasts shared its batches. So once the database refused a
//! kept message of a topic for its quota, the topic's kept messages at least that large are
//! refused where they are pushed, with the database's reason, for `FOR` (1 s), without
//! entering the relay; smaller ones still go to the database, which may find them room.
//! Messages that are not kept are never refused here. Within that second a message may be
//! refused that another sidecar's expiry just made room for: the sender is told the
//! reason, and its next push after the second is judged by the database again.

use crate::hub::Payload;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a topic found full is refused without asking the database.
pub const FOR: Duration = Duration::from_secs(1);
/// Topics remembered at most (a kept message needs a private topic its sender may write,
/// so these are few; past this, a topic is not remembered and the database judges it).
const MAX_TOPICS: usize = 10_000;

#[derive(Default)]
pub struct FullTopics {
    topics: Mutex<HashMap<(bool, String), Full>>,
}

struct Full {
    until: Instant,
    /// The smallest kept message refused: a smaller one may still fit the byte quota.
    bytes: usize,
    reason: String,
}

/// The size the quota counts a message at.
pub fn size(payload: &Payload) -> usize {
    match payload {
        Payload::Json(j) => j.len(),
        Payload::Binary(b) => b.len(),
    }
}

impl FullTopics {
    /// The database's reason if a kept message of `bytes` to this topic is known not to fit.
    pub fn refused(&self, topic: &str, private: bool, bytes: usize) -> Option<String> {
        let topics = self.topics.lock().unwrap();
        if topics.is_empty() {
            return None;
        }
        let full = topics.get(&(private, topic.to_owned()))?;
        (full.until > Instant::now() && bytes >= full.bytes).then(|| full.reason.clone())
    }

    /// The database refused a kept message of `bytes` to this topic for its quota.
    pub fn found_full(&self, topic: &str, private: bool, bytes: usize, reason: &str) {
        let now = Instant::now();
        let mut topics = self.topics.lock().unwrap();
        if topics.len() >= MAX_TOPICS {
            topics.retain(|_, f| f.until > now);
        }
        let key = (private, topic.to_owned());
        let smallest = match topics.get(&key) {
            Some(f) if f.until > now => f.bytes.min(bytes),
            _ => bytes,
        };
        if topics.len() < MAX_TOPICS || topics.contains_key(&key) {
            topics.insert(
                key,
                Full {
                    until: now + FOR,
                    bytes: smallest,
                    reason: reason.to_owned(),
                },
            );
        }
    }
}

/// Whether the database's refusal of a kept message is its topic's quota.
pub fn is_quota(reason: &str) -> bool {
    reason.starts_with("PersistQuotaExceeded")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_topic_refuses_as_large_kept_messages_for_a_second_and_smaller_ones_ask() {
        let full = FullTopics::default();
        assert_eq!(full.refused("room", true, 100), None);
        full.found_full("room", true, 100, "PersistQuotaExceeded: room");
        assert_eq!(
            full.refused("room", true, 100).as_deref(),
            Some("PersistQuotaExceeded: room")
        );
        assert!(full.refused("room", true, 5000).is_some());
        assert_eq!(
            full.refused("room", true, 99),
            None,
            "may fit the bytes left"
        );
        assert_eq!(full.refused("room", false, 100), None, "another topic");
        assert_eq!(full.refused("other", true, 100), None);
        // A smaller one refused too lowers the size refused here.
        full.found_full("room", true, 10, "PersistQuotaExceeded: room");
        assert!(full.refused("room", true, 10).is_some());
    }

    #[test]
    fn past_its_second_a_topic_is_asked_again() {
        let full = FullTopics::default();
        full.found_full("room", true, 1, "PersistQuotaExceeded: room");
        full.topics.lock().unwrap().values_mut().for_each(|f| {
            f.until = Instant::now() - Duration::from_millis(1);
        });
        assert_eq!(full.refused("room", true, 1), None);
    }

    #[test]
    fn past_its_bound_of_topics_a_new_one_is_left_to_the_database_until_others_expire() {
        let full = FullTopics::default();
        for i in 0..MAX_TOPICS {
            full.found_full(&format!("t{i}"), true, 1, "PersistQuotaExceeded");
        }
        full.found_full("one-too-many", true, 1, "PersistQuotaExceeded");
        assert_eq!(full.topics.lock().unwrap().len(), MAX_TOPICS);
        assert_eq!(
            full.refused("one-too-many", true, 1),
            None,
            "not remembered"
        );
        // One already remembered is still updated at the bound.
        full.found_full("t7", true, 0, "PersistQuotaExceeded");
        assert!(full.refused("t7", true, 0).is_some());
        // Once some have expired, they make room.
        full.topics
            .lock()
            .unwrap()
            .iter_mut()
            .filter(|((_, t), _)| t.ends_with('0'))
            .for_each(|(_, f)| f.until = Instant::now() - Duration::from_millis(1));
        full.found_full("one-too-many", true, 1, "PersistQuotaExceeded");
        assert!(full.refused("one-too-many", true, 1).is_some());
        assert_eq!(
            full.topics.lock().unwrap().len(),
            MAX_TOPICS - MAX_TOPICS / 10 + 1
        );
    }
}
