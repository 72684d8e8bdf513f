//! The drainer's Postgres Changes stage: which channel gets which change of a drained
//! batch, and what of it, with Supabase's authorization (reference §6) asked in batches.
//!
//! For each changed table of the batch, with the channels whose bindings match a change:
//! 1. One lookup: whether the table has RLS, its primary key, and for each distinct role
//!    of those channels the columns it may SELECT (`realtime.selectable`: the role guard,
//!    Supabase's 400 without a primary key and 401 when the key is not readable).
//! 2. On a table with RLS, one `realtime.visible` call for the INSERTs and UPDATEs: each
//!    distinct identity (role and claims) is asked only about the rows its bindings let
//!    through (`asked`), by primary key. Supabase asks one query per subscriber per change.
//!    DELETEs are not checked, as in Supabase, and with RLS their old_record keeps only the
//!    primary key.
//! 3. When some binding filters with `like`, `ilike`, `match` or `imatch` (on a table with
//!    RLS after 2, over the rows each channel may see only; before it otherwise),
//!    `realtime.match_patterns` calls for the table: Postgres's own `LIKE`, `ILIKE`, `~` and
//!    `~*` judge each distinct pattern against the values it is asked about, each pattern
//!    under a time budget of its own (`FILTER_PATTERN_TIMEOUT_MS`). A pattern that fails
//!    (over its budget) withholds the change from the channels whose binding holds it, and
//!    tells them; the other channels and the rest of the batch go on. The patterns are
//!    asked fewest-per-connection first, in calls no pattern's budget can push past the
//!    call's statement_timeout (`pattern_calls`), under a budget apart from the RLS check
//!    of 2: one client's patterns never spend another's check.
//! 4. Each channel gets the change with the columns its role may read (and its `select`),
//!    once, with the ids of all its bindings that matched. A record over
//!    MAX_RECORD_BYTES keeps only its small values and carries Supabase's 413.
//!
//! Every check of a table runs under that table's budget (`CHANGES_CHECK_TIMEOUT_MS`; the
//! patterns one, the RLS check another), set as the server's statement_timeout of each call, and its work is bounded per call:
//! `realtime.visible` asks each identity about at most `POLL_MAX_CHANGES` records and at
//! most `CHANGES_CHECK_MAX_IDENTITIES` identities at a time (Supabase polls 100 changes at
//! a time; `chunks_of`). A check that fails, is cancelled by its timeout, or finds the
//! budget spent withholds the changes it did not decide from those channels and tells them
//! (a `system` error, among the channel's frames at the first change withheld from it):
//! nothing unchecked is ever sent. A lost connection withholds the same way.
//!
//! The drainer runs the stage in two parts: `matched` (the matching, no database call) in
//! its loop, then `check` per table on the check pool (`checks`, connections of its own),
//! off the drain's path; the channels waiting for a check hold their later frames in queue
//! order (`change_hold`). `prepare` runs both for one set of changes at once, on any
//! `Lookup`.

use super::binding::Change;
use super::pattern_calls;
use super::subscribers::{Subscriber, Subscribers};
use crate::metrics::Metrics;
use crate::reason::Notice;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// A value kept in a record over the size cap is at most this long (JSON text), as in
/// Supabase.
const SMALL_VALUE_BYTES: usize = 64;

/// What the stage learns of a table once per batch.
#[derive(Clone, Debug, Default)]
pub struct TableInfo {
    pub oid: u32,
    pub rls: bool,
    pub primary_key: Vec<String>,
    /// Per role: the columns it may SELECT, or why it may not read the table.
    pub roles: HashMap<String, Result<Vec<String>, String>>,
}

/// One visible (identity, record) pair, or an identity's error, 1-based as
/// `realtime.visible` returns them.
pub type VisibleRow = (i32, Option<i32>, Option<String>);

/// One row of `realtime.match_patterns`: (pattern, subject, verdict) or (pattern, error),
/// 1-based.
pub type PatternRow = (i32, Option<i32>, Option<bool>, Option<String>);

/// Why a lookup failed.
#[derive(Debug)]
pub enum DbError {
    /// The connection is gone or stuck: the check's worker connects again for its next.
    Lost(String),
    /// The database refused the call (a policy's error is not this: it comes back per
    /// identity). The table's changes in this batch are withheld.
    Failed(String),
    /// The server cancelled the call at its statement_timeout (the table's budget).
    TimedOut,
}

/// The database side of the stage: a trait so the stage is tested without Postgres.
/// `budget`: how long the call may run on the server (its statement_timeout).
pub(crate) trait Lookup {
    /// None when the table no longer exists.
    async fn table(
        &self,
        schema: &str,
        table: &str,
        roles: &[String],
        budget: Duration,
    ) -> Result<Option<TableInfo>, DbError>;

    async fn visible(
        &self,
        oid: u32,
        call: &VisibleCall,
        budget: Duration,
    ) -> Result<Vec<VisibleRow>, DbError>;

