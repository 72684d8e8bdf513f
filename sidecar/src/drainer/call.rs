//! One drain call: the tables whose changes it decodes, the queue's statistics every few
//! seconds, the linger before it, and its answer read once into what each row is, cut before
//! a change a channel joined its table for during the call (drained again at once).

use super::session::{within, Destinations, Session, SessionError};
use super::unix_millis;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::packed;
use crate::rows::{As, Entry, Read};
use std::time::{Duration, Instant};
use tokio_postgres::Row;

/// The tables some channel listens to, as the oids `realtime.drain` decodes changes of.
const TABLES_SQL: &str = "SELECT realtime.table_oids($1, $2) AS oids";

/// How often the queue's statistics (held-back commits, retention) are read into metrics:
/// often enough for a scrape every 15 s or so, and seldom, as each read is a round trip and
/// a wake-up of the primary's backend for every sidecar process (the primary's work by the
/// second grows with the processes, issue 42). It was every second.
const STATS_EVERY: Duration = Duration::from_secs(5);

/// What a drain call waits for at most when nothing commits.
const TIMEOUT_MS: i32 = 1000;

impl Session {
    /// Makes the next drain call, a linger after the last batch if that batch asked for it.
    pub(super) async fn call(
        &mut self,
        cfg: &Config,
        to: Destinations<'_>,
        metrics: &Metrics,
    ) -> Result<Vec<Row>, SessionError> {
        let (client, setup) = (&self.client, self.setup);
        metrics.drain_answered(unix_millis());
        let generation = to.changes.generation();
        if self.decode_for != Some(generation) {
            self.decode = match to.changes.tables() {
                None => None,
                Some(tables) => {
                    let (schemas, names): (Vec<String>, Vec<String>) = tables.into_iter().unzip();
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
                        [&schemas, &names];
                    let row =
                        within(setup, "tables", client.query_one(TABLES_SQL, &params)).await?;
                    Some(row.get("oids"))
                }
            };
            self.decode_for = Some(generation);
        }
        if self.stats_at.elapsed() >= STATS_EVERY {
            self.stats_at = Instant::now();
            let row = within(setup, "stats", client.query_one(&self.stats, &[])).await?;
            let (pending, oldest): (i64, i64) = (row.get("pending_bytes"), row.get("oldest_seq"));
            metrics.pending_bytes.set(pending as f64);
            metrics
                .oldest_pending_seconds
                .set(row.get::<_, f64>("oldest_pending_secs"));
            metrics.oldest_seq.set(oldest as f64);
            metrics
                .retained_seconds
                .set(row.get::<_, f64>("retained_secs"));
        }
        let no_linger = 0i32;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
            &cfg.consumer,
            &self.pos,
            &self.batch,
            &TIMEOUT_MS,
            &no_linger,
            &self.decode,
        ];
        if let Some(at) = self.next_call.take() {
            // The linger is this sidecar's own wait, not the database's silence: /healthz
            // counts a stuck drain from its end.
            let wait = at.saturating_duration_since(tokio::time::Instant::now());
            metrics.drain_answered(unix_millis() + wait.as_millis() as i64);
            tokio::time::sleep_until(at).await;
        }
        self.called = tokio::time::Instant::now();
        // A drain answers within its timeout; much later means the backend or the network is
        // stuck, and /healthz says so meanwhile.
        let deadline = Duration::from_millis(TIMEOUT_MS as u64) + Duration::from_secs(5);
        within(deadline, "drain", client.query(&self.stmt, &params)).await
    }

    /// Reads a drain's answer once into what each row is (`rows`), and decides whether the
    /// next call waits a linger.
    pub(super) fn read<'r>(
        &mut self,
        rows: &'r [Row],
        to: Destinations<'_>,
        metrics: &Metrics,
    ) -> Result<Vec<Read<'r>>, SessionError> {
        let how = As {
            epoch: self.epoch,
            replayed: false,
            client_ids: false,
        };
        let mut entries = match &self.col {
            Some(col) => rows.iter().map(|r| col.read(r, how)).collect(),
            None => match rows.first() {
                Some(row) => packed::read(row.get("packed"), how),
                None => Err("realtime.drain_packed returned no row".into()),
            },
        }
        .map_err(SessionError::Lost)?;
        // Only an answer that carried something paces the next call: a marker alone (messages
        // for other sidecars' topics read past) says nothing of this sidecar's load.
        let carried = entries
            .iter()
            .filter(|r| !matches!(r.entry, Entry::Filtered | Entry::End | Entry::Cut { .. }))
            .count();
        self.pace = !self.pacing.is_off() && carried > 0 && entries.len() < self.batch as usize;
        // A change left undecoded (no channel listened to its table when the call began)
        // that a channel now listens to (it joined meanwhile): stop before it and drain
        // again from there with its table decoded. Once per change, so a table that cannot
        // be resolved does not loop. Looked for only when the channels changed during the
        // call: otherwise every table listened to was decoded.
        let joined_meanwhile = self.decode_for != Some(to.changes.generation());
        let redrained = self.redrained;
        let undecoded_wanted = |r: &Read| match r.entry {
            Entry::Change {
                data: None,
                table: Some(t),
                ..
            } => r.seq != redrained && to.changes.any_named(t),
            _ => false,
        };
        let cut = joined_meanwhile
            .then(|| entries.iter().position(undecoded_wanted))
            .flatten();
        if let Some(cut) = cut {
            self.redrained = entries[cut].seq;
            entries.truncate(cut);
            self.decode_for = None;
            // What was cut off is waiting: fetch it again at once.
            self.pace = false;
            metrics.drain_redrains_total.increment(1);
        } else if let Some(last) = entries.last() {
            // This sidecar's share of the traffic (`pace`), from a whole answer only: a cut
            // one is read again.
            let moved = (last.seq - self.pos).max(0) as u64;
            self.pacing
                .record(moved, carried as u64, tokio::time::Instant::now());
        }
        Ok(entries)
    }

    /// The batch was handed out: the next call waits if the batch asked for it (`pace`).
    pub(super) fn handed_out(&mut self) {
        if self.pace {
            let now = tokio::time::Instant::now();
            self.next_call = Some(self.pacing.next_call(self.called, now));
        }
    }

    /// Confirms the position handed out (at shutdown: a restarted sidecar resumes after it).
    pub(super) async fn confirm(&self, cfg: &Config) -> Result<(), SessionError> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&cfg.consumer, &self.pos];
        let confirm = self
            .client
            .execute("SELECT realtime.confirm($1, $2)", &params);
        within(self.setup, "confirm", confirm).await?;
        Ok(())
    }
}
