//! Configuration from flags and environment, with the names a Supabase self-hoster knows
//! where they exist (`PORT`, `API_JWT_SECRET`, `DB_HOST`, ... or one `DATABASE_URL`).

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
    /// Secret that client JWTs (apikey and access tokens) are signed with (HS256/384/512).
    #[arg(long, env = "API_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: String,

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

    /// Consumer slot this sidecar drains; every sidecar needs its own.
    #[arg(long, env = "CONSUMER_NAME", default_value = "realtime-sidecar")]
    pub consumer: String,
    /// After the first message of a batch, wait this long for more (fewer, larger batches).
    #[arg(long, env = "DRAIN_LINGER_MS", default_value_t = 1)]
    pub drain_linger_ms: u32,
    /// Most messages one drain call returns.
    #[arg(long, env = "DRAIN_BATCH", default_value_t = 10_000)]
    pub drain_batch: u32,

    /// Channels one connection may join (Supabase's default).
    #[arg(long, env = "MAX_CHANNELS_PER_CLIENT", default_value_t = 100)]
    pub max_channels_per_client: usize,
    /// Largest WebSocket frame or message accepted from a client, in bytes.
    #[arg(long, env = "MAX_FRAME_SIZE", default_value_t = 1_048_576)]
    pub max_frame_size: usize,
    /// Frames queued for one connection before it counts as too slow and is disconnected.
    /// Keep it above DRAIN_BATCH: one drain batch may all go to one busy topic at once.
    #[arg(long, env = "MAX_OUTBOUND_FRAMES", default_value_t = 20_000)]
    pub max_outbound_frames: usize,
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
    /// Directory of static files served at `/` (the demo page); nothing is served without it.
    #[arg(long, env = "WEB_ROOT")]
    pub web_root: Option<std::path::PathBuf>,
    /// A connection that sends nothing (not even a heartbeat) for this long is closed.
    #[arg(long, env = "IDLE_TIMEOUT_SECS", default_value_t = 60)]
    pub idle_timeout_secs: u64,
}

impl Config {
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
