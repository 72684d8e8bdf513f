//! Quotas of persisted messages the database just found full: a topic's
//! (MAX_PERSISTED_*_PER_TOPIC), a sender's (MAX_PERSISTED_*_PER_USER) or the database's
//! (MAX_PERSISTED_MESSAGES, MAX_PERSISTED_BYTES; `sql/persisted.sql`).
//!
//! The quotas are judged in `realtime.relay_batch`, under the topic's and the sender's locks,
//! by counting what they keep; a batch holding a message past one fails whole and the relay
//! splits it down to that message. A user pushing kept messages into a full topic as fast
//! as a connection is let made every push such a failure and its splitting, in the database
//! (the soak's persister: a quarter of a core of Postgres at 200 pushes a second), and
//! delayed whichever other clients' broadcasts shared its batches. So once the database
//! refused a kept message for a quota, kept messages at least that large that the same
//! quota counts are refused where they are pushed, with the database's reason, for `FOR`
//! (1 s), without entering the relay; smaller ones still go to the database, which may find
//! them room. Messages that are not kept are never refused here. Within that second a
//! message may be refused that another sidecar's expiry just made room for: the sender is
//! told the reason, and its next push after the second is judged by the database again.

use crate::hub::Payload;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a quota found full is refused without asking the database.
pub const FOR: Duration = Duration::from_secs(1);
/// Quotas remembered at most (a kept message needs a private topic its sender may write,
/// so these are few; past this, a quota is not remembered and the database judges it).
const MAX_QUOTAS: usize = 10_000;

#[derive(Default)]
pub struct FullQuotas {
    quotas: Mutex<HashMap<Holder, Full>>,
}

/// What a quota counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Holder {
    /// A topic (private or not).
    Topic(bool, String),
    /// A sender, as `relay_batch` names it (`persist::sender`).
    Sender(String),
    /// Every sender together.
    All,
}

struct Full {
    until: Instant,
    /// The smallest kept message refused: a smaller one may still fit the byte quota.
    bytes: usize,
    reason: String,
}

/// A kept message, as the quotas count it.
pub struct Kept<'a> {
    pub topic: &'a str,
    pub private: bool,
    pub sender: Option<&'a str>,
    pub bytes: usize,
}

impl Kept<'_> {
    fn holders(&self) -> [Option<Holder>; 3] {
        [
            Some(Holder::All),
            Some(Holder::Topic(self.private, self.topic.to_owned())),
            self.sender.map(|s| Holder::Sender(s.to_owned())),
        ]
    }

    /// The quota a refusal's text names (each names its settings).
    fn holder_of(&self, reason: &str) -> Option<Holder> {
        if reason.contains("_PER_TOPIC") {
            Some(Holder::Topic(self.private, self.topic.to_owned()))
        } else if reason.contains("_PER_USER") {
            self.sender.map(|s| Holder::Sender(s.to_owned()))
        } else {
            Some(Holder::All)
        }
    }
}

/// The size the quota counts a message at.
pub fn size(payload: &Payload) -> usize {
    match payload {
        Payload::Json(j) => j.len(),
        Payload::Binary(b) => b.len(),
    }
}

impl FullQuotas {
    /// The database's reason if this kept message is known not to fit one of its quotas.
    pub fn refused(&self, kept: &Kept) -> Option<String> {
        let quotas = self.quotas.lock().unwrap();
        if quotas.is_empty() {
            return None;
        }
        let now = Instant::now();
        kept.holders().into_iter().flatten().find_map(|h| {
            let full = quotas.get(&h)?;
            (full.until > now && kept.bytes >= full.bytes).then(|| full.reason.clone())
        })
    }

