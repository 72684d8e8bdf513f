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
//! channels, hands each changed table's share to the check pool (`postgres_changes::checks`,
//! on connections of its own), leaves a slot in each matched channel's queue order
//! (`change_hold`) and hands out the rest of the batch at once. Only the channels with a
//! slot pending wait for it.

use crate::config::Config;
use crate::hub::{Hub, QueueMessage};
use crate::metrics::Metrics;
use crate::out::Reach;
use crate::packed;
use crate::postgres_changes::checks::Checks;
use crate::postgres_changes::deliver::{self, Outgoing};
use crate::postgres_changes::position;
use crate::postgres_changes::subscribers::{Subscriber, Subscribers};
use crate::presence::view::Views;
use crate::reason::Notice;
use crate::rows::{As, Columns, Entry, Read};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_postgres::{Client, NoTls};

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

/// The tables some channel listens to, as the oids `realtime.drain` decodes changes of.
const TABLES_SQL: &str = "SELECT realtime.table_oids($1, $2) AS oids";

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

async fn connect(cfg: &Config) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = cfg
        .pg_config()
        .expect("validated at startup")
        .connect(NoTls)
        .await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "drain connection closed");
        }
    });
    Ok(client)
}

/// Where drained messages go: broadcasts to the hub, row changes to the channels of
/// `changes`, presence diffs to the views of `presence`.
#[derive(Clone, Copy)]
struct Destinations<'a> {
    hub: &'a Hub,
    changes: &'a Subscribers,
    checks: &'a Checks,
    presence: &'a Views,
}

/// Why a drain session ended.
#[derive(Debug)]
enum SessionError {
    Db(tokio_postgres::Error),
    /// A drained row could not be read.
    Lost(String),
    /// A call did not answer within its deadline: the connection is given up.
    Stuck(&'static str),
    /// realtime.drain returned no column of this name (an extension of another version).
    Missing(&'static str),
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // tokio-postgres says only "db error" for a server error: its message is the news.
            SessionError::Db(e) => match e.as_db_error() {
                Some(d) => write!(f, "{}", d.message()),
                None => write!(f, "{e}"),
            },
            SessionError::Stuck(what) => write!(f, "{what} did not answer in time"),
            SessionError::Lost(why) => write!(f, "{why}"),
            SessionError::Missing(column) => {
                write!(f, "realtime.drain returned no column \"{column}\"")
            }
        }
    }
}

impl From<tokio_postgres::Error> for SessionError {
    fn from(e: tokio_postgres::Error) -> Self {
        SessionError::Db(e)
    }
}

/// Runs one call with a deadline.
async fn within<T>(
    deadline: Duration,
    what: &'static str,
    call: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, SessionError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SessionError::Stuck(what)),
    }
}

/// How often the queue's statistics (held-back commits, retention) are read into metrics.
const STATS_EVERY: Duration = Duration::from_secs(1);
const STATS_SQL: &str = "SELECT pending_bytes, \
     coalesce(extract(epoch FROM clock_timestamp() - oldest_pending_since), 0)::float8 \
     AS oldest_pending_secs, oldest_seq, \
     coalesce(extract(epoch FROM clock_timestamp() - oldest_committed_at), 0)::float8 AS retained_secs \
     FROM realtime.stats()";

