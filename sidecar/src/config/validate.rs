//! Every setting's range, checked once at startup: a bad one stops the sidecar with exit
//! code 2 and a message naming it.

use super::{Config, InvalidConfig, MIN_SECRET_BYTES, RELAY_QUEUE};

impl Config {
    /// Refuses settings that would fail later (or never make sense), with a message naming
    /// the setting.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        // API_JWT_SECRET's length, API_JWT_JWKS's keys, JWT_CLAIM_VALIDATORS' form.
        self.verifier(|_| {})?;
        // DB_SSL_CA_CERT read and parsed now: a bad file refuses the start.
        self.db_tls()?;
        if let Some(s) = &self.metrics_jwt_secret {
            if s.len() < MIN_SECRET_BYTES {
                return Err(InvalidConfig(format!(
                    "METRICS_JWT_SECRET must be at least {MIN_SECRET_BYTES} bytes long (it has {})",
                    s.len()
                )));
            }
        }
        // A slice, not an array of a fixed length: every new setting changed that length.
        let ranges: &[(&str, u64, u64, u64)] = &[
            (
                "MAX_HTTP_CONNECTIONS",
                self.max_http_connections as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_HTTP_CONNECTIONS_PER_PEER",
                self.max_http_connections_per_peer as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_CONNECTIONS_PER_IPV6_56",
                self.max_connections_per_ipv6_56 as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_CONNECTIONS_PER_IPV6_48",
                self.max_connections_per_ipv6_48 as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_CONNECTIONS_PER_IPV4_24",
                self.max_connections_per_ipv4_24 as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_CONNECTIONS_PER_ADDRESS",
                self.max_connections_per_address as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_REST_REQUESTS_IN_FLIGHT",
                self.max_rest_requests_in_flight as u64,
                1,
                1_000_000,
            ),
            (
                "MAX_REST_REQUESTS_IN_FLIGHT_PER_ADDRESS",
                self.max_rest_requests_in_flight_per_address as u64,
                1,
                1_000_000,
            ),
            (
                "MAX_REST_MESSAGES_PER_REQUEST",
                self.max_rest_messages_per_request as u64,
                1,
                (RELAY_QUEUE / 2) as u64,
            ),
            (
                "MAX_REST_EVENTS_PER_SECOND",
                self.max_rest_events_per_second as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_REST_EVENTS_PER_SECOND_PER_ADDRESS",
                self.max_rest_events_per_second_per_address as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_REST_EVENTS_PER_SECOND_PER_USER",
                self.max_rest_events_per_second_per_user as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_OUTBOUND_BYTES",
                self.max_outbound_bytes as u64,
                1 << 20,
                1 << 40,
            ),
            (
                "MAX_BINDINGS_PER_JOIN",
                self.max_bindings_per_join as u64,
                1,
                100_000,
            ),
            (
                "MAX_BINDINGS_PER_CONNECTION",
                self.max_bindings_per_connection as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_BINDINGS_PER_ADDRESS",
                self.max_bindings_per_address as u64,
                1,
                100_000_000,
            ),
            (
                "MAX_PATTERNS_PER_JOIN",
                self.max_patterns_per_join as u64,
                1,
                100_000,
            ),
            (
                "MAX_PATTERNS_PER_CONNECTION",
                self.max_patterns_per_connection as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_PATTERNS_PER_ADDRESS",
                self.max_patterns_per_address as u64,
                1,
                100_000_000,
            ),
            (
                "FILTER_PATTERNS_PER_CALL",
                self.filter_patterns_per_call as u64,
                1,
                100_000,
            ),
            (
                "MAX_SCHEMA_WIDE_BINDINGS",
                self.max_schema_wide_bindings as u64,
                1,
                100_000_000,
            ),
            (
                "MAX_FILTER_CONDITIONS_PER_BINDING",
                self.max_filter_conditions_per_binding as u64,
                1,
                10_000,
            ),
            (
                "MAX_FILTER_VALUE_BYTES",
                self.max_filter_value_bytes as u64,
                1,
                1 << 30,
            ),
            (
                "MAX_TABLES_PER_JOIN",
                self.max_tables_per_join as u64,
                1,
                100_000,
            ),
            (
                "MAX_PRESENCE_KEY_BYTES",
                self.max_presence_key_bytes as u64,
                1,
                1 << 20,
            ),
            ("DRAIN_LINGER_MS", self.drain_linger_ms as u64, 0, 10_000),
            (
                "DRAIN_LINGER_MAX_MS",
                self.drain_linger_max_ms as u64,
                0,
                10_000,
            ),
            (
                "DRAIN_CALLS_PER_SECOND",
                self.drain_calls_per_second as u64,
                0,
                1_000_000,
            ),
            (
                "MAX_RECORD_BYTES",
                self.max_record_bytes as u64,
                1024,
                1 << 30,
            ),
            ("DRAIN_BATCH", self.drain_batch as u64, 1, 1_000_000),
            (
                "MAX_CHANNELS_PER_CLIENT",
                self.max_channels_per_client as u64,
                1,
                100_000,
            ),
            ("MAX_FRAME_SIZE", self.max_frame_size as u64, 1024, 1 << 30),
            (
                "MAX_READING_BYTES_PER_ADDRESS",
                self.max_reading_bytes_per_address as u64,
                1024,
                1 << 40,
            ),
            (
                "MAX_READING_BYTES",
                self.max_reading_bytes as u64,
                1024,
                1 << 40,
            ),
            (
                "MAX_RELAY_BYTES_PER_ADDRESS",
                self.max_relay_bytes_per_address as u64,
                1024,
                1 << 40,
            ),
            (
                "MAX_RELAY_BYTES",
                self.max_relay_bytes as u64,
                1024,
                1 << 40,
            ),
            (
                "MAX_OUTBOUND_BYTES_PER_ADDRESS",
                self.max_outbound_bytes_per_address as u64,
                1 << 20,
                1 << 40,
            ),
            (
                "MAX_SIDECAR_OUTBOUND_BYTES",
                self.max_sidecar_outbound_bytes as u64,
                1 << 20,
                1 << 40,
            ),
            (
                "MAX_OUTBOUND_FRAMES",
                self.max_outbound_frames as u64,
                1,
                10_000_000,
            ),
            (
                "MAX_JOINS_PER_SECOND",
                self.max_joins_per_second as u64,
                1,
                1_000_000,
            ),
            (
                "MAX_EVENTS_PER_SECOND",
                self.max_events_per_second as u64,
                1,
                1_000_000,
            ),
            (
                "AUTHORIZATION_TTL_SECS",
                self.authorization_ttl_secs,
                1,
                86_400,
            ),
            ("IDLE_TIMEOUT_SECS", self.idle_timeout_secs, 1, 86_400),
            (
                "MAX_CONNECTIONS",
                self.max_connections as u64,
                1,
                10_000_000,
            ),
            (
                "HTTP_HEADER_TIMEOUT_SECS",
                self.http_header_timeout_secs,
                1,
                3_600,
            ),
            (
                "DB_STATEMENT_TIMEOUT_MS",
                self.db_statement_timeout_ms,
                10,
                3_600_000,
            ),
            (
                "FILTER_PATTERN_TIMEOUT_MS",
                self.filter_pattern_timeout_ms,
                1,
                60_000,
            ),
            (
                "MAX_FILTER_PATTERN_LENGTH",
                self.max_filter_pattern_length as u64,
                1,
                65_536,
            ),
            (
                "DB_CONNECT_TIMEOUT_SECS",
                self.db_connect_timeout_secs,
                1,
                3_600,
            ),
        ];
        for &(name, value, low, high) in ranges {
            if !(low..=high).contains(&value) {
                return Err(InvalidConfig(format!(
                    "{name} must be between {low} and {high} (it is {value})"
                )));
            }
        }
        for (lesser, low, greater, high) in [
            (
                "MAX_FRAME_SIZE",
                self.max_frame_size,
                "MAX_READING_BYTES_PER_ADDRESS",
                self.max_reading_bytes_per_address,
            ),
            (
                "MAX_READING_BYTES_PER_ADDRESS",
                self.max_reading_bytes_per_address,
                "MAX_READING_BYTES",
                self.max_reading_bytes,
            ),
            (
                "MAX_FRAME_SIZE",
                self.max_frame_size,
                "MAX_RELAY_BYTES_PER_ADDRESS",
                self.max_relay_bytes_per_address,
            ),
            (
                "MAX_RELAY_BYTES_PER_ADDRESS",
                self.max_relay_bytes_per_address,
                "MAX_RELAY_BYTES",
                self.max_relay_bytes,
            ),
            (
                "MAX_OUTBOUND_BYTES_PER_ADDRESS",
                self.max_outbound_bytes_per_address,
                "MAX_SIDECAR_OUTBOUND_BYTES",
                self.max_sidecar_outbound_bytes,
            ),
        ] {
            if low > high {
                return Err(InvalidConfig(format!(
                    "{greater} must be at least {lesser} ({high} < {low})"
                )));
            }
        }
        if self.max_policy_header_bytes > self.max_frame_size {
            return Err(InvalidConfig(
                "MAX_POLICY_HEADER_BYTES must not exceed MAX_FRAME_SIZE".into(),
            ));
        }
        self.pg_config().map(|_| ())
    }
}
