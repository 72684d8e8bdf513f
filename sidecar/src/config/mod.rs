//! Configuration from flags and environment, with the names a Supabase self-hoster knows
//! where they exist (`PORT`, `API_JWT_SECRET`, `DB_HOST`, ... or one `DATABASE_URL`).

pub mod supabase_names;
mod validate;

use clap::Parser;
use std::net::IpAddr;
use std::time::Duration;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "realtime-sidecar",
    about = "Supabase-Realtime-compatible WebSocket server fed by pg_realtime"
)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "BIND", default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// Port for WebSocket and HTTP. Several processes may share it (SO_REUSEPORT).
    #[arg(long, env = "PORT", default_value_t = 4000)]
    pub port: u16,
    /// Secret that client JWTs (apikey and access tokens) are signed with (HS256/384/512);
    /// optional when API_JWT_JWKS is given.
    #[arg(long, env = "API_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// Supabase's static JWKS (`{"keys": [...]}`: its `JWT_JWKS`): asymmetric tokens
    /// (RS256/384/512, ES256/384, EdDSA) and `oct` keys, chosen by the `alg`'s key type and
    /// the token's `kid` (`jwt::keys`).
    #[arg(long, env = "API_JWT_JWKS", hide_env_values = true)]
    pub jwt_jwks: Option<String>,
    /// Supabase's: a JSON object of claims a token must hold these values of when it has
    /// them (`{"iss": "supabase"}`).
    #[arg(long, env = "JWT_CLAIM_VALIDATORS")]
    pub jwt_claim_validators: Option<String>,
    /// Supabase's opaque publishable keys (`sb_publishable_...`, one or a comma-separated
    /// list): each stands for the claims of the anon key, `{"role": "anon", "iss":
    /// "supabase"}`, where no gateway swaps it for a JWT (`jwt::api_keys`).
    #[arg(long, env = "SUPABASE_PUBLISHABLE_KEY", hide_env_values = true)]
    pub supabase_publishable_key: Option<String>,
    /// Supabase's opaque secret keys (`sb_secret_...`): each stands for the service_role's
    /// claims; refused from a browser.
    #[arg(long, env = "SUPABASE_SECRET_KEY", hide_env_values = true)]
    pub supabase_secret_key: Option<String>,
    /// Supabase's: when set, `/metrics` wants `Authorization: Bearer <JWT signed with it>`
    /// and answers 403 otherwise; unset, `/metrics` is open to whoever reaches the port.
    #[arg(long, env = "METRICS_JWT_SECRET", hide_env_values = true)]
    pub metrics_jwt_secret: Option<String>,

    /// libpq-style connection string; overrides the DB_* settings.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    #[arg(long, env = "DB_HOST", default_value = "127.0.0.1")]
    pub db_host: String,
    #[arg(long, env = "DB_PORT", default_value_t = 5432)]
    pub db_port: u16,
    #[arg(long, env = "DB_USER", default_value = "postgres")]
    pub db_user: String,
    #[arg(long, env = "DB_PASSWORD", hide_env_values = true)]
    pub db_password: Option<String>,
    #[arg(long, env = "DB_NAME", default_value = "postgres")]
    pub db_name: String,
    /// Require TLS to Postgres and verify its certificate (`db_tls`): Supabase's DB_SSL.
    #[arg(long, env = "DB_SSL", default_value_t = false, action = clap::ArgAction::Set)]
    pub db_ssl: bool,
    /// The CA certificates (PEM) Postgres's certificate is verified against; without it, the
    /// system's trust store. Supabase's DB_SSL_CA_CERT.
    #[arg(long, env = "DB_SSL_CA_CERT")]
    pub db_ssl_ca_cert: Option<std::path::PathBuf>,

    /// Consumer slot this sidecar drains; every sidecar needs its own.
    #[arg(long, env = "CONSUMER_NAME", default_value = "realtime-sidecar")]
    pub consumer: String,
    /// After handing out a drained batch, wait this long before the next drain call (fewer,
    /// larger batches under load; a message after a quiet spell is not held).
    #[arg(long, env = "DRAIN_LINGER_MS", default_value_t = 1)]
    pub drain_linger_ms: u32,
    /// A budget of drain calls a second for all sidecars together under load (set alike
    /// on each): each waits between its calls' starts 1 ÷ (budget × its share of the
    /// traffic), so routed sidecars make together the calls one would. 0: no budget.
    #[arg(long, env = "DRAIN_CALLS_PER_SECOND", default_value_t = 0)]
    pub drain_calls_per_second: u32,
    /// The longest the budget makes a sidecar wait after handing out a batch.
    #[arg(long, env = "DRAIN_LINGER_MAX_MS", default_value_t = 50)]
    pub drain_linger_max_ms: u32,
    /// Drain only the topics (and tables) this sidecar's channels joined (`realtime.listen`);
    /// false: drain every message.
    #[arg(long, env = "FILTER_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub filter_topics: bool,
    /// Supabase's "Allow public access" off (its tenant's `private_only`): a join of a
    /// public channel is refused with `PrivateOnly: This project only allows private
    /// channels`, before its token is read.
    #[arg(long, env = "PRIVATE_ONLY", default_value_t = false, action = clap::ArgAction::Set)]
    pub private_only: bool,
    /// The tenant Supabase's health route answers for (`/api/tenants/:tenant/health`, what
    /// its docker-compose healthcheck asks); any other is 404. Supabase's self-hosted name.
    #[arg(long, env = "SELF_HOST_TENANT_NAME", default_value = "realtime-dev")]
    pub self_host_tenant_name: String,
    /// `region` in that route's answer (Supabase's REGION; unset: null).
    #[arg(long, env = "REGION")]
    pub region: Option<String>,
    /// Most messages one drain call returns.
    #[arg(long, env = "DRAIN_BATCH", default_value_t = 10_000)]
    pub drain_batch: u32,

    /// A Postgres Changes event whose data is larger keeps only values of at most 64 bytes
    /// and carries "Error 413: Payload Too Large" (Supabase's max_record_bytes default).
    /// Applied where the change is decoded (the session's realtime.max_record_bytes), and
    /// again to what a subscriber's role may read.
    #[arg(long, env = "MAX_RECORD_BYTES", default_value_t = 1_048_576)]
    pub max_record_bytes: usize,

    /// Channels one connection may join (Supabase's default).
    #[arg(long, env = "MAX_CHANNELS_PER_CLIENT", default_value_t = 100)]
    pub max_channels_per_client: usize,
    /// Largest WebSocket frame or message accepted from a client, and largest REST body, in
    /// bytes (Supabase's 5,000,000). What is being read is bounded per address and in all
    /// (MAX_READING_BYTES_PER_ADDRESS, MAX_READING_BYTES).
    #[arg(long, env = "MAX_FRAME_SIZE", default_value_t = 5_000_000)]
    pub max_frame_size: usize,
    /// Bytes of client frames being read from one client address, its connections together
    /// (`reading`): past the first 64 KiB of each message, a frame's bytes are taken when
    /// its header announces them. A frame that would pass it closes its connection (1013,
    /// "ReadingBytesLimitReached: ... MAX_READING_BYTES_PER_ADDRESS ..."). At least
    /// MAX_FRAME_SIZE.
    #[arg(long, env = "MAX_READING_BYTES_PER_ADDRESS", default_value_t = 64 << 20)]
    pub max_reading_bytes_per_address: usize,
    /// Bytes of client frames being read by the whole sidecar (REST bodies included); past it
    /// as MAX_READING_BYTES_PER_ADDRESS, naming MAX_READING_BYTES. At least
    /// MAX_READING_BYTES_PER_ADDRESS.
    #[arg(long, env = "MAX_READING_BYTES", default_value_t = 512 << 20)]
    pub max_reading_bytes: usize,
    /// Bytes of one client address's broadcasts waiting for the relay (its connections' and
    /// REST requests' together), and of its pushes held while a private channel's verdict is
    /// asked: a push that would pass it is refused ("UnableToBroadcast: ...
    /// MAX_RELAY_BYTES_PER_ADDRESS ...; retry", a track "UnableToTrackPresence: ..."). At least
    /// MAX_FRAME_SIZE.
    #[arg(long, env = "MAX_RELAY_BYTES_PER_ADDRESS", default_value_t = 64 << 20)]
    pub max_relay_bytes_per_address: usize,
    /// Bytes of every broadcast waiting for the relay and every push held for a verdict;
    /// past it as MAX_RELAY_BYTES_PER_ADDRESS, naming MAX_RELAY_BYTES. At least
    /// MAX_RELAY_BYTES_PER_ADDRESS.
    #[arg(long, env = "MAX_RELAY_BYTES", default_value_t = 512 << 20)]
    pub max_relay_bytes: usize,
    /// Frames queued for one connection before it counts as too slow and is disconnected.
    /// Keep it above DRAIN_BATCH: one drain batch may all go to one busy topic at once.
    #[arg(long, env = "MAX_OUTBOUND_FRAMES", default_value_t = 20_000)]
    pub max_outbound_frames: usize,
    /// Bytes queued for one connection before it counts as too slow and is disconnected
    /// (a frame is always taken into an empty queue): a client that stops reading pins at
    /// most this much, whatever its frames' sizes.
    #[arg(long, env = "MAX_OUTBOUND_BYTES", default_value_t = 64 << 20)]
    pub max_outbound_bytes: usize,
    /// Bytes of the large frames (16 KiB or more) queued to one client address's
    /// connections, each distinct frame counted once however many of them queue it
    /// (`out::SharedBytes`): a push past it closes that connection (1008, "too slow: ...
    /// MAX_OUTBOUND_BYTES_PER_ADDRESS").
    #[arg(long, env = "MAX_OUTBOUND_BYTES_PER_ADDRESS", default_value_t = 256 << 20)]
    pub max_outbound_bytes_per_address: usize,
    /// The same for every connection: a push past it closes its connection (1008, "too
    /// slow: ... MAX_SIDECAR_OUTBOUND_BYTES").
    #[arg(long, env = "MAX_SIDECAR_OUTBOUND_BYTES", default_value_t = 2 << 30)]
    pub max_sidecar_outbound_bytes: usize,
    /// Postgres Changes bindings one join may carry (realtime-js sends one per `.on()`);
    /// every binding of a schema-wide channel runs against every change drained.
    #[arg(long, env = "MAX_BINDINGS_PER_JOIN", default_value_t = 100)]
    pub max_bindings_per_join: usize,
    /// Postgres Changes bindings of one connection's channels together.
    #[arg(long, env = "MAX_BINDINGS_PER_CONNECTION", default_value_t = 1000)]
    pub max_bindings_per_connection: usize,
    /// Postgres Changes bindings of all the connections of one client address (an IPv6
    /// /64) together: without it one address holds MAX_CONNECTIONS_PER_ADDRESS times
    /// MAX_BINDINGS_PER_CONNECTION, and every binding of a schema-wide channel runs against
    /// every drained change. A join past it is refused as MAX_BINDINGS_PER_CONNECTION
    /// refuses.
    #[arg(long, env = "MAX_BINDINGS_PER_ADDRESS", default_value_t = 10_000)]
    pub max_bindings_per_address: usize,
    /// Pattern conditions (`like`, `ilike`, `match`, `imatch`) of one join's bindings: each
    /// is asked about every changed value of its table in the database, so they are counted
    /// apart from other conditions (issue 39, H1: 16,000 from one socket took a backend to
    /// gigabytes and every other subscriber's check budget). realtime-js writes one filter
    /// per `.on()`.
    #[arg(long, env = "MAX_PATTERNS_PER_JOIN", default_value_t = 16)]
    pub max_patterns_per_join: usize,
    /// Pattern conditions of one connection's channels together.
    #[arg(long, env = "MAX_PATTERNS_PER_CONNECTION", default_value_t = 64)]
    pub max_patterns_per_connection: usize,
    /// Pattern conditions of all the connections of one client address together (refused
    /// as MAX_PATTERNS_PER_CONNECTION refuses).
    #[arg(long, env = "MAX_PATTERNS_PER_ADDRESS", default_value_t = 256)]
    pub max_patterns_per_address: usize,
    /// Bindings of all the connections of one IPv6 /56 together (a residential line's
    /// block: 256 /64s, each with MAX_BINDINGS_PER_ADDRESS); refused as
    /// MAX_BINDINGS_PER_ADDRESS refuses, naming the block (issue 39, M2).
    #[arg(long, env = "MAX_BINDINGS_PER_IPV6_56", default_value_t = 20_000)]
    pub max_bindings_per_ipv6_56: usize,
    /// The same for an IPv6 /48 (a cloud tenant's block).
    #[arg(long, env = "MAX_BINDINGS_PER_IPV6_48", default_value_t = 40_000)]
    pub max_bindings_per_ipv6_48: usize,
    /// The same for an IPv4 /24.
    #[arg(long, env = "MAX_BINDINGS_PER_IPV4_24", default_value_t = 40_000)]
    pub max_bindings_per_ipv4_24: usize,
    /// Pattern conditions of all the connections of one IPv6 /56 together.
    #[arg(long, env = "MAX_PATTERNS_PER_IPV6_56", default_value_t = 512)]
    pub max_patterns_per_ipv6_56: usize,
    /// The same for an IPv6 /48.
    #[arg(long, env = "MAX_PATTERNS_PER_IPV6_48", default_value_t = 1024)]
    pub max_patterns_per_ipv6_48: usize,
    /// The same for an IPv4 /24.
    #[arg(long, env = "MAX_PATTERNS_PER_IPV4_24", default_value_t = 1024)]
    pub max_patterns_per_ipv4_24: usize,
    /// Distinct patterns one `realtime.match_patterns` call judges: a table's patterns are
    /// asked in calls of at most this many, each connection's after those of connections
    /// with fewer, so that the ones with most are the ones a spent budget leaves undecided.
    #[arg(long, env = "FILTER_PATTERNS_PER_CALL", default_value_t = 64)]
    pub filter_patterns_per_call: usize,
    /// Bindings without a table (`{schema: 'public'}` or `{schema: '*'}`) of every channel of
    /// this sidecar together: each is matched against every drained change of its schemas on
    /// the drain's own loop, so past some thousands they slow every delivery of the sidecar
    /// (issue 39, M3). A join past it is refused; backends may use the whole,
    /// other clients leave BACKEND_RESERVE_PERCENT of it.
    #[arg(long, env = "MAX_SCHEMA_WIDE_BINDINGS", default_value_t = 50_000)]
    pub max_schema_wide_bindings: usize,
    /// Conditions of one binding's filter (realtime-js writes one).
    #[arg(long, env = "MAX_FILTER_CONDITIONS_PER_BINDING", default_value_t = 16)]
    pub max_filter_conditions_per_binding: usize,
    /// Bytes of one filter condition's value (an `in` list's items together: 100 UUIDs fit).
    #[arg(long, env = "MAX_FILTER_VALUE_BYTES", default_value_t = 4096)]
    pub max_filter_value_bytes: usize,
    /// Distinct tables one join's bindings may name; each is a key this sidecar listens to
    /// in the database (`realtime.max_topics_per_consumer` bounds them all together).
    #[arg(long, env = "MAX_TABLES_PER_JOIN", default_value_t = 100)]
    pub max_tables_per_join: usize,
    /// Bytes of a presence key (`config.presence.key`), which every watcher receives in
    /// every state and diff.
    #[arg(long, env = "MAX_PRESENCE_KEY_BYTES", default_value_t = 1024)]
    pub max_presence_key_bytes: usize,
    /// Joins per second one connection may make before it is disconnected.
    #[arg(long, env = "MAX_JOINS_PER_SECOND", default_value_t = 100)]
    pub max_joins_per_second: u32,
    /// Messages per second one connection may send before it is disconnected.
    #[arg(long, env = "MAX_EVENTS_PER_SECOND", default_value_t = 1000)]
    pub max_events_per_second: u32,
    /// How long a private channel's read and write verdicts are trusted before they are
    /// checked again (so revoking access takes effect without a new token).
    #[arg(long, env = "AUTHORIZATION_TTL_SECS", default_value_t = 60)]
    pub authorization_ttl_secs: u64,
    /// How long a private channel's denied verdict is remembered for the same identity (role,
    /// claims, headers), topic and action, at most 5 s (0: never): joins flooding topics their
    /// identity may not read are answered without asking the database again (issue 39, M1).
    /// A new token is a new identity, so a grant takes effect with the token that carries it.
    #[arg(long, env = "AUTHORIZATION_DENIAL_CACHE_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(0..=5000))]
    pub authorization_denial_cache_ms: u64,
    /// Denied verdicts remembered at most (about 40 bytes each); past it the expired are
    /// dropped, and if that is not enough, all of them: forgetting a denial costs only a
    /// database call, and a flood of distinct topics could otherwise grow the map without
    /// bound within its 5 s.
    #[arg(long, env = "MAX_REMEMBERED_DENIALS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_remembered_denials: u64,
    /// Authorization checks one client address may have waiting for the authorizer: its
    /// requests wait in a line of their own, served in turn with every other address's
    /// (`verdict_queue`; issue 39, M1). Past it a join is refused "ClientJoinRateLimitReached:
    /// Too many authorization checks of this client address are waiting
    /// (MAX_VERDICTS_WAITING_PER_ADDRESS)"; a re-check is retried later.
    #[arg(long, env = "MAX_VERDICTS_WAITING_PER_ADDRESS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_verdicts_waiting_per_address: u64,
    /// Authorization checks waiting, every address together (a few hundred bytes each); past
    /// it the newest of the longest line gives way to a newcomer, whose own line is shorter.
    #[arg(long, env = "MAX_VERDICTS_WAITING", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub max_verdicts_waiting: u64,
    /// Joins per second of all the connections of one client address (each connection has
    /// its own MAX_JOINS_PER_SECOND too): past it a join is refused, the socket kept. A
    /// private join costs a verdict of the one authorizer, shared by every client (issue 39,
    /// M1: 1,000 sockets of one address at 100 joins a second each).
    #[arg(long, env = "MAX_JOINS_PER_SECOND_PER_ADDRESS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_joins_per_second_per_address: u32,
    /// Joins per second of every address of one IPv6 /56 together (a residential line's
    /// block: 256 /64s); refused "ClientJoinRateLimitReached: Too many joins per second from
    /// this network (B)", the socket kept (issue 39, M2).
    #[arg(long, env = "MAX_JOINS_PER_SECOND_PER_IPV6_56", default_value_t = 2000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_joins_per_second_per_ipv6_56: u32,
    /// The same for an IPv6 /48 (a cloud tenant's block).
    #[arg(long, env = "MAX_JOINS_PER_SECOND_PER_IPV6_48", default_value_t = 4000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_joins_per_second_per_ipv6_48: u32,
    /// The same for an IPv4 /24.
    #[arg(long, env = "MAX_JOINS_PER_SECOND_PER_IPV4_24", default_value_t = 4000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_joins_per_second_per_ipv4_24: u32,
    /// Joins per second of every connection of this sidecar together (Supabase's tenant
    /// `max_joins_per_second`): each may cost verdicts of the one authorizer, and clients on
    /// many addresses could otherwise ask it for more than it answers (issue 39, M1).
    /// Clients leave BACKEND_RESERVE_PERCENT of it to backends; past their part a join is
    /// refused "ClientJoinRateLimitReached: Too many joins per second on this server", the
    /// socket kept.
    #[arg(long, env = "MAX_SIDECAR_JOINS_PER_SECOND", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sidecar_joins_per_second: u32,
    /// Presence metas one topic holds before a channel's first track into it is refused
    /// ("Too many presence members in this topic: ..."): every joiner is sent the whole
    /// state and every watching sidecar keeps it; one address held 1,000 members of up to
    /// 16 KiB each (issue 39, L4).
    #[arg(long, env = "MAX_PRESENCE_MEMBERS_PER_TOPIC", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_presence_members_per_topic: u64,
    /// Directory of static files served at `/` (the demo page); nothing is served without it.
    #[arg(long, env = "WEB_ROOT")]
    pub web_root: Option<std::path::PathBuf>,
    /// A connection that sends nothing (not even a heartbeat) for this long is closed.
    #[arg(long, env = "IDLE_TIMEOUT_SECS", default_value_t = 60)]
    pub idle_timeout_secs: u64,

    /// WebSocket connections this process holds at most; more are refused at upgrade with
    /// Supabase's `ConnectionRateLimitReached` (HTTP 429), so they cannot exhaust its files.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 16_384)]
    pub max_connections: usize,
    /// An HTTP request whose headers have not all arrived after this long is dropped (slow
    /// clients holding sockets open); a REST body gets as long again.
    #[arg(long, env = "HTTP_HEADER_TIMEOUT_SECS", default_value_t = 10)]
    pub http_header_timeout_secs: u64,
    /// Origins whose pages may call the REST broadcast routes from a browser (the preflight
    /// is answered and `Access-Control-Allow-Origin` names them): `*` for any, as Supabase,
    /// or a comma-separated list of `scheme://host[:port]`.
    #[arg(long, env = "CORS_ALLOWED_ORIGINS", default_value = "*",
          value_parser = crate::cors::AllowedOrigins::parse)]
    pub cors_allowed_origins: crate::cors::AllowedOrigins,
    /// Proxies whose `X-Forwarded-For` names the client (addresses or CIDR blocks,
    /// comma-separated). Empty, the default: every client is its connection's peer, and the
    /// header is ignored (any client can write one).
    #[arg(long, env = "TRUSTED_PROXIES", default_value = "",
          value_parser = crate::address::TrustedProxies::parse)]
    pub trusted_proxies: crate::address::TrustedProxies,
    /// WebSocket connections one client address (an IPv6 /64) may hold; more are refused at
    /// upgrade with "ConnectionRateLimitReached: Too many connections from this address", so
    /// one address cannot take the sidecar's MAX_CONNECTIONS. A connection whose apikey is a
    /// `service_role` token (a backend's) counts in none of the per-address limits.
    #[arg(long, env = "MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 1000)]
    pub max_connections_per_address: usize,
    /// WebSocket connections of one IPv6 /56 (a residential line's block), all its /64s
    /// together; more are refused at upgrade with "ConnectionRateLimitReached: Too many
    /// connections from this network (N/56)". Backends are not counted.
    #[arg(long, env = "MAX_CONNECTIONS_PER_IPV6_56", default_value_t = 2000)]
    pub max_connections_per_ipv6_56: usize,
    /// The same for an IPv6 /48 (a cloud tenant's block).
    #[arg(long, env = "MAX_CONNECTIONS_PER_IPV6_48", default_value_t = 4000)]
    pub max_connections_per_ipv6_48: usize,
    /// The same for an IPv4 /24.
    #[arg(long, env = "MAX_CONNECTIONS_PER_IPV4_24", default_value_t = 4000)]
    pub max_connections_per_ipv4_24: usize,
    /// The part, in percent, of the process's totals (MAX_CONNECTIONS,
    /// MAX_REST_EVENTS_PER_SECOND) that only backends (`service_role`) may use: clients that
    /// fill the rest never lock the app's own server out (issue 39, M2).
    #[arg(long, env = "BACKEND_RESERVE_PERCENT", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=90))]
    pub backend_reserve_percent: u64,
    /// TCP connections being served as HTTP (a request, a keep-alive, an upgrade not yet
    /// done) at once; a connection past it is closed as it is accepted. An upgraded
    /// WebSocket counts against MAX_CONNECTIONS instead. Without it, keep-alive connections
    /// sending a request every few seconds could take every file the process may open
    /// (issue 39, L10).
    #[arg(long, env = "MAX_HTTP_CONNECTIONS", default_value_t = 8192)]
    pub max_http_connections: usize,
    /// The same per peer address (the TCP peer: a trusted proxy, which carries many
    /// clients, is bounded by MAX_HTTP_CONNECTIONS only).
    #[arg(long, env = "MAX_HTTP_CONNECTIONS_PER_PEER", default_value_t = 2048)]
    pub max_http_connections_per_peer: usize,
    /// REST broadcast requests being served at once; more are answered 429 "Too many
    /// requests" before their body is read.
    #[arg(long, env = "MAX_REST_REQUESTS_IN_FLIGHT", default_value_t = 256)]
    pub max_rest_requests_in_flight: usize,
    /// REST broadcast requests one client address may have in flight (429 "Too many
    /// requests"); a `service_role` token is not bound by it.
    #[arg(
        long,
        env = "MAX_REST_REQUESTS_IN_FLIGHT_PER_ADDRESS",
        default_value_t = 16
    )]
    pub max_rest_requests_in_flight_per_address: usize,
    /// Messages in one REST request (429 "Too many messages to broadcast, please reduce the
    /// batch size"); at most half the relay's queue, which is REST's share of it.
    #[arg(long, env = "MAX_REST_MESSAGES_PER_REQUEST", default_value_t = 1000)]
    pub max_rest_messages_per_request: usize,
    /// REST messages per second this sidecar accepts from everyone together (429 "You have
    /// exceeded your rate limit", or the batch text when the batch is what does not fit).
    #[arg(long, env = "MAX_REST_EVENTS_PER_SECOND", default_value_t = 10_000)]
    pub max_rest_events_per_second: u32,
    /// REST messages per second from one client address (an IPv6 /64); 429 as above. Not
    /// for `service_role` tokens.
    #[arg(
        long,
        env = "MAX_REST_EVENTS_PER_SECOND_PER_ADDRESS",
        default_value_t = 1000
    )]
    pub max_rest_events_per_second_per_address: u32,
    /// REST messages per second from one IPv6 /56 (a residential line's block), all its
    /// /64s together; 429 as above. One client holding many /64s otherwise had as many
    /// addresses' rates and could take the whole total (issue 39, M2).
    #[arg(
        long,
        env = "MAX_REST_EVENTS_PER_SECOND_PER_IPV6_56",
        default_value_t = 2000
    )]
    pub max_rest_events_per_second_per_ipv6_56: u32,
    /// The same for an IPv6 /48 (a cloud tenant's block).
    #[arg(
        long,
        env = "MAX_REST_EVENTS_PER_SECOND_PER_IPV6_48",
        default_value_t = 4000
    )]
    pub max_rest_events_per_second_per_ipv6_48: u32,
    /// The same for an IPv4 /24.
    #[arg(
        long,
        env = "MAX_REST_EVENTS_PER_SECOND_PER_IPV4_24",
        default_value_t = 4000
    )]
    pub max_rest_events_per_second_per_ipv4_24: u32,
    /// REST messages per second from one user (the JWT's `sub`, from any address); 429 as
    /// above. Anonymous tokens have no `sub`: their address bounds them.
    #[arg(
        long,
        env = "MAX_REST_EVENTS_PER_SECOND_PER_USER",
        default_value_t = 1000
    )]
    pub max_rest_events_per_second_per_user: u32,
    /// Bytes of a socket's `x-` headers carried into `request.headers` for policies; a socket
    /// whose headers are larger is refused at upgrade (they are copied into every request).
    #[arg(long, env = "MAX_POLICY_HEADER_BYTES", default_value_t = 8192)]
    pub max_policy_header_bytes: usize,
    /// Longest `match` / `imatch` filter pattern, in characters: a client's regular
    /// expression is evaluated for every change of its table. A longer one refuses the join.
    #[arg(long, env = "MAX_FILTER_PATTERN_LENGTH", default_value_t = 256)]
    pub max_filter_pattern_length: usize,
    /// Time one `match` / `imatch` pattern may take over a drained batch's values of its
    /// table; past it the changes it would let through are withheld from its channels (told
    /// by a `system` message) and everyone else's are delivered.
    #[arg(long, env = "FILTER_PATTERN_TIMEOUT_MS", default_value_t = 100)]
    pub filter_pattern_timeout_ms: u64,
    /// statement_timeout of the authorization and relay calls, in milliseconds.
    #[arg(long, env = "DB_STATEMENT_TIMEOUT_MS", default_value_t = 5000)]
    pub db_statement_timeout_ms: u64,
    /// How long connecting to Postgres may take.
    #[arg(long, env = "DB_CONNECT_TIMEOUT_SECS", default_value_t = 5)]
    pub db_connect_timeout_secs: u64,

    /// Presence pushes (track, untrack) one channel may send per second before it is closed
    /// with Supabase's "Client presence rate limit exceeded". High enough for cursors and
    /// typing indicators (Supabase's 5 per 30 s is not).
    #[arg(
        long,
        env = "MAX_CLIENT_PRESENCE_EVENTS_PER_SECOND",
        default_value_t = 30
    )]
    pub max_client_presence_events_per_second: u32,
    /// Presence pushes of one channel waiting for their change to commit (the database slow
    /// or away); past it a push is refused at once with "Too many presence pushes of this
    /// channel are waiting for the database" and changes nothing. At the channel's 30 pushes
    /// a second that is over 3 s of waiting; realtime-js gives up on a push after 10 s.
    #[arg(
        long,
        env = "MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL",
        default_value_t = 100,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub max_presence_pushes_waiting_per_channel: u32,
    /// Tracks this sidecar accepts per second across its clients; past it the tracks of the
    /// addresses that spent more than their share are refused with "Too many presence
    /// messages per second" (the channel stays; a bystander is still served).
    #[arg(long, env = "MAX_PRESENCE_EVENTS_PER_SECOND", default_value_t = 10_000)]
    pub max_presence_events_per_second: u32,
    /// Tracks one connection may make per second over all its channels; past it a track is
    /// refused with "Too many presence messages from this connection per second".
    #[arg(
        long,
        env = "MAX_CONNECTION_PRESENCE_EVENTS_PER_SECOND",
        default_value_t = 100
    )]
    pub max_connection_presence_events_per_second: u32,
    /// Tracks one client address (an IPv6 /64) may make per second; past it a track is
    /// refused with "Too many presence messages from this address per second".
    #[arg(
        long,
        env = "MAX_PRESENCE_EVENTS_PER_SECOND_PER_ADDRESS",
        default_value_t = 1000
    )]
    pub max_presence_events_per_second_per_address: u32,
    /// Largest presence meta (a track's payload, as JSON); a larger track closes the
    /// channel with "Track message size exceeded". Every watcher of the topic gets it.
    #[arg(long, env = "MAX_PRESENCE_META_BYTES", default_value_t = 16_384)]
    pub max_presence_meta_bytes: usize,
    /// Presence changes of a topic are sent to its watchers as one diff per window (a join
    /// and a leave of one member within a window cancel out); a room of 1,000 watchers or
    /// more uses at least 50 ms.
    #[arg(long, env = "PRESENCE_WINDOW_MS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub presence_window_ms: u64,
    /// How long this sidecar's presence lease lasts without renewal (renewed every second):
    /// a sidecar that hangs or is cut off this long loses its members. A killed one loses
    /// them within a second, whatever this is (its database session is gone).
    #[arg(long, env = "PRESENCE_LEASE_SECS", default_value_t = 3,
          value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub presence_lease_secs: u64,

    /// How long the Postgres Changes checks of one table in one drained batch may take, all
    /// calls together (each runs under the server's statement_timeout of what is left).
    /// Changes not decided by then are withheld from their channels, which are told "Changes
    /// to S.T could not be authorized and were not delivered: the check took longer than
    /// CHANGES_CHECK_TIMEOUT_MS"; the rest of the batch goes out.
    #[arg(long, env = "CHANGES_CHECK_TIMEOUT_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub changes_check_timeout_ms: u64,
    /// Changed rows one RLS check call asks each identity about (Supabase's
    /// poll_max_changes: it polls 100 changes at a time): a bulk write is checked in calls
    /// of bounded work.
    #[arg(long, env = "POLL_MAX_CHANGES", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub poll_max_changes: u64,
    /// Subscriber identities one RLS check call asks for, with POLL_MAX_CHANGES the bound
    /// on a call's work (identities × rows).
    #[arg(long, env = "CHANGES_CHECK_MAX_IDENTITIES", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub changes_check_max_identities: u64,
    /// Connections the Postgres Changes checks run on, beside the drain's (which never runs
    /// one). A table's checks run one at a time, in queue order; different tables' at once,
    /// up to this many: one slow table holds one connection, never another table's checks.
    #[arg(long, env = "CHANGES_CHECK_CONNECTIONS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub changes_check_connections: u64,
    /// Parts one table's check is split into by identity, each checked at once on a
    /// connection of its own (each of the CHANGES_CHECK_CONNECTIONS workers opens up to
    /// this many). Why: `realtime.visible` sets each identity up (a subtransaction, its
    /// settings, an executor start) before its first row; one backend doing it for 1,000
    /// subscribers was p99 1.75 s at 1,000 inserts/s (`pgbench/changes.py`).
    #[arg(long, env = "CHANGES_CHECK_PARTS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=16))]
    pub changes_check_parts: u64,
    /// Drained changes waiting for their check, all tables together, at most (and
    /// CHANGES_CHECK_BACKLOG_BYTES of their data): past it a batch's changes of a table are
    /// withheld from their channels, which are told "Changes to S.T could not be authorized
    /// and were not delivered: more than CHANGES_CHECK_BACKLOG (N) changes, or
    /// CHANGES_CHECK_BACKLOG_BYTES (B), are waiting for their check". It bounds what one
    /// bulk writer into a table with a costly policy makes the sidecar hold.
    #[arg(long, env = "CHANGES_CHECK_BACKLOG", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub changes_check_backlog: u64,
    /// Bytes of drained change data waiting for their check, at most (CHANGES_CHECK_BACKLOG).
    #[arg(long, env = "CHANGES_CHECK_BACKLOG_BYTES", default_value_t = 64 << 20,
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub changes_check_backlog_bytes: u64,

    /// Most messages of its topic one resume (`config.broadcast.resume`) is sent: a client
    /// further behind gets the newest this many and a `system` error with `recovered:
    /// false` and the positions not sent ("More than MAX_RESUME_MESSAGES (N) messages follow
    /// position P: ..."). It bounds what one join makes the sidecar hold for it.
    #[arg(long, env = "MAX_RESUME_MESSAGES", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_resume_messages: u64,
    /// Bytes of one history's frames (a resume's or a replay's), held while they are sent at
    /// the client's pace: past it the oldest are not sent (a resume is told `recovered:
    /// false` with their positions, naming this setting). The newest message is always sent,
    /// whatever its size. Messages may be a megabyte each: counted in messages only, 100
    /// slow resumes of one address held about 25 GB (issue 39, H2).
    #[arg(long, env = "MAX_RESUME_BYTES", default_value_t = 32 << 20,
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub max_resume_bytes: u64,
    /// Bytes of the histories of one client address being sent, together (a further
    /// history is cut to what is left, told so, naming this setting).
    #[arg(long, env = "MAX_RESUME_BYTES_PER_ADDRESS", default_value_t = 128 << 20,
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub max_resume_bytes_per_address: u64,
    /// Bytes of every history being sent, together.
    #[arg(long, env = "MAX_RESUME_BYTES_IN_FLIGHT", default_value_t = 1 << 30,
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub max_resume_bytes_in_flight: u64,
    /// Time the checks of one resume's Postgres Changes may take, all its chunks together:
    /// the history worker serves one join at a time, and each chunk's own
    /// CHANGES_CHECK_TIMEOUT_MS let one resume hold it for minutes (issue 39, H2). What is
    /// not checked by then is withheld, the channel told.
    #[arg(long, env = "RESUME_CHECK_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub resume_check_timeout_ms: u64,
    /// Joins of one client address (an IPv6 /64) whose history (resume or replay) is being
    /// read or sent at once: each may hold MAX_RESUME_MESSAGES in memory while it is sent. A
    /// further one is answered and waits in its address's line until one of them ends (a
    /// thousand users behind one NAT rejoining after a restart are legitimate).
    #[arg(long, env = "MAX_RESUMES_PER_ADDRESS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_resumes_per_address: u64,
    /// Joins of one client address waiting in that line at most; a join past it goes live
    /// at once without its history, told so by the `system` message of a resume that cannot
    /// be served (`recovered: false`, naming this setting).
    #[arg(long, env = "MAX_RESUMES_WAITING_PER_ADDRESS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub max_resumes_waiting_per_address: u64,

    /// Persisted messages (`persist`) one topic keeps at most, unexpired, counted over every
    /// sidecar; a push past it is refused with "UnableToBroadcast: PersistQuotaExceeded:
    /// topic T keeps at most N persisted messages and B bytes ..." (nothing is relayed).
    #[arg(long, env = "MAX_PERSISTED_MESSAGES_PER_TOPIC", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    pub max_persisted_messages_per_topic: u64,
    /// Bytes of persisted payloads one topic keeps at most (as stored), refused the same way.
    #[arg(long, env = "MAX_PERSISTED_BYTES_PER_TOPIC", default_value_t = 10_000_000,
          value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
    pub max_persisted_bytes_per_topic: u64,
    /// Persisted messages one sender keeps at most, unexpired, over every topic and sidecar:
    /// a user (the token's `sub`), or for a token without one (the public anon key) a
    /// client address (an IPv6 /64); the app's backend (`service_role`) counts in the total
    /// only. A topic's quota alone let one user with a write policy on a prefix
    /// (`room:<uid>-*`) keep MAX_PERSISTED_BYTES_PER_TOPIC in as many topics as it names
    /// (issue 39, M4). Refused "UnableToBroadcast: PersistQuotaExceeded: user U keeps at
    /// most N persisted messages and B bytes ...".
    #[arg(long, env = "MAX_PERSISTED_MESSAGES_PER_USER", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    pub max_persisted_messages_per_user: u64,
    /// Bytes of persisted payloads one sender keeps at most, refused the same way.
    #[arg(long, env = "MAX_PERSISTED_BYTES_PER_USER", default_value_t = 100_000_000,
          value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
    pub max_persisted_bytes_per_user: u64,
    /// Persisted messages the database keeps at most, every sender together: senders are as
    /// many as sign-ups or addresses, so only a total bounds the table. Refused
    /// "UnableToBroadcast: PersistQuotaExceeded: this database keeps at most N persisted
    /// messages and B bytes ...". Expired messages count until the next expiry round.
    #[arg(long, env = "MAX_PERSISTED_MESSAGES", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
    pub max_persisted_messages: u64,
    /// Bytes of persisted payloads the database keeps at most, refused the same way.
    #[arg(long, env = "MAX_PERSISTED_BYTES", default_value_t = 1_000_000_000,
          value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
    pub max_persisted_bytes: u64,
}

