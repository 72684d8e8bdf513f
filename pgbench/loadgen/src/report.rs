//! Counters shared by all connections of one run, the progress line and the result line.

use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Latency is recorded into shards rather than one histogram per connection: a histogram
/// of this range is tens of KB, which at 17,000 connections per process would dwarf the
/// connections themselves.
const SHARDS: usize = 64;

pub struct Totals {
    pub connected: AtomicU64,
    pub failed: AtomicU64,
    pub closed_early: AtomicU64,
    pub joined: AtomicU64,
    pub join_errors: AtomicU64,
    pub sent: AtomicU64,
    pub expected: AtomicU64,
    pub received: AtomicU64,
    pub gaps: AtomicU64,
    pub reordered: AtomicU64,
    pub push_refused: AtomicU64,
    /// Joined subscribers per topic: what a message to that topic should reach.
    pub subscribers: Vec<AtomicU64>,
    latency: Vec<Mutex<Histogram<u64>>>,
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).unwrap()
}

impl Totals {
    pub fn new(topics: usize) -> Totals {
        Totals {
            connected: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            closed_early: AtomicU64::new(0),
            joined: AtomicU64::new(0),
            join_errors: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            expected: AtomicU64::new(0),
            received: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            reordered: AtomicU64::new(0),
            push_refused: AtomicU64::new(0),
            subscribers: (0..topics).map(|_| AtomicU64::new(0)).collect(),
            latency: (0..SHARDS).map(|_| Mutex::new(histogram())).collect(),
        }
    }

    pub fn record(&self, client: usize, sent_at_us: i64) {
        let us = (now_us() - sent_at_us).max(1) as u64;
        self.latency[client % SHARDS]
            .lock()
            .unwrap()
            .saturating_record(us);
        self.received.fetch_add(1, Relaxed);
    }

    /// A message to `topic` was sent: count whom it should reach.
    pub fn sent_to(&self, topic: usize) {
        self.sent.fetch_add(1, Relaxed);
        self.expected
            .fetch_add(self.subscribers[topic].load(Relaxed), Relaxed);
    }

    pub fn latency(&self) -> Histogram<u64> {
        let mut all = histogram();
        for shard in &self.latency {
            all.add(&*shard.lock().unwrap()).unwrap();
        }
        all
    }
}

/// Prints one line a second to stderr until `stop` turns true.
pub async fn progress(
    totals: std::sync::Arc<Totals>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let got = totals.received.load(Relaxed);
        eprintln!(
            "[{:>4.0} s] connected {} failed {} joined {} sent {} received {} ({}/s) gaps {}",
            start.elapsed().as_secs_f64(),
            totals.connected.load(Relaxed),
            totals.failed.load(Relaxed) + totals.closed_early.load(Relaxed),
            totals.joined.load(Relaxed),
            totals.sent.load(Relaxed),
            got,
            got - last,
            totals.gaps.load(Relaxed),
        );
        last = got;
    }
}