/// One connected session: resume the slot and drain until an error or shutdown.
async fn session(
    cfg: &Config,
    to: Destinations<'_>,
    metrics: &Metrics,
    epoch: &mut Option<i64>,
    handed: &mut i64,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), SessionError> {
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
        }
        Some(_) => {
            // The slot confirms a batch at the next drain call; one handed out just before
            // the connection ended is not handed out again.
            pos = pos.max(*handed);
            hub.system_all(&Notice::DatabaseBack);
        }
        None => {}
    }
    if epoch.is_none() {
        crate::privileges::log(&client, setup).await;
    }
    *epoch = Some(now_epoch);
    metrics.db_up.store(1, Relaxed);
    tracing::info!(consumer = %cfg.consumer, position = pos, "draining");

    let packed_form: bool = within(setup, "setup", client.query_one(HAS_PACKED_SQL, &[]))
        .await?
        .get("packed");
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
    let batch = cfg.drain_batch as i32;
    // The linger is kept here, not asked of `realtime.drain` (which would wait after the
    // first message it finds, on its own latch): the next call is made a linger after the
    // last batch was handed out, so under load the backend finds a batch waiting and answers
    // at once, woken once per call instead of two or three times (for the call, for the
    // first commit, after its linger); a message after a quiet spell is not held at all; and
    // a busy hub still gathers a linger's messages beyond those its hand-out took.
    let linger = Duration::from_millis(cfg.drain_linger_ms.into());
    let no_linger = 0i32;
    let timeout_ms = 1000i32;
    // A drain answers within its timeout; much later means the backend or the network is
    // stuck, and /healthz says so meanwhile.
    let deadline = Duration::from_millis(timeout_ms as u64) + Duration::from_secs(5);
    // When the next call may be made: a linger after the last batch was handed out, unless
    // that batch carried nothing or was full (then there is nothing to gather, or more waits).
    let mut next_call: Option<tokio::time::Instant> = None;
    let mut stats_at = Instant::now();
    // Which tables' changes the drain decodes (None: all), for which subscription generation.
    let mut decode: Option<Vec<u32>> = None;
    let mut decode_for: Option<u64> = None;
    // The last change drained again because a channel joined its table meanwhile.
    let mut redrained: i64 = -1;
    loop {
        metrics.drain_answered(unix_millis());
        let generation = to.changes.generation();
        if decode_for != Some(generation) {
            decode = match to.changes.tables() {
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
            decode_for = Some(generation);
        }
        if stats_at.elapsed() >= STATS_EVERY {
            stats_at = Instant::now();
            let row = within(setup, "stats", client.query_one(&stats, &[])).await?;
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
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
            &cfg.consumer,
            &pos,
            &batch,
            &timeout_ms,
            &no_linger,
            &decode,
        ];
        let paced = async {
            if let Some(at) = next_call.take() {
                // The linger is this sidecar's own wait, not the database's silence: /healthz
                // counts a stuck drain from its end.
                let wait = at.saturating_duration_since(tokio::time::Instant::now());
                metrics.drain_answered(unix_millis() + wait.as_millis() as i64);
                tokio::time::sleep_until(at).await;
            }
            within(deadline, "drain", client.query(&stmt, &params)).await
        };
        let rows = tokio::select! {
            r = paced => r?,
            _ = shutdown.changed() => {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&cfg.consumer, &pos];
                let confirm = client.execute("SELECT realtime.confirm($1, $2)", &params);
                within(setup, "confirm", confirm).await?;
                return Ok(());
            }
        };
        // Each row read once into what it is (`rows`).
        let how = As {
            epoch: now_epoch,
            replayed: false,
            client_ids: false,
        };
        let mut entries = match &col {
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
            .any(|r| !matches!(r.entry, Entry::Filtered | Entry::End | Entry::Cut { .. }));
        let mut pace = !linger.is_zero() && carried && entries.len() < batch as usize;
        // A change left undecoded (no channel listened to its table when the call began)
        // that a channel now listens to (it joined meanwhile): stop before it and drain
        // again from there with its table decoded. Once per change, so a table that cannot
        // be resolved does not loop. Looked for only when the channels changed during the
        // call: otherwise every table listened to was decoded.
        let joined_meanwhile = decode_for != Some(to.changes.generation());
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
            redrained = entries[cut].seq;
            entries.truncate(cut);
            decode_for = None;
            // What was cut off is waiting: fetch it again at once.
            pace = false;
            metrics.drain_redrains_total.increment(1);
        }
        if entries.is_empty() {
            continue;
        }
        metrics.drain_batches_total.increment(1);
        // Row changes are matched to channels here (no database call); each changed table's
        // share goes to the check pool, and each matched channel gets a slot in its queue
        // order, left below as the batch is handed out.
        let (datas, seqs): (Vec<&str>, Vec<i64>) = entries
            .iter()
            .filter_map(|r| match r.entry {
                Entry::Change { data, .. } => Some((data.unwrap_or("null"), r.seq)),
                _ => None,
            })
            .unzip();
        let (mut notices, mut slots, mut jobs) = (Vec::new(), Vec::new(), Vec::new());
        if !datas.is_empty() {
            (notices, slots, jobs) = match_changes(to, &datas, (now_epoch, &seqs), metrics);
        }
        let mut notices = notices.into_iter();
        let mut slots = slots.into_iter();
        // The channels that got a slot, per job (by hold: each once).
        let mut holders: Vec<HashMap<usize, Reach>> = jobs.iter().map(|_| HashMap::new()).collect();
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
        let mut positions = position::Positions::default();
        for Read { seq, entry } in entries {
            pos = seq;
            let (notice, slot) = match entry {
                Entry::Change { .. } => (
                    notices.next().unwrap_or_default(),
                    slots.next().unwrap_or_default(),
                ),
                _ => (Vec::new(), Vec::new()),
            };
            let quiet_change =
                matches!(entry, Entry::Change { .. }) && notice.is_empty() && slot.is_empty();
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
                    for f in notice {
                        f.send(metrics);
                    }
                    for (job, change, sub) in slot {
                        if sub.reach.slot(jobs[job].0, change, seq) {
                            // Its position follows the batch, behind the slot (`position`).
                            positions.note_slot(&sub);
                            holders[job]
                                .entry(sub.reach.hold_id())
                                .or_insert_with(|| sub.reach.clone());
                        }
                    }
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
        positions.send(now_epoch, pos, metrics);
        metrics.last_seq.set(pos as f64);
        *handed = pos;
        for ((id, set), holders) in jobs.into_iter().zip(holders) {
            to.checks.submit(id, set, holders.into_values().collect());
        }
        if pace {
            next_call = Some(tokio::time::Instant::now() + linger);
        }
    }
}