/// A setting the sidecar refuses to start with; the text names it. (Exit status 2.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidConfig(pub String);

impl std::fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidConfig {}

/// Broadcasts waiting for the relay at most (`relay`); WebSocket pushes beyond it are
/// refused, REST requests may hold half of it (`rest_limits`, MAX_REST_MESSAGES_PER_REQUEST).
pub const RELAY_QUEUE: usize = 10_000;

/// The shortest secret accepted (API_JWT_SECRET, METRICS_JWT_SECRET, an `oct` key).
pub use crate::jwt::MIN_SECRET_BYTES;

impl Config {
    /// The bytes of frames being read and of broadcasts waiting for the relay, each bounded
    /// per address and for the sidecar (`byte_budget`).
    pub fn byte_budgets(
        &self,
    ) -> (
        crate::byte_budget::ByteBudget,
        crate::byte_budget::ByteBudget,
    ) {
        use crate::byte_budget::ByteBudget;
        (
            ByteBudget::new(self.max_reading_bytes_per_address, self.max_reading_bytes),
            ByteBudget::new(self.max_relay_bytes_per_address, self.max_relay_bytes),
        )
    }

    /// The table of large frames queued to connections (`out::SharedBytes`).
    pub fn outbound_bytes(&self) -> crate::out::SharedBytes {
        crate::out::SharedBytes::new(
            self.max_outbound_bytes_per_address,
            self.max_sidecar_outbound_bytes,
        )
    }

