//! Counters and the commit-to-dispatch latency histogram, rendered for Prometheus.

use hdrhistogram::Histogram;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

#[derive(Default)]
pub struct Metrics {
    pub connections: AtomicI64,
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    pub channels: AtomicI64,
    pub joins_total: AtomicU64,
    pub join_errors_total: AtomicU64,
    pub deliveries_total: AtomicU64,
    pub client_broadcasts_total: AtomicU64,
    pub auth_batches_total: AtomicU64,
    pub auth_requests_total: AtomicU64,
    pub slow_disconnects_total: AtomicU64,
    pub malformed_frames_total: AtomicU64,
    pub drain_batches_total: AtomicU64,
    pub drain_messages_total: AtomicU64,
    pub drain_gaps_total: AtomicU64,
    pub drain_lost_messages_total: AtomicU64,
    pub db_reconnects_total: AtomicU64,
    pub db_up: AtomicI64,
    /// Sequence of the last message this sidecar drained.
    pub last_seq: AtomicI64,
    pub auth_isolations_total: AtomicU64,
    pub auth_policy_errors_total: AtomicU64,
    pub client_broadcast_failures_total: AtomicU64,
    pub connections_over_limit_total: AtomicU64,
    pub slow_requests_closed_total: AtomicU64,
    /// Bytes of the queue held back behind a transaction that is still committing.
    pub pending_bytes: AtomicI64,
    /// How long (µs) the oldest of those has been committing.
    oldest_pending_age_us: AtomicI64,
    /// Oldest sequence the queue still retains.
    pub oldest_seq: AtomicI64,
    /// When (unix ms) the last drain call answered; /healthz fails when it is too old.
    drain_answered_ms: AtomicI64,
    /// Why the drain connection last failed, for /healthz.
    down_reason: Mutex<String>,
    /// Microseconds from commit to dispatch (1 µs .. 60 s).
    latency: Mutex<Option<Histogram<u64>>>,
}

/// A drain call that has not answered for this long means the database is stuck. A drain
/// waits at most a second for messages, so this is three missed answers; it is shorter than
/// the drain call's deadline, after which the connection is given up and replaced.
pub const DRAIN_STUCK_MS: i64 = 3_000;

impl Metrics {
    pub fn drain_answered(&self, now_ms: i64) {
        self.drain_answered_ms.store(now_ms, Relaxed);
    }

    pub fn set_down_reason(&self, why: String) {
        *self.down_reason.lock().unwrap() = why;
    }

    pub fn set_oldest_pending_age(&self, secs: f64) {
        self.oldest_pending_age_us
            .store((secs * 1e6) as i64, Relaxed);
    }

    /// Healthy while the drain connection is up and its calls answer; else the reason.
    pub fn health(&self, now_ms: i64) -> Result<(), String> {
        if self.db_up.load(Relaxed) != 1 {
            let why = self.down_reason.lock().unwrap();
            return Err(match why.as_str() {
                "" => "database unavailable".into(),
                why => format!("database unavailable: {why}"),
            });
        }
        let silent = now_ms - self.drain_answered_ms.load(Relaxed);
        if silent > DRAIN_STUCK_MS {
            return Err(format!(
                "drain stuck: the database has not answered for {} s",
                silent / 1000
            ));
        }
        Ok(())
    }

    pub fn record_latency_us(&self, us: u64) {
        let mut h = self.latency.lock().unwrap();
        let h = h.get_or_insert_with(|| Histogram::new_with_bounds(1, 60_000_000, 3).unwrap());
        h.saturating_record(us.max(1));
    }

