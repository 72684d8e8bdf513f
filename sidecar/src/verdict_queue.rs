//! The line private-channel verdicts wait in for the one authorizer connection, served in
//! turn by client address (issue 39, M1).
//!
//! Every private join, first push and re-check of every client asks `realtime.authorize`
//! through one connection, in batches. Its queue was first come first served, so whoever
//! asked most was answered first: clients on a few networks, each within its join rates,
//! could keep everyone else's joins waiting behind theirs. Here each client address (an
//! IPv6 /64; backends together under none) has a line of its own, and the authorizer's next
//! requests are taken from the lines in turn, one from each, so a newcomer waits behind at
//! most one request of each other address (and what was already handed on, `AHEAD`).
//!
//! Bounds: an address's line holds at most MAX_VERDICTS_WAITING_PER_ADDRESS; past it the
//! request is answered at once, `DbFailure::Busy` (its join is refused with that reason, a
//! re-check is retried later). All lines hold at most MAX_VERDICTS_WAITING; past it the
//! newest request of the longest line makes room for the newcomer (or the newcomer is
//! refused if its line is the longest): many addresses cannot fill the lines against one
//! that asks little.
//!
//! One task owns the lines (no lock): it reads every request as it comes, and hands the
//! next in turn to the authorizer's worker whenever it has room for it.

use crate::address::AddressKey;
use crate::authorizer::{AuthRequest, Verdict};
use crate::db_worker::DbFailure;
use crate::metrics::Metrics;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Requests handed on to the authorizer's worker ahead of its current call at most: they
/// are its next batch, and what a newcomer may wait behind besides one request per address.
pub const AHEAD: usize = 2_000;

/// The lines, by address, with their turn.
pub struct Lines {
    lines: HashMap<Option<AddressKey>, VecDeque<AuthRequest>>,
    /// Addresses with requests waiting, in the order of their next turn.
    turn: VecDeque<Option<AddressKey>>,
    held: usize,
    per_address: usize,
    total: usize,
}