    /// Which subjects each pattern matches by its op (`like`, `ilike`, `match`, `imatch`),
    /// asked only the (pattern, subject) pairs of `asked`.
    async fn patterns(
        &self,
        patterns: &[String],
        ops: &[&'static str],
        subjects: &[Option<String>],
        asked: &[i32],
        budget: Duration,
    ) -> Result<Vec<PatternRow>, DbError>;
}

/// One `realtime.visible` call: identities (role, claims), records (their keys as JSON)
/// and the (identity, record) pairs asked, 1-based, flat.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VisibleCall {
    pub roles: Vec<String>,
    pub claims: Vec<String>,
    pub records: Vec<String>,
    pub asked: Vec<i32>,
    /// The records are whole rows, each seen only while the row still holds it
    /// (`realtime.visible_current`, a resume's check), not keys (`realtime.visible`).
    pub current: bool,
}

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
    fn left(&self, started: Instant) -> Duration {
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
    /// Queues the frame in the channel's order (`change_hold`; a full queue cuts the
    /// connection off, as the hub's does).
    pub fn send(self, metrics: &Metrics) {
        if self.to.reach.send_ordered(self.frame) == crate::outbound::Sent::Queued {
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
    bindings: Vec<usize>,
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

/// The channels each change of a batch matched, by table: what is asked of the database.
pub(crate) struct Matched {
    /// Each change's `data` in bytes.
    sizes: Vec<usize>,
    /// Per change, what needs no check (a change the extension could not decode: its
    /// channels are told it was lost).
    pub(crate) notices: Vec<Vec<Outgoing>>,
    /// Per changed table (schema, name), in order of first appearance, its candidates in
    /// queue order.
    pub(crate) tables: Vec<((String, String), Vec<Candidate>)>,
}

/// Changes a check parses between two yields of its task (`TableSet::parse`): the 10,000
/// of a bulk write took it 50-90 ms here, which in one go held one of the runtime's two
/// threads, and the drain and the connections queued behind it.
const PARSE_PER_YIELD: usize = 256;

/// One table's share of a batch, for a check of its own: its changes (renumbered from 0,
/// in queue order), their batch indexes, and its candidates.
pub(crate) struct TableSet {
    pub(crate) schema: String,
    pub(crate) table: String,
    /// Each change's `data` as drained.
    pub(crate) raw: Vec<String>,
    /// Each change's `data` parsed (None: not JSON), by `parse`, where the set is checked:
    /// empty until then.
    pub(crate) parsed: Vec<Option<Value>>,
    pub(crate) at: Vec<usize>,
    pub(crate) candidates: Vec<Candidate>,
    /// The JSON text bytes of its changes (about what it holds while it waits).
    pub(crate) bytes: usize,
    /// Each change's queue position (epoch, seq), for the gate of a channel whose history
    /// is being sent (`crate::gate`); empty when the caller has none to give.
    pub(crate) positions: Vec<(i64, i64)>,
}

impl TableSet {
    /// How many changes it holds.
    pub(crate) fn changes(&self) -> usize {
        self.raw.len()
    }

    /// Parses its changes' `data` for the check, on the check's task: never on the drain's
    /// path (`matched`), and PARSE_PER_YIELD at a time, the task yielding in between.
    pub(crate) async fn parse(&mut self) {
        if self.parsed.len() == self.raw.len() {
            return;
        }
        self.parsed = Vec::with_capacity(self.raw.len());
        for chunk in self.raw.chunks(PARSE_PER_YIELD) {
            let parsed = chunk.iter().map(|d| serde_json::from_str(d).ok());
            self.parsed.extend(parsed);
            if self.raw.len() > PARSE_PER_YIELD {
                tokio::task::yield_now().await;
            }
        }
    }
}

impl Matched {
    /// Each table's changes and candidates as a set of its own (a change is of one table);
    /// `datas` as given to `matched`.
    pub(crate) fn split(&mut self, datas: &[&str]) -> Vec<TableSet> {
        let mut sets = Vec::with_capacity(self.tables.len());
        for ((schema, table), mut candidates) in std::mem::take(&mut self.tables) {
            let mut local: HashMap<usize, usize> = HashMap::new();
            let (mut raw, mut at, mut bytes) = (Vec::new(), Vec::new(), 0);
            for c in &mut candidates {
                let i = *local.entry(c.change).or_insert_with(|| {
                    bytes += self.sizes[c.change];
                    raw.push(datas[c.change].to_owned());
                    at.push(c.change);
                    at.len() - 1
                });
                c.change = i;
            }
            sets.push(TableSet {
                schema,
                table,
                raw,
                parsed: Vec::new(),
                at,
                candidates,
                bytes,
                positions: Vec::new(),
            });
        }
        sets
    }
}

/// What `matched` reads of a change's `data`: its place and kind, and its rows as text.
/// A row is parsed only for a table some channel filters (`Subscribers::reads_rows`), and
/// the whole `data` only where the change is checked (`TableSet::parse`). Parsed whole
/// here, a 10,000-row insert held the drain, and every broadcast committed after it, for
/// about 90 ms of building JSON trees (the soak's bulk writer: `pgbench/RESULTS.md`).
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    schema: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    table: std::borrow::Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    record: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    old_record: Option<&'a serde_json::value::RawValue>,
}

/// Which channels each change of a batch (`datas`: each change's `data` JSON, in queue
/// order) may go to by their bindings, before any check: no database call.
pub(crate) fn matched(subscribers: &Subscribers, datas: &[&str]) -> Matched {
    let mut out = Matched {
        sizes: datas.iter().map(|d| d.len()).collect(),
        notices: datas.iter().map(|_| Vec::new()).collect(),
        tables: Vec::new(),
    };
    if subscribers.is_empty() {
        return out;
    }
    let mut table_at: HashMap<(String, String), usize> = HashMap::new();
    // Whether a table's rows are read to match its changes, asked once per table a batch.
    let mut reads_rows: Vec<(String, String, bool)> = Vec::new();
    for (i, d) in datas.iter().enumerate() {
        let Ok(head) = serde_json::from_str::<Head>(d) else {
            // Not a deliverable change (a table dropped or altered before it was drained
            // carries only errors), or not JSON.
            if let Ok(data) = serde_json::from_str::<Value>(d) {
                report_undeliverable(subscribers, &data, &mut out.notices[i]);
            }
            continue;
        };
        let (schema, table) = (head.schema.as_ref(), head.table.as_ref());
        let reads = match reads_rows
            .iter()
            .find(|(s, t, _)| s == schema && t == table)
        {
            Some(&(_, _, reads)) => reads,
            None => {
                let reads = subscribers.reads_rows(schema, table);
                reads_rows.push((schema.to_owned(), table.to_owned(), reads));
                reads
            }
        };
        let delete = head.kind == "DELETE";
        // Deletes are matched on the old row, the others on the new (`Binding::matches`).
        let row: Option<Map<String, Value>> = if reads {
            let text = if delete { head.old_record } else { head.record };
            text.and_then(|r| serde_json::from_str(r.get()).ok())
        } else {
            None
        };
        let c = Change {
            schema,
            table,
            kind: &head.kind,
            record: if delete { None } else { row.as_ref() },
            old_record: if delete { row.as_ref() } else { None },
        };
        let mut found = Vec::new();
        for sub in subscribers.of(c.schema, c.table, row.as_ref()) {
            let bindings: Vec<usize> = (0..sub.bindings.len())
                .filter(|&b| sub.bindings[b].matches(&c))
                .collect();
            if !bindings.is_empty() {
                found.push(Candidate {
                    change: i,
                    sub,
                    bindings,
                });
            }
        }
        if found.is_empty() {
            continue;
        }
        let key = (c.schema.to_owned(), c.table.to_owned());
        let t = *table_at.entry(key.clone()).or_insert_with(|| {
            out.tables.push((key, Vec::new()));
            out.tables.len() - 1
        });
        out.tables[t].1.extend(found);
    }
    out
}

/// The frames for each change of a batch (`datas`: each change's `data` JSON, in queue
/// order), in the same order: matched, then checked table by table on `db`. A check that
/// could not be made withholds what it did not decide (its channels get a `system` notice
/// among the frames, at the first change withheld from them); when it found the connection
/// lost, `lost` says so and the other tables' checks are not tried (their changes are
/// withheld the same way). The drain runs the same steps apart (`matched`, then `check` per
/// table on the pool, `checks`); this whole is for one set of changes checked at once (a
/// rejoining channel's resumed changes) and the stage's tests.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) async fn prepare(
    db: &impl Lookup,
    subscribers: &Subscribers,
    datas: &[&str],
    limits: &Limits,
    metrics: &Metrics,
) -> Prepared {
    let Matched {
        notices, tables, ..
    } = matched(subscribers, datas);
    // Only the changes some channel may get are parsed.
    let mut parsed: Vec<Option<Value>> = datas.iter().map(|_| None).collect();
    for c in tables.iter().flat_map(|(_, candidates)| candidates) {
        if parsed[c.change].is_none() {
            parsed[c.change] = serde_json::from_str(datas[c.change]).ok();
        }
    }
    let mut out = Prepared {
        frames: notices,
        lost: None,
        asked: false,
    };
    for ((schema, table), candidates) in tables {
        let table = Table {
            schema: &schema,
            name: &table,
        };
        if let Some(why) = &out.lost {
            // The connection is gone: nothing more can be checked in this batch.
            withhold_failed(&candidates, table, why, metrics, &mut out.frames);
            continue;
        }
        out.asked = true;
        let lost = check(
            db,
            table,
            &parsed,
            candidates,
            limits,
            metrics,
            &mut out.frames,
        )
        .await;
        out.lost = out.lost.or(lost);
    }
    out
}

/// Checks one table's candidates (`candidates`, whose `change` index `parsed` and
/// `frames`) on `db` within the table's budget, and adds each kept candidate's frame, and
/// each withheld channel's notice, to `frames`. Some(why) when the connection was found
/// lost.
pub(crate) async fn check(
    db: &impl Lookup,
    table: Table<'_>,
    parsed: &[Option<Value>],
    candidates: Vec<Candidate>,
    limits: &Limits,
    metrics: &Metrics,
    frames: &mut [Vec<Outgoing>],
) -> Option<String> {
    let mut lost = None;
    let kept = authorize(
        db, table, parsed, candidates, limits, metrics, &mut lost, frames,
    )
    .await;
    // Each change's data as a role sees it is made once; each frame once per
    // (serializer, topic, ids): channels of one topic and bindings share its bytes.
    // (change, role's number, select): roles are numbered, not cloned per candidate.
    type Shape = (usize, usize, Option<Vec<String>>);
    let mut shaped: HashMap<Shape, (String, HashMap<FrameKey, Message>)> = HashMap::new();
    let mut role_number: HashMap<String, usize> = HashMap::new();
    let mut last: Option<(Shape, FrameKey, Message)> = None;
    for (cand, info_cols, trim_to_key) in kept {
        let data = parsed[cand.change].as_ref().expect("parsed");
        let select = common_select(&cand);
        let role = match role_number.get(cand.sub.role.as_str()) {
            Some(&n) => n,
            None => {
                let n = role_number.len();
                role_number.insert(cand.sub.role.clone(), n);
                n
            }
        };
        let key = (cand.change, role, select);
        let ids: Vec<u32> = cand
            .bindings
            .iter()
            .map(|&b| cand.sub.bindings[b].id)
            .collect();
        let reach = &cand.sub.reach;
        let frame_key = (reach.vsn, reach.topic.clone(), ids);
        // Candidates come change by change, a topic's channels together: most frames are the
        // one just made, found without hashing the shape or the topic.
        let frame = match &last {
            Some((k, f, m)) if *k == key && *f == frame_key => m.clone(),
            _ => {
                let (text, shapes) = shaped.entry(key.clone()).or_insert_with(|| {
                    let text = shape(
                        data,
                        &info_cols,
                        key.2.as_deref(),
                        trim_to_key.as_deref(),
                        limits.max_record_bytes,
                    );
                    (text, HashMap::new())
                });
                let frame = shapes
                    .entry(frame_key.clone())
                    .or_insert_with_key(|(_, _, ids)| {
                        Message::text(reach.postgres_changes_text(ids, text))
                    })
                    .clone();
                last = Some((key, frame_key, frame.clone()));
                frame
            }
        };
        frames[cand.change].push(Outgoing {
            to: cand.sub,
            frame,
            change: true,
        });
    }
    lost
}

/// What makes two channels' frames of one shaped change the same bytes.
type FrameKey = (crate::frame::Vsn, Arc<str>, Vec<u32>);

/// A kept candidate, the columns its role may read, and the primary key when its
/// old_record is trimmed to it (a DELETE on a table with RLS).
type Kept = (Candidate, Columns, Option<Vec<String>>);

/// The columns a role may read, shared by all its candidates (one copy per role, not per
/// candidate: a batch may hold 10^5).
type Columns = Arc<Vec<String>>;

/// A table, as its changes name it.
#[derive(Clone, Copy)]
pub(crate) struct Table<'a> {
    pub(crate) schema: &'a str,
    pub(crate) name: &'a str,
}

/// Why a check did not decide, as the channels are told.
fn timed_out(limits: &Limits) -> String {
    format!(
        "the check took longer than CHANGES_CHECK_TIMEOUT_MS ({} ms)",
        limits.check_timeout.as_millis()
    )
}

