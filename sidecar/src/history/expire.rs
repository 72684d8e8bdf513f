//! Persisted messages past their retention deleted (`realtime.expire_persisted`), in bounded
//! chunks each round, on the history worker's connection: chunks of 10,000 rows (about 55 ms
//! each here), at most ten a round, so a mass expiry is worked off over the rounds instead
//! of one DELETE that outlives its statement timeout and rolls back every minute (of 150,000
//! expired rows, 100,000 go in the first round: `sidecar/tests/history.rs`). Expiry is not a
//! setting.

use crate::config::Config;
use crate::metrics::Metrics;
use std::time::Duration;
use tokio_postgres::Client;

/// Persisted messages past their ttl are deleted this often (by every sidecar: the delete
/// is idempotent and cheap on the expiry index).
pub(super) const EXPIRE_EVERY: Duration = Duration::from_secs(60);

pub(super) const EXPIRE_SQL: &str = "SELECT realtime.expire_persisted($1) AS gone";

/// Most expired rows deleted in one statement, and most statements in one round: a mass
/// expiry is worked off in bounded chunks over the rounds, never one delete that outlives
/// its statement timeout and rolls back each time.
pub(super) const EXPIRE_CHUNK: i32 = 10_000;

pub(super) const EXPIRE_CHUNKS_PER_ROUND: usize = 10;

pub(super) async fn expire_persisted(client: &Client, cfg: &Config, metrics: &Metrics) {
    for _ in 0..EXPIRE_CHUNKS_PER_ROUND {
        let call = client.query_one(EXPIRE_SQL, &[&EXPIRE_CHUNK]);
        match tokio::time::timeout(cfg.db_call_deadline(), call).await {
            Ok(Ok(row)) => {
                let gone: i32 = row.get("gone");
                metrics.persisted_expired_total.increment(gone as u64);
                if gone < EXPIRE_CHUNK {
                    return;
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "deleting expired persisted messages failed");
                return;
            }
            Err(_) => {
                tracing::warn!("deleting expired persisted messages did not answer in time");
                return;
            }
        }
    }
}