impl Lines {
    pub fn new(per_address: usize, total: usize) -> Lines {
        Lines {
            lines: HashMap::new(),
            turn: VecDeque::new(),
            held: 0,
            per_address: per_address.max(1),
            total: total.max(1),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Puts a request in its address's line; returns what must be refused to make room
    /// (the request itself, or the newest of the longest line).
    pub fn push(&mut self, r: AuthRequest) -> Option<AuthRequest> {
        let key = r.who.address;
        let len = self.lines.get(&key).map_or(0, VecDeque::len);
        if len >= self.per_address {
            return Some(r);
        }
        let mut evicted = None;
        if self.held >= self.total {
            let longest = self
                .lines
                .iter()
                .max_by_key(|(_, line)| line.len())
                .map(|(k, line)| (*k, line.len()));
            match longest {
                Some((k, n)) if n > len + 1 => {
                    evicted = self.lines.get_mut(&k).and_then(VecDeque::pop_back);
                    self.held -= 1;
                }
                _ => return Some(r),
            }
        }
        let line = self.lines.entry(key).or_default();
        if line.is_empty() {
            self.turn.push_back(key);
        }
        line.push_back(r);
        self.held += 1;
        evicted
    }

    /// The next request in turn: the oldest of the address whose turn it is.
    pub fn pop(&mut self) -> Option<AuthRequest> {
        while let Some(key) = self.turn.pop_front() {
            let Some(line) = self.lines.get_mut(&key) else {
                continue;
            };
            let Some(r) = line.pop_front() else {
                self.lines.remove(&key);
                continue;
            };
            self.held -= 1;
            if line.is_empty() {
                self.lines.remove(&key);
            } else {
                self.turn.push_back(key);
            }
            return Some(r);
        }
        None
    }
}

/// Answers a request the lines had no room for.
fn refuse(r: AuthRequest, metrics: &Metrics) {
    metrics.auth_verdicts_refused_total.increment(1);
    let _ = r.reply.send(Verdict::Failed(DbFailure::Busy));
}

/// Runs until `rx` closes (and what waits is handed on) or the worker is gone: reads every
/// request into its line, hands the next in turn to `out` whenever it has room.
pub async fn serve(
    mut rx: mpsc::Receiver<AuthRequest>,
    out: mpsc::Sender<AuthRequest>,
    mut lines: Lines,
    metrics: Arc<Metrics>,
) {
    loop {
        tokio::select! {
            biased;
            permit = out.reserve(), if !lines.is_empty() => {
                let Ok(permit) = permit else { return };
                if let Some(r) = lines.pop() {
                    permit.send(r);
                }
            }
            r = rx.recv() => match r {
                Some(r) => {
                    if let Some(refused) = lines.push(r) {
                        refuse(refused, &metrics);
                    }
                }
                None => break,
            },
        }
    }
    while let Some(r) = lines.pop() {
        if out.send(r).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authorizer::Identity;
    use std::net::{IpAddr, Ipv4Addr};
    use tokio::sync::oneshot;

    fn ask(address: Option<u8>, topic: &str) -> (AuthRequest, oneshot::Receiver<Verdict>) {
        let (reply, rx) = oneshot::channel();
        let address = address.map(|a| AddressKey::of(IpAddr::V4(Ipv4Addr::new(192, 0, 2, a))));
        let r = AuthRequest {
            who: Arc::new(Identity {
                role: "anon".into(),
                claims: "{}".into(),
                headers: "{}".into(),
                address,
            }),
            topic: topic.into(),
            extension: "broadcast",
            write: false,
            reply,
        };
        (r, rx)
    }

    /// Issue 39, M1: the authorizer's queue was first come first served, so one address's
    /// thousands of requests were all answered before a request that came after them.
    #[test]
    fn one_address_s_requests_were_all_answered_before_another_s() {
        let mut lines = Lines::new(10_000, 100_000);
        for i in 0..5_000 {
            assert!(lines.push(ask(Some(1), &format!("flood{i}")).0).is_none());
        }
        assert!(lines.push(ask(Some(2), "bystander").0).is_none());
        assert!(lines.push(ask(None, "backend").0).is_none());
        let first: Vec<String> = (0..3).map(|_| lines.pop().unwrap().topic).collect();
        assert_eq!(first, ["flood0", "bystander", "backend"]);
        // Then the flood, in its order.
        assert_eq!(lines.pop().unwrap().topic, "flood1");
        let mut n = 1;
        while lines.pop().is_some() {
            n += 1;
        }
        assert_eq!(n, 4_999);
        assert!(lines.is_empty() && lines.lines.is_empty() && lines.turn.is_empty());
    }

    /// MAX_VERDICTS_WAITING_PER_ADDRESS and MAX_VERDICTS_WAITING: past an address's bound
    /// its request is refused; past the total, the longest line gives way to a newcomer.
    #[test]
    fn lines_are_bounded_per_address_and_in_total_the_longest_giving_way() {
        let mut lines = Lines::new(3, 5);
        for i in 0..3 {
            assert!(lines.push(ask(Some(1), &format!("a{i}")).0).is_none());
        }
        let refused = lines
            .push(ask(Some(1), "a3").0)
            .expect("past its address's bound");
        assert_eq!(refused.topic, "a3");
        assert!(lines.push(ask(Some(2), "b0").0).is_none());
        assert!(lines.push(ask(Some(2), "b1").0).is_none());
        // Five held: a newcomer takes the place of the longest line's newest.
        let evicted = lines.push(ask(Some(3), "c0").0).expect("room was made");
        assert_eq!(evicted.topic, "a2");
        // A line as long as the longest less one is refused rather than evicting.
        let refused = lines.push(ask(Some(2), "b2").0).expect("full");
        assert_eq!(refused.topic, "b2");
        let order: Vec<String> = std::iter::from_fn(|| lines.pop())
            .map(|r| r.topic)
            .collect();
        assert_eq!(order, ["a0", "b0", "c0", "a1", "b1"]);
    }

    #[tokio::test]
    async fn what_has_no_room_is_answered_busy_and_the_rest_reach_the_worker_in_turn() {
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = mpsc::channel(100);
        let (out, mut worker) = mpsc::channel(1);
        let mut replies = Vec::new();
        for (a, t) in [(1, "a0"), (1, "a1"), (1, "a2"), (2, "b0")] {
            let (r, reply) = ask(Some(a), t);
            tx.send(r).await.unwrap();
            replies.push(reply);
        }
        drop(tx);
        // One request per address may wait: a0 is handed on, a1 waits, a2 has no room.
        let task = tokio::spawn(serve(rx, out, Lines::new(1, 100), metrics.clone()));
        let mut got = Vec::new();
        while let Some(r) = worker.recv().await {
            got.push(r.topic);
        }
        task.await.unwrap();
        assert_eq!(replies[2].try_recv(), Ok(Verdict::Failed(DbFailure::Busy)));
        assert_eq!(
            metrics.value("realtime_auth_verdicts_refused_total"),
            Some(1.0)
        );
        assert_eq!(got, ["a0", "a1", "b0"]);
    }
}