/// Keeps the candidates of one table that may see their change, within the table's
/// budget. Channels whose check could not be made are told; `lost` is set when it found
/// the connection gone.
#[allow(clippy::too_many_arguments)]
async fn authorize(
    db: &impl Lookup,
    table: Table<'_>,
    parsed: &[Option<Value>],
    candidates: Vec<Candidate>,
    limits: &Limits,
    metrics: &Metrics,
    lost: &mut Option<String>,
    frames: &mut [Vec<Outgoing>],
) -> Vec<Kept> {
    let started = Instant::now();
    let remaining = || limits.left(started);
    let mut roles: Vec<String> = candidates
        .iter()
        .map(|c| c.sub.role.as_str())
        .collect::<HashSet<&str>>()
        .into_iter()
        .map(str::to_owned)
        .collect();
    roles.sort();
    let info = match db
        .table(table.schema, table.name, &roles, remaining())
        .await
    {
        Ok(Some(info)) => info,
        Ok(None) => {
            // Dropped since the change was decoded: nothing can be checked.
            metrics
                .changes_withheld_total
                .increment(candidates.len() as u64);
            return Vec::new();
        }
        Err(e) => {
            let why = failure(e, limits, lost);
            withhold_failed(&candidates, table, &why, metrics, frames);
            return Vec::new();
        }
    };
    let is_delete = |c: &Candidate| {
        parsed[c.change]
            .as_ref()
            .and_then(|d| d.get("type"))
            .and_then(Value::as_str)
            == Some("DELETE")
    };
    // The role's columns; a binding whose filter reads a column the role can no longer
    // read (a REVOKE since the join) matches nothing. On a table with RLS a DELETE is not
    // checked and delivers its key alone, so its filters may read the key alone: a filter
    // on another column of the old row would tell, binding by binding, what a row the
    // subscriber may not see held (stricter than Supabase, which filters the whole row).
    let columns: HashMap<&str, Columns> = info
        .roles
        .iter()
        .filter_map(|(role, cols)| Some((role.as_str(), Arc::new(cols.as_ref().ok()?.clone()))))
        .collect();
    let mut readable: Vec<(Candidate, Columns)> = Vec::new();
    for mut cand in candidates {
        let Some(cols) = columns.get(cand.sub.role.as_str()) else {
            metrics.changes_withheld_total.increment(1);
            continue;
        };
        let sub = cand.sub.clone();
        let key_only = info.rls && is_delete(&cand);
        cand.bindings.retain(|&b| {
            sub.bindings[b].filters.iter().all(|f| {
                cols.contains(&f.column) && (!key_only || info.primary_key.contains(&f.column))
            })
        });
        if cand.bindings.is_empty() {
            metrics.changes_withheld_total.increment(1);
            continue;
        }
        readable.push((cand, cols.clone()));
    }
    if !info.rls {
        // Pattern filters (like, ilike, match, imatch), judged by the database in calls for
        // the table, under what is left of its budget.
        let readable = readable
            .into_iter()
            .map(|(c, cols)| (c, cols, None))
            .collect();
        return match_patterns(
            db,
            table,
            parsed,
            readable,
            remaining(),
            limits,
            metrics,
            (lost, frames),
        )
        .await;
    }
    // RLS: INSERTs and UPDATEs are checked; DELETEs pass with the key alone.
    let (deletes, checked): (Vec<_>, Vec<_>) =
        readable.into_iter().partition(|(c, _)| is_delete(c));
    let mut kept: Vec<Kept> = deletes
        .into_iter()
        .map(|(c, cols)| (c, cols, Some(info.primary_key.clone())))
        .collect();
    if !checked.is_empty() {
        let started = Instant::now();
        let remaining = || limits.left(started);
        // Distinct identities, distinct records and distinct pairs, each numbered once (maps,
        // not scans: a batch may hold 10^5 candidates). A subscriber's identity is looked up
        // by its claims once, not once per candidate.
        let mut identities: Vec<(&str, &str)> = Vec::new();
        let mut identity_at: HashMap<(&str, &str), i32> = HashMap::new();
        let mut identity_of: HashMap<usize, i32> = HashMap::new();
        let mut records: Vec<usize> = Vec::new();
        let mut record_at: Vec<i32> = vec![0; parsed.len()];
        let mut pair_of: Vec<(i32, i32)> = Vec::with_capacity(checked.len());
        for (cand, _) in &checked {
            let i = *identity_of
                .entry(Arc::as_ptr(&cand.sub) as usize)
                .or_insert_with(|| {
                    let who = (cand.sub.role.as_str(), cand.sub.claims.as_str());
                    *identity_at.entry(who).or_insert_with(|| {
                        identities.push(who);
                        identities.len() as i32
                    })
                });
            let r = &mut record_at[cand.change];
            if *r == 0 {
                records.push(cand.change);
                *r = records.len() as i32;
            }
            pair_of.push((i, *r));
        }
        // Each distinct pair, as (record, identity) in queue order, and the call that asks it;
        // vectors indexed by pair, not maps: at 10^5 pairs a check's hash lookups were a third
        // of its own CPU.
        let (distinct, call_of) = chunks_of(&pair_of, limits);
        let mut calls: Vec<Vec<usize>> = Vec::new();
        for (p, &c) in call_of.iter().enumerate() {
            if calls.len() <= c {
                calls.resize_with(c + 1, Vec::new);
            }
            calls[c].push(p);
        }
        // Each record's key (a resume's: the whole record), made once however many calls ask
        // about it, and only when a call does (a bulk write's records past the budget are never
        // asked about).
        let mut keys: Vec<Option<String>> = vec![None; records.len()];
        let mut seen = vec![false; distinct.len()];
        let mut decided = vec![false; calls.len()];
        let mut failed: Option<String> = None;
        // Each identity's and record's number within the call being built (0: not in it).
        let mut local_identity = vec![0i32; identities.len() + 1];
        let mut local_record = vec![0i32; records.len() + 1];
        let mut build = |c: usize| {
            let mut built = Built::default();
            built.call.current = limits.resume;
            for &p in calls.get(c).map(Vec::as_slice).unwrap_or_default() {
                let (r, i) = distinct[p];
                if local_identity[i as usize] == 0 {
                    let (role, claims) = identities[i as usize - 1];
                    built.call.roles.push(role.to_owned());
                    built.call.claims.push(claims.to_owned());
                    built.identities.push(i);
                    local_identity[i as usize] = built.identities.len() as i32;
                }
                if local_record[r as usize] == 0 {
                    let key = keys[r as usize - 1].get_or_insert_with(|| {
                        let data = parsed[records[r as usize - 1]].as_ref().expect("parsed");
                        if limits.resume {
                            data.get("record").map(Value::to_string).unwrap_or_default()
                        } else {
                            key_only(data, &info.primary_key)
                        }
                    });
                    built.call.records.push(key.clone());
                    built.records.push(r);
                    local_record[r as usize] = built.records.len() as i32;
                }
                built
                    .call
                    .asked
                    .extend([local_identity[i as usize], local_record[r as usize]]);
            }
            for &i in &built.identities {
                local_identity[i as usize] = 0;
            }
            for &r in &built.records {
                local_record[r as usize] = 0;
            }
            built
        };
        // Call c's answer is read, and call c + 2 built, while call c + 1 runs: the server does
        // not wait for this side between calls. Each call is sent when the one before has
        // answered, so its statement_timeout is what is left of the budget as it starts.
        let mut answered: Option<(usize, Built, Vec<VisibleRow>)> = None;
        let mut next = build(0);
        for c in 0..calls.len() {
            let budget = remaining();
            if budget.is_zero() {
                failed = Some(timed_out(limits));
                break;
            }
            let this = std::mem::take(&mut next);
            let meanwhile = async {
                if let Some((c, built, rows)) = answered.take() {
                    read_visible(&built, rows, &distinct, &mut seen, metrics);
                    decided[c] = true;
                }
                next = build(c + 1);
            };
            let (result, ()) =
                futures_util::future::join(db.visible(info.oid, &this.call, budget), meanwhile)
                    .await;
            match result {
                Ok(rows) => answered = Some((c, this, rows)),
                Err(e) => {
                    failed = Some(failure(e, limits, lost));
                    break;
                }
            }
        }
        if let Some((c, built, rows)) = answered.take() {
            read_visible(&built, rows, &distinct, &mut seen, metrics);
            decided[c] = true;
        }
        let index_of = |(i, r): (i32, i32)| {
            distinct
                .binary_search(&(r, i))
                .expect("every pair was numbered")
        };
        let mut undecided: Vec<Candidate> = Vec::new();
        for ((cand, cols), pair) in checked.into_iter().zip(pair_of) {
            let p = index_of(pair);
            if !decided[call_of[p]] {
                undecided.push(cand);
            } else if seen[p] {
                let trim = limits.resume.then(|| info.primary_key.clone());
                kept.push((cand, cols, trim));
            } else {
                metrics.changes_withheld_total.increment(1);
            }
        }
        if let Some(why) = failed {
            withhold_failed(&undecided, table, &why, metrics, frames);
        }
    }
    // On a table with RLS, pattern filters are judged after the check, over the rows each
    // channel may see only (issue 39, L3: judged before it, whether a pattern ran out of its
    // time over a batch's values, rows hidden from its subscriber among them, could tell
    // about those values). They have a CHANGES_CHECK_TIMEOUT_MS of their own: a client's
    // patterns never spend the time that decides the other subscribers' changes (issue 39,
    // H1), so a table's check takes at most twice it.
    match_patterns(
        db,
        table,
        parsed,
        kept,
        limits.left(Instant::now()),
        limits,
        metrics,
        (lost, frames),
    )
    .await
}

/// One `realtime.visible` call and the global numbers of its identities and records.
#[derive(Default)]
struct Built {
    call: VisibleCall,
    identities: Vec<i32>,
    records: Vec<i32>,
}

/// Marks the pairs a call's answer says are visible (`distinct`: the pairs as (record,
/// identity), sorted); an identity's error is counted.
fn read_visible(
    built: &Built,
    rows: Vec<VisibleRow>,
    distinct: &[(i32, i32)],
    seen: &mut [bool],
    metrics: &Metrics,
) {
    for (identity, record, error) in rows {
        let identity = built.identities[identity as usize - 1];
        match (record, error) {
            (Some(r), _) => {
                let pair = (built.records[r as usize - 1], identity);
                if let Ok(p) = distinct.binary_search(&pair) {
                    seen[p] = true;
                }
            }
            (None, Some(why)) => {
                // A policy that raised, or a role the guard refuses: that identity only.
                tracing::debug!(identity, error = %why, "a change's RLS check failed for one identity");
                metrics.auth_policy_errors_total.increment(1);
            }
            (None, None) => {}
        }
    }
}

/// The distinct (identity, record) pairs of `pairs` as (record, identity), sorted (queue
/// order), and the call that asks each, calls numbered in the order they are made. Records
/// are taken in queue order into windows in which no identity is asked about more than
/// POLL_MAX_CHANGES of them; a window's identities, in order of appearance, are asked in
/// groups of CHANGES_CHECK_MAX_IDENTITIES. So a call's work stays within POLL_MAX_CHANGES ×
/// CHANGES_CHECK_MAX_IDENTITIES pairs, what the budget allows is decided in queue order, and
/// an identity whose filters let through one change in ten is set up once per thousand
/// changes rather than once per hundred: each call pays a fixed cost per identity (a
/// subtransaction, its settings, an executor start), which windows of POLL_MAX_CHANGES
/// records paid ten times over for 1,000 subscribers in ten rooms (`pgbench/changes.py`).
fn chunks_of(pairs: &[(i32, i32)], limits: &Limits) -> (Vec<(i32, i32)>, Vec<usize>) {
    let mut distinct: Vec<(i32, i32)> = pairs.iter().map(|&(i, r)| (r, i)).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let (per_identity, per_call) = (limits.max_changes.max(1), limits.max_identities.max(1));
    let mut call_of = Vec::with_capacity(distinct.len());
    // The calls of the windows before this one.
    let mut before = 0;
    // In the current window: each identity's (place among the window's identities, records).
    let mut seen: HashMap<i32, (usize, usize)> = HashMap::new();
    for record in distinct.chunk_by(|a, b| a.0 == b.0) {
        let full = record
            .iter()
            .any(|(_, i)| seen.get(i).is_some_and(|&(_, n)| n >= per_identity));
        if full {
            before += seen.len().div_ceil(per_call);
            seen.clear();
        }
        for &(_, i) in record {
            let next = seen.len();
            let (place, n) = seen.entry(i).or_insert((next, 0));
            *n += 1;
            call_of.push(before + *place / per_call);
        }
    }
    (distinct, call_of)
}

