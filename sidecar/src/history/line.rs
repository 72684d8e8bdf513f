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

use crate::address::AddressKey;
use crate::metrics::Metrics;
use crate::reason::Notice;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What waits in a line: a join's history request (`Request`). The line gives it
/// its place, asks whether its channel is still there, and tells it when it cannot run.
pub trait Waiting: Send + 'static {
    /// Holds its place while it runs (the place is given back when the request drops).
    fn hold(&mut self, permit: Permit);
    /// Its channel is still there to be sent its history.
    fn live(&self) -> bool;
    /// It will not run: the channel goes live, told `why` (None: the database could not be
    /// read).
    fn unavailable(self, why: Option<&str>, metrics: &Metrics);
}

/// The per-address lines of one sidecar.
pub struct Line<R> {
    inner: Arc<Inner<R>>,
}

impl<R> Clone for Line<R> {
    fn clone(&self) -> Self {
        Line {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<R> {
    addresses: Mutex<HashMap<AddressKey, Queue<R>>>,
    /// MAX_RESUMES_PER_ADDRESS
    running: usize,
    /// MAX_RESUMES_WAITING_PER_ADDRESS
    waiting: usize,
    /// The history worker's queue.
    history: mpsc::Sender<R>,
    metrics: Arc<Metrics>,
}

/// One address: its histories running, and its joins waiting, oldest first.
struct Queue<R> {
    running: usize,
    waiting: VecDeque<R>,
}

impl<R> Default for Queue<R> {
    fn default() -> Self {
        Queue {
            running: 0,
            waiting: VecDeque::new(),
        }
    }
}

/// How a place goes back to its line, whatever waits in it.
trait Release: Send + Sync {
    fn release(self: Arc<Self>, address: Option<AddressKey>);
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
    inner: Arc<dyn Release>,
    address: Option<AddressKey>,
}

impl Permit {
    /// The client address whose share this is (None: a backend's connection).
    pub fn address(&self) -> Option<AddressKey> {
        self.address
    }
}

impl<R: Waiting> Line<R> {
    pub fn new(
        running: u64,
        waiting: u64,
        history: mpsc::Sender<R>,
        metrics: Arc<Metrics>,
    ) -> Line<R> {
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
    pub fn admit(&self, address: Option<AddressKey>, r: R) -> Admitted {
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
            q.waiting.retain(R::live);
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
        r.unavailable(Some(&notice.text()), &inner.metrics);
        Admitted::Refused
    }

    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.inner.addresses.lock().unwrap().len()
    }
}

impl<R: Waiting> Inner<R> {
    /// Hands a join holding one of its address's places to the history worker.
    fn run(self: &Arc<Self>, address: Option<AddressKey>, mut r: R) {
        r.hold(Permit {
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
                r.unavailable(None, &self.metrics);
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.inner.clone().release(self.address);
    }
}

impl<R: Waiting> Release for Inner<R> {
    fn release(self: Arc<Self>, address: Option<AddressKey>) {
        let inner = &self;
        let Some(address) = address else {
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
            if r.live() {
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
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    fn address(last: u8) -> Option<AddressKey> {
        Some(AddressKey::of(IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))))
    }

    /// A join's request as the line sees it: its topic, whether its channel is still there,
    /// and its place once it runs.
    struct Request {
        key: Key,
        there: Arc<AtomicBool>,
        _permit: Option<Permit>,
    }

    struct Key {
        topic: String,
    }

    impl Waiting for Request {
        fn hold(&mut self, permit: Permit) {
            self._permit = Some(permit);
        }
        fn live(&self) -> bool {
            self.there.load(Relaxed)
        }
        fn unavailable(self, _why: Option<&str>, metrics: &Metrics) {
            metrics.history_unrecovered_total.increment(1);
        }
    }

    /// Its channel: dropping it is the channel leaving.
    struct Channel(Arc<AtomicBool>);

    impl Channel {
        fn close(&self) {
            self.0.store(false, Relaxed);
        }
    }

    impl Drop for Channel {
        fn drop(&mut self) {
            self.close();
        }
    }

    /// A resuming channel's request, and its channel.
    fn request(topic: &str) -> (Request, Channel) {
        let there = Arc::new(AtomicBool::new(true));
        let r = Request {
            key: Key {
                topic: topic.into(),
            },
            there: there.clone(),
            _permit: None,
        };
        (r, Channel(there))
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
        let (left, channel) = request("left");
        assert_eq!(line.admit(a, left), Admitted::Waiting);
        channel.close();
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
