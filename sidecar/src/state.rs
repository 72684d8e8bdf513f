//! State shared by every task of one sidecar process.

use crate::config::Config;
use crate::hub::Hub;
use crate::jwt::Verifier;
use crate::metrics::Metrics;
use crate::postgres_changes::subscribable::CheckRequest;
use crate::postgres_changes::subscribers::Subscribers;
use crate::reason::Refusal;
use crate::relay;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

pub struct Shared {
    pub cfg: Arc<Config>,
    pub hub: Arc<Hub>,
    pub verifier: Verifier,
    /// Who may read `/metrics` (`METRICS_JWT_SECRET`).
    pub metrics_auth: crate::metrics_auth::MetricsAuth,
    pub metrics: Arc<Metrics>,
    /// Turns true once when the server starts shutting down.
    pub shutdown: watch::Receiver<bool>,
    /// Private-channel authorization requests, batched into `realtime.authorize`.
    pub authorize: mpsc::Sender<crate::authorizer::AuthRequest>,
    /// Client broadcasts waiting to be relayed through the database (`relay`).
    pub relay: mpsc::Sender<relay::Broadcast>,
    /// Persist quotas the relay just found full (`persist_full`).
    pub persist_full: Arc<crate::persist_full::FullQuotas>,
    /// Postgres Changes bindings waiting for their join-time check.
    pub check: mpsc::Sender<CheckRequest>,
    /// Joins waiting for their replay or resume (`history`).
    pub history: mpsc::Sender<crate::history::Request>,
    /// The channels with Postgres Changes bindings, which the drainer serves.
    pub changes: Arc<Subscribers>,
    /// Presence: the views of watched topics and the channels' wishes (`presence`).
    pub presence: Arc<crate::presence::Presence>,
    /// The topics and tables this sidecar's channels hold, kept in the database (`interest`).
    pub interest: Arc<crate::interest::Interest>,
    /// The REST routes' bounds: in flight, per request, per second (`rest_limits`).
    pub rest_limits: crate::rest_limits::RestLimits,
    /// WebSocket connections per client address (MAX_CONNECTIONS_PER_ADDRESS).
    pub connections_by_address: crate::tally::InFlight<crate::address::AddressKey>,
    /// Joins per second per client address (MAX_JOINS_PER_SECOND_PER_ADDRESS).
    pub joins_by_address: crate::tally::RateTally<crate::address::AddressKey>,
    /// Joins this second per wider block of addresses (MAX_JOINS_PER_SECOND_PER_IPV6_56 ...).
    pub joins_by_block: crate::tally::RateTally<crate::address::Block>,
    /// Joins this second of the whole sidecar (MAX_SIDECAR_JOINS_PER_SECOND).
    pub joins_total: crate::tally::RateTally<()>,
    /// TCP connections being served as HTTP, in all and per untrusted peer
    /// (MAX_HTTP_CONNECTIONS, MAX_HTTP_CONNECTIONS_PER_PEER).
    pub http_connections: crate::tally::InFlight<()>,
    pub http_connections_by_peer: crate::tally::InFlight<std::net::IpAddr>,
    /// And per wider block (MAX_CONNECTIONS_PER_IPV6_56, _48, MAX_CONNECTIONS_PER_IPV4_24).
    pub connections_by_block: crate::tally::InFlight<crate::address::Block>,
    /// Postgres Changes bindings per client address, each connection's share a `Charge`
    /// (MAX_BINDINGS_PER_ADDRESS).
    pub bindings_by_address: crate::tally::Amounts<crate::address::AddressKey>,
    /// Their pattern conditions per client address (MAX_PATTERNS_PER_ADDRESS).
    pub patterns_by_address: crate::tally::Amounts<crate::address::AddressKey>,
    /// The same per wider block of addresses (MAX_BINDINGS_PER_IPV6_56 and friends).
    pub bindings_by_block: crate::tally::Amounts<crate::address::Block>,
    pub patterns_by_block: crate::tally::Amounts<crate::address::Block>,
    /// The schema-wide bindings of every channel (MAX_SCHEMA_WIDE_BINDINGS), one key.
    pub schema_wide_bindings: crate::tally::Amounts<()>,
    /// Histories read or sent per client address, and the lines the others wait in
    /// (MAX_RESUMES_PER_ADDRESS, `history::line`); joins reach `history` through it.
    pub resumes: crate::history::line::Line<crate::history::Request>,
    /// Bytes of client frames being read (MAX_READING_BYTES_PER_ADDRESS, MAX_READING_BYTES).
    pub reading: crate::byte_budget::ByteBudget,
    /// Bytes of broadcasts waiting for the relay and of pushes held for a private channel's
    /// verdict (MAX_RELAY_BYTES_PER_ADDRESS, MAX_RELAY_BYTES).
    pub relay_bytes: crate::byte_budget::ByteBudget,
    /// Large frames queued to connections, each counted once (MAX_OUTBOUND_BYTES_PER_ADDRESS,
    /// MAX_SIDECAR_OUTBOUND_BYTES).
    pub outbound: crate::out::SharedBytes,
    /// Random per process: the high half of this sidecar's relay origins.
    pub instance: u32,
}

