//! "Ask once, hold pushes, release in order": the client pushes of a channel that need a
//! verdict not asked yet (a private channel's broadcast write verdict, its presence
//! verdicts), as Supabase asks them, at the first push that needs one. The push that finds
//! no verdict asks and is held; pushes that come while the verdict is on its way are held
//! behind it; when it is back they are handled again, in the order they came.
//!
//! How many can be held is bounded by the channel's rate limits (events and presence
//! pushes a second) times the database call deadline; how many bytes, by the relay's
//! (MAX_RELAY_BYTES_PER_ADDRESS, MAX_RELAY_BYTES): a held push waits for the database as a
//! broadcast queued for the relay does, and each holds its bytes there until it is released
//! (a frame may be megabytes, and a slow verdict can take seconds).

use crate::byte_budget::Hold;
use crate::frame::Inbound;

/// One channel's pushes of one kind held while their verdict is asked.
pub struct Held<P> {
    asking: bool,
    pushes: Vec<(Inbound, P, Hold)>,
}

impl<P> std::fmt::Debug for Held<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("asking", &self.asking)
            .field("pushes", &self.pushes.len())
            .finish()
    }
}

impl<P> Default for Held<P> {
    fn default() -> Self {
        Held {
            asking: false,
            pushes: Vec::new(),
        }
    }
}

impl<P> Held<P> {
    /// A verdict is on its way.
    pub fn is_asking(&self) -> bool {
        self.asking
    }

    /// Holds a push with its bytes (`hold`): the push that asks the verdict, or one that
    /// came while it is being asked (`is_asking`).
    pub fn hold(&mut self, m: Inbound, p: P, hold: Hold) {
        self.asking = true;
        self.pushes.push((m, p, hold));
    }

    /// The verdict is back: the pushes held meanwhile, in the order they came; their bytes
    /// are given back.
    pub fn release(&mut self) -> Vec<(Inbound, P)> {
        self.asking = false;
        std::mem::take(&mut self.pushes)
            .into_iter()
            .map(|(m, p, _)| (m, p))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn push(reference: &str) -> Inbound {
        Inbound {
            join_ref: None,
            reference: Some(reference.into()),
            topic: "realtime:room".into(),
            event: "broadcast".into(),
            payload: json!({}),
        }
    }

    #[test]
    fn pushes_wait_behind_the_one_that_asked_and_come_back_in_order_with_their_bytes() {
        let budget = crate::byte_budget::ByteBudget::new(1000, 1000);
        let take = |n| budget.take(None, n).unwrap();
        let mut held: Held<u32> = Held::default();
        assert!(!held.is_asking(), "nothing asked");
        held.hold(push("2"), 2, take(100));
        assert!(held.is_asking());
        held.hold(push("3"), 3, take(200));
        held.hold(push("4"), 4, take(300));
        assert_eq!(budget.held(), 600);
        let back: Vec<u32> = held.release().into_iter().map(|p| p.1).collect();
        assert_eq!(back, vec![2, 3, 4]);
        assert_eq!(budget.held(), 0, "released pushes hold no bytes");
        assert!(!held.is_asking());
        assert!(held.release().is_empty());
    }
}
