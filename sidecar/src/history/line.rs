//! How many joins of one client address may have their history read or sent at once
//! (MAX_RESUMES_PER_ADDRESS), and the line the others wait in (MAX_RESUMES_WAITING_PER_ADDRESS).
//!
//! Each join that asks for history (a resume or Supabase's replay) may make the sidecar
//! hold up to MAX_RESUME_MESSAGES messages while they are sent at the client's pace, and the
//! anon key is public: without a bound per address, one address's slow readers hold as many
//! as it has channels. A join of an address with its share running is still answered at
//! once (its live frames held behind its gate, as for any resume) and waits here, in join
//! order, until one of its address's histories ends: a thousand users behind one NAT
//! rejoining after a restart is legitimate, and their resumes are served, a share at a
//! time. Only past the line's own bound is a join told at once, by the `system` message of a
//! resume that cannot be served, that it goes live without its history. Other addresses'
//! histories never wait here: they have lines of their own, and the history worker is not
//! held by anyone's line.
//!
//! A running history holds a `Permit` in its `Request`; the request travels through the
//! history worker and its sending task (and further passes), and wherever it is dropped
//! the permit goes to the next live join of the line. The map holds an address only while
//! it has a history running, so it never outgrows the joins in flight.
//!
//! A backend's connection (`Claims::is_backend`) has no line: its joins' histories run at
//! once, bounded by its channels (MAX_CHANNELS_PER_CLIENT) like any connection's.

use super::fetch::{self, Request};
use crate::address::AddressKey;
use crate::metrics::Metrics;
use crate::reason::Notice;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// The per-address lines of one sidecar.
#[derive(Clone)]
pub struct Line {
    inner: Arc<Inner>,
}

struct Inner {
    addresses: Mutex<HashMap<AddressKey, Queue>>,
    /// MAX_RESUMES_PER_ADDRESS
    running: usize,
    /// MAX_RESUMES_WAITING_PER_ADDRESS
    waiting: usize,
    /// The history worker's queue.
    history: mpsc::Sender<Request>,
    metrics: Arc<Metrics>,
}

/// One address: its histories running, and its joins waiting, oldest first.
#[derive(Default)]
struct Queue {
    running: usize,
    waiting: VecDeque<Request>,
}

/// What `Line::admit` did with a join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// Handed to the history worker.
    Now,
    /// In its address's line.
    Waiting,
    /// The line was full: the channel went live without its history, told why.
    Refused,
}

/// One running history of an address (or of a backend's connection, `None`: no line);
/// dropping it lets the next of the line run.
pub struct Permit {
    inner: Arc<Inner>,
    address: Option<AddressKey>,
}

impl Permit {
    /// The client address whose share this is (None: a backend's connection).
    pub fn address(&self) -> Option<AddressKey> {
        self.address
    }
}

impl Line {
    pub fn new(
        running: u64,
        waiting: u64,
        history: mpsc::Sender<Request>,
        metrics: Arc<Metrics>,
    ) -> Line {
        Line {
            inner: Arc::new(Inner {
                addresses: Mutex::default(),
                running: running.max(1) as usize,
                waiting: waiting as usize,
                history,
                metrics,
            }),
        }
    }

    /// Runs a join's history now if its address has room (a backend's always), or puts it
    /// in the address's line, or (the line full) lets the channel go live without it.
    pub fn admit(&self, address: Option<AddressKey>, r: Request) -> Admitted {
        let inner = &self.inner;
        let Some(address) = address else {
            inner.metrics.resumes_running.increment(1.0);
            inner.run(None, r);
            return Admitted::Now;
        };
        let mut addresses = inner.addresses.lock().unwrap();
        let q = addresses.entry(address).or_default();
        if q.running < inner.running {
            q.running += 1;
            drop(addresses);
            inner.metrics.resumes_running.increment(1.0);
            inner.run(Some(address), r);
            return Admitted::Now;
        }
        if q.waiting.len() >= inner.waiting {
            // Channels that left while waiting no longer count against the line.
            let before = q.waiting.len();
            q.waiting.retain(live);
            let gone = before - q.waiting.len();
            inner.metrics.resumes_waiting.decrement(gone as f64);
        }
        if q.waiting.len() < inner.waiting {
            q.waiting.push_back(r);
            inner.metrics.resumes_waiting.increment(1.0);
            return Admitted::Waiting;
        }
        drop(addresses);
        inner.metrics.resumes_refused_total.increment(1);
        let notice = Notice::ResumeLineFull {
            running: inner.running as u64,
            waiting: inner.waiting as u64,
        };
        fetch::unavailable_because(r, &notice.text(), &inner.metrics);
        Admitted::Refused
    }

    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.inner.addresses.lock().unwrap().len()
    }
}

impl Inner {
    /// Hands a join holding one of its address's places to the history worker.
    fn run(self: &Arc<Self>, address: Option<AddressKey>, mut r: Request) {
        r.permit = Some(Permit {
            inner: self.clone(),
            address,
        });
        if let Err(e) = self.history.try_send(r) {
            let r = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            // Its place is given back when its (empty) sending ends. (Without a runtime, the
            // process is ending: the request is dropped, and the line with it.)
            if tokio::runtime::Handle::try_current().is_ok() {
                fetch::unavailable(r, &self.metrics);
            }
        }
    }
}

/// A waiting join whose channel is still there to be sent its history.
fn live(r: &Request) -> bool {
    !r.gate.is_closed() && !r.reach.is_closed()
}