impl Shared {
    /// The origin that names connection `conn` of this process in `realtime.relay`.
    pub fn origin(&self, conn: u64) -> i64 {
        ((self.instance as i64) << 32) | (conn & 0xffff_ffff) as i64
    }

    /// Headers reach policies as `request.headers` and are copied into every authorization
    /// request of the connection: their size is bounded.
    pub fn policy_headers_fit(&self, headers_json: &str) -> Result<(), Refusal> {
        let limit = self.cfg.max_policy_header_bytes;
        if headers_json.len() > limit {
            return Err(Refusal::RequestHeadersTooLarge {
                bytes: headers_json.len(),
                limit,
            });
        }
        Ok(())
    }
}

/// A nonzero process identifier that differs between sidecars and restarts.
pub fn instance_id() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed = (std::process::id().wrapping_mul(2_654_435_761)) ^ nanos;
    (mixed & 0x7fff_ffff) | 1
}

/// A `Shared` for in-process tests, with the far ends of its request queues: the test
/// plays the authorizer and the relay.
#[cfg(test)]
pub mod testing {
    use super::*;
    use crate::authorizer::AuthRequest;
    use clap::Parser;
    use serde_json::Value;

    pub const SECRET: &str = "a-test-secret-of-at-least-thirty-two-bytes";

    pub struct Backends {
        pub authorize: mpsc::Receiver<AuthRequest>,
        pub relay: mpsc::Receiver<relay::Broadcast>,
        pub check: mpsc::Receiver<CheckRequest>,
        pub history: mpsc::Receiver<crate::history::Request>,
        /// Kept so that `shutdown` stays open.
        pub stop: watch::Sender<bool>,
    }

    /// A sidecar's shared state with settings `args` (flags, as on the command line).
    pub fn shared(args: &[&str]) -> (Arc<Shared>, Backends) {
        let mut all = vec!["realtime-sidecar", "--jwt-secret", SECRET];
        // No interest worker runs here: joins are answered without waiting for uploads.
        if !args.iter().any(|a| a.starts_with("--filter-topics")) {
            all.extend_from_slice(&["--filter-topics", "false"]);
        }
        all.extend_from_slice(args);
        let cfg = Arc::new(Config::try_parse_from(all).expect("test settings"));
        let metrics = Arc::new(Metrics::default());
        let (stop, shutdown) = watch::channel(false);
        let (authorize, authorize_rx) = mpsc::channel(64);
        let (relay, relay_rx) = mpsc::channel(64);
        let (check, check_rx) = mpsc::channel(64);
        let (history, history_rx) = mpsc::channel(64);
        let presence = Arc::new(crate::presence::Presence::new(metrics.clone(), &cfg));
        let resumes = crate::history::line::Line::new(
            cfg.max_resumes_per_address,
            cfg.max_resumes_waiting_per_address,
            history.clone(),
            metrics.clone(),
        );
        let cfg_budgets = cfg.byte_budgets();
        let outbound = cfg.outbound_bytes();
        let shared = Shared {
            persist_full: Arc::default(),
            resumes,
            bindings_by_address: crate::tally::Amounts::default(),
            patterns_by_address: crate::tally::Amounts::default(),
            bindings_by_block: crate::tally::Amounts::default(),
            patterns_by_block: crate::tally::Amounts::default(),
            schema_wide_bindings: crate::tally::Amounts::default(),
            check,
            history,
            presence,
            changes: Arc::default(),
            interest: crate::interest::Interest::new(cfg.filter_topics),
            rest_limits: crate::rest_limits::RestLimits::new(
                &cfg,
                64,
                metrics.rest_requests_in_flight.clone(),
            ),
            connections_by_address: crate::tally::InFlight::default(),
            connections_by_block: crate::tally::InFlight::default(),
            http_connections: crate::tally::InFlight::default(),
            http_connections_by_peer: crate::tally::InFlight::default(),
            joins_by_address: crate::tally::RateTally::new(1024),
            joins_by_block: crate::tally::RateTally::new(1024),
            joins_total: crate::tally::RateTally::new(1),
            hub: Arc::new(Hub::new(metrics.clone())),
            verifier: Verifier::with_secret(SECRET),
            metrics_auth: crate::metrics_auth::MetricsAuth::new(None),
            cfg,
            metrics,
            shutdown,
            authorize,
            relay,
            reading: cfg_budgets.0,
            relay_bytes: cfg_budgets.1,
            outbound,
            instance: 7,
        };
        let backends = Backends {
            authorize: authorize_rx,
            relay: relay_rx,
            check: check_rx,
            history: history_rx,
            stop,
        };
        (Arc::new(shared), backends)
    }

    /// A token signed with `SECRET`.
    pub fn token(claims: &Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), claims, &key).unwrap()
    }
}
