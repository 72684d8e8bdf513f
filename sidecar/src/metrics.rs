//! The sidecar's metrics: counters, gauges and the commit-to-dispatch latency summary, kept
//! by the `metrics` crate and rendered for Prometheus by `metrics-exporter-prometheus`.
//!
//! Each sidecar has its own recorder (never the process-wide one), so tests can run several
//! in one process; every metric is registered here once, with its help text, and the rest of
//! the code holds typed handles (`Counter`, `Gauge`, `Histogram`). Two values are also read
//! by the code itself, and so are kept in atomics mirrored into their gauges when rendered:
//! the open connections (MAX_CONNECTIONS is enforced on it) and whether the drain
//! connection is up (`/healthz`).

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Level, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// How often samples of the latency summary are folded in, keeping their memory bounded
/// when nobody scrapes.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

pub struct Metrics {
    handle: PrometheusHandle,
    /// Open connections, counted at upgrade (MAX_CONNECTIONS is enforced on this).
    pub connections: AtomicI64,
    /// 1 while the drain connection is up.
    pub db_up: AtomicI64,
    connections_gauge: Gauge,
    db_up_gauge: Gauge,
    /// REST broadcast requests being served (counted by `rest_limits`, which holds a clone).
    pub rest_requests_in_flight: Arc<AtomicUsize>,
    rest_requests_in_flight_gauge: Gauge,

    pub connections_total: Counter,
    pub connections_refused: Counter,
    pub connections_over_limit_total: Counter,
    pub slow_requests_closed_total: Counter,
    /// TCP connections closed as accepted: past MAX_HTTP_CONNECTIONS or _PER_PEER.
    pub http_connections_refused_total: Counter,
    pub channels: Gauge,
    pub joins_total: Counter,
    pub join_errors_total: Counter,
    pub deliveries_total: Counter,
    pub slow_disconnects_total: Counter,
    pub malformed_frames_total: Counter,
    pub client_broadcasts_total: Counter,
    pub client_broadcast_failures_total: Counter,
    pub persist_full_refusals_total: Counter,
    pub reading_refusals_total: Counter,
    pub relay_bytes_refusals_total: Counter,
    pub auth_batches_total: Counter,
    pub auth_requests_total: Counter,
    pub auth_isolations_total: Counter,
    pub auth_policy_errors_total: Counter,
    pub drain_batches_total: Counter,
    pub drain_messages_total: Counter,
    pub drain_gaps_total: Counter,
    pub drain_lost_messages_total: Counter,
    pub db_reconnects_total: Counter,
    pub postgres_changes_checks_total: Counter,
    /// Bindings a channel joined without (`postgres_changes::unserved`).
    pub postgres_changes_unserved_total: Counter,
    pub changes_delivered_total: Counter,
    /// Checks of changed tables' changes run (one covers every batch of its table that
    /// waited for it: `postgres_changes::pool`).
    pub changes_checks_total: Counter,
    pub changes_withheld_total: Counter,
    pub change_check_failures_total: Counter,
    pub drain_redrains_total: Counter,
    pub history_requests_total: Counter,
    pub history_calls_total: Counter,
    pub history_messages_total: Counter,
    pub history_unrecovered_total: Counter,
    /// Private-channel verdicts answered by a remembered denial (AUTHORIZATION_DENIAL_CACHE_MS).
    pub auth_denials_cached_total: Counter,
    /// Verdict requests refused for want of room in their address's line (`verdict_queue`).
    pub auth_verdicts_refused_total: Counter,
    /// Histories cut short by their bytes (MAX_RESUME_BYTES and friends, `history::budget`).
    pub history_cut_by_bytes_total: Counter,
    /// Bytes of history frames made and not yet queued to their sockets (`history::budget`).
    pub history_bytes_held: Gauge,
    /// Bytes of client frames being read, and of broadcasts waiting for the relay, held
    /// (`byte_budget`); set when the metrics are read.
    pub reading_bytes_held: Gauge,
    pub relay_bytes_held: Gauge,
    pub outbound_bytes_held: Gauge,
    /// Joins whose history is being read or sent, and those waiting in their address's
    /// line (MAX_RESUMES_PER_ADDRESS, `history::line`), and those the full line turned away.
    pub resumes_running: Gauge,
    pub resumes_waiting: Gauge,
    pub resumes_refused_total: Counter,
    pub change_positions_total: Counter,
    pub persisted_expired_total: Counter,
    pub inserted_expired_total: Counter,
    pub presence_tracks_total: Counter,
    pub presence_write_batches_total: Counter,
    pub presence_write_statements_total: Counter,
    pub presence_writes_total: Counter,
    pub presence_write_failures_total: Counter,
    pub presence_loads_total: Counter,
    pub presence_diffs_applied_total: Counter,
    pub presence_diffs_sent_total: Counter,
    pub presence_frames_total: Counter,
    pub presence_reaped_total: Counter,
    pub presence_sessions_lost_total: Counter,
    pub presence_topics: Gauge,
    /// Topics and tables this sidecar's slot listens to in the database (NaN: everything).
    pub listened_keys: Gauge,
    pub presence_members: Gauge,
    /// Age (seconds) of the oldest message the queue retains: how far back a resume reaches.
    pub retained_seconds: Gauge,
    /// Sequence of the last message this sidecar drained.
    pub last_seq: Gauge,
    /// Bytes of the queue held back behind a transaction that is still committing.
    pub pending_bytes: Gauge,
    /// How long (seconds) the oldest of those has been committing.
    pub oldest_pending_seconds: Gauge,
    /// Oldest sequence the queue still retains.
    pub oldest_seq: Gauge,
    /// Seconds from commit to fan-out.
    pub commit_to_dispatch: Histogram,