    /// The database refused this kept message for the quota its reason names.
    pub fn found_full(&self, kept: &Kept, reason: &str) {
        let Some(key) = kept.holder_of(reason) else {
            return;
        };
        let now = Instant::now();
        let mut quotas = self.quotas.lock().unwrap();
        if quotas.len() >= MAX_QUOTAS {
            quotas.retain(|_, f| f.until > now);
        }
        let smallest = match quotas.get(&key) {
            Some(f) if f.until > now => f.bytes.min(kept.bytes),
            _ => kept.bytes,
        };
        if quotas.len() < MAX_QUOTAS || quotas.contains_key(&key) {
            quotas.insert(
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

/// Whether the database's refusal of a kept message is one of its quotas.
pub fn is_quota(reason: &str) -> bool {
    reason.starts_with("PersistQuotaExceeded")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPIC: &str = "PersistQuotaExceeded: topic room ... (MAX_PERSISTED_MESSAGES_PER_TOPIC, MAX_PERSISTED_BYTES_PER_TOPIC)";
    const USER: &str = "PersistQuotaExceeded: user u1 ... (MAX_PERSISTED_MESSAGES_PER_USER, MAX_PERSISTED_BYTES_PER_USER)";
    const ALL: &str =
        "PersistQuotaExceeded: this database ... (MAX_PERSISTED_MESSAGES, MAX_PERSISTED_BYTES)";

    fn kept<'a>(topic: &'a str, sender: Option<&'a str>, bytes: usize) -> Kept<'a> {
        Kept {
            topic,
            private: true,
            sender,
            bytes,
        }
    }

    #[test]
    fn a_full_topic_refuses_as_large_kept_messages_for_a_second_and_smaller_ones_ask() {
        let full = FullQuotas::default();
        assert_eq!(full.refused(&kept("room", None, 100)), None);
        full.found_full(&kept("room", None, 100), TOPIC);
        assert_eq!(
            full.refused(&kept("room", None, 100)).as_deref(),
            Some(TOPIC)
        );
        assert!(full.refused(&kept("room", Some("user u2"), 5000)).is_some());
        assert_eq!(
            full.refused(&kept("room", None, 99)),
            None,
            "may fit the bytes left"
        );
        let public = Kept {
            private: false,
            ..kept("room", None, 100)
        };
        assert_eq!(full.refused(&public), None, "another topic");
        assert_eq!(full.refused(&kept("other", None, 100)), None);
        // A smaller one refused too lowers the size refused here.
        full.found_full(&kept("room", None, 10), TOPIC);
        assert!(full.refused(&kept("room", None, 10)).is_some());
    }

    #[test]
    fn a_full_sender_is_refused_in_every_topic_and_a_full_database_for_everyone() {
        let full = FullQuotas::default();
        full.found_full(&kept("room:u1-1", Some("user u1"), 10), USER);
        assert_eq!(
            full.refused(&kept("room:u1-2", Some("user u1"), 10))
                .as_deref(),
            Some(USER),
            "another topic of the same sender"
        );
        assert_eq!(full.refused(&kept("room:u1-1", Some("user u2"), 10)), None);
        assert_eq!(
            full.refused(&kept("room:u1-1", None, 10)),
            None,
            "a backend"
        );
        full.found_full(&kept("room:u3", Some("user u3"), 10), ALL);
        assert_eq!(
            full.refused(&kept("elsewhere", None, 10)).as_deref(),
            Some(ALL)
        );
    }

    #[test]
    fn past_its_second_a_quota_is_asked_again() {
        let full = FullQuotas::default();
        full.found_full(&kept("room", None, 1), TOPIC);
        full.quotas.lock().unwrap().values_mut().for_each(|f| {
            f.until = Instant::now() - Duration::from_millis(1);
        });
        assert_eq!(full.refused(&kept("room", None, 1)), None);
    }

    #[test]
    fn past_its_bound_of_quotas_a_new_one_is_left_to_the_database_until_others_expire() {
        let full = FullQuotas::default();
        for i in 0..MAX_QUOTAS {
            full.found_full(&kept(&format!("t{i}"), None, 1), TOPIC);
        }
        full.found_full(&kept("one-too-many", None, 1), TOPIC);
        assert_eq!(full.quotas.lock().unwrap().len(), MAX_QUOTAS);
        assert_eq!(
            full.refused(&kept("one-too-many", None, 1)),
            None,
            "not remembered"
        );
        // One already remembered is still updated at the bound.
        full.found_full(&kept("t7", None, 0), TOPIC);
        assert!(full.refused(&kept("t7", None, 0)).is_some());
        // Once some have expired, they make room.
        full.quotas
            .lock()
            .unwrap()
            .iter_mut()
            .filter(|(h, _)| matches!(h, Holder::Topic(_, t) if t.ends_with('0')))
            .for_each(|(_, f)| f.until = Instant::now() - Duration::from_millis(1));
        full.found_full(&kept("one-too-many", None, 1), TOPIC);
        assert!(full.refused(&kept("one-too-many", None, 1)).is_some());
        assert_eq!(
            full.quotas.lock().unwrap().len(),
            MAX_QUOTAS - MAX_QUOTAS / 10 + 1
        );
    }
}
