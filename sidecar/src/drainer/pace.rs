//! When the drain makes its next call under load: a linger after the last hand-out, and,
//! with a budget of drain calls (`DRAIN_CALLS_PER_SECOND`), no sooner than this sidecar's
//! share of that budget allows.
//!
//! # Why
//!
//! A drain call costs the primary about the same whatever it carries (a round trip, a
//! wake-up of its backend), so what draining costs the primary is the number of calls. One
//! sidecar handed every message makes one call a cycle under load (its linger, the call,
//! the hand-out). N sidecars routed by topic, each handed a 1/N share, each make one call a
//! cycle too, and their cycles are shorter (less to hand out): N times the calls, and N
//! times the primary's cost, for the same messages. (In the lab, at 2,000 messages a second:
//! 0.20 calls a message for one sidecar, 0.87 for eight.)
//!
//! A budget of B calls a second, set alike on every sidecar, fixes the total instead: each
//! sidecar starts a call no sooner than `1 ÷ (B × share)` after its last one started, its
//! share being the part of the queue's traffic it is handed. The sidecars together then make
//! at most B calls a second, however many they are, without knowing of each other. B at or
//! below what one sidecar makes on its own under the load keeps the primary's cost of
//! draining flat as sidecars are added.
//!
//! The price is latency under load, and only there: the wait follows a batch that carried
//! something, so a message after a quiet spell is not held (its call started long ago), and
//! the wait after a hand-out is capped by `DRAIN_LINGER_MAX_MS`. Without a budget (0, the
//! default) every sidecar waits its linger and nothing more, as before.
//!
//! # The share
//!
//! Measured over windows of about a second: the entries handed out (messages, changes,
//! presence diffs, gaps) ÷ the sequences the position moved (every message published,
//! this sidecar's and the ones it read past for other sidecars' topics). Until a window
//! has moved, the share is 1.

use std::time::Duration;
use tokio::time::Instant;

/// How long a share is measured before it is used.
const WINDOW: Duration = Duration::from_secs(1);

pub(super) struct Pacing {
    linger: Duration,
    /// All sidecars' drain calls a second under load (None: no budget).
    budget: Option<f64>,
    /// The longest wait after a hand-out the budget may ask for (never less than `linger`).
    max: Duration,
    share: f64,
    window_at: Instant,
    own: u64,
    moved: u64,
}

impl Pacing {
    pub(super) fn new(linger: Duration, budget: u32, max: Duration, now: Instant) -> Self {
        Pacing {
            linger,
            budget: (budget > 0).then_some(budget as f64),
            max: max.max(linger),
            share: 1.0,
            window_at: now,
            own: 0,
            moved: 0,
        }
    }

    /// Whether calls are paced at all (`DRAIN_LINGER_MS` 0 and no budget: every call at
    /// once).
    pub(super) fn is_off(&self) -> bool {
        self.linger.is_zero() && self.budget.is_none()
    }

    /// A drain answer: the position moved by `moved` sequences, `own` of them handed out.
    pub(super) fn record(&mut self, moved: u64, own: u64, now: Instant) {
        self.moved += moved;
        self.own += own.min(moved);
        if now.duration_since(self.window_at) >= WINDOW && self.moved > 0 {
            self.share = self.own as f64 / self.moved as f64;
            self.window_at = now;
            self.own = 0;
            self.moved = 0;
        }
    }

    /// When the next call may start, after a batch that carried something: the call just
    /// answered started at `called`, and its batch was handed out at `handed`.
    pub(super) fn next_call(&self, called: Instant, handed: Instant) -> Instant {
        let after_linger = handed + self.linger;
        let Some(budget) = self.budget else {
            return after_linger;
        };
        // A share of 0 (nothing of the last window was this sidecar's) waits the longest.
        let interval = 1.0 / (budget * self.share.max(f64::MIN_POSITIVE));
        let by_budget = called + Duration::from_secs_f64(interval.min(self.max.as_secs_f64()));
        by_budget.max(after_linger).min(handed + self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_budget_spaces_calls_by_the_share_up_to_the_most() {
        let t0 = Instant::now();
        let mut p = Pacing::new(MS, 400, 50 * MS, t0);
        // No window measured yet: a share of 1, a call every 2.5 ms of 400 a second.
        let (called, handed) = (t0, t0 + MS);
        assert_eq!(
            p.next_call(called, handed),
            t0 + 2500 * Duration::from_micros(1)
        );
        // An eighth of what the position moved was this sidecar's: a call every 20 ms.
        p.record(800, 100, t0 + 500 * MS);
        assert_eq!(
            p.next_call(called, handed),
            t0 + 2500 * Duration::from_micros(1)
        );
        p.record(800, 100, t0 + 1000 * MS);
        assert_eq!(p.next_call(called, handed), t0 + 20 * MS);
        // A call that itself took longer than the interval: the linger after its hand-out.
        assert_eq!(p.next_call(called, t0 + 30 * MS), t0 + 31 * MS);
        // Nothing of it this sidecar's: the most.
        p.record(1000, 0, t0 + 2000 * MS);
        assert_eq!(p.next_call(called, handed), called + 50 * MS);
        assert_eq!(p.next_call(called, t0 + 40 * MS), t0 + 50 * MS);
        // A window in which the position did not move keeps the share it had.
        p.record(0, 0, t0 + 5000 * MS);
        assert_eq!(p.next_call(called, handed), called + 50 * MS);
        // After a quiet spell the call started long ago: only the linger.
        let late = t0 + 10_000 * MS;
        p.record(1000, 1000, late);
        assert_eq!(p.next_call(t0, late), late + MS);
    }

    #[test]
    fn without_a_budget_the_linger_after_the_hand_out() {
        let t0 = Instant::now();
        let mut p = Pacing::new(MS, 0, 50 * MS, t0);
        p.record(1000, 1, t0 + 2000 * MS);
        assert_eq!(p.next_call(t0, t0 + 3 * MS), t0 + 4 * MS);
        assert!(Pacing::new(Duration::ZERO, 0, 50 * MS, t0).is_off());
    }

    /// A budget set with no linger (`DRAIN_LINGER_MS` 0) was ignored: every call was made
    /// at once, and the sidecar made as many calls as it could.
    #[test]
    fn a_budget_without_a_linger_still_spaces_calls() {
        let t0 = Instant::now();
        let p = Pacing::new(Duration::ZERO, 400, 50 * MS, t0);
        assert!(!p.is_off());
        assert_eq!(
            p.next_call(t0, t0 + MS),
            t0 + 2500 * Duration::from_micros(1)
        );
    }
}
