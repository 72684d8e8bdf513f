//! Graceful shutdown: on SIGTERM or SIGINT the server stops accepting, every connection is
//! sent a close frame with a reason, and the drainer confirms its position.

use crate::metrics::Metrics;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

pub async fn wait_for_signal() {
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Waits (at most `limit`) for the connections to send their close frames and finish.
pub async fn wait_for_connections(metrics: &Metrics, limit: Duration) {
    let until = Instant::now() + limit;
    while metrics.connections.load(Relaxed) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
