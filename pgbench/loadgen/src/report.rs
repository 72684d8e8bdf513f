//! Counters shared by all connections of one run, the progress line and the result line.

use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Latency is recorded into shards rather than one histogram per connection: a histogram
/// of this range is tens of KB, which at 17,000 connections per process would dwarf the
/// connections themselves.
const SHARDS: usize = 64;
/// A delivery slower than this is counted in the second it was sent (`slow_seconds`), so a
/// tail can be told from a steady rise: when it happened, and how often.
const SLOW_US: u64 = 50_000;

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
    /// Deliveries slower than SLOW_US, by the unix second they were sent: (count, slowest µs).
    slow: Mutex<std::collections::BTreeMap<i64, (u64, u64)>>,
    pub storm: Storm,
}

/// What a resume storm (`--storm-after`) did.
#[derive(Default)]
pub struct Storm {
    /// When (unix µs) the clients dropped their sockets.
    pub at_us: AtomicI64,
    pub dropped: AtomicU64,
    pub rejoined: AtomicU64,
    pub rejoin_errors: AtomicU64,
    /// Clients that had no position yet (no message received): rejoined without resume.
    pub without_position: AtomicU64,
    pub recovered: AtomicU64,
    pub unrecovered: AtomicU64,
    /// Messages the server said it sent from its history (sum of the system messages').
    pub resent: AtomicU64,
    /// Replayed deliveries received, and those of them the client had already had before
    /// the drop (its position was 1 to 5 s behind on purpose).
    pub replayed: AtomicU64,
    pub redelivered: AtomicU64,
    /// What Supabase's replay (at most 25 per channel) would have left out: messages, and
    /// clients short of some.
    pub beyond_25: AtomicU64,
    pub clients_beyond_25: AtomicU64,
    /// Last time (unix µs) a client was live again (its resume's system message arrived).
    pub last_live_us: AtomicI64,
    /// Drop to live again, per client, in µs.
    pub live_after: Mutex<Option<Histogram<u64>>>,
    /// Drop to connected again, and to the rejoin's reply, per client, in µs: where the
    /// time until live goes.
    pub connected_after: Mutex<Option<Histogram<u64>>>,
    pub replied_after: Mutex<Option<Histogram<u64>>>,
}

fn since_us(at: &AtomicI64) -> u64 {
    (now_us() - at.load(Relaxed)).max(1) as u64
}

fn quantiles(h: &Mutex<Option<Histogram<u64>>>) -> serde_json::Value {
    let h = h.lock().unwrap().clone().unwrap_or_else(histogram);
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    serde_json::json!({"p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": h.max() as f64 / 1000.0})
}

impl Storm {
    pub fn connected(&self) {
        let took = since_us(&self.at_us);
        let mut h = self.connected_after.lock().unwrap();
        h.get_or_insert_with(histogram).saturating_record(took);
    }

    pub fn replied(&self) {
        let took = since_us(&self.at_us);
        let mut h = self.replied_after.lock().unwrap();
        h.get_or_insert_with(histogram).saturating_record(took);
    }

    pub fn live_again(&self, resent: u64, recovered: bool) {
        let now = now_us();
        let took = (now - self.at_us.load(Relaxed)).max(1) as u64;
        self.live_after
            .lock()
            .unwrap()
            .get_or_insert_with(histogram)
            .saturating_record(took);
        self.last_live_us.fetch_max(now, Relaxed);
        self.resent.fetch_add(resent, Relaxed);
        if resent > 25 {
            self.beyond_25.fetch_add(resent - 25, Relaxed);
            self.clients_beyond_25.fetch_add(1, Relaxed);
        }
        if recovered {
            self.recovered.fetch_add(1, Relaxed);
        } else {
            self.unrecovered.fetch_add(1, Relaxed);
        }
    }

    /// The result line's `storm` object.
    pub fn json(&self) -> serde_json::Value {
        let h = self
            .live_after
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(histogram);
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let g = |a: &AtomicU64| a.load(Relaxed);
        let all_live_s =
            (self.last_live_us.load(Relaxed) - self.at_us.load(Relaxed)).max(0) as f64 / 1e6;
        serde_json::json!({
            "dropped": g(&self.dropped), "rejoined": g(&self.rejoined), "rejoin_errors": g(&self.rejoin_errors),
            "without_position": g(&self.without_position), "recovered": g(&self.recovered),
            "unrecovered": g(&self.unrecovered), "resent": g(&self.resent), "replayed_received": g(&self.replayed),
            "redelivered": g(&self.redelivered), "all_live_seconds": all_live_s,
            "resent_per_second": if all_live_s > 0.0 { g(&self.resent) as f64 / all_live_s } else { 0.0 },
            "live_after_p50_ms": ms(0.5), "live_after_p99_ms": ms(0.99), "live_after_max_ms": h.max() as f64 / 1000.0,
            "connected_after": quantiles(&self.connected_after), "replied_after": quantiles(&self.replied_after),
            "supabase_replay_would_leave_out": g(&self.beyond_25),
            "clients_supabase_replay_would_short": g(&self.clients_beyond_25),
        })
    }
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
            slow: Mutex::default(),
            storm: Storm::default(),
        }
    }

    pub fn record(&self, client: usize, sent_at_us: i64) {
        let us = (now_us() - sent_at_us).max(1) as u64;
        self.latency[client % SHARDS]
            .lock()
            .unwrap()
            .saturating_record(us);
        self.received.fetch_add(1, Relaxed);
        if us > SLOW_US {
            let mut slow = self.slow.lock().unwrap();
            let (n, max) = slow.entry(sent_at_us / 1_000_000).or_default();
            *n += 1;
            *max = (*max).max(us);
        }
    }

    /// The seconds (unix) whose sends had deliveries slower than SLOW_US, most first, at
    /// most `top`: [second, how many, slowest ms].
    pub fn slow_seconds(&self, top: usize) -> serde_json::Value {
        let slow = self.slow.lock().unwrap();
        let mut all: Vec<_> = slow.iter().map(|(s, (n, max))| (*s, *n, *max)).collect();
        all.sort_by_key(|(s, n, _)| (std::cmp::Reverse(*n), *s));
        all.truncate(top);
        serde_json::json!(all
            .iter()
            .map(|(s, n, max)| serde_json::json!([s, n, *max as f64 / 1000.0]))
            .collect::<Vec<_>>())
    }

    /// A delivery that counts against `expected` but not in the latency (a message sent
    /// while the client was away, received from the server's history).
    pub fn record_late(&self) {
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
