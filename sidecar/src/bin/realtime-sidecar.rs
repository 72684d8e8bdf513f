//! The sidecar's executable: settings from flags and the environment, logs, a runtime, and
//! `realtime_sidecar::run` until SIGTERM or SIGINT. Everything else is the library.

use clap::Parser;
use realtime_sidecar::config::{self, Config};
use realtime_sidecar::shutdown;

fn main() -> std::process::ExitCode {
    // Supabase's names first (TENANT_MAX_*), while the process has one thread.
    let notes = config::supabase_names::apply();
    let cfg = Config::parse();
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
    for note in notes {
        tracing::info!("{note}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(realtime_sidecar::run(cfg, shutdown::wait_for_signal())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sidecar failed");
            std::process::ExitCode::FAILURE
        }
    }
}
