//! realtime-sidecar: drains pg_realtime's queue and serves Supabase Realtime's WebSocket
//! protocol. The parts: `server` (listener, HTTP, upgrades), `connection` (one socket),
//! `frame` (wire format), `channel` (join options), `hub` (topics and fan-out), `drainer`
//! (the Postgres side), `publish` (client broadcasts), `jwt`, `metrics`, `config`, `shutdown`.

mod authorizer;
mod batch;
mod channel;
mod command;
mod config;
mod connection;
mod drainer;
mod frame;
#[cfg(test)]
mod fuzz;
mod hub;
mod jwt;
mod metrics;
mod publish;
mod reason;
mod rest;
mod server;
mod shutdown;
mod state;

use clap::Parser;
use std::net::SocketAddr;
use std::sync::Arc;

fn main() -> std::process::ExitCode {
    let cfg = config::Config::parse();
    if let Err(e) = cfg.validate() {
        eprintln!("realtime-sidecar: {e}");
        return std::process::ExitCode::from(2);
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("LOG_LEVEL")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    // LOG_FORMAT=json gives one JSON object per line, for log collectors.
    if std::env::var("LOG_FORMAT").is_ok_and(|f| f == "json") {
        logs.json().init();
    } else {
        logs.init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cfg)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sidecar failed");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cfg: config::Config) -> std::io::Result<()> {
    let cfg = Arc::new(cfg);
    let addr = SocketAddr::new(cfg.bind, cfg.port);
    let listener = server::bind(addr)?;
    let (trigger, shutdown) = tokio::sync::watch::channel(false);
    let metrics = Arc::new(metrics::Metrics::default());
    let hub = Arc::new(hub::Hub::new(metrics.clone()));
    let (publish_tx, publish_rx) = tokio::sync::mpsc::channel(10_000);
    // Bounded: a flood of joins waits here (backpressure) rather than timing out.
    let (authorize_tx, authorize_rx) = tokio::sync::mpsc::channel(20_000);
    let shared = Arc::new(state::Shared {
        cfg: cfg.clone(),
        hub: hub.clone(),
        verifier: jwt::Verifier::new(&cfg.jwt_secret),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        publish: publish_tx,
        authorize: authorize_tx,
        instance: state::instance_id(),
    });
    tracing::info!(%addr, consumer = %cfg.consumer, "listening");
    let drainer = tokio::spawn(drainer::run(
        cfg.clone(),
        hub,
        metrics.clone(),
        shutdown.clone(),
    ));
    let publisher = tokio::spawn(publish::run(
        cfg.clone(),
        publish_rx,
        metrics.clone(),
        shutdown.clone(),
    ));
    let authorizer = tokio::spawn(authorizer::run(
        cfg.clone(),
        authorize_rx,
        metrics.clone(),
        shutdown.clone(),
    ));
    let accept = tokio::spawn(server::serve(listener, shared));

    shutdown::wait_for_signal().await;
    tracing::info!("shutting down: closing connections and confirming the queue position");
    let _ = trigger.send(true);
    let _ = accept.await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drainer).await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), publisher).await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), authorizer).await;
    shutdown::wait_for_connections(&metrics, std::time::Duration::from_secs(5)).await;
    Ok(())
}
