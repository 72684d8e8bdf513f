use clap::{Parser, ValueEnum};

/// One run of the load generator: connections, the channels they join, who sends and how fast.
/// The scenarios of pgbench/RESULTS.md are presets of these flags in pgbench/scenarios.py.
#[derive(Parser, Debug)]
pub struct Args {
    /// Server base URL, e.g. ws://127.0.0.1:4000; several, comma-separated, route each
    /// client by topic: to the server its first topic's name hashes to (`plan::route`), as
    /// a topic-aware proxy or a client choosing by topic hash would.
    #[arg(long, value_delimiter = ',', required = true)]
    pub url: Vec<String>,
    #[arg(long, value_enum, default_value = "supabase")]
    pub protocol: Protocol,
    /// Serializer of the Supabase protocol: 1.0.0 (JSON objects) or 2.0.0 (arrays, binary).
    #[arg(long, default_value = "2.0.0")]
    pub vsn: String,
    /// HMAC secret the server verifies tokens with.
    #[arg(long)]
    pub jwt_secret: String,
    /// Sign tokens ES256 with this P-256 private key (PEM) instead, as asymmetric
    /// Supabase projects do; the server has its public key in API_JWT_JWKS.
    #[arg(long)]
    pub jwt_ec_pem: Option<String>,
    /// The `kid` of ES256 tokens.
    #[arg(long)]
    pub jwt_kid: Option<String>,
    /// Postgres connection string; the database publishers write there.
    #[arg(long)]
    pub dsn: String,
    /// WebSocket connections to open.
    #[arg(long, alias = "subscribers", default_value_t = 1)]
    pub clients: usize,
    /// Topics, named <topic-prefix><k> for k in 0..topics.
    #[arg(long, default_value_t = 1)]
    pub topics: usize,
    #[arg(long, default_value = "load")]
    pub topic_prefix: String,
    /// Channels each client joins.
    #[arg(long, default_value_t = 1)]
    pub channels_per_client: usize,
    /// How clients pick topics: round-robin (client i joins i*C .. i*C+C-1 modulo topics,
    /// so every topic gets the same number of subscribers), random (seeded), or group
    /// (client i joins topic i / group-size: echo is a group of 1).
    #[arg(long, value_enum, default_value = "round-robin")]
    pub assign: Assign,
    #[arg(long, default_value_t = 10)]
    pub group_size: usize,
    /// Who sends: the database through realtime.send, inserts into the bench_rows table
    /// (whose trigger broadcasts), inserts into Centrifugo's outbox table, the clients
    /// themselves through the server, or nobody.
    #[arg(long, value_enum, default_value = "send")]
    pub publisher: Publisher,
    /// Messages per second: in total for the database publishers, per client for `clients`.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Seconds of sending (or of holding the connections when nobody sends).
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Padding added to each payload, in bytes.
    #[arg(long, default_value_t = 64)]
    pub pad: usize,
    /// Join private channels as role authenticated, client i with sub = member_uuid(i + 1).
    #[arg(long)]
    pub private: bool,
    /// Subscribe to Postgres Changes instead of broadcasts: each channel binds INSERTs of
    /// public.bench_changes with filter `k=eq.<topic index>` (pgbench/changes_setup.sql), as
    /// role authenticated, client i with sub = member_uuid(i + 1). Use `--publisher changes`.
    #[arg(long)]
    pub postgres_changes: bool,
    /// With --postgres-changes: ask for the channel's position after each batch of changes
    /// (`config.broadcast.resume = {changes: true}`: a `system` message per batch).
    #[arg(long)]
    pub change_positions: bool,
    /// Local addresses to connect from, comma-separated; client i connects from the
    /// (i mod n)th. Several give more than the ~28,000 ephemeral ports one source address has
    /// towards one server port, and, behind a proxy that names them in X-Forwarded-For,
    /// several clients as the server's per-address limits count them.
    #[arg(long, value_delimiter = ',')]
    pub source_ip: Vec<std::net::IpAddr>,
    /// Adds `&<name>=<the client's first topic>` to the WebSocket URL, as an app does with
    /// realtime-js's `params` so that a proxy hashing on that parameter (HAProxy's
    /// `balance url_param`) puts each topic's clients on one server.
    #[arg(long)]
    pub route_param: Option<String>,
    /// Connection attempts in flight at once.
    #[arg(long, default_value_t = 256)]
    pub connect_concurrency: usize,
    /// Print a progress line to stderr every second.
    #[arg(long)]
    pub progress: bool,
    /// Seed of the random topic assignment.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A resume storm (Supabase protocol, broadcast, one channel per client): this many
    /// seconds into the sending window every client drops its socket at once, reconnects
    /// and rejoins with `config.broadcast.resume` at the position it had `--behind-min` to
    /// `--behind-max` seconds before (spread over the clients); the result line gets a
    /// `storm` object (time until all are live again, messages resent, none lost).
    #[arg(long)]
    pub storm_after: Option<f64>,
    #[arg(long, default_value_t = 1.0)]
    pub behind_min: f64,
    #[arg(long, default_value_t = 5.0)]
    pub behind_max: f64,
    /// A label for the result line.
    #[arg(long, default_value = "")]
    pub label: String,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Supabase Realtime's Phoenix protocol, as the sidecar speaks it.
    Supabase,
    /// Centrifugo's JSON protocol (v5, /connection/websocket).
    Centrifugo,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assign {
    RoundRobin,
    Random,
    Group,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publisher {
    Send,
    Table,
    Outbox,
    /// Inserts into public.bench_changes, whose changes reach `--postgres-changes` clients.
    Changes,
    Clients,
    None,
}
