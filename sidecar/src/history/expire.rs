//! What is kept past its retention deleted, on the history worker's connection, in bounded
//! chunks each round: persisted client broadcasts past their ttl
//! (`realtime.expire_persisted`), and rows the app inserted into `realtime.messages` past
//! Supabase's 72 hours (`realtime.expire_messages`, run as that table's owner). Chunks of
//! 10,000 rows (about 55 ms each here), at most ten a round, so a mass expiry is worked off
//! over the rounds instead of one DELETE that outlives its statement timeout and rolls back
//! every minute (of 150,000 expired rows, 100,000 go in the first round:
//! `sidecar/tests/history.rs`). Expiry is not a setting.

use crate::config::Config;
use crate::metrics::Metrics;
use metrics::Counter;
use std::time::Duration;
use tokio_postgres::Client;

/// Expired rows are deleted this often (by every sidecar: the deletes are idempotent and
/// cheap on the expiry index).
pub(super) const EXPIRE_EVERY: Duration = Duration::from_secs(60);

pub(super) const EXPIRE_SQL: &str = "SELECT realtime.expire_persisted($1) AS gone";

const EXPIRE_INSERTED_SQL: &str = "SELECT realtime.expire_messages($1) AS gone";

/// Most expired rows deleted in one statement, and most statements in one round: a mass
/// expiry is worked off in bounded chunks over the rounds, never one delete that outlives
/// its statement timeout and rolls back each time.
pub(super) const EXPIRE_CHUNK: i32 = 10_000;

pub(super) const EXPIRE_CHUNKS_PER_ROUND: usize = 10;

/// One expiry round: persisted broadcasts, then inserted rows.
pub(super) async fn expire_round(client: &Client, cfg: &Config, metrics: &Metrics) {
    let persisted = &metrics.persisted_expired_total;
    expire(client, cfg, EXPIRE_SQL, persisted, "persisted messages").await;
    let inserted = &metrics.inserted_expired_total;
    expire(
        client,
        cfg,
        EXPIRE_INSERTED_SQL,
        inserted,
        "rows of realtime.messages",
    )
    .await;
}

async fn expire(client: &Client, cfg: &Config, sql: &str, gone_total: &Counter, what: &str) {
    for _ in 0..EXPIRE_CHUNKS_PER_ROUND {
        let call = client.query_one(sql, &[&EXPIRE_CHUNK]);
        match tokio::time::timeout(cfg.db_call_deadline(), call).await {
            Ok(Ok(row)) => {
                let gone: i32 = row.get("gone");
                gone_total.increment(gone as u64);
                if gone < EXPIRE_CHUNK {
                    return;
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "deleting expired {what} failed");
                return;
            }
            Err(_) => {
                tracing::warn!("deleting expired {what} did not answer in time");
                return;
            }
        }
    }
}