impl Drop for Permit {
    fn drop(&mut self) {
        let inner = &self.inner;
        let Some(address) = self.address else {
            inner.metrics.resumes_running.decrement(1.0);
            return;
        };
        let mut addresses = inner.addresses.lock().unwrap();
        let Some(q) = addresses.get_mut(&address) else {
            return;
        };
        // The place passes to the oldest waiting join still joined; the others are dropped
        // (their channels left: nothing is sent to them).
        let mut next = None;
        while let Some(r) = q.waiting.pop_front() {
            inner.metrics.resumes_waiting.decrement(1.0);
            if live(&r) {
                next = Some(r);
                break;
            }
        }
        if next.is_none() {
            q.running -= 1;
            if q.running == 0 && q.waiting.is_empty() {
                addresses.remove(&address);
            }
        }
        drop(addresses);
        match next {
            Some(r) => inner.run(Some(address), r),
            None => inner.metrics.resumes_running.decrement(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Vsn;
    use crate::gate::Gate;
    use crate::history::ask::Ask;
    use crate::hub::TopicKey;
    use crate::reach::Link;
    use std::net::{IpAddr, Ipv4Addr};

    fn address(last: u8) -> Option<AddressKey> {
        Some(AddressKey::of(IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))))
    }

    /// A resuming channel's request, and the receiving end of its connection's queue.
    fn request(topic: &str) -> (Request, crate::outbound::Receiver) {
        let (tx, rx) = crate::outbound::bounded(100, 1 << 20);
        let link = Link::new(1, Vsn::V1, 0, tx);
        let reach = link.reach(&format!("realtime:{topic}"), Some("1"));
        let r = Request {
            ask: Ask::Resume { epoch: 1, seq: 0 },
            key: TopicKey {
                private: false,
                topic: topic.into(),
            },
            reach,
            gate: Gate::new(100, 1 << 20),
            carry: None,
            changes: None,
            permit: None,
        };
        (r, rx)
    }

    #[tokio::test]
    async fn an_address_runs_its_share_the_next_wait_in_order_and_past_the_line_go_live_told_why() {
        let metrics = Arc::new(Metrics::default());
        let (history, mut worker) = mpsc::channel(16);
        let line = Line::new(2, 2, history, metrics.clone());
        let a = address(1);
        let mut keep = Vec::new();
        let mut admitted = Vec::new();
        for i in 0..5 {
            let (r, rx) = request(&format!("t{i}"));
            keep.push(rx);
            admitted.push(line.admit(a, r));
        }
        use Admitted::*;
        assert_eq!(admitted, [Now, Now, Waiting, Waiting, Refused]);
        assert_eq!(metrics.value("realtime_resumes_running"), Some(2.0));
        assert_eq!(metrics.value("realtime_resumes_waiting"), Some(2.0));
        assert_eq!(metrics.value("realtime_resumes_refused_total"), Some(1.0));
        // Another address is not behind this one's line.
        let (other, _rx) = request("other");
        assert_eq!(line.admit(address(2), other), Now);
        let first = worker.try_recv().unwrap();
        let second = worker.try_recv().unwrap();
        let other = worker.try_recv().unwrap();
        assert_eq!(
            (&*first.key.topic, &*second.key.topic, &*other.key.topic),
            ("t0", "t1", "other")
        );
        assert!(worker.try_recv().is_err(), "the waiting ones wait");
        // A history that ends lets the oldest waiting join of its address run.
        drop(first);
        let third = worker.try_recv().unwrap();
        assert_eq!(third.key.topic, "t2");
        // A waiting channel that left is passed over.
        drop(keep.remove(3));
        drop(second);
        assert!(worker.try_recv().is_err(), "t3's connection is gone");
        assert_eq!(metrics.value("realtime_resumes_waiting"), Some(0.0));
        drop(third);
        drop(other);
        assert_eq!(
            line.addresses(),
            0,
            "an address with nothing running is forgotten"
        );
        assert_eq!(metrics.value("realtime_resumes_running"), Some(0.0));
    }

    #[tokio::test]
    async fn a_full_line_makes_room_by_dropping_the_channels_that_left() {
        let metrics = Arc::new(Metrics::default());
        let (history, _worker) = mpsc::channel(16);
        let line = Line::new(1, 1, history, metrics.clone());
        let a = address(1);
        let (running, _rx0) = request("running");
        assert_eq!(line.admit(a, running), Admitted::Now);
        let (left, _rx1) = request("left");
        let gate = left.gate.clone();
        assert_eq!(line.admit(a, left), Admitted::Waiting);
        gate.close();
        let (next, _rx2) = request("next");
        assert_eq!(line.admit(a, next), Admitted::Waiting);
        assert_eq!(metrics.value("realtime_resumes_waiting"), Some(1.0));
    }

    #[tokio::test]
    async fn a_backend_s_histories_run_at_once_in_no_line() {
        let metrics = Arc::new(Metrics::default());
        let (history, mut worker) = mpsc::channel(16);
        let line = Line::new(1, 0, history, metrics.clone());
        let mut keep = Vec::new();
        for i in 0..3 {
            let (r, rx) = request(&format!("b{i}"));
            keep.push(rx);
            assert_eq!(line.admit(None, r), Admitted::Now);
        }
        assert_eq!(line.addresses(), 0, "a backend holds no address's line");
        assert_eq!(metrics.value("realtime_resumes_running"), Some(3.0));
        let running: Vec<Request> = (0..3).map(|_| worker.try_recv().unwrap()).collect();
        drop(running);
        assert_eq!(metrics.value("realtime_resumes_running"), Some(0.0));
    }
}