    /// The limit of connections of `block` (MAX_CONNECTIONS_PER_IPV6_56 and friends).
    pub fn max_connections_per_block(&self, block: &crate::address::Block) -> usize {
        match block.prefix {
            56 => self.max_connections_per_ipv6_56,
            48 => self.max_connections_per_ipv6_48,
            _ => self.max_connections_per_ipv4_24,
        }
    }

    /// The bindings and the pattern conditions `block` may hold, with the settings' names
    /// (MAX_BINDINGS_PER_IPV6_56, MAX_PATTERNS_PER_IPV6_56 and friends).
    pub fn max_bindings_per_block(
        &self,
        block: &crate::address::Block,
    ) -> ((usize, &'static str), (usize, &'static str)) {
        match block.prefix {
            56 => (
                (self.max_bindings_per_ipv6_56, "MAX_BINDINGS_PER_IPV6_56"),
                (self.max_patterns_per_ipv6_56, "MAX_PATTERNS_PER_IPV6_56"),
            ),
            48 => (
                (self.max_bindings_per_ipv6_48, "MAX_BINDINGS_PER_IPV6_48"),
                (self.max_patterns_per_ipv6_48, "MAX_PATTERNS_PER_IPV6_48"),
            ),
            _ => (
                (self.max_bindings_per_ipv4_24, "MAX_BINDINGS_PER_IPV4_24"),
                (self.max_patterns_per_ipv4_24, "MAX_PATTERNS_PER_IPV4_24"),
            ),
        }
    }