    /// When (unix ms) the last drain call answered; /healthz fails when it is too old.
    drain_answered_ms: AtomicI64,
}

/// A drain call that has not answered for this long means the database is stuck. A drain
/// waits at most a second for messages, so this is three missed answers; it is shorter than
/// the drain call's deadline, after which the connection is given up and replaced.
pub const DRAIN_STUCK_MS: i64 = 3_000;

/// Registers every metric with its help text on one recorder.
struct Registry {
    recorder: PrometheusRecorder,
}

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

impl Registry {
    fn counter(&self, name: &'static str, help: &'static str) -> Counter {
        self.recorder
            .describe_counter(KeyName::from_const_str(name), None, help.into());
        self.recorder
            .register_counter(&Key::from_static_name(name), &METADATA)
    }

    fn gauge(&self, name: &'static str, help: &'static str) -> Gauge {
        self.recorder
            .describe_gauge(KeyName::from_const_str(name), None, help.into());
        self.recorder
            .register_gauge(&Key::from_static_name(name), &METADATA)
    }

    fn summary(&self, name: &'static str, unit: Unit, help: &'static str) -> Histogram {
        self.recorder
            .describe_histogram(KeyName::from_const_str(name), Some(unit), help.into());
        self.recorder
            .register_histogram(&Key::from_static_name(name), &METADATA)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        // Histograms are rendered as summaries with these quantiles, over a sliding window
        // of the last minute (three 20-second buckets, the exporter's default).
        let recorder = PrometheusBuilder::new()
            .set_quantiles(&[0.5, 0.9, 0.99, 0.999])
            .expect("valid quantiles")
            .build_recorder();
        let handle = recorder.handle();
        let r = Registry { recorder };
        Metrics {
            handle,
            connections: AtomicI64::new(0),
            db_up: AtomicI64::new(0),
            connections_gauge: r.gauge("realtime_connections", "open WebSocket connections"),
            db_up_gauge: r.gauge("realtime_db_up", "1 while the drain connection is up"),
            rest_requests_in_flight: Arc::default(),
            rest_requests_in_flight_gauge: r.gauge(
                "realtime_rest_requests_in_flight",
                "REST broadcast requests being served (MAX_REST_REQUESTS_IN_FLIGHT)",
            ),
            connections_total: r.counter(
                "realtime_connections_total",
                "WebSocket connections accepted",
            ),
            connections_refused: r.counter(
                "realtime_connections_refused_total",
                "connections refused at upgrade (bad apikey or parameters)",
            ),
            connections_over_limit_total: r.counter(
                "realtime_connections_over_limit_total",
                "upgrades refused because MAX_CONNECTIONS were open",
            ),
            http_connections_refused_total: r.counter(
                "realtime_http_connections_refused_total",
                "TCP connections closed as they were accepted: past MAX_HTTP_CONNECTIONS or MAX_HTTP_CONNECTIONS_PER_PEER",
            ),
            slow_requests_closed_total: r.counter(
                "realtime_slow_requests_closed_total",
                "HTTP connections closed for not sending their request in time",
            ),
            channels: r.gauge("realtime_channels", "joined channels"),
            joins_total: r.counter("realtime_joins_total", "channel joins accepted"),
            join_errors_total: r.counter("realtime_join_errors_total", "channel joins refused"),
            deliveries_total: r
                .counter("realtime_deliveries_total", "frames queued to subscribers"),
            slow_disconnects_total: r.counter(
                "realtime_slow_disconnects_total",
                "connections closed for not keeping up",
            ),
            malformed_frames_total: r.counter(
                "realtime_malformed_frames_total",
                "client frames that could not be decoded",
            ),
            client_broadcasts_total: r.counter(
                "realtime_client_broadcasts_total",
                "client broadcasts relayed through the database",
            ),
            client_broadcast_failures_total: r.counter(
                "realtime_client_broadcast_failures_total",
                "client broadcasts that could not be relayed (each reported to its sender)",
            ),
            persist_full_refusals_total: r.counter(
                "realtime_persist_full_refusals_total",
                "kept broadcasts refused without the database: their topic was just found at its quota",
            ),
            reading_refusals_total: r.counter(
                "realtime_reading_refusals_total",
                "client frames and REST bodies refused: the bytes being read would pass MAX_READING_BYTES_PER_ADDRESS or MAX_READING_BYTES",
            ),
            relay_bytes_refusals_total: r.counter(
                "realtime_relay_bytes_refusals_total",
                "client broadcasts and held pushes refused: the bytes waiting for the database (the relay, a private channel's verdict) would pass MAX_RELAY_BYTES_PER_ADDRESS or MAX_RELAY_BYTES",
            ),
            auth_batches_total: r
                .counter("realtime_auth_batches_total", "realtime.authorize calls"),
            auth_requests_total: r.counter(
                "realtime_auth_requests_total",
                "authorization verdicts asked for",
            ),
            auth_isolations_total: r.counter(
                "realtime_auth_isolations_total",
                "authorization batches split after a failed call",
            ),
            auth_policy_errors_total: r.counter(
                "realtime_auth_policy_errors_total",
                "verdicts denied by an error (a raising policy, a missing grant, a refused role)",
            ),
            drain_batches_total: r.counter(
                "realtime_drain_batches_total",
                "drain calls that returned messages",
            ),
            drain_messages_total: r.counter(
                "realtime_drain_messages_total",
                "messages drained from the queue",
            ),
            drain_gaps_total: r.counter("realtime_drain_gaps_total", "gaps reported by the queue"),
            drain_lost_messages_total: r.counter(
                "realtime_drain_lost_messages_total",
                "messages lost in gaps",
            ),
            db_reconnects_total: r
                .counter("realtime_db_reconnects_total", "reconnections to Postgres"),
            postgres_changes_checks_total: r.counter(
                "realtime_postgres_changes_checks_total",
                "joins whose postgres_changes bindings were checked against the database",
            ),
            postgres_changes_unserved_total: r.counter(
                "realtime_postgres_changes_unserved_total",
                "postgres_changes bindings a channel joined without, its client told why in a system message",
            ),
            changes_checks_total: r.counter(
                "realtime_changes_checks_total",
                "checks of a changed table's changes, each covering every drained batch of the table that waited for it",
            ),
            changes_delivered_total: r.counter(
                "realtime_changes_delivered_total",
                "Postgres Changes events queued to channels",
            ),
            changes_withheld_total: r.counter(
                "realtime_changes_withheld_total",
                "Postgres Changes a matching channel did not get: the row is not visible to it under RLS, or its role may not read the table",
            ),
            drain_redrains_total: r.counter(
                "realtime_drain_redrains_total",
                "drains repeated from a change left undecoded because a channel joined its table while the drain was in flight",
            ),
            change_check_failures_total: r.counter(
                "realtime_change_check_failures_total",
                "changes of one table in one batch not delivered because their RLS check failed (the channels were told)",
            ),
            history_requests_total: r.counter(
                "realtime_history_requests_total",
                "joins that asked for replay or resume",
            ),
            history_calls_total: r.counter(
                "realtime_history_calls_total",
                "realtime.history calls (one per batch of joins, more for long histories)",
            ),
            history_messages_total: r.counter(
                "realtime_history_messages_total",
                "messages sent to joining channels from the queue's history",
            ),
            history_unrecovered_total: r.counter(
                "realtime_history_unrecovered_total",
                "resumes answered recovered: false (evicted, another epoch, a position ahead, or the database unreadable)",
            ),
            auth_denials_cached_total: r.counter(
                "realtime_auth_denials_cached_total",
                "private-channel verdicts answered by a denial the database gave in the last AUTHORIZATION_DENIAL_CACHE_MS, without asking it again",
            ),
            auth_verdicts_refused_total: r.counter(
                "realtime_auth_verdicts_refused_total",
                "authorization checks refused for want of room in their client address's line (MAX_VERDICTS_WAITING_PER_ADDRESS, MAX_VERDICTS_WAITING)",
            ),
            history_cut_by_bytes_total: r.counter(
                "realtime_history_cut_by_bytes_total",
                "histories sent without their oldest messages: over MAX_RESUME_BYTES, their address's MAX_RESUME_BYTES_PER_ADDRESS or MAX_RESUME_BYTES_IN_FLIGHT",
            ),
            history_bytes_held: r.gauge(
                "realtime_history_bytes_held",
                "bytes of history frames made and not yet queued to their sockets (at most MAX_RESUME_BYTES_IN_FLIGHT)",
            ),
            reading_bytes_held: r.gauge(
                "realtime_reading_bytes_held",
                "bytes of client frames and REST bodies being read, held against MAX_READING_BYTES",
            ),
            relay_bytes_held: r.gauge(
                "realtime_relay_bytes_held",
                "bytes of client broadcasts waiting for the relay and of pushes held for a private channel's verdict, held against MAX_RELAY_BYTES",
            ),
            outbound_bytes_held: r.gauge(
                "realtime_outbound_bytes_held",
                "bytes of the distinct large frames queued to connections, held against MAX_SIDECAR_OUTBOUND_BYTES",
            ),
            resumes_running: r.gauge(
                "realtime_resumes_running",
                "joins whose history is being read or sent (at most MAX_RESUMES_PER_ADDRESS per client address)",
            ),
            resumes_waiting: r.gauge(
                "realtime_resumes_waiting",
                "joins waiting for their address's histories before theirs is read (at most MAX_RESUMES_WAITING_PER_ADDRESS per client address)",
            ),
            resumes_refused_total: r.counter(
                "realtime_resumes_refused_total",
                "joins that went live without their history because their address's line was full",
            ),
            change_positions_total: r.counter(
                "realtime_change_positions_total",
                "system messages telling a channel that asked for them its position after a batch of Postgres Changes",
            ),
            persisted_expired_total: r.counter(
                "realtime_persisted_expired_total",
                "persisted client broadcasts deleted past their ttl",
            ),
            inserted_expired_total: r.counter(
                "realtime_inserted_expired_total",
                "rows the app inserted into realtime.messages deleted after Supabase's 72 hours",
            ),
            presence_tracks_total: r.counter(
                "realtime_presence_tracks_total",
                "presence tracks accepted from clients",
            ),
            presence_write_batches_total: r.counter(
                "realtime_presence_write_batches_total",
                "presence write statements (one per batch of changed members)",
            ),
            presence_write_statements_total: r.counter(
                "realtime_presence_write_statements_total",
                "presence write statements run, a refused batch's halves included",
            ),
            presence_writes_total: r.counter(
                "realtime_presence_writes_total",
                "presence tracks and untracks written to the database",
            ),
            presence_write_failures_total: r.counter(
                "realtime_presence_write_failures_total",
                "presence writes the database refused (each answered with an error)",
            ),
            presence_loads_total: r.counter(
                "realtime_presence_loads_total",
                "topic presence states read from the database to build a view",
            ),
            presence_diffs_applied_total: r.counter(
                "realtime_presence_diffs_applied_total",
                "presence diffs drained and applied to a view",
            ),
            presence_diffs_sent_total: r.counter(
                "realtime_presence_diffs_sent_total",
                "coalesced presence diffs sent (once per topic and window)",
            ),
            presence_frames_total: r.counter(
                "realtime_presence_frames_total",
                "presence_state and presence_diff frames queued to channels",
            ),
            presence_reaped_total: r.counter(
                "realtime_presence_reaped_total",
                "members of ended sessions (dead or cut-off sidecars) made to leave by this sidecar's reaper",
            ),
            presence_sessions_lost_total: r.counter(
                "realtime_presence_sessions_lost_total",
                "presence sessions this sidecar lost (connection or lease) and replaced, tracking its members again",
            ),
            presence_topics: r.gauge("realtime_presence_topics", "topics whose presence this sidecar holds a view of"),
            listened_keys: r.gauge("realtime_listened_keys", "topics and tables this sidecar's drains are filtered to (NaN: every message)"),
            presence_members: r.gauge("realtime_presence_members", "members in this sidecar's presence views"),
            retained_seconds: r.gauge(
                "realtime_queue_retained_seconds",
                "age of the oldest message the queue retains: how far back a resume reaches",
            ),
            last_seq: r.gauge("realtime_last_seq", "sequence of the last drained message"),
            pending_bytes: r.gauge(
                "realtime_queue_pending_bytes",
                "queue bytes held back behind transactions still committing",
            ),
            oldest_pending_seconds: r.gauge(
                "realtime_queue_oldest_pending_seconds",
                "how long the oldest transaction still committing has held back later messages",
            ),
            oldest_seq: r.gauge(
                "realtime_queue_oldest_seq",
                "oldest sequence the queue retains",
            ),
            commit_to_dispatch: r.summary(
                "realtime_commit_to_dispatch_seconds",
                Unit::Seconds,
                "time from commit to fan-out",
            ),
            drain_answered_ms: AtomicI64::new(0),
        }
    }
}

