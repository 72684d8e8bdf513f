//! What every stage of a check shares: its limits, a candidate channel, a frame going out,
//! and how a change that could not be decided is withheld and told.

use super::super::subscribers::Subscriber;
use super::lookup::DbError;
use crate::metrics::Metrics;
use crate::reason::Notice;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// The bounds of the stage (`Config`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_record_bytes: usize,
    /// A table's checks in one batch, all calls together, take at most this long.
    pub check_timeout: Duration,
    /// Records per identity per `realtime.visible` call.
    pub max_changes: usize,
    /// Identities per `realtime.visible` call.
    pub max_identities: usize,
    /// The changes are a resume's, checked long after their commit: on a table with RLS an
    /// INSERT or UPDATE is sent only while its row still holds the version it recorded
    /// (a version written while the row was hidden, a draft published since, is never
    /// resent), and an UPDATE's old_record keeps only the key (the old version is no
    /// row's any more).
    pub resume: bool,
    /// One pattern's budget in the database (FILTER_PATTERN_TIMEOUT_MS).
    pub pattern_timeout: Duration,
    /// Patterns per `realtime.match_patterns` call (FILTER_PATTERNS_PER_CALL).
    pub patterns_per_call: usize,
    /// Every check ends by then, whatever is left of its table's budget: a resume's one
    /// budget for all its chunks (RESUME_CHECK_TIMEOUT_MS).
    pub until: Option<Instant>,
}

impl Limits {
    /// What is left of a check's budget that started at `started`.
    pub(super) fn left(&self, started: Instant) -> Duration {
        let own = self.check_timeout.saturating_sub(started.elapsed());
        match self.until {
            Some(until) => own.min(until.saturating_duration_since(Instant::now())),
            None => own,
        }
    }

    pub fn of(cfg: &crate::config::Config) -> Limits {
        Limits {
            max_record_bytes: cfg.max_record_bytes,
            check_timeout: Duration::from_millis(cfg.changes_check_timeout_ms),
            max_changes: cfg.poll_max_changes as usize,
            max_identities: cfg.changes_check_max_identities as usize,
            resume: false,
            pattern_timeout: Duration::from_millis(cfg.filter_pattern_timeout_ms),
            patterns_per_call: cfg.filter_patterns_per_call,
            until: None,
        }
    }
}

/// What the stage made of a batch: each change's frames in queue order, and whether a
/// check found the connection lost.
#[derive(Default)]
pub struct Prepared {
    pub frames: Vec<Vec<Outgoing>>,
    pub lost: Option<String>,
    /// Some check was asked of the database (its statement_timeout is still set).
    pub asked: bool,
}

/// One frame for one channel (a frame shared by the channels that get the same bytes: the
/// same change as the same role sees it, under the same topic, ids and serializer).
pub struct Outgoing {
    pub to: Arc<Subscriber>,
    pub frame: Message,
    /// A `postgres_changes` event (counted as a delivered change), not a `system` message.
    pub change: bool,
}

impl Outgoing {
    /// Queues the frame in the channel's order (behind its pending slots; a full queue
    /// cuts the connection off, as the hub's does).
    pub fn send(self, metrics: &Metrics) {
        if self.to.reach.in_order(self.frame) == crate::out::Sent::Queued {
            metrics.deliveries_total.increment(1);
            if self.change {
                metrics.changes_delivered_total.increment(1);
            }
        }
    }
}

/// A channel a change matched, and the bindings it matched by.
pub(crate) struct Candidate {
    /// The change's index in the batch (or in a check's own set: `Matched::split`).
    pub(crate) change: usize,
    pub(crate) sub: Arc<Subscriber>,
    /// Indexes into `sub.bindings`.
    pub(super) bindings: Vec<usize>,
}

#[cfg(test)]
impl Candidate {
    /// A candidate of change `change` for `sub`, with no binding (for other modules' tests).
    pub(crate) fn for_test(change: usize, sub: Arc<Subscriber>) -> Candidate {
        Candidate {
            change,
            sub,
            bindings: Vec::new(),
        }
    }
}

/// What makes two channels' frames of one shaped change the same bytes.
pub(super) type FrameKey = (crate::frame::Vsn, Arc<str>, Vec<u32>);

/// A kept candidate, the columns its role may read, and the primary key when its
/// old_record is trimmed to it (a DELETE on a table with RLS).
pub(super) type Kept = (Candidate, Columns, Option<Vec<String>>);

/// The columns a role may read, shared by all its candidates (one copy per role, not per
/// candidate: a batch may hold 10^5).
pub(super) type Columns = Arc<Vec<String>>;

/// A table, as its changes name it.
#[derive(Clone, Copy)]
pub(crate) struct Table<'a> {
    pub(crate) schema: &'a str,
    pub(crate) name: &'a str,
}

/// Why a check did not decide, as the channels are told.
pub(super) fn timed_out(limits: &Limits) -> String {
    format!(
        "the check took longer than CHANGES_CHECK_TIMEOUT_MS ({} ms)",
        limits.check_timeout.as_millis()
    )
}

/// What the channels are told of a failed check; a lost connection is also noted for the
/// caller.
pub(super) fn failure(e: DbError, limits: &Limits, lost: &mut Option<String>) -> String {
    match e {
        DbError::Failed(why) => why,
        DbError::TimedOut => timed_out(limits),
        DbError::Lost(why) => {
            *lost = Some(why.clone());
            why
        }
    }
}

/// Tells each channel once that changes of a table were withheld because they could not
/// be checked: a `system` notice among `frames`, at the first change withheld from it.
pub(crate) fn withhold_failed(
    cands: &[Candidate],
    table: Table<'_>,
    why: &str,
    metrics: &Metrics,
    frames: &mut [Vec<Outgoing>],
) {
    if cands.is_empty() {
        return;
    }
    let Table {
        schema,
        name: table,
    } = table;
    tracing::warn!(schema, table, error = %why, "a change's RLS check failed; withheld");
    metrics.change_check_failures_total.increment(1);
    metrics.changes_withheld_total.increment(cands.len() as u64);
    let mut told = HashSet::new();
    for c in cands {
        if !told.insert((c.sub.reach.conn, c.sub.reach.topic.clone())) {
            continue;
        }
        let notice = Notice::ChangesWithheld {
            schema: schema.into(),
            table: table.into(),
            why: why.into(),
        };
        let text = c.sub.reach.system_text(notice.status(), &notice.text());
        frames[c.change].push(Outgoing {
            to: c.sub.clone(),
            frame: Message::text(text),
            change: false,
        });
    }
}