    pub fn render(&self) -> String {
        let mut s = String::with_capacity(4096);
        let counters: [(&str, &str, u64); 20] = [
            (
                "realtime_auth_batches_total",
                "realtime.authorize calls",
                self.auth_batches_total.load(Relaxed),
            ),
            (
                "realtime_auth_requests_total",
                "authorization verdicts asked for",
                self.auth_requests_total.load(Relaxed),
            ),
            (
                "realtime_client_broadcasts_total",
                "client broadcasts relayed through the database",
                self.client_broadcasts_total.load(Relaxed),
            ),
            (
                "realtime_connections_total",
                "WebSocket connections accepted",
                self.connections_total.load(Relaxed),
            ),
            (
                "realtime_connections_refused_total",
                "connections refused at upgrade (bad apikey or parameters)",
                self.connections_refused.load(Relaxed),
            ),
            (
                "realtime_joins_total",
                "channel joins accepted",
                self.joins_total.load(Relaxed),
            ),
            (
                "realtime_join_errors_total",
                "channel joins refused",
                self.join_errors_total.load(Relaxed),
            ),
            (
                "realtime_deliveries_total",
                "frames queued to subscribers",
                self.deliveries_total.load(Relaxed),
            ),
            (
                "realtime_slow_disconnects_total",
                "connections closed for not keeping up",
                self.slow_disconnects_total.load(Relaxed),
            ),
            (
                "realtime_malformed_frames_total",
                "client frames that could not be decoded",
                self.malformed_frames_total.load(Relaxed),
            ),
            (
                "realtime_drain_batches_total",
                "drain calls that returned messages",
                self.drain_batches_total.load(Relaxed),
            ),
            (
                "realtime_drain_messages_total",
                "messages drained from the queue",
                self.drain_messages_total.load(Relaxed),
            ),
            (
                "realtime_drain_gaps_total",
                "gaps reported by the queue",
                self.drain_gaps_total.load(Relaxed),
            ),
            (
                "realtime_drain_lost_messages_total",
                "messages lost in gaps",
                self.drain_lost_messages_total.load(Relaxed),
            ),
            (
                "realtime_db_reconnects_total",
                "reconnections to Postgres",
                self.db_reconnects_total.load(Relaxed),
            ),
            (
                "realtime_auth_isolations_total",
                "authorization batches split after a failed call",
                self.auth_isolations_total.load(Relaxed),
            ),
            (
                "realtime_auth_policy_errors_total",
                "verdicts denied by an error (a raising policy, a missing grant, a refused role)",
                self.auth_policy_errors_total.load(Relaxed),
            ),
            (
                "realtime_client_broadcast_failures_total",
                "client broadcasts that could not be relayed (each reported to its sender)",
                self.client_broadcast_failures_total.load(Relaxed),
            ),
            (
                "realtime_connections_over_limit_total",
                "upgrades refused because MAX_CONNECTIONS were open",
                self.connections_over_limit_total.load(Relaxed),
            ),
            (
                "realtime_slow_requests_closed_total",
                "HTTP connections closed for not sending their request in time",
                self.slow_requests_closed_total.load(Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        let gauges: [(&str, &str, i64); 6] = [
            (
                "realtime_connections",
                "open WebSocket connections",
                self.connections.load(Relaxed),
            ),
            (
                "realtime_channels",
                "joined channels",
                self.channels.load(Relaxed),
            ),
            (
                "realtime_db_up",
                "1 while the drain connection is up",
                self.db_up.load(Relaxed),
            ),
            (
                "realtime_last_seq",
                "sequence of the last drained message",
                self.last_seq.load(Relaxed),
            ),
            (
                "realtime_queue_pending_bytes",
                "queue bytes held back behind transactions still committing",
                self.pending_bytes.load(Relaxed),
            ),
            (
                "realtime_queue_oldest_seq",
                "oldest sequence the queue retains",
                self.oldest_seq.load(Relaxed),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let name = "realtime_queue_oldest_pending_seconds";
        let _ = writeln!(
            s,
            "# HELP {name} how long the oldest transaction still committing has held back later messages\n# TYPE {name} gauge\n{name} {}",
            self.oldest_pending_age_us.load(Relaxed) as f64 / 1e6
        );
        let name = "realtime_commit_to_dispatch_seconds";
        let _ = writeln!(
            s,
            "# HELP {name} time from commit to fan-out\n# TYPE {name} summary"
        );
        if let Some(h) = self.latency.lock().unwrap().as_ref() {
            for q in [0.5, 0.9, 0.99, 0.999] {
                let _ = writeln!(
                    s,
                    "{name}{{quantile=\"{q}\"}} {}",
                    h.value_at_quantile(q) as f64 / 1e6
                );
            }
            let _ = writeln!(s, "{name}_count {}", h.len());
        }
        s
    }
}
