//! "Ask once, hold pushes, release in order": the client pushes of a channel that need a
//! verdict not asked yet (a private channel's broadcast write verdict, its presence
//! verdicts), as Supabase asks them, at the first push that needs one. The push that finds
//! no verdict asks and is held; pushes that come while the verdict is on its way are held
//! behind it; when it is back they are handled again, in the order they came.
//!
//! How many can be held is bounded by the channel's rate limits (events and presence
//! pushes a second) times the database call deadline.

use crate::frame::Inbound;

/// One channel's pushes of one kind held while their verdict is asked.
#[derive(Debug)]
pub struct Held<P> {
    asking: bool,
    pushes: Vec<(Inbound, P)>,
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

    /// A push: held while a verdict is being asked, else handed back to be handled now.
    pub fn admit(&mut self, m: Inbound, p: P) -> Option<(Inbound, P)> {
        if self.asking {
            self.pushes.push((m, p));
            None
        } else {
            Some((m, p))
        }
    }

    /// The push that needs a verdict not asked yet: held, and the verdict is being asked.
    pub fn ask(&mut self, m: Inbound, p: P) {
        self.asking = true;
        self.pushes.push((m, p));
    }

    /// The verdict is back: the pushes held meanwhile, in the order they came.
    pub fn release(&mut self) -> Vec<(Inbound, P)> {
        self.asking = false;
        std::mem::take(&mut self.pushes)
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
    fn pushes_wait_behind_the_one_that_asked_and_come_back_in_order() {
        let mut held: Held<u32> = Held::default();
        assert_eq!(
            held.admit(push("1"), 1).map(|p| p.1),
            Some(1),
            "nothing asked"
        );
        held.ask(push("2"), 2);
        assert!(held.is_asking());
        assert!(held.admit(push("3"), 3).is_none());
        assert!(held.admit(push("4"), 4).is_none());
        let back: Vec<u32> = held.release().into_iter().map(|p| p.1).collect();
        assert_eq!(back, vec![2, 3, 4]);
        assert!(!held.is_asking());
        assert!(held.release().is_empty());
    }
}