/// What the channels are told of a failed check; a lost connection is also noted for the
/// caller.
fn failure(e: DbError, limits: &Limits, lost: &mut Option<String>) -> String {
    match e {
        DbError::Failed(why) => why,
        DbError::TimedOut => timed_out(limits),
        DbError::Lost(why) => {
            *lost = Some(why.clone());
            why
        }
    }
}

/// Keeps, of each candidate's bindings, those whose pattern conditions hold,
/// as the database judges them in calls for the table (`realtime.match_patterns`,
/// `pattern_calls`). A
/// binding whose pattern could not be judged (over its time budget, or the call failed) is
/// dropped and its channel told; a candidate left without bindings is withheld. A lost
/// connection is noted in `lost` for the caller.
#[allow(clippy::too_many_arguments)]
async fn match_patterns<T>(
    db: &impl Lookup,
    table: Table<'_>,
    parsed: &[Option<Value>],
    readable: Vec<(Candidate, Columns, T)>,
    budget: Duration,
    limits: &Limits,
    metrics: &Metrics,
    (lost, frames): (&mut Option<String>, &mut [Vec<Outgoing>]),
) -> Vec<(Candidate, Columns, T)> {
    let Table {
        schema,
        name: table,
    } = table;
    let started = Instant::now();
    let left = || budget.saturating_sub(started.elapsed());
    // Distinct patterns, distinct (change, column) values and distinct pairs, numbered once,
    // and each connection's patterns (its place in the order they are asked).
    let mut patterns: Vec<(String, &'static str)> = Vec::new();
    let mut pattern_at: HashMap<(String, &'static str), i32> = HashMap::new();
    let mut subjects: Vec<Option<String>> = Vec::new();
    let mut subject_at: HashMap<(usize, String), i32> = HashMap::new();
    // Per pattern, the subjects it is asked about.
    let mut asked_of: Vec<Vec<i32>> = Vec::new();
    let mut asked_pairs = HashSet::new();
    let mut owners: HashMap<crate::reach::ConnId, Vec<i32>> = HashMap::new();
    for (n, (cand, _, _)) in readable.iter().enumerate() {
        // A batch may hold 10^5 candidates: the runtime thread is handed back now and then
        // (the drain's other checks and the sockets share it).
        if n % 1024 == 1023 {
            tokio::task::yield_now().await;
        }
        for &b in &cand.bindings {
            for f in &cand.sub.bindings[b].filters {
                if !f.op.is_pattern() {
                    continue;
                }
                let key = (f.values[0].clone(), f.op.name());
                let p = *pattern_at.entry(key.clone()).or_insert_with(|| {
                    patterns.push(key);
                    asked_of.push(Vec::new());
                    patterns.len() as i32
                });
                let s = *subject_at
                    .entry((cand.change, f.column.clone()))
                    .or_insert_with(|| {
                        subjects.push(subject(parsed[cand.change].as_ref(), &f.column));
                        subjects.len() as i32
                    });
                if asked_pairs.insert((p, s)) {
                    asked_of[p as usize - 1].push(s);
                }
                owners.entry(cand.sub.reach.conn).or_default().push(p);
            }
        }
    }
    if patterns.is_empty() {
        return readable;
    }
    drop(asked_pairs);
    let order = pattern_calls::order(owners.into_iter().collect());
    let mut verdicts: HashMap<(i32, i32), Option<bool>> = HashMap::new();
    let mut failed: HashMap<i32, String> = HashMap::new();
    // The patterns in calls that fit what is left of the budget (`pattern_calls`), each
    // call with its own numbering: patterns and subjects 1-based as the call has them.
    let mut at = 0;
    while at < order.len() {
        let budget = left();
        let n = pattern_calls::fits(budget, limits.pattern_timeout, limits.patterns_per_call);
        if n == 0 {
            let why = timed_out(limits);
            for &p in &order[at..] {
                failed.insert(p, why.clone());
            }
            break;
        }
        let these = &order[at..(at + n).min(order.len())];
        at += these.len();
        let mut texts = Vec::with_capacity(these.len());
        let mut ops = Vec::with_capacity(these.len());
        let mut local_subjects: Vec<Option<String>> = Vec::new();
        let mut global_subject: Vec<i32> = Vec::new();
        let mut local_at: HashMap<i32, i32> = HashMap::new();
        let mut asked: Vec<i32> = Vec::new();
        for (i, &p) in these.iter().enumerate() {
            let (text, op) = &patterns[p as usize - 1];
            texts.push(text.clone());
            ops.push(*op);
            for &s in &asked_of[p as usize - 1] {
                let local = *local_at.entry(s).or_insert_with(|| {
                    local_subjects.push(subjects[s as usize - 1].clone());
                    global_subject.push(s);
                    local_subjects.len() as i32
                });
                asked.extend([i as i32 + 1, local]);
            }
        }
        match db
            .patterns(&texts, &ops, &local_subjects, &asked, budget)
            .await
        {
            Ok(rows) => {
                for (p, s, matched, error) in rows {
                    let p = these[p as usize - 1];
                    match (s, error) {
                        (Some(s), _) => {
                            verdicts.insert((p, global_subject[s as usize - 1]), matched);
                        }
                        (None, Some(why)) => {
                            failed.insert(p, why);
                        }
                        (None, None) => {}
                    }
                }
            }
            // The call itself failed, ran out of the table's budget or lost the connection:
            // none of its patterns was judged, and their channels are told so. A lost
            // connection answers no later call either.
            Err(e) => {
                let gone = matches!(e, DbError::Lost(_));
                let why = failure(e, limits, lost);
                let rest = if gone {
                    &order[at - these.len()..]
                } else {
                    these
                };
                for &p in rest {
                    failed.insert(p, why.clone());
                }
                if gone {
                    break;
                }
            }
        }
    }
    let mut kept = Vec::with_capacity(readable.len());
    let mut told = std::collections::HashSet::new();
    for (mut cand, cols, extra) in readable {
        let sub = cand.sub.clone();
        let mut failure: Option<&str> = None;
        cand.bindings.retain(|&b| {
            sub.bindings[b].filters.iter().all(|f| {
                if !f.op.is_pattern() {
                    return true;
                }
                let p = pattern_at[&(f.values[0].clone(), f.op.name())];
                if let Some(why) = failed.get(&p) {
                    failure = Some(why);
                    return false;
                }
                let s = subject_at[&(cand.change, f.column.clone())];
                // SQL's three values: a NULL value matches neither way.
                verdicts
                    .get(&(p, s))
                    .copied()
                    .flatten()
                    .is_some_and(|m| m != f.negate)
            })
        });
        if let Some(why) = failure {
            metrics.change_check_failures_total.increment(1);
            if told.insert((sub.reach.conn, sub.reach.topic.clone())) {
                tracing::warn!(schema, table, error = %why, "a pattern filter could not be evaluated; withheld");
                let notice = Notice::FilterFailed {
                    schema: schema.into(),
                    table: table.into(),
                    why: why.into(),
                };
                let text = sub.reach.system_text(notice.status(), &notice.text());
                frames[cand.change].push(Outgoing {
                    to: sub.clone(),
                    frame: Message::text(text),
                    change: false,
                });
            }
        }
        if cand.bindings.is_empty() {
            metrics.changes_withheld_total.increment(1);
            continue;
        }
        kept.push((cand, cols, extra));
    }
    kept
}

/// A column's value in a change's row (the old row for a DELETE, as filters read it) as
/// text, what Supabase hands `~`: `value #>> '{}'` (a JSON string unquoted, NULL for null).
fn subject(data: Option<&Value>, column: &str) -> Option<String> {
    let data = data?;
    let field = if data.get("type").and_then(Value::as_str) == Some("DELETE") {
        "old_record"
    } else {
        "record"
    };
    match data.get(field)?.get(column)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
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

/// Withholds a table's candidates with `why` without asking the database (the checks'
/// backlog is full): each channel is told once, among `frames`.
pub(crate) fn withhold(set: &TableSet, why: &str, metrics: &Metrics, frames: &mut [Vec<Outgoing>]) {
    let table = Table {
        schema: &set.schema,
        name: &set.table,
    };
    withhold_failed(&set.candidates, table, why, metrics, frames);
}

/// A change the extension could not decode (its table dropped or altered before it was
/// drained): the channels that named that table are told it was lost and why. A channel
/// listening to whole schemas is told only that a change was lost: its role may not read
/// that table, so neither the name nor the error is its to learn.
fn report_undeliverable(subscribers: &Subscribers, data: &Value, out: &mut Vec<Outgoing>) {
    let (Some(table), Some(errors)) = (
        data.get("table").and_then(Value::as_str),
        data.get("errors").and_then(Value::as_array),
    ) else {
        return;
    };
    let why: Vec<&str> = errors.iter().filter_map(Value::as_str).collect();
    for sub in subscribers.named(table) {
        let named = sub
            .bindings
            .iter()
            .any(|b| b.table.as_deref() == Some(table));
        let notice = if named {
            Notice::ChangeLost {
                table: table.into(),
                why: why.join("; "),
            }
        } else {
            Notice::SomeChangeLost
        };
        let text = sub.reach.system_text(notice.status(), &notice.text());
        out.push(Outgoing {
            to: sub,
            frame: Message::text(text),
            change: false,
        });
    }
}

/// The `select` of a candidate's bindings: None (every readable column) unless every
/// matched binding names its columns; then their union.
fn common_select(c: &Candidate) -> Option<Vec<String>> {
    let mut all: Vec<String> = Vec::new();
    for &b in &c.bindings {
        let s = c.sub.bindings[b].select.as_ref()?;
        for col in s {
            if !all.contains(col) {
                all.push(col.clone());
            }
        }
    }
    Some(all)
}

/// The record's primary key as JSON, what `realtime.visible` looks rows up by.
fn key_only(data: &Value, key: &[String]) -> String {
    let row = data
        .get("record")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let kept: Map<String, Value> = row.into_iter().filter(|(k, _)| key.contains(k)).collect();
    Value::Object(kept).to_string()
}

/// The change as one role sees it: columns it may read (and selected), old_record trimmed
/// to the key when asked, small values only past the size cap.
fn shape(
    data: &Value,
    readable: &[String],
    select: Option<&[String]>,
    trim_to_key: Option<&[String]>,
    max_record_bytes: usize,
) -> String {
    let keep = |name: &str| {
        readable.iter().any(|c| c == name) && select.is_none_or(|s| s.iter().any(|c| c == name))
    };
    let mut d = data.clone();
    if let Some(Value::Array(cols)) = d.get_mut("columns") {
        cols.retain(|c| c.get("name").and_then(Value::as_str).is_some_and(keep));
    }
    if let Some(Value::Object(r)) = d.get_mut("record") {
        r.retain(|k, _| keep(k));
    }
    if let Some(Value::Object(r)) = d.get_mut("old_record") {
        r.retain(|k, _| keep(k) && trim_to_key.is_none_or(|key| key.iter().any(|c| c == k)));
    }
    let text = d.to_string();
    if text.len() <= max_record_bytes {
        return text;
    }
    for field in ["record", "old_record"] {
        if let Some(Value::Object(r)) = d.get_mut(field) {
            r.retain(|_, v| v.to_string().len() <= SMALL_VALUE_BYTES);
        }
    }
    let too_large = Value::from("Error 413: Payload Too Large");
    match d.get_mut("errors") {
        Some(Value::Array(e)) => e.push(too_large),
        _ => d["errors"] = Value::Array(vec![too_large]),
    }
    d.to_string()
}

const TABLE_SQL: &str =
    "SELECT oid, rls, primary_key, role, columns, error FROM realtime.table_access($1, $2, $3)";

const VISIBLE_SQL: &str = "SELECT identity, record, error \
     FROM realtime.visible($1::oid::regclass, $2::text[], $3::text[], $4::text[], $5::int4[])";

const VISIBLE_CURRENT_SQL: &str = "SELECT identity, record, error \
     FROM realtime.visible_current($1::oid::regclass, $2::text[], $3::text[], $4::text[], $5::int4[])";

const PATTERNS_SQL: &str = "SELECT pattern, subject, matched, error \
     FROM realtime.match_patterns($1::text[], $2::text[], $3::text[], $4::int4[], $5::int4)";

/// The lookups on a check connection (`checks`; statements prepared on first use). Each
/// call runs under the server's statement_timeout of its budget, so the server ends a check
/// that runs long; the client gives up `grace` later, for a server that does not answer at
/// all.
pub struct Db<'a> {
    pub client: &'a tokio_postgres::Client,
    pub grace: Duration,
    /// Each match pattern's time budget within its call (`FILTER_PATTERN_TIMEOUT_MS`).
    pub pattern_budget_ms: i32,
    pub statements: &'a Statements,
}

/// The prepared statements of one connection.
#[derive(Default)]
pub struct Statements {
    table: tokio::sync::OnceCell<tokio_postgres::Statement>,
    visible: tokio::sync::OnceCell<tokio_postgres::Statement>,
    visible_current: tokio::sync::OnceCell<tokio_postgres::Statement>,
    patterns: tokio::sync::OnceCell<tokio_postgres::Statement>,
}

impl Db<'_> {
    fn error(&self, e: tokio_postgres::Error) -> DbError {
        if self.client.is_closed() {
            return DbError::Lost(e.to_string());
        }
        match e.as_db_error() {
            Some(d) if *d.code() == tokio_postgres::error::SqlState::QUERY_CANCELED => {
                DbError::TimedOut
            }
            // The server is ending this connection (a FATAL the client has not yet seen
            // close): the session ends after the batch, as for a closed one.
            Some(d) if d.code().code().starts_with("57P") => DbError::Lost(d.message().to_owned()),
            Some(d) => DbError::Failed(d.message().to_owned()),
            None => DbError::Failed(e.to_string()),
        }
    }

    async fn query(
        &self,
        cell: &tokio::sync::OnceCell<tokio_postgres::Statement>,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        budget: Duration,
    ) -> Result<Vec<tokio_postgres::Row>, DbError> {
        if budget.is_zero() {
            return Err(DbError::TimedOut);
        }
        // At least 1 ms: 0 would switch the timeout off.
        let ms = budget.as_millis().clamp(1, i32::MAX as u128);
        let call = async {
            self.client
                .batch_execute(&format!("SET statement_timeout = {ms}"))
                .await?;
            let stmt = cell.get_or_try_init(|| self.client.prepare(sql)).await?;
            self.client.query(stmt, params).await
        };
        match tokio::time::timeout(budget + self.grace, call).await {
            Err(_) => Err(DbError::Lost(
                "a Postgres Changes check did not answer in time".into(),
            )),
            Ok(r) => r.map_err(|e| self.error(e)),
        }
    }
}

impl Lookup for Db<'_> {
    async fn table(
        &self,
        schema: &str,
        table: &str,
        roles: &[String],
        budget: Duration,
    ) -> Result<Option<TableInfo>, DbError> {
        let rows = self
            .query(
                &self.statements.table,
                TABLE_SQL,
                &[&schema, &table, &roles],
                budget,
            )
            .await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let mut info = TableInfo {
            oid: first.get("oid"),
            rls: first.get("rls"),
            primary_key: first.get("primary_key"),
            roles: HashMap::new(),
        };
        for row in &rows {
            let role: String = row.get("role");
            let verdict = match row.get::<_, Option<String>>("error") {
                Some(why) => Err(why),
                None => Ok(row
                    .get::<_, Option<Vec<String>>>("columns")
                    .unwrap_or_default()),
            };
            info.roles.insert(role, verdict);
        }
        Ok(Some(info))
    }

    async fn visible(
        &self,
        oid: u32,
        call: &VisibleCall,
        budget: Duration,
    ) -> Result<Vec<VisibleRow>, DbError> {
        let (cell, sql) = if call.current {
            (&self.statements.visible_current, VISIBLE_CURRENT_SQL)
        } else {
            (&self.statements.visible, VISIBLE_SQL)
        };
        let rows = self
            .query(
                cell,
                sql,
                &[&oid, &call.roles, &call.claims, &call.records, &call.asked],
                budget,
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("identity"), r.get("record"), r.get("error")))
            .collect())
    }

    async fn patterns(
        &self,
        patterns: &[String],
        ops: &[&'static str],
        subjects: &[Option<String>],
        asked: &[i32],
        budget: Duration,
    ) -> Result<Vec<PatternRow>, DbError> {
        let rows = self
            .query(
                &self.statements.patterns,
                PATTERNS_SQL,
                &[&patterns, &ops, &subjects, &asked, &self.pattern_budget_ms],
                budget,
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get("pattern"),
                    r.get("subject"),
                    r.get("matched"),
                    r.get("error"),
                )
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Vsn;
    use crate::postgres_changes::parse_bindings;
    use serde_json::json;
    use std::sync::Mutex;
    use tokio_tungstenite::tungstenite::Message;

    type Asked = (Vec<String>, Vec<String>, Vec<i32>);

    /// Plays the database: table `public.todos` with RLS and key `id`; role
    /// `authenticated` reads every column but `secret`, `anon` may not read the key (401);
    /// a row is visible to claims `{"sub":"u1"}` when its id is odd. `notes` has no RLS.
    /// Asked about versions (a resume's check), a row holds a record's version unless the
    /// record's title is "draft" (the row was published since).
    #[derive(Default)]
    struct Fake {
        /// Each visible call's (claims, records, asked).
        visible_calls: Mutex<Vec<Asked>>,
        /// Each patterns call's (patterns, asked).
        pattern_calls: Mutex<Vec<(Vec<String>, Vec<i32>)>>,
        fail_visible: bool,
        /// Each visible call takes this long, or is cancelled by its budget.
        visible_takes: Duration,
        /// Each pattern starting "slow" takes this long before it fails (its own budget);
        /// a call whose patterns take longer than the call's budget is cancelled.
        pattern_takes: Duration,
    }

    impl Lookup for Fake {
        async fn table(
            &self,
            _schema: &str,
            table: &str,
            roles: &[String],
            _budget: Duration,
        ) -> Result<Option<TableInfo>, DbError> {
            if table == "gone" {
                return Ok(None);
            }
            let roles = roles
                .iter()
                .map(|r| {
                    let cols = match r.as_str() {
                        "authenticated" => Ok(vec!["id".into(), "title".into(), "owner".into()]),
                        _ => Err("Error 401: Unauthorized".to_owned()),
                    };
                    (r.clone(), cols)
                })
                .collect();
            Ok(Some(TableInfo {
                oid: 42,
                rls: table == "todos",
                primary_key: vec!["id".into()],
                roles,
            }))
        }

        async fn visible(
            &self,
            oid: u32,
            call: &VisibleCall,
            budget: Duration,
        ) -> Result<Vec<VisibleRow>, DbError> {
            let VisibleCall {
                roles,
                claims,
                records,
                asked,
                current,
            } = call;
            assert_eq!(oid, 42);
            if self.visible_takes > budget {
                tokio::time::sleep(budget).await;
                return Err(DbError::TimedOut);
            }
            tokio::time::sleep(self.visible_takes).await;
            self.visible_calls.lock().unwrap().push((
                claims.to_vec(),
                records.to_vec(),
                asked.to_vec(),
            ));
            if self.fail_visible {
                return Err(DbError::Failed(
                    "permission denied for function visible".into(),
                ));
            }
            let mut rows = Vec::new();
            for pair in asked.chunks(2) {
                let (i, r) = (pair[0], pair[1]);
                let rec: Value = serde_json::from_str(&records[r as usize - 1]).unwrap();
                if *current {
                    assert!(rec.get("title").is_some(), "a version is sent whole");
                } else {
                    assert_eq!(rec.as_object().unwrap().len(), 1, "only the key is sent");
                }
                let odd = rec["id"].as_i64().unwrap() % 2 == 1;
                let held = !*current || rec["title"] != "draft";
                if roles[i as usize - 1] == "authenticated"
                    && claims[i as usize - 1] == r#"{"sub":"u1"}"#
                    && odd
                    && held
                {
                    rows.push((i, Some(r), None));
                }
            }
            Ok(rows)
        }

        /// Plays `realtime.match_patterns` with Rust's `starts_with` standing for `~`
        /// (`^x` only); a pattern "slow" fails as over its budget.
        async fn patterns(
            &self,
            patterns: &[String],
            ops: &[&'static str],
            subjects: &[Option<String>],
            asked: &[i32],
            budget: Duration,
        ) -> Result<Vec<PatternRow>, DbError> {
            self.pattern_calls
                .lock()
                .unwrap()
                .push((patterns.to_vec(), asked.to_vec()));
            let slow = patterns.iter().filter(|p| p.starts_with("slow")).count() as u32;
            let takes = self.pattern_takes * slow;
            if takes > budget {
                tokio::time::sleep(budget).await;
                return Err(DbError::TimedOut);
            }
            tokio::time::sleep(takes).await;
            let mut rows = Vec::new();
            for (i, p) in patterns.iter().enumerate() {
                if p.starts_with("slow") {
                    rows.push((i as i32 + 1, None, None, Some("too slow".to_owned())));
                }
            }
            for pair in asked.chunks(2) {
                let (p, s) = (pair[0], pair[1]);
                let pattern = &patterns[p as usize - 1];
                if pattern.starts_with("slow") {
                    continue;
                }
                let prefix = pattern.trim_start_matches('^');
                let fold = |x: &str| {
                    if ops[p as usize - 1] == "imatch" {
                        x.to_lowercase()
                    } else {
                        x.to_owned()
                    }
                };
                let verdict = subjects[s as usize - 1]
                    .as_deref()
                    .map(|v| fold(v).starts_with(&fold(prefix)));
                rows.push((p, Some(s), verdict, None));
            }
            Ok(rows)
        }
    }

    fn limits() -> Limits {
        Limits {
            max_record_bytes: 1 << 20,
            check_timeout: Duration::from_secs(5),
            max_changes: 100,
            max_identities: 100,
            resume: false,
            pattern_timeout: Duration::from_millis(100),
            patterns_per_call: 64,
            until: None,
        }
    }

    fn sub(
        conn: u64,
        role: &str,
        claims: &str,
        bindings: Value,
    ) -> (Subscriber, crate::outbound::Receiver) {
        let (tx, rx) = crate::outbound::channel(64);
        let link = crate::reach::Link::new(conn, Vsn::V1, conn as i64, tx);
        let s = Subscriber {
            reach: link.reach(&crate::frame::channel_topic(&format!("c{conn}")), None),
            bindings: parse_bindings(Some(&bindings)).unwrap(),
            role: role.into(),
            claims: claims.into(),
            gate: None,
            positions: false,
        };
        (s, rx)
    }

    fn change(table: &str, kind: &str, id: i64) -> String {
        let rec = json!({"id": id, "title": "t", "owner": "u", "secret": "s"});
        let mut d = json!({
            "schema": "public", "table": table, "commit_timestamp": "2026-01-01T00:00:00.000Z",
            "type": kind,
            "columns": [{"name": "id", "type": "int8"}, {"name": "title", "type": "text"},
                        {"name": "owner", "type": "text"}, {"name": "secret", "type": "text"}],
            "errors": null
        });
        if kind != "DELETE" {
            d["record"] = rec.clone();
        }
        if kind != "INSERT" {
            d["old_record"] = rec;
        }
        d.to_string()
    }

    /// What each outgoing change frame carries: (conn, ids, data).
    fn delivered(out: &[Vec<Outgoing>]) -> Vec<Vec<(u64, Value, Value)>> {
        out.iter()
            .map(|v| {
                v.iter()
                    .filter(|o| o.change)
                    .map(|o| {
                        let f: Value = serde_json::from_str(o.frame.to_text().unwrap()).unwrap();
                        (
                            o.to.reach.conn,
                            f["payload"]["ids"].clone(),
                            f["payload"]["data"].clone(),
                        )
                    })
                    .collect()
            })
            .collect()
    }

    #[tokio::test]
    async fn rls_tables_are_checked_per_identity_once_per_batch_and_columns_trimmed() {
        let subs = Subscribers::default();
        let all = json!([{"event": "*", "schema": "public", "table": "todos"}]);
        let (owner, _r1) = sub(1, "authenticated", r#"{"sub":"u1"}"#, all.clone());
        let (other, _r2) = sub(2, "authenticated", r#"{"sub":"u2"}"#, all.clone());
        let (anon, _r3) = sub(3, "anon", "{}", all);
        subs.add(owner);
        subs.add(other);
        subs.add(anon);
        let db = Fake::default();
        let datas = [
            change("todos", "INSERT", 1),
            change("todos", "UPDATE", 2),
            change("todos", "DELETE", 4),
        ];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let m = Metrics::default();
        let out = prepare(&db, &subs, &datas, &limits(), &m).await.frames;
        let got = delivered(&out);
        // Row 1 (odd) is visible to u1 only; row 2 to nobody; the delete reaches both
        // authenticated channels with the key alone, and anon (401) gets nothing.
        assert_eq!(got[0].len(), 1);
        assert_eq!(got[0][0].0, 1);
        let data = &got[0][0].2;
        assert_eq!(data["record"], json!({"id": 1, "title": "t", "owner": "u"}));
        assert!(data["columns"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "secret"));
        assert!(got[1].is_empty());
        let mut del: Vec<u64> = got[2].iter().map(|d| d.0).collect();
        del.sort();
        assert_eq!(del, vec![1, 2]);
        assert_eq!(got[2][0].2["old_record"], json!({"id": 4}));
        // One visible call for the batch: two identities, two records, four pairs.
        let calls = db.visible_calls.lock().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].0.len(), 2);
        assert_eq!(calls[0].1, vec![r#"{"id":1}"#, r#"{"id":2}"#]);
        assert_eq!(calls[0].2.len(), 8);
        // Withheld: anon's three (401) and the three pairs RLS hides.
        assert_eq!(m.value("realtime_changes_withheld_total"), Some(6.0));
    }

    /// A resume's check (`resume`: the issue's H3, a draft resent after it was published)
    /// asks whether each row still holds the version its change recorded, sending whole
    /// records: the draft's INSERT is not resent, the UPDATE that published it is, and its
    /// old_record (the draft) keeps only the key. The live check sends keys.
    #[tokio::test]
    async fn a_resume_resends_only_versions_rows_still_hold_and_old_records_keep_the_key() {
        let subs = Subscribers::default();
        let all = json!([{"event": "*", "schema": "public", "table": "todos"}]);
        let (owner, _r1) = sub(1, "authenticated", r#"{"sub":"u1"}"#, all);
        subs.add(owner);
        let db = Fake::default();
        let with_title = |data: String, title: &str, old: Option<&str>| {
            let mut d: Value = serde_json::from_str(&data).unwrap();
            d["record"]["title"] = json!(title);
            if let Some(old) = old {
                d["old_record"]["title"] = json!(old);
            }
            d.to_string()
        };
        let datas = [
            with_title(change("todos", "INSERT", 7), "draft", None),
            with_title(change("todos", "UPDATE", 7), "published", Some("draft")),
        ];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let resume = Limits {
            resume: true,
            ..limits()
        };
        let out = prepare(&db, &subs, &datas, &resume, &Metrics::default())
            .await
            .frames;
        let got = delivered(&out);
        assert!(got[0].is_empty(), "the draft was resent: {:?}", got[0]);
        assert_eq!(got[1].len(), 1);
        assert_eq!(
            got[1][0].2["record"],
            json!({"id": 7, "title": "published", "owner": "u"})
        );
        assert_eq!(got[1][0].2["old_record"], json!({"id": 7}));
        let asked = db.visible_calls.lock().unwrap().clone();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].1.len(), 2);
        // Live, the same batch is asked by key, and the draft's INSERT is sent (its row is
        // visible at the check, milliseconds after the commit, as on Supabase).
        let live = prepare(&db, &subs, &datas, &limits(), &Metrics::default())
            .await
            .frames;
        assert_eq!(delivered(&live)[0].len(), 1);
    }

    #[tokio::test]
    async fn only_pairs_a_filter_lets_through_are_asked_and_ids_list_every_match() {
        let subs = Subscribers::default();
        let (s, _rx) = sub(
            1,
            "authenticated",
            r#"{"sub":"u1"}"#,
            json!([{"event": "*", "schema": "public", "table": "todos", "filter": "id=eq.3"},
                   {"event": "INSERT", "schema": "public"},
                   {"event": "UPDATE", "schema": "public", "table": "todos", "select": ["id"]}]),
        );
        let ids: Vec<u32> = s.bindings.iter().map(|b| b.id).collect();
        subs.add(s);
        let db = Fake::default();
        let datas = [change("todos", "INSERT", 3), change("todos", "INSERT", 5)];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let out = prepare(&db, &subs, &datas, &limits(), &Metrics::default())
            .await
            .frames;
        let got = delivered(&out);
        assert_eq!(got[0][0].1, json!([ids[0], ids[1]]));
        assert_eq!(got[1][0].1, json!([ids[1]]));
        // The select of one binding does not narrow what a binding without one gets.
        assert_eq!(got[0][0].2["record"]["title"], "t");
    }

    #[tokio::test]
    async fn a_failed_check_withholds_and_tells_the_channel_and_a_table_without_rls_is_not_asked() {
        let subs = Subscribers::default();
        let (s, _rx) = sub(
            1,
            "authenticated",
            r#"{"sub":"u1"}"#,
            json!([{"event": "*", "schema": "public"}]),
        );
        subs.add(s);
        let db = Fake {
            fail_visible: true,
            ..Fake::default()
        };
        let datas = [change("todos", "INSERT", 1), change("notes", "INSERT", 2)];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let m = Metrics::default();
        let out = prepare(&db, &subs, &datas, &limits(), &m).await.frames;
        let got = delivered(&out);
        assert!(got[0].is_empty(), "nothing unchecked is sent");
        assert_eq!(got[1].len(), 1, "notes has no RLS");
        // The notice is among the frames, at the change withheld: in the channel's order.
        let told = notices(&out[..1]).remove(0).1;
        assert_eq!(told["event"], "system");
        assert!(told["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("could not be authorized"));
        assert_eq!(m.value("realtime_change_check_failures_total"), Some(1.0));
    }

    #[tokio::test]
    async fn a_change_lost_to_a_dropped_table_is_told_to_its_table_s_channels_not_counted_as_delivered(
    ) {
        let subs = Subscribers::default();
        let (s, rx) = sub(
            1,
            "authenticated",
            "{}",
            json!([{"event": "*", "schema": "public", "table": "todos"}]),
        );
        subs.add(s);
        let (other, _rx2) = sub(
            2,
            "authenticated",
            "{}",
            json!([{"event": "*", "schema": "public", "table": "notes"}]),
        );
        subs.add(other);
        let lost = json!({"schema": null, "table": "todos", "type": "INSERT", "columns": [],
                          "errors": ["Error 410: the table was dropped before this change was delivered"]})
        .to_string();
        let m = Metrics::default();
        let out = prepare(&Fake::default(), &subs, &[lost.as_str()], &limits(), &m)
            .await
            .frames;
        assert_eq!(out[0].len(), 1, "only the channel of that table is told");
        for o in out.into_iter().flatten() {
            o.send(&m);
        }
        let told: Value = match rx.try_recv().unwrap() {
            Message::Text(t) => serde_json::from_str(&t).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(told["event"], "system");
        assert_eq!(
            told["payload"]["message"],
            "A change to table todos was lost: Error 410: the table was dropped before this change was delivered"
        );
        assert_eq!(m.value("realtime_changes_delivered_total"), Some(0.0));
    }

    #[tokio::test]
    async fn patterns_are_judged_in_one_call_per_table_and_a_failed_one_withholds_its_channel_only()
    {
        let subs = Subscribers::default();
        let on = |filter: &str| json!([{"event": "*", "schema": "public", "table": "notes", "filter": filter}]);
        let (m1, _r1) = sub(1, "authenticated", "{}", on("title=match.^t"));
        let (m2, _r2) = sub(2, "authenticated", "{}", on("title=imatch.^T"));
        let (m3, _r3) = sub(3, "authenticated", "{}", on("title=not.match.^t"));
        let (slow, _slow_rx) = sub(4, "authenticated", "{}", on("title=match.slow"));
        let (plain, _r5) = sub(5, "authenticated", "{}", on("id=eq.1"));
        for s in [m1, m2, m3, slow, plain] {
            subs.add(s);
        }
        let db = Fake::default();
        let datas = [change("notes", "INSERT", 1)];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let m = Metrics::default();
        let out = prepare(&db, &subs, &datas, &limits(), &m).await;
        let mut got: Vec<u64> = delivered(&out.frames)[0].iter().map(|d| d.0).collect();
        got.sort();
        // "t" matches ^t and ^T case-insensitively; not.match excludes it; the slow
        // pattern's channel is withheld and told; the plain channel is untouched.
        assert_eq!(got, vec![1, 2, 5]);
        let calls = db.pattern_calls.lock().unwrap();
        assert_eq!(calls.len(), 1, "one call for the table");
        assert_eq!(
            calls[0].0.len(),
            3,
            "distinct patterns: ^t (twice), ^T, slow"
        );
        let (to, told) = notices(&out.frames).remove(0);
        assert_eq!(to, 4);
        assert_eq!(told["event"], "system");
        assert_eq!(
            told["payload"]["message"],
            "Changes to public.notes were not delivered to this channel: its filter could not be evaluated: too slow"
        );
        assert_eq!(m.value("realtime_changes_withheld_total"), Some(2.0));
    }

    /// Issue 39, H1: one connection's slow patterns were asked in one call with everyone's
    /// under the table's one budget; the call was cancelled, every pattern channel withheld,
    /// and the RLS check left with nothing of the budget. Now the bystander's pattern is
    /// asked first and judged, the RLS check has a budget of its own, and only the slow
    /// client's channel is withheld and told.
    #[tokio::test]
    async fn slow_patterns_of_one_connection_spent_everyone_s_check() {
        let subs = Subscribers::default();
        let on = |filter: &str| json!([{"event": "*", "schema": "public", "table": "todos", "filter": filter}]);
        let flood: Vec<String> = (0..20).map(|i| format!("title=match.slow{i}")).collect();
        let (attacker, _ra) = sub(9, "authenticated", r#"{"sub":"u1"}"#, on(&flood.join(",")));
        let (patterned, _rp) = sub(1, "authenticated", r#"{"sub":"u1"}"#, on("title=match.^t"));
        let (plain, _rq) = sub(2, "authenticated", r#"{"sub":"u1"}"#, on("id=eq.1"));
        for s in [attacker, patterned, plain] {
            subs.add(s);
        }
        let db = Fake {
            pattern_takes: Duration::from_millis(20),
            visible_takes: Duration::from_millis(150),
            ..Fake::default()
        };
        // 20 slow patterns of 20 ms: twice the table's 200 ms; the RLS check alone takes
        // most of it.
        let limits = Limits {
            check_timeout: Duration::from_millis(200),
            pattern_timeout: Duration::from_millis(20),
            ..limits()
        };
        let datas = [change("todos", "INSERT", 1)];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let out = prepare(&db, &subs, &datas, &limits, &Metrics::default()).await;
        let mut got: Vec<u64> = delivered(&out.frames)[0].iter().map(|d| d.0).collect();
        got.sort();
        assert_eq!(got, vec![1, 2]);
        let told: Vec<u64> = notices(&out.frames).iter().map(|n| n.0).collect();
        assert_eq!(told, vec![9]);
        let calls = db.pattern_calls.lock().unwrap();
        assert_eq!(
            calls[0].0[0], "^t",
            "the bystander's pattern is asked first"
        );
        assert!(
            calls.iter().all(|(p, _)| p.len() <= 8),
            "8 × 20 ms fit 80% of 200 ms"
        );
    }

    /// Issue 39, L3: on a table with RLS, pattern filters were judged before the check, over
    /// every changed row's value, those hidden from the pattern's subscriber too, so whether
    /// a pattern ran out of its time could tell about them. They are judged after it, over
    /// the rows the channel may see only.
    #[tokio::test]
    async fn patterns_were_asked_about_rows_their_subscriber_may_not_see() {
        let subs = Subscribers::default();
        let on = json!([{"event": "*", "schema": "public", "table": "todos", "filter": "title=match.^t"}]);
        let (s, _rx) = sub(1, "authenticated", r#"{"sub":"u1"}"#, on);
        subs.add(s);
        let db = Fake::default();
        // Row 1 is visible to u1, row 2 is not (the fake's policy: odd ids).
        let datas = [change("todos", "INSERT", 1), change("todos", "INSERT", 2)];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let out = prepare(&db, &subs, &datas, &limits(), &Metrics::default()).await;
        let got = delivered(&out.frames);
        assert_eq!((got[0].len(), got[1].len()), (1, 0));
        let calls = db.pattern_calls.lock().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, vec![1, 1], "asked about row 1's value only");
    }

    /// The `system` notices among the frames, in order: (conn, the notice).
    fn notices(out: &[Vec<Outgoing>]) -> Vec<(u64, Value)> {
        out.iter()
            .flatten()
            .filter(|o| !o.change)
            .map(|o| {
                let v: Value = serde_json::from_str(o.frame.to_text().unwrap()).unwrap();
                (o.to.reach.conn, v)
            })
            .collect()
    }

    fn told(out: &[Vec<Outgoing>]) -> Vec<String> {
        notices(out)
            .into_iter()
            .map(|(_, v)| {
                v["payload"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    }

    /// A bulk write is checked in calls of at most POLL_MAX_CHANGES records; what the
    /// table's budget decided is delivered, the rest withheld with one word per channel.
    #[tokio::test]
    async fn a_bulk_write_past_the_check_budget_delivers_what_was_decided_and_withholds_the_rest() {
        let subs = Subscribers::default();
        let all = json!([{"event": "*", "schema": "public", "table": "todos"}]);
        let (s, _rx) = sub(1, "authenticated", r#"{"sub":"u1"}"#, all);
        subs.add(s);
        let db = Fake {
            visible_takes: Duration::from_millis(60),
            ..Fake::default()
        };
        let datas: Vec<String> = (1..=250).map(|id| change("todos", "INSERT", id)).collect();
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let limits = Limits {
            check_timeout: Duration::from_millis(100),
            ..limits()
        };
        let m = Metrics::default();
        let started = Instant::now();
        let out = prepare(&db, &subs, &datas, &limits, &m).await;
        assert!(started.elapsed() < Duration::from_millis(500));
        assert!(out.lost.is_none());
        let calls = db.visible_calls.lock().unwrap();
        assert_eq!(calls[0].1.len(), 100, "one call asks about 100 records");
        assert_eq!(
            calls.len(),
            1,
            "the second call was cancelled by the budget"
        );
        let got = delivered(&out.frames);
        // The first 100 records were decided: the odd ones are visible.
        let sent: usize = got.iter().map(Vec::len).sum();
        assert_eq!(sent, 50);
        assert!(got[..100]
            .iter()
            .enumerate()
            .all(|(i, v)| v.len() == (i % 2 == 0) as usize));
        assert_eq!(
            told(&out.frames),
            vec![
                "Changes to public.todos could not be authorized and were not delivered: \
                  the check took longer than CHANGES_CHECK_TIMEOUT_MS (100 ms)"
            ]
        );
        // Told at the first change it was not given a verdict on.
        assert_eq!(notices(&out.frames[100..101]).len(), 1);
        assert_eq!(m.value("realtime_change_check_failures_total"), Some(1.0));
    }

    #[tokio::test]
    async fn identities_are_asked_in_chunks_with_their_own_numbering() {
        let subs = Subscribers::default();
        let all = json!([{"event": "*", "schema": "public", "table": "todos"}]);
        let mut rxs = Vec::new();
        for n in 0..5 {
            let claims = if n == 3 {
                r#"{"sub":"u1"}"#.to_owned()
            } else {
                format!(r#"{{"sub":"x{n}"}}"#)
            };
            let (s, rx) = sub(n, "authenticated", &claims, all.clone());
            subs.add(s);
            rxs.push(rx);
        }
        let db = Fake::default();
        let datas = [change("todos", "INSERT", 1), change("todos", "INSERT", 3)];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let limits = Limits {
            max_changes: 1,
            max_identities: 2,
            ..limits()
        };
        let out = prepare(&db, &subs, &datas, &limits, &Metrics::default()).await;
        // 2 records × 3 chunks of identities: six calls, each at most 2 identities.
        let calls = db.visible_calls.lock().unwrap();
        assert_eq!(calls.len(), 6);
        assert!(calls.iter().all(|c| c.0.len() <= 2 && c.1.len() == 1));
        let got = delivered(&out.frames);
        assert_eq!(got[0].iter().map(|d| d.0).collect::<Vec<_>>(), vec![3]);
        assert_eq!(got[1].iter().map(|d| d.0).collect::<Vec<_>>(), vec![3]);
    }

    /// Regression: windows of POLL_MAX_CHANGES records asked every identity of a window
    /// again for each window, so 1,000 subscribers in ten rooms were set up ten times per
    /// thousand changes. Windows now close only when some identity has POLL_MAX_CHANGES
    /// records in it: two rooms' identities, four changes alternating between the rooms,
    /// one record per identity per call, are two calls, not four.
    #[tokio::test]
    async fn an_identity_is_asked_once_per_window_of_its_own_records() {
        let subs = Subscribers::default();
        for n in 0..6 {
            let room = if n % 2 == 0 { "(1,3)" } else { "(2,4)" };
            let binding = json!([{"event": "*", "schema": "public", "table": "todos",
                                  "filter": format!("id=in.{room}")}]);
            let (s, _rx) = sub(n, "authenticated", &format!(r#"{{"sub":"x{n}"}}"#), binding);
            subs.add(s);
        }
        let db = Fake::default();
        let datas: Vec<String> = (1..=4).map(|id| change("todos", "INSERT", id)).collect();
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let limits = Limits {
            max_changes: 1,
            ..limits()
        };
        prepare(&db, &subs, &datas, &limits, &Metrics::default()).await;
        let calls = db.visible_calls.lock().unwrap();
        let asked: Vec<(usize, usize)> = calls.iter().map(|c| (c.0.len(), c.1.len())).collect();
        assert_eq!(
            asked,
            vec![(6, 2), (6, 2)],
            "identities and records per call"
        );
        assert!(
            calls.iter().all(|c| c.2.len() == 2 * 6),
            "each identity one record"
        );
    }

    /// DELETEs on a table with RLS are not checked and deliver the key alone: a filter on
    /// another column would reveal, binding by binding, what the hidden row held.
    #[tokio::test]
    async fn a_delete_on_an_rls_table_is_filtered_on_its_key_alone() {
        let subs = Subscribers::default();
        let (s, _rx) = sub(
            1,
            "authenticated",
            r#"{"sub":"u2"}"#,
            json!([{"event": "DELETE", "schema": "public", "table": "todos", "filter": "owner=eq.u"},
                   {"event": "DELETE", "schema": "public", "table": "todos", "filter": "id=eq.4"}]),
        );
        let ids: Vec<u32> = s.bindings.iter().map(|b| b.id).collect();
        subs.add(s);
        let datas = [change("todos", "DELETE", 4), change("todos", "DELETE", 6)];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let out = prepare(
            &Fake::default(),
            &subs,
            &datas,
            &limits(),
            &Metrics::default(),
        )
        .await;
        let got = delivered(&out.frames);
        assert_eq!(got[0].len(), 1);
        assert_eq!(
            got[0][0].1,
            json!([ids[1]]),
            "the owner filter is not evaluated"
        );
        assert!(got[1].is_empty(), "no filter on the key matched row 6");
    }

    #[tokio::test]
    async fn channels_of_one_topic_share_one_frame() {
        let subs = Subscribers::default();
        let all = json!([{"event": "*", "schema": "public", "table": "notes"}]);
        let (a, _ra) = sub(1, "authenticated", "{}", all.clone());
        let (mut b, _rb) = sub(2, "authenticated", "{}", all);
        b.reach = a.reach.clone();
        b.reach.conn = 2;
        subs.add(a);
        subs.add(b);
        let datas = [change("notes", "INSERT", 1)];
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let out = prepare(
            &Fake::default(),
            &subs,
            &datas,
            &limits(),
            &Metrics::default(),
        )
        .await;
        let f = &out.frames[0];
        assert_eq!(f.len(), 2);
        let bytes = |o: &Outgoing| match &o.frame {
            Message::Text(t) => t.as_str().as_ptr(),
            other => panic!("{other:?}"),
        };
        assert_eq!(bytes(&f[0]), bytes(&f[1]), "one allocation for both");
    }

    #[tokio::test]
    async fn a_lost_change_is_told_without_its_table_to_a_channel_of_whole_schemas() {
        let subs = Subscribers::default();
        let (s, _rx) = sub(1, "anon", "{}", json!([{"event": "*", "schema": "*"}]));
        subs.add(s);
        let lost = json!({"schema": null, "table": "payroll", "type": "INSERT", "columns": [],
                          "errors": ["Error 410: the table was dropped before this change was delivered"]})
        .to_string();
        let out = prepare(
            &Fake::default(),
            &subs,
            &[lost.as_str()],
            &limits(),
            &Metrics::default(),
        )
        .await;
        let text = out.frames[0][0].frame.to_text().unwrap().to_owned();
        assert!(!text.contains("payroll"), "{text}");
        assert!(text.contains("A change was lost"), "{text}");
    }

    #[test]
    fn a_record_over_the_cap_keeps_its_small_values_and_says_413() {
        let data: Value = serde_json::from_str(&change("notes", "INSERT", 1)).unwrap();
        let mut big = data.clone();
        big["record"]["title"] = json!("x".repeat(1000));
        let cols: Vec<String> = ["id", "title", "owner"].map(String::from).to_vec();
        let text: Value = serde_json::from_str(&shape(&big, &cols, None, None, 500)).unwrap();
        assert_eq!(text["record"], json!({"id": 1, "owner": "u"}));
        assert_eq!(text["errors"], json!(["Error 413: Payload Too Large"]));
        let small: Value = serde_json::from_str(&shape(&data, &cols, None, None, 500)).unwrap();
        assert_eq!(small["errors"], Value::Null);
    }

    #[tokio::test]
    async fn a_bulk_write_is_matched_on_the_drain_s_path_without_its_rows_parsed() {
        // The soak's bulk writer: 10,000 inserts into a table one channel listens to whole.
        let subs = Subscribers::default();
        let (whole, _r1) = sub(
            1,
            "authenticated",
            "{}",
            json!([{"event": "INSERT", "schema": "public", "table": "bulk"}]),
        );
        subs.add(whole);
        assert!(!subs.reads_rows("public", "bulk"), "nobody filters it");
        let datas: Vec<String> = (0..10_000).map(|i| change("bulk", "INSERT", i)).collect();
        let datas: Vec<&str> = datas.iter().map(String::as_str).collect();
        let mut m = matched(&subs, &datas);
        let sets = m.split(&datas);
        assert_eq!(sets.len(), 1);
        let mut set = sets.into_iter().next().unwrap();
        assert_eq!((set.changes(), set.candidates.len()), (10_000, 10_000));
        assert!(set.parsed.is_empty(), "parsed on the drain's path");
        assert_eq!(set.raw[7], datas[7]);
        // Where it is checked.
        set.parse().await;
        assert_eq!(set.parsed.len(), 10_000);
        assert_eq!(set.parsed[7].as_ref().unwrap()["record"]["id"], 7);

        // A channel that filters the table: its rows are read to match, and only the
        // changes it wants are candidates.
        let (room, _r2) = sub(
            2,
            "authenticated",
            "{}",
            json!([{"event": "*", "schema": "public", "table": "bulk", "filter": "id=eq.7"}]),
        );
        subs.add(room);
        assert!(subs.reads_rows("public", "bulk"));
        let mut m = matched(&subs, &datas[..10]);
        let set = m.split(&datas[..10]).into_iter().next().unwrap();
        let to_room: Vec<usize> = set
            .candidates
            .iter()
            .filter(|c| c.sub.reach.conn == 2)
            .map(|c| c.change)
            .collect();
        assert_eq!(to_room, vec![7]);
        // A filter on the old row of a DELETE reads the old row.
        let deleted = [change("bulk", "DELETE", 7), change("bulk", "DELETE", 8)];
        let deleted: Vec<&str> = deleted.iter().map(String::as_str).collect();
        let mut m = matched(&subs, &deleted);
        let set = m.split(&deleted).into_iter().next().unwrap();
        assert_eq!(set.candidates.len(), 1);
        assert_eq!(set.candidates[0].sub.reach.conn, 2);
        assert!(!subs.reads_rows("public", "other"));
    }
}