/// Per change of a batch: the frames it needs no check for, in order.
type Notices = Vec<Vec<Outgoing>>;
/// Per change of a batch: the slots to leave, as (job's index in `Jobs`, the change in the
/// job, the channel).
type Slots = Vec<Vec<(usize, u32, Arc<Subscriber>)>>;
/// The checks admitted, as (job id, its table's share).
type Jobs = Vec<(u64, deliver::TableSet)>;

/// Matches a batch's changes (`datas`, in queue order) to channels and admits each changed
/// table's share to the check pool; a share the pool has no room for is withheld at once
/// (its channels' notices among the frames).
fn match_changes(
    to: Destinations<'_>,
    datas: &[&str],
    (epoch, seqs): (i64, &[i64]),
    metrics: &Metrics,
) -> (Notices, Slots, Jobs) {
    let mut matched = deliver::matched(to.changes, datas);
    let sets = matched.split(datas);
    let mut notices = std::mem::take(&mut matched.notices);
    let mut slots: Slots = datas.iter().map(|_| Vec::new()).collect();
    let mut jobs: Jobs = Vec::with_capacity(sets.len());
    for mut set in sets {
        set.positions = set.at.iter().map(|&i| (epoch, seqs[i])).collect();
        match to.checks.admit(&set) {
            Ok(id) => {
                for c in &set.candidates {
                    let change = set.at[c.change];
                    slots[change].push((jobs.len(), c.change as u32, c.sub.clone()));
                }
                jobs.push((id, set));
            }
            Err(why) => {
                let mut frames: Vec<Vec<Outgoing>> = set.at.iter().map(|_| Vec::new()).collect();
                deliver::withhold(&set, &why, metrics, &mut frames);
                for (local, outs) in frames.into_iter().enumerate() {
                    notices[set.at[local]].extend(outs);
                }
            }
        }
    }
    (notices, slots, jobs)
}
