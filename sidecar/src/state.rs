//! State shared by every task of one sidecar process.

use crate::config::Config;
use crate::hub::Hub;
use crate::jwt::Verifier;
use crate::metrics::Metrics;
use crate::publish::Publish;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

pub struct Shared {
    pub cfg: Arc<Config>,
    pub hub: Arc<Hub>,
    pub verifier: Verifier,
    pub metrics: Arc<Metrics>,
    /// Turns true once when the server starts shutting down.
    pub shutdown: watch::Receiver<bool>,
    /// Private-channel authorization requests, batched into `realtime.authorize`.
    pub authorize: mpsc::Sender<crate::authorizer::AuthRequest>,
    /// Client broadcasts waiting to be relayed through the database.
    pub publish: mpsc::Sender<Publish>,
    /// Random per process: the high half of this sidecar's relay origins.
    pub instance: u32,
}

impl Shared {
    /// The origin that names connection `conn` of this process in `realtime.relay`.
    pub fn origin(&self, conn: u64) -> i64 {
        ((self.instance as i64) << 32) | (conn & 0xffff_ffff) as i64
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
