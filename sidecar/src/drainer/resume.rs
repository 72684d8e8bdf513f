//! A session begun: connect, resume the consumer slot, tell subscribers of an outage or a
//! restart, and choose how the drain's answers are read.

use super::pace::Pacing;
use super::session::{within, Destinations, Session, SessionError};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::reason::Notice;
use crate::rows::Columns;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// The queue's statistics (held-back commits, retention), read into metrics every few seconds
/// (`call`).
const STATS_SQL: &str = "SELECT pending_bytes, \
     coalesce(extract(epoch FROM clock_timestamp() - oldest_pending_since), 0)::float8 \
     AS oldest_pending_secs, oldest_seq, \
     coalesce(extract(epoch FROM clock_timestamp() - oldest_committed_at), 0)::float8 AS retained_secs \
     FROM realtime.stats()";

/// A batch as one packed value (`packed`): what the drainer calls when the extension has it.
const DRAIN_PACKED_SQL: &str = "SELECT realtime.drain_packed($1, $2, $3, $4, $5, $6) AS packed";

/// Whether this role may call `realtime.drain_packed` (false also when it does not exist: an
/// extension older than 0.3.0, or a role granted only what an older README listed).
const HAS_PACKED_SQL: &str = "SELECT coalesce(has_function_privilege(\
     to_regprocedure('realtime.drain_packed(text, bigint, integer, integer, integer, oid[])'), \
     'EXECUTE'), false) AS packed";

/// The row form, for an extension without the packed one. Rows are read by these column
/// names (`rows::Columns`), never by a position written here.
const DRAIN_SQL: &str =
    "SELECT seq, kind, topic, event, payload::text AS payload, binary_payload, \
     private, (extract(epoch FROM committed_at) * 1000000)::int8 AS committed_us, id::text AS id, \
     lost_first, lost_last, origin \
     FROM realtime.drain($1, $2, $3, $4, $5, $6)";

async fn connect(cfg: &Config) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = cfg
        .pg_config()
        .expect("validated at startup")
        .connect(cfg.db_tls().expect("validated at startup"))
        .await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "drain connection closed");
        }
    });
    Ok(client)
}

impl Session {
    /// Connects and resumes the slot. `epoch` is the queue's epoch the last session saw
    /// (None at the first), `handed` the last sequence handed out across sessions.
    pub(super) async fn resume(
        cfg: &Config,
        to: Destinations<'_>,
        metrics: &Metrics,
        epoch: &mut Option<i64>,
        handed: i64,
    ) -> Result<Session, SessionError> {
        let setup = Duration::from_secs(cfg.db_connect_timeout_secs);
        let client = within(setup, "connecting", connect(cfg)).await?;
        // Timestamps in drained Postgres Changes are rendered in the session's zone: UTC, as
        // Supabase's are, whatever the server's default.
        within(setup, "setup", client.batch_execute("SET TimeZone = 'UTC'")).await?;
        let hub = to.hub;
        let mut pos: i64 = within(
            setup,
            "create_consumer",
            client.query_one(
                "SELECT realtime.create_consumer($1) AS position",
                &[&cfg.consumer],
            ),
        )
        .await?
        .get("position");
        if !cfg.filter_topics {
            // A slot that an earlier process filtered keeps its filter until told otherwise.
            within(
                setup,
                "listen_all",
                client.execute("SELECT realtime.listen_all($1)", &[&cfg.consumer]),
            )
            .await?;
        }
        // The slot is claimed before anything is told: another backend may still hold it (a
        // cut connection's, until its server notices), and then every attempt fails at its
        // first drain; telling "available" at each reconnect and "unavailable" at each
        // failure told clients both, again and again (issue 42). A drain of one message,
        // decoding nothing, claims it; what it returns is read again by the first real call
        // (no position is confirmed here).
        let packed_form: bool = within(setup, "setup", client.query_one(HAS_PACKED_SQL, &[]))
            .await?
            .get("packed");
        let claim = if packed_form {
            "SELECT realtime.drain_packed($1, NULL, 1, 0, 0, '{}') IS NULL"
        } else {
            "SELECT count(*) FROM realtime.drain($1, NULL, 1, 0, 0, '{}')"
        };
        within(setup, "claim", client.query(claim, &[&cfg.consumer])).await?;
        // The epoch as unix microseconds: the `meta.epoch` of every message delivered.
        let now_epoch: i64 = within(
            setup,
            "stats",
            client.query_one(
                "SELECT (extract(epoch FROM epoch) * 1000000)::int8 AS epoch FROM realtime.stats()",
                &[],
            ),
        )
        .await?
        .get("epoch");
        match *epoch {
            Some(old) if old != now_epoch => {
                tracing::warn!(
                    old,
                    new = now_epoch,
                    "database restarted; undelivered messages were lost"
                );
                // The slot is new, positioned at the end: read from the new queue's start instead,
                // so what was committed since the restart, before this reconnect, is delivered.
                pos = 0;
                hub.system_all(&Notice::DatabaseRestarted);
                // Presence diffs of the old queue not drained are gone: read the views
                // again from the new primary's table.
                to.presence.reload_all();
            }
            Some(_) => {
                // The slot confirms a batch at the next drain call; one handed out just before
                // the connection ended is not handed out again.
                pos = pos.max(handed);
                hub.system_all(&Notice::DatabaseBack);
            }
            None => {}
        }
        if epoch.is_none() {
            crate::privileges::log(&client, setup).await;
        }
        crate::app_objects::sync(&client, setup).await;
        *epoch = Some(now_epoch);
        metrics.db_up.store(1, Relaxed);
        tracing::info!(consumer = %cfg.consumer, position = pos, "draining");

        // How a drain's answer is read: one packed value, or rows by column name.
        let (stmt, col) = if packed_form {
            (
                within(setup, "prepare", client.prepare(DRAIN_PACKED_SQL)).await?,
                None,
            )
        } else {
            tracing::warn!("realtime.drain_packed is not available to this role; draining rows");
            let stmt = within(setup, "prepare", client.prepare(DRAIN_SQL)).await?;
            let col = Columns::of(stmt.columns()).map_err(SessionError::Missing)?;
            (stmt, Some(col))
        };
        let stats = within(setup, "prepare", client.prepare(STATS_SQL)).await?;
        Ok(Session {
            client,
            pos,
            epoch: now_epoch,
            stmt,
            col,
            stats,
            setup,
            batch: cfg.drain_batch as i32,
            // The linger is kept here, not asked of `realtime.drain` (which would wait after
            // the first message it finds, on its own latch): the next call is made a linger
            // after the last batch was handed out, so under load the backend finds a batch
            // waiting and answers at once, woken once per call instead of two or three times
            // (for the call, for the first commit, after its linger); a message after a quiet
            // spell is not held at all; and a busy hub still gathers a linger's messages
            // beyond those its hand-out took. With a budget of calls, `pace` may wait longer.
            pacing: Pacing::new(
                Duration::from_millis(cfg.drain_linger_ms.into()),
                cfg.drain_calls_per_second,
                Duration::from_millis(cfg.drain_linger_max_ms.into()),
                tokio::time::Instant::now(),
            ),
            next_call: None,
            called: tokio::time::Instant::now(),
            pace: false,
            stats_at: Instant::now(),
            decode: None,
            decode_for: None,
            redrained: -1,
        })
    }
}
