//! What the database workers (relay, authorizer, checker, history, presence) share: a Postgres
//! connection kept up with backoff, and batches made of whatever requests are waiting (no
//! timer: a batch holds what arrived while the previous one was in the database).

use crate::config::Config;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_postgres::{Client, NoTls};

/// Connects with `cfg`'s settings, retrying with backoff (100 ms doubling to 5 s), and sets
/// the session's statement_timeout. Requests that wait meanwhile are handed to `fail` after
/// each failed attempt, so they are answered, not left hanging. None on shutdown.
pub async fn connect<T>(
    cfg: &Config,
    what: &str,
    rx: &mut mpsc::Receiver<T>,
    shutdown: &mut watch::Receiver<bool>,
    mut fail: impl FnMut(T),
) -> Option<Client> {
    let each_failure = || {
        while let Ok(r) = rx.try_recv() {
            fail(r);
        }
    };
    connect_retrying(cfg, what, shutdown, each_failure).await
}

/// Connects as `connect` does, calling `each_failure` after every failed attempt. None on
/// shutdown.
pub async fn connect_retrying(
    cfg: &Config,
    what: &str,
    shutdown: &mut watch::Receiver<bool>,
    mut each_failure: impl FnMut(),
) -> Option<Client> {
    let mut backoff = Duration::from_millis(100);
    let pg = cfg.pg_config().expect("validated at startup");
    let setup = format!("SET statement_timeout = {}", cfg.db_statement_timeout_ms);
    loop {
        let attempt = async {
            let (client, conn) = pg.connect(NoTls).await?;
            tokio::spawn(conn);
            client.batch_execute(&setup).await?;
            Ok::<_, tokio_postgres::Error>(client)
        };
        let attempt = tokio::select! {
            c = attempt => c,
            _ = shutdown.changed() => return None,
        };
        match attempt {
            Ok(client) => return Some(client),
            Err(e) => {
                tracing::warn!(error = %e, "{what} connection failed; retrying");
                each_failure();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return None,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Waits for a request, then takes what else is waiting, up to `max`. None on shutdown or
/// when every sender is gone.
pub async fn next_batch<T>(
    rx: &mut mpsc::Receiver<T>,
    max: usize,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Vec<T>> {
    let first = tokio::select! {
        r = rx.recv() => r?,
        _ = shutdown.changed() => return None,
    };
    let mut batch = vec![first];
    while batch.len() < max {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
    Some(batch)
}