    /// The joins per second of `block` (MAX_JOINS_PER_SECOND_PER_IPV6_56 and friends).
    pub fn max_joins_per_second_per_block(&self, block: &crate::address::Block) -> u32 {
        match block.prefix {
            56 => self.max_joins_per_second_per_ipv6_56,
            48 => self.max_joins_per_second_per_ipv6_48,
            _ => self.max_joins_per_second_per_ipv4_24,
        }
    }

    /// Of a process-wide total, the part clients other than backends may use
    /// (BACKEND_RESERVE_PERCENT is kept for backends; at least one is always left).
    pub fn clients_share(&self, total: u64) -> u64 {
        (total - total * self.backend_reserve_percent / 100).max(1)
    }

    /// The Postgres connection settings, with a connect timeout and TCP keepalives so that
    /// a database that vanishes without closing the socket is noticed.
    pub fn pg_config(&self) -> Result<tokio_postgres::Config, InvalidConfig> {
        let mut c: tokio_postgres::Config = self.dsn().parse().map_err(|e| {
            InvalidConfig(format!(
                "DATABASE_URL / DB_* settings are not a valid connection string: {e}"
            ))
        })?;
        if self.db_ssl {
            c.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        c.connect_timeout(Duration::from_secs(self.db_connect_timeout_secs))
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
        // MAX_RECORD_BYTES is applied where changes are decoded, in the drain and
        // `realtime.history` (issue 39, H4), as this session's realtime.max_record_bytes.
        let options = format!(
            "{} -c realtime.max_record_bytes={}",
            c.get_options().unwrap_or_default(),
            self.max_record_bytes
        );
        c.options(options.trim_start());
        Ok(c)
    }

    /// What every connection to Postgres connects with (`db_tls::shared`): DB_SSL_CA_CERT read
    /// at the first call, the startup check, and the connector shared after.
    pub fn db_tls(&self) -> Result<crate::db_tls::Tls, InvalidConfig> {
        crate::db_tls::shared(self.db_ssl_ca_cert.as_deref()).map_err(InvalidConfig)
    }

    /// The latest an authorization or relay call may answer before its connection is given
    /// up (the server's statement_timeout should have ended it well before).
    pub fn db_call_deadline(&self) -> Duration {
        Duration::from_millis(self.db_statement_timeout_ms) + Duration::from_secs(5)
    }

    pub fn http_header_timeout(&self) -> Duration {
        Duration::from_secs(self.http_header_timeout_secs)
    }

    /// The tokio-postgres connection string.
    pub fn dsn(&self) -> String {
        if let Some(url) = &self.database_url {
            return url.clone();
        }
        let mut s = format!(
            "host={} port={} user={} dbname={} application_name=realtime-sidecar",
            self.db_host, self.db_port, self.db_user, self.db_name
        );
        if let Some(p) = &self.db_password {
            s.push_str(&format!(
                " password='{}'",
                p.replace('\\', "\\\\").replace('\'', "\\'")
            ));
        }
        s
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs)
    }
}

#[cfg(test)]
mod tests;

impl Config {
    /// The verifier of client tokens these settings make (API_JWT_SECRET, API_JWT_JWKS,
    /// JWT_CLAIM_VALIDATORS); `unusable` is told each key of the set no token will be
    /// verified with.
    pub fn verifier(
        &self,
        unusable: impl FnMut(String),
    ) -> Result<crate::jwt::Verifier, InvalidConfig> {
        use crate::jwt::{ApiKeys, Keys, Validators, Verifier};
        let keys = Keys::new(
            self.jwt_secret.as_deref(),
            self.jwt_jwks.as_deref(),
            unusable,
        )
        .map_err(InvalidConfig)?;
        let validators =
            Validators::parse(self.jwt_claim_validators.as_deref()).map_err(InvalidConfig)?;
        let api_keys = ApiKeys::new(
            self.supabase_publishable_key.as_deref(),
            self.supabase_secret_key.as_deref(),
        )
        .map_err(InvalidConfig)?;
        Ok(Verifier::new(keys, validators, api_keys))
    }
}
