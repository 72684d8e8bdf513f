//! The one Postgres connection that drains this sidecar's consumer slot into the hub.
//!
//! Each drain call passes the last sequence it handed to the hub, which confirms it; after a
//! reconnect the slot resumes from there, or from what this process handed out since if
//! that is further (a session that ended after handing out a batch does not hand it out
//! again), so nothing within the queue's capacity is lost. While the database is away
//! subscribers are told, and when it comes back with a new epoch (it restarted) they are
//! told that messages were lost.
//!
//! A Postgres Changes check never holds the drain: the drain matches a batch's changes to
//! channels, hands each changed table's share to the check pool (`postgres_changes::pool`,
//! on connections of its own), leaves a slot in each matched channel's queue order
//! (`postgres_changes::stage`) and hands out the rest of the batch at once. Only the
//! channels with a slot pending wait for it.
//!
//! A session (`session`) is begun by `resume` (connect, resume the slot, tell of an outage
//! or a restart), then each drain call (`call`: decode set, statistics, linger, the answer
//! read once) is followed by its hand-out, here; `pace` says when the next call is made.

mod call;
mod pace;
mod resume;
mod session;

use crate::config::Config;
use crate::hub::{Hub, QueueMessage};
use crate::metrics::Metrics;
use crate::postgres_changes::pool::Checks;
use crate::postgres_changes::stage::{ChangeStage, Step};
use crate::postgres_changes::subscribers::Subscribers;
use crate::presence::view::Views;
use crate::reason::Notice;
use crate::rows::{Entry, Read};
use session::{Destinations, Session, SessionError};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Runs until `shutdown` turns true; then confirms the position and returns.
pub async fn run(
    cfg: Arc<Config>,
    hub: Arc<Hub>,
    changes: Arc<Subscribers>,
    checks: Checks,
    presence: Arc<Views>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut epoch: Option<i64> = None;
    // The last sequence handed out, across sessions of the same epoch.
    let mut handed: i64 = 0;
    let mut backoff = Duration::from_millis(100);
    let to = Destinations {
        hub: &hub,
        changes: &changes,
        checks: &checks,
        presence: &presence,
    };
    loop {
        let result = session(&cfg, to, &metrics, &mut epoch, &mut handed, &mut shutdown).await;
        let was_up = metrics.db_up.swap(0, Relaxed) == 1;
        match result {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "drain connection failed; reconnecting");
            }
        }
        if was_up {
            backoff = Duration::from_millis(100);
            metrics.db_reconnects_total.increment(1);
            hub.system_all(&Notice::DatabaseUnavailable);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

fn unix_millis() -> i64 {
    unix_micros() / 1000
}

fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// One connected session: resume the slot and drain until an error or shutdown.
async fn session(
    cfg: &Config,
    to: Destinations<'_>,
    metrics: &Metrics,
    epoch: &mut Option<i64>,
    handed: &mut i64,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), SessionError> {
    let mut s = Session::resume(cfg, to, metrics, epoch, *handed).await?;
    loop {
        let rows = tokio::select! {
            r = s.call(cfg, to, metrics) => r?,
            _ = shutdown.changed() => return s.confirm(cfg).await,
        };
        let entries = s.read(&rows, to, metrics)?;
        if entries.is_empty() {
            continue;
        }
        hand_out(&mut s, to, metrics, entries);
        *handed = s.pos;
        s.handed_out();
    }
}

/// Hands a batch out in queue order: broadcasts to the hub (consecutive ones together),
/// presence diffs to the views, row changes to the Postgres Changes stage, a gap to
/// everyone.
fn hand_out(s: &mut Session, to: Destinations<'_>, metrics: &Metrics, entries: Vec<Read>) {
    let hub = to.hub;
    metrics.drain_batches_total.increment(1);
    // Row changes are matched to channels here (no database call); each changed table's
    // share goes to the check pool, and each matched channel gets a slot in its queue
    // order as the batch is handed out (`postgres_changes::stage`).
    let mut changes = ChangeStage::begin(to.changes, to.checks, &entries, s.epoch, metrics);
    let now_us = unix_micros();
    let dispatched = |committed_us: i64| {
        metrics
            .commit_to_dispatch
            .record((now_us - committed_us).max(0) as f64 / 1e6);
        metrics.drain_messages_total.increment(1);
    };
    // Consecutive broadcasts are handed out together (`Hub::dispatch_batch`); anything
    // else in the batch first hands out those before it, so each connection still gets
    // everything in queue order.
    let mut broadcasts: Vec<QueueMessage> = Vec::new();
    for Read { seq, entry } in entries {
        s.pos = seq;
        let step = matches!(entry, Entry::Change { .. }).then(|| changes.next_change());
        let quiet_change = step.as_ref().is_some_and(Step::is_quiet);
        let ordered = !matches!(
            entry,
            Entry::Message { .. } | Entry::Filtered | Entry::End | Entry::Cut { .. }
        );
        if ordered && !quiet_change && !broadcasts.is_empty() {
            hub.dispatch_batch(&broadcasts);
            broadcasts.clear();
        }
        match entry {
            Entry::Gap { first, last } => {
                metrics.drain_gaps_total.increment(1);
                metrics
                    .drain_lost_messages_total
                    .increment((last - first + 1) as u64);
                tracing::warn!(
                    first,
                    last,
                    "messages were evicted before this sidecar read them"
                );
                hub.system_all(&Notice::MessagesLost { first, last });
                // Presence diffs may be among them: the views are read again.
                to.presence.reload_all();
            }
            // Messages for other sidecars' topics were read through up to here
            // (`interest`): nothing to hand out, but the position moves past them.
            Entry::Filtered | Entry::End | Entry::Cut { .. } => {}
            Entry::Presence {
                committed_us,
                key,
                diff,
            } => {
                // A presence diff (extension/src/presence.rs): never a broadcast; it
                // moves this sidecar's view of its topic, if a channel here watches it.
                dispatched(committed_us);
                to.presence.apply(&key, diff.unwrap_or("null"));
            }
            Entry::Change { committed_us, .. } => {
                // A row change goes to Postgres Changes channels only, never to a
                // broadcast topic (one named after its table would get it).
                dispatched(committed_us);
                changes.hand_out(step.unwrap_or_default(), seq, metrics);
            }
            Entry::Message {
                committed_us,
                message,
            } => {
                dispatched(committed_us);
                broadcasts.push(message);
            }
        }
    }
    hub.dispatch_batch(&broadcasts);
    changes.finish(to.checks, s.epoch, s.pos, metrics);
    metrics.last_seq.set(s.pos as f64);
}