impl Metrics {
    pub fn drain_answered(&self, now_ms: i64) {
        self.drain_answered_ms.store(now_ms, Relaxed);
    }

    /// Healthy while the drain connection is up and its calls answer; else the reason.
    pub fn health(&self, now_ms: i64) -> Result<(), String> {
        // The database's own error text (a host, a database or role name, a server's
        // message) is logged, not answered: /healthz may be reachable by anyone.
        if self.db_up.load(Relaxed) != 1 {
            return Err("database unavailable".into());
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

    /// Folds recent latency samples into the summary (see `UPKEEP_EVERY`).
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        self.connections_gauge
            .set(self.connections.load(Relaxed) as f64);
        self.db_up_gauge.set(self.db_up.load(Relaxed) as f64);
        self.rest_requests_in_flight_gauge
            .set(self.rest_requests_in_flight.load(Relaxed) as f64);
        self.handle.render()
    }

    /// One unlabelled metric's value as rendered, for tests.
    #[cfg(test)]
    pub fn value(&self, name: &str) -> Option<f64> {
        self.render().lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .and_then(|v| v.parse().ok())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names and types the hand-written exposition had; dashboards and the test suite
    /// read them.
    const COUNTERS: [&str; 47] = [
        "realtime_resumes_refused_total",
        "realtime_reading_refusals_total",
        "realtime_relay_bytes_refusals_total",
        "realtime_persist_full_refusals_total",
        "realtime_auth_batches_total",
        "realtime_auth_requests_total",
        "realtime_client_broadcasts_total",
        "realtime_connections_total",
        "realtime_connections_refused_total",
        "realtime_joins_total",
        "realtime_join_errors_total",
        "realtime_deliveries_total",
        "realtime_slow_disconnects_total",
        "realtime_malformed_frames_total",
        "realtime_drain_batches_total",
        "realtime_drain_messages_total",
        "realtime_drain_gaps_total",
        "realtime_drain_lost_messages_total",
        "realtime_db_reconnects_total",
        "realtime_auth_isolations_total",
        "realtime_auth_policy_errors_total",
        "realtime_client_broadcast_failures_total",
        "realtime_connections_over_limit_total",
        "realtime_slow_requests_closed_total",
        "realtime_postgres_changes_checks_total",
        "realtime_changes_checks_total",
        "realtime_changes_delivered_total",
        "realtime_changes_withheld_total",
        "realtime_change_check_failures_total",
        "realtime_drain_redrains_total",
        "realtime_history_requests_total",
        "realtime_history_calls_total",
        "realtime_history_messages_total",
        "realtime_history_unrecovered_total",
        "realtime_change_positions_total",
        "realtime_persisted_expired_total",
        "realtime_inserted_expired_total",
        "realtime_presence_tracks_total",
        "realtime_presence_write_batches_total",
        "realtime_presence_writes_total",
        "realtime_presence_write_failures_total",
        "realtime_presence_loads_total",
        "realtime_presence_diffs_applied_total",
        "realtime_presence_diffs_sent_total",
        "realtime_presence_frames_total",
        "realtime_presence_reaped_total",
        "realtime_presence_sessions_lost_total",
    ];
    const GAUGES: [&str; 17] = [
        "realtime_outbound_bytes_held",
        "realtime_reading_bytes_held",
        "realtime_relay_bytes_held",
        "realtime_resumes_running",
        "realtime_resumes_waiting",
        "realtime_rest_requests_in_flight",
        "realtime_presence_topics",
        "realtime_listened_keys",
        "realtime_presence_members",
        "realtime_connections",
        "realtime_channels",
        "realtime_db_up",
        "realtime_last_seq",
        "realtime_queue_pending_bytes",
        "realtime_queue_oldest_seq",
        "realtime_queue_oldest_pending_seconds",
        "realtime_queue_retained_seconds",
    ];

    #[test]
    fn every_metric_keeps_its_name_and_type_and_is_rendered_before_any_event() {
        let m = Metrics::default();
        let text = m.render();
        for name in COUNTERS {
            assert!(
                text.contains(&format!("# TYPE {name} counter\n")),
                "{name}\n{text}"
            );
            assert_eq!(m.value(name), Some(0.0), "{name}");
        }
        for name in GAUGES {
            assert!(
                text.contains(&format!("# TYPE {name} gauge\n")),
                "{name}\n{text}"
            );
            assert_eq!(m.value(name), Some(0.0), "{name}");
        }
        assert!(
            text.contains("# TYPE realtime_commit_to_dispatch_seconds summary\n"),
            "{text}"
        );
    }

    #[test]
    fn values_reach_the_exposition() {
        let m = Metrics::default();
        m.joins_total.increment(3);
        m.channels.increment(2.0);
        m.channels.decrement(1.0);
        m.connections.store(5, Relaxed);
        m.last_seq.set(123_456_789_012.0);
        for ms in 1..=100 {
            m.commit_to_dispatch.record(ms as f64 / 1000.0);
        }
        m.run_upkeep();
        assert_eq!(m.value("realtime_joins_total"), Some(3.0));
        assert_eq!(m.value("realtime_channels"), Some(1.0));
        assert_eq!(m.value("realtime_connections"), Some(5.0));
        assert_eq!(m.value("realtime_last_seq"), Some(123_456_789_012.0));
        let text = m.render();
        let p99 = text
            .lines()
            .find_map(|l| l.strip_prefix("realtime_commit_to_dispatch_seconds{quantile=\"0.99\"} "))
            .unwrap_or_else(|| panic!("no p99\n{text}"));
        let p99: f64 = p99.parse().unwrap();
        assert!((0.097..=0.101).contains(&p99), "p99 {p99}");
        assert_eq!(
            m.value("realtime_commit_to_dispatch_seconds_count"),
            Some(100.0)
        );
    }
}
