//! State shared by every task of one sidecar process.

use crate::config::Config;
use crate::hub::Hub;
use crate::jwt::Verifier;
use crate::metrics::Metrics;
use std::sync::Arc;
use tokio::sync::watch;

pub struct Shared {
    pub cfg: Arc<Config>,
    pub hub: Arc<Hub>,
    pub verifier: Verifier,
    pub metrics: Arc<Metrics>,
    /// Turns true once when the server starts shutting down.
    pub shutdown: watch::Receiver<bool>,
}
