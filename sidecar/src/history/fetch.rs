//! The history worker: answers the joins that asked for replay or resume, with one
//! `realtime.history` call per batch of joins (one walk of the queue's retained range for
//! all their topics, not one per client: a thousand clients of one topic rejoining after
//! a restart cost one walk), on its own connection, as the authorizer batches verdicts.
//! Each join's share is then sent to its socket by a task of its own, paced so that it
//! never fills more than half the socket's outbound queue (live messages of the
//! connection's other channels keep their room, and a long catch-up is not taken for a
//! slow client), and finally its gate opens (`gate`).
//!
//! A resume whose position covers its Postgres Changes (`ask::change_positions`) also gets
//! the changes of its bindings' tables after its position, read in the same walk (decoded
//! by the extension as the drain decodes them) and checked as live changes are, by
//! `postgres_changes::deliver::prepare` for a set holding only the rejoining channel, on
//! this connection, in chunks of POLL_MAX_CHANGES under CHANGES_CHECK_TIMEOUT_MS each and
//! RESUME_CHECK_TIMEOUT_MS for all of them: so by RLS and column privileges as they stand
//! at the rejoin. `realtime.visible_current` judges a row as it is now: the INSERT or
//! UPDATE of a row deleted, hidden or changed since is not resent; a DELETE is (as live,
//! DELETEs are not checked by row). Checked before they are counted, the changes the
//! channel may see count against MAX_RESUME_MESSAGES with the topic's broadcasts, and their
//! frames against the history's bytes (`budget`: MAX_RESUME_BYTES, per address, in flight).
//! Within a batch, client addresses take turns (`fair`).

use super::ask::Ask;
use super::budget::{self, Budget, Held};
use super::line::{Permit, Waiting};
use crate::config::Config;
use crate::db_worker;
use crate::frame::{self, Vsn};
use crate::hub::{Payload, QueueMessage, TopicKey};
use crate::metrics::Metrics;
use crate::out::Reach;
use crate::out::Sent;
use crate::out::{At, Opened};
use crate::postgres_changes::deliver;
use crate::postgres_changes::subscribers::{Subscriber, Subscribers};
use crate::postgres_changes::Binding;
use crate::rows::{self, As, Columns, Entry};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;
use tokio_tungstenite::tungstenite::Message;

/// Most joins answered by one call.
const BATCH: usize = 10_000;
/// A client that takes nothing from its queue for this long while its history waits is cut
/// off as too slow.
const STALL_LIMIT: Duration = Duration::from_secs(30);
/// How long a batch that found other joins waiting gathers more before its walk
/// (`db_worker::gather_storm`). A storm of rejoins (10,000 clients after a network blip)
/// is then served by a few dozen walks of the ring instead of hundreds of small ones, each
/// of which walks the whole range since the oldest position asked for; a lone resume waits
/// for nothing.
const STORM_GATHER: Duration = Duration::from_millis(50);

const SQL: &str = "SELECT seq, kind, topic, event, payload::text AS payload, binary_payload, \
     private, (extract(epoch FROM committed_at) * 1000000)::int8 AS committed_us, id::text AS id, \
     lost_first, lost_last, origin \
     FROM realtime.history($1, $2, $3, to_timestamp($4::float8 / 1000), $5, $6, $7, $8)";

/// The tables that bindings name by (schema or `*`, table or NULL for every table of the
/// schema), looked up by the extension (`sql/tables.sql`).
const TABLES_SQL: &str = "SELECT realtime.table_oids($1, $2) AS oids";

/// The newest persisted client broadcasts (`persist`) of the topics since a time, at most
/// Supabase's 25 per topic, not expired: what a replay adds from the table when the ring no
/// longer holds them.
const PERSISTED_SQL: &str =
    "SELECT id::text AS id, topic, private, event, payload::text AS payload, \
     binary_payload, (extract(epoch FROM sent_at) * 1000000)::int8 AS committed_us \
     FROM realtime.persisted_history($1, $2, to_timestamp($3::float8 / 1000), $4)";

/// Persisted messages past their ttl are deleted this often (by every sidecar: the delete
/// is idempotent and cheap on the expiry index).
const EXPIRE_EVERY: Duration = Duration::from_secs(60);
const EXPIRE_SQL: &str = "SELECT realtime.expire_persisted($1) AS gone";
/// Most expired rows deleted in one statement, and most statements in one round: a mass
/// expiry is worked off in bounded chunks over the rounds, never one delete that outlives
/// its statement timeout and rolls back each time.
const EXPIRE_CHUNK: i32 = 10_000;
const EXPIRE_CHUNKS_PER_ROUND: usize = 10;

const EPOCH_SQL: &str =
    "SELECT (extract(epoch FROM epoch) * 1000000)::int8 AS epoch FROM realtime.stats()";

/// A joined channel's request for history, and how to reach it.
pub struct Request {
    pub ask: Ask,
    pub key: TopicKey,
    pub reach: Reach,
    /// Set on a further pass (the gate overflowed while the last one was sent: `gate`).
    pub carry: Option<Carry>,
    /// The channel's Postgres Changes, when its position covers them.
    pub changes: Option<Changes>,
    /// One of its client address's MAX_RESUMES_PER_ADDRESS places (`line`), held while the
    /// history is read and sent, over every pass; given back, to the next of the line, where
    /// the request is dropped. None while it waits in the line.
    pub permit: Option<Permit>,
}

/// A resuming channel's Postgres Changes bindings and the identity it joined with: what
/// its resent changes are matched and checked against.
#[derive(Clone)]
pub struct Changes {
    pub bindings: Vec<Binding>,
    pub role: String,
    pub claims: String,
}

/// What earlier passes of one join's history came to, for its final system message.
#[derive(Clone, Debug, Default)]
pub struct Carry {
    /// The position the client resumed from (None for Supabase's replay, which ends with
    /// no system message).
    pub from: Option<(i64, i64)>,
    pub resent: usize,
    /// The first and last sequence found evicted, over all passes.
    pub missing: Option<(i64, i64)>,
    pub passes: u32,
    /// The span of positions a resume did not send because its topic held more than
    /// MAX_RESUME_MESSAGES after the position, or more bytes than its `budget` allowed
    /// (the newest were sent).
    pub over_limit: Option<(i64, i64)>,
    /// What cut it there (the first pass's).
    pub cut_by: Option<CutBy>,
    /// What a replay sent (it filters the topic's messages, so a later pass must not send
    /// these again, and must send the others).
    pub skip: Vec<i64>,
    /// The resume covered the channel's Postgres Changes: how many were resent, and how
    /// many could not be checked (withheld, the channel told why).
    pub changes: Option<usize>,
    pub withheld: usize,
}

/// The bound that cut a resume short of its position.
#[derive(Clone, Copy, Debug)]
pub enum CutBy {
    /// MAX_RESUME_MESSAGES
    Messages(usize),
    /// Its bytes (`budget`).
    Bytes(budget::Bound),
    /// The decoded bytes of a table's changes in one `realtime.history` call
    /// (`realtime.drain_max_decoded_size`, shared among the call's tables).
    Decoded,
}

/// Passes at most before a client that cannot catch up is cut off as too slow.
const MAX_PASSES: u32 = 100;

/// One message of a history call's result.
struct Found {
    key: TopicKey,
    committed_us: i64,
    message: QueueMessage,
    /// Its frame per serializer, encoded once for every client that gets it.
    frames: [OnceLock<Option<Message>>; 2],
}

impl Found {
    fn frame(&self, vsn: Vsn) -> Option<Message> {
        let i = usize::from(vsn == Vsn::V2);
        self.frames[i]
            .get_or_init(|| self.message.frame(vsn))
            .clone()
    }
}

/// A captured change of a history call, decoded.
struct FoundChange {
    seq: i64,
    /// The table as the queue names it (what a `cut` row names).
    topic: String,
    schema: String,
    table: String,
    data: String,
    /// `data` parsed, for the bindings' filters.
    value: Value,
}

/// What one call of `realtime.history` returned.
#[derive(Default)]
struct Read {
    found: Vec<Found>,
    /// Changes of the tables asked for, in queue order.
    changes: Vec<FoundChange>,
    /// (first, last) sequences evicted before the walk reached them.
    gaps: Vec<(i64, i64)>,
    /// Every message up to this sequence was considered.
    through: i64,
    /// Tables (as the queue names them) whose changes before a position were left out to
    /// bound the call's decoded bytes, with that position.
    cuts: Vec<(String, i64)>,
}

/// `again` is this task's own queue, where a join whose gate overflowed comes back for its
/// next pass.
pub async fn run(
    cfg: Arc<Config>,
    mut rx: mpsc::Receiver<Request>,
    again: mpsc::Sender<Request>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let fail_metrics = metrics.clone();
    let fail = move |r: Request| unavailable(r, &fail_metrics);
    // The bytes of the histories being sent (MAX_RESUME_BYTES and friends).
    let budget = Budget::of(&cfg, Some(metrics.history_bytes_held.clone()));
    // Joins whose read found the connection gone (Postgres restarted, say): served once more
    // on the next connection rather than told the database could not be read.
    let mut retry: Vec<Request> = Vec::new();
    loop {
        let Some(client) =
            db_worker::connect(&cfg, "history", &mut rx, &mut shutdown, fail.clone()).await
        else {
            return;
        };
        let epoch = match client.query_one(EPOCH_SQL, &[]).await {
            Ok(row) => row.get::<_, i64>("epoch"),
            Err(e) => {
                tracing::warn!(error = %e, "history connection failed; reconnecting");
                continue;
            }
        };
        // The checks of resumed changes prepare their statements once per connection.
        let statements = deliver::Statements::default();
        let budget = &budget;
        let mut expire = tokio::time::interval(EXPIRE_EVERY);
        let mut retried = std::mem::take(&mut retry);
        loop {
            let batch = if !retried.is_empty() {
                Some(std::mem::take(&mut retried))
            } else {
                tokio::select! {
                    b = db_worker::next_batch(&mut rx, BATCH, &mut shutdown) => b,
                    _ = expire.tick() => {
                        expire_persisted(&client, &cfg, &metrics).await;
                        continue;
                    }
                }
            };
            let Some(mut batch) = batch else { break };
            db_worker::gather_storm(&mut rx, &mut batch, BATCH, STORM_GATHER).await;
            if client.is_closed() {
                retry = batch;
                break;
            }
            metrics.history_requests_total.increment(batch.len() as u64);
            let (resumes, replays): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .partition(|r| matches!(r.ask, Ask::Resume { .. }));
            let mut lost = false;
            for (group, resume) in [(resumes, true), (replays, false)] {
                if group.is_empty() {
                    continue;
                }
                if lost {
                    retry.extend(group);
                    continue;
                }
                let served = if resume {
                    let group = fair(group);
                    let with = (&again, &*metrics, &statements, budget);
                    serve_resumes(&client, &cfg, epoch, group, with).await
                } else {
                    serve_replays(&client, &cfg, epoch, group, &again, &metrics, budget).await
                };
                if let Err((e, group)) = served {
                    tracing::warn!(error = %e, "realtime.history failed");
                    lost = client.is_closed();
                    if lost {
                        retry.extend(group);
                    } else {
                        group.into_iter().for_each(|r| unavailable(r, &metrics));
                    }
                }
            }
            if lost {
                break;
            }
        }
        if *shutdown.borrow() || rx.is_closed() {
            retry.into_iter().for_each(|r| unavailable(r, &metrics));
            return;
        }
    }
}

type Served = Result<(), (String, Vec<Request>)>;

async fn expire_persisted(client: &Client, cfg: &Config, metrics: &Metrics) {
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

/// Adds the persisted messages of `keys` since `since_ms` that the ring no longer holds
/// (no position: their sequence is 0), and puts everything in commit-time order.
async fn add_persisted(
    client: &Client,
    cfg: &Config,
    keys: &[TopicKey],
    since_ms: i64,
    epoch: i64,
    read: &mut Read,
) -> Result<(), String> {
    let topics: Vec<&str> = keys.iter().map(|k| k.topic.as_str()).collect();
    let private: Vec<bool> = keys.iter().map(|k| k.private).collect();
    let since = since_ms as f64;
    let newest = super::ask::MAX_REPLAY as i32;
    let params: [&(dyn ToSql + Sync); 4] = [&topics, &private, &since, &newest];
    let rows = tokio::time::timeout(cfg.db_call_deadline(), client.query(PERSISTED_SQL, &params))
        .await
        .map_err(|_| "reading persisted messages did not answer in time".to_owned())?
        .map_err(|e| {
            e.as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned())
        })?;
    let held: std::collections::HashSet<String> = read
        .found
        .iter()
        .filter_map(|f| f.message.id.clone())
        .collect();
    for row in rows {
        let id: String = row.get("id");
        if held.contains(&id) {
            continue;
        }
        let payload = Payload::from_columns(row.get("binary_payload"), row.get("payload"));
        let key = TopicKey {
            private: row.get("private"),
            topic: row.get("topic"),
        };
        read.found.push(Found {
            committed_us: row.get("committed_us"),
            message: QueueMessage {
                topic: key.topic.clone(),
                event: row.get("event"),
                payload,
                private: key.private,
                id: Some(id),
                origin: None,
                epoch,
                seq: 0,
                replayed: true,
            },
            key,
            frames: [OnceLock::new(), OnceLock::new()],
        });
    }
    read.found.sort_by_key(|f| (f.committed_us, f.message.seq));
    Ok(())
}

/// Reads the history after `from` for `keys`: the newest `newest` messages of each topic,
/// in one call that walks to the end of what the queue has published (the extension keeps
/// at most `newest` per topic as it walks, so a call is never cut short by its size and the
/// `end` row is the queue's end: everything up to it was considered). What a request may
/// ask for is bounded by `newest`, so a resume from position 0 copies at most that many
/// messages of its topic, never the topic's whole retained history.
#[allow(clippy::too_many_arguments)]
async fn read(
    client: &Client,
    cfg: &Config,
    from: i64,
    keys: &[TopicKey],
    since_ms: Option<i64>,
    newest: i32,
    relayed: bool,
    epoch: i64,
    tables: Option<&[u32]>,
    metrics: &Metrics,
) -> Result<Read, String> {
    let topics: Vec<&str> = keys.iter().map(|k| k.topic.as_str()).collect();
    let private: Vec<bool> = keys.iter().map(|k| k.private).collect();
    let since = since_ms.map(|s| s as f64);
    let mut out = Read {
        through: from,
        ..Read::default()
    };
    metrics.history_calls_total.increment(1);
    let newest = Some(newest);
    let tables: Option<Vec<tokio_postgres::types::Oid>> = tables.map(<[u32]>::to_vec);
    let params: [&(dyn ToSql + Sync); 8] = [
        &out.through,
        &topics,
        &private,
        &since,
        &newest,
        &relayed,
        &i32::MAX,
        &tables,
    ];
    let rows = tokio::time::timeout(cfg.db_call_deadline(), client.query(SQL, &params))
        .await
        .map_err(|_| "realtime.history did not answer in time".to_owned())?
        .map_err(|e| {
            e.as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned())
        })?;
    let how = As {
        epoch,
        replayed: true,
        client_ids: !relayed,
    };
    let Some(first) = rows.first() else {
        return Ok(out);
    };
    let col = Columns::of(first.columns())
        .map_err(|c| format!("realtime.history returned no column \"{c}\""))?;
    for row in &rows {
        let rows::Read { seq, entry } = col.read(row, how)?;
        match entry {
            Entry::End => out.through = seq,
            Entry::Cut { table } => out.cuts.push((table.unwrap_or_default().to_owned(), seq)),
            Entry::Gap { first, last } => out.gaps.push((first, last)),
            Entry::Message {
                committed_us,
                message,
            } => out.found.push(found(committed_us, message)),
            Entry::Change {
                data: Some(data),
                table: topic,
                ..
            } => {
                // Its place, for which channels' bindings it may match (`deliver` matches
                // it again, with the filters).
                let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
                let name = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                let (schema, table) = (name("schema"), name("table"));
                out.changes.push(FoundChange {
                    seq,
                    topic: topic.unwrap_or_default().to_owned(),
                    schema,
                    table,
                    data: data.to_owned(),
                    value: v,
                });
            }
            // A history holds none of these (`extension/src/history.rs`).
            Entry::Filtered | Entry::Presence { .. } | Entry::Change { .. } => {}
        }
    }
    Ok(out)
}

/// A message of `realtime.history` (`rows::As` says which ids it keeps: a replay's all,
/// as Supabase's replay gives each its row's id; a resume's client broadcasts none, as live).
fn found(committed_us: i64, message: QueueMessage) -> Found {
    let key = TopicKey {
        private: message.private,
        topic: message.topic.clone(),
    };
    Found {
        committed_us,
        message,
        key,
        frames: [OnceLock::new(), OnceLock::new()],
    }
}

fn distinct_keys(requests: &[Request]) -> Vec<TopicKey> {
    let mut keys: Vec<TopicKey> = requests.iter().map(|r| r.key.clone()).collect();
    keys.sort_by(|a, b| (&a.topic, a.private).cmp(&(&b.topic, b.private)));
    keys.dedup();
    keys
}

/// Each message's index per topic, in queue order.
fn by_topic(read: &Read) -> HashMap<&TopicKey, Vec<usize>> {
    let mut map: HashMap<&TopicKey, Vec<usize>> = HashMap::new();
    for (i, f) in read.found.iter().enumerate() {
        map.entry(&f.key).or_default().push(i);
    }
    map
}

/// The messages of one topic, in queue order.
fn of_topic<'a>(
    read: &'a Read,
    index: &'a HashMap<&TopicKey, Vec<usize>>,
    key: &TopicKey,
) -> impl Iterator<Item = &'a Found> + 'a {
    index
        .get(key)
        .into_iter()
        .flatten()
        .map(|&i| &read.found[i])
}

/// The requests of a batch, their addresses taken in turn (each address's in join order): the
/// worker serves one request at a time, and an address that asked for many histories at
/// once does not make the others' wait behind all of its own.
fn fair(requests: Vec<Request>) -> Vec<Request> {
    in_turn(requests, |r| r.permit.as_ref().and_then(|p| p.address()))
}

/// `items` with their keys taken in turn, in order of first appearance, each key's items in
/// their order.
fn in_turn<T, K: PartialEq>(items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let mut lines: Vec<(K, std::collections::VecDeque<T>)> = Vec::new();
    for item in items {
        let k = key(&item);
        match lines.iter_mut().find(|(l, _)| *l == k) {
            Some((_, q)) => q.push_back(item),
            None => lines.push((k, std::collections::VecDeque::from([item]))),
        }
    }
    let mut out = Vec::new();
    while !lines.is_empty() {
        for (_, q) in &mut lines {
            out.extend(q.pop_front());
        }
        lines.retain(|(_, q)| !q.is_empty());
    }
    out
}

type With<'a> = (
    &'a mpsc::Sender<Request>,
    &'a Metrics,
    &'a deliver::Statements,
    &'a Budget,
);

async fn serve_resumes(
    client: &Client,
    cfg: &Config,
    epoch: i64,
    requests: Vec<Request>,
    (again, metrics, statements, budget): With<'_>,
) -> Served {
    // A position of another epoch (the database restarted since): everything this epoch
    // still holds is sent, after a word that what came before is lost.
    let after = |r: &Request| match r.ask {
        Ask::Resume { epoch: e, seq } if e == epoch => seq,
        _ => 0,
    };
    let from = requests.iter().map(after).min().unwrap_or(0);
    let keys = distinct_keys(&requests);
    // One more than a resume may be sent: a topic (or table) that returns that many holds
    // more.
    let limit = cfg.max_resume_messages as usize;
    let newest = (limit + 1).min(i32::MAX as usize) as i32;
    let tables = match change_tables(client, cfg, &requests).await {
        Ok(t) => t,
        Err(e) => return Err((e, requests)),
    };
    let read = match read(
        client,
        cfg,
        from,
        &keys,
        None,
        newest,
        true,
        epoch,
        tables.as_deref(),
        metrics,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return Err((e, requests)),
    };
    let index = by_topic(&read);
    // Per table of the read: how many changes it returned and the first one's position.
    let mut per_table: HashMap<(&str, &str), (usize, i64)> = HashMap::new();
    for c in &read.changes {
        let e = per_table
            .entry((c.schema.as_str(), c.table.as_str()))
            .or_insert((0, c.seq));
        e.0 += 1;
    }
    let db = deliver::Db {
        client,
        grace: Duration::from_secs(5),
        pattern_budget_ms: cfg.filter_pattern_timeout_ms as i32,
        statements,
    };
    let limits = deliver::Limits::of(cfg);
    let mut asked = false;
    let mut pending = requests.into_iter();
    while let Some(r) = pending.next() {
        let Ask::Resume {
            epoch: asked_epoch,
            seq,
        } = r.ask
        else {
            continue;
        };
        let after = after(&r);
        let skip = r.carry.as_ref().map_or(&[][..], |c| &c.skip[..]);
        let topic: Vec<&Found> = of_topic(&read, &index, &r.key)
            .filter(|f| f.message.seq > after && !skip.contains(&f.message.seq))
            .collect();
        let changes: Vec<&FoundChange> = match &r.changes {
            None => Vec::new(),
            Some(c) => read
                .changes
                .iter()
                .filter(|f| f.seq > after && !skip.contains(&f.seq))
                .filter(|f| wanted(&c.bindings, f))
                .collect(),
        };
        // Where what this channel may have lost begins: a topic or table that returned
        // `newest` was cut to its newest, so before its first one nothing is known.
        let mut cut = after + 1;
        if of_topic(&read, &index, &r.key).count() >= newest as usize {
            cut = cut.max(
                of_topic(&read, &index, &r.key)
                    .next()
                    .map_or(cut, |f| f.message.seq),
            );
        }
        // A table whose changes the call cut to bound their decoded bytes: before its
        // first one returned nothing is known either.
        let mut decoded_cut = None;
        if let Some(c) = &r.changes {
            for ((schema, table), (n, first)) in &per_table {
                if *n >= newest as usize && places(&c.bindings, schema, table) {
                    cut = cut.max(*first);
                }
            }
            for (topic, first) in &read.cuts {
                let Some(t) = read.changes.iter().find(|f| &f.topic == topic) else {
                    continue;
                };
                if *first > cut && places(&c.bindings, &t.schema, &t.table) {
                    cut = *first;
                    decoded_cut = Some(cut);
                }
            }
        }
        // The changes are checked before anything is counted: what counts against
        // MAX_RESUME_MESSAGES and the bytes is what the channel may see (issue 39, L2:
        // counted before the check, the range a cut resume reported told positions of
        // changes it may not see). Their check is bounded by RESUME_CHECK_TIMEOUT_MS.
        let changes: Vec<&FoundChange> = changes.into_iter().filter(|c| c.seq >= cut).collect();
        // (position, frame, a change rather than a notice)
        let mut checked: Vec<(i64, Message, bool)> = Vec::new();
        let mut withheld = 0;
        if let Some(c) = &r.changes {
            let budgets = (&limits, Duration::from_millis(cfg.resume_check_timeout_ms));
            match check_changes(&db, &r, c, &changes, budgets, metrics).await {
                Checked::Lost(e) => {
                    // The connection is gone: this request and the rest are served again on
                    // the next one.
                    let mut rest = vec![r];
                    rest.extend(pending);
                    return Err((e, rest));
                }
                Checked::Done {
                    frames,
                    withheld: w,
                    asked: a,
                } => {
                    asked |= a;
                    checked = frames;
                    withheld = w;
                }
            }
        }
        // Together, in queue order, at most `limit`: the newest are kept.
        let mut seqs: Vec<i64> = topic
            .iter()
            .map(|f| f.message.seq)
            .chain(checked.iter().filter(|c| c.2).map(|c| c.0))
            .filter(|&q| q >= cut)
            .collect();
        seqs.sort_unstable();
        if seqs.len() > limit {
            cut = seqs[seqs.len() - limit];
        }
        let mut cut_by = (cut > after + 1).then_some(if decoded_cut == Some(cut) {
            CutBy::Decoded
        } else {
            CutBy::Messages(limit)
        });
        // And in bytes (`budget`): the newest that fit what this history may hold.
        let address = r.permit.as_ref().and_then(|p| p.address());
        let mut sized: Vec<(i64, usize)> = topic
            .iter()
            .filter(|f| f.message.seq >= cut)
            .map(|f| (f.message.seq, f.frame(r.reach.vsn).map_or(0, |m| m.len())))
            .chain(
                checked
                    .iter()
                    .filter(|c| c.0 >= cut)
                    .map(|c| (c.0, c.1.len())),
            )
            .collect();
        sized.sort_unstable();
        let sizes: Vec<usize> = sized.iter().map(|s| s.1).collect();
        if let (first, Some(bound)) = budget::keep_newest(&sizes, &budget.room(address)) {
            cut = match sized.get(first) {
                Some(&(seq, _)) => seq,
                None => sized.last().map_or(cut, |&(seq, _)| seq + 1),
            };
            cut_by = Some(CutBy::Bytes(bound));
            metrics.history_cut_by_bytes_total.increment(1);
        }
        let over_limit = (cut > after + 1).then(|| (after + 1, cut - 1));
        let mut frames: Vec<(i64, Message)> = topic
            .iter()
            .filter(|f| f.message.seq >= cut)
            .filter_map(|f| Some((f.message.seq, f.frame(r.reach.vsn)?)))
            .collect();
        let resent_broadcasts = frames.len();
        let resent_changes = r
            .changes
            .as_ref()
            .map(|_| checked.iter().filter(|c| c.2 && c.0 >= cut).count());
        frames.extend(
            checked
                .into_iter()
                .filter(|c| c.0 >= cut)
                .map(|(seq, frame, _)| (seq, frame)),
        );
        frames.sort_by_key(|f| f.0);
        let missing = read.gaps.iter().filter(|&&(_, last)| last > after).fold(
            None,
            |span: Option<(i64, i64)>, &(first, last)| {
                let first = first.max(after + 1);
                Some(span.map_or((first, last), |(f, l)| (f.min(first), l.max(last))))
            },
        );
        let first_pass = r.carry.is_none();
        let mut carry = r.carry.clone().unwrap_or(Carry {
            from: Some((asked_epoch, seq)),
            ..Carry::default()
        });
        carry.resent += resent_broadcasts + resent_changes.unwrap_or(0);
        if let Some(n) = resent_changes {
            carry.changes = Some(carry.changes.unwrap_or(0) + n);
        }
        carry.withheld += withheld;
        carry.passes += 1;
        if let Some((f, l)) = missing {
            carry.missing = Some(carry.missing.map_or((f, l), |(a, b)| (a.min(f), b.max(l))));
        }
        if let Some((f, l)) = over_limit {
            carry.cut_by = carry.cut_by.or(cut_by);
            carry.over_limit = Some(
                carry
                    .over_limit
                    .map_or((f, l), |(a, b)| (a.min(f), b.max(l))),
            );
        }
        let ahead = first_pass && asked_epoch == epoch && seq > read.through;
        let system = carry.from.map(|from| {
            resume_system(
                &r,
                epoch,
                from,
                &carry,
                ahead,
                (read.through, limit),
                metrics,
            )
        });
        metrics
            .history_messages_total
            .increment((resent_broadcasts + resent_changes.unwrap_or(0)) as u64);
        // Everything of the channel up to the read's end was sent (now or by an earlier
        // pass).
        let dedupe = (read.through, Vec::new());
        let held = budget.take(address, frames.iter().map(|f| f.1.len()).sum());
        tokio::spawn(send(
            r,
            epoch,
            (frames, Some(held)),
            system,
            dedupe,
            carry,
            again.clone(),
        ));
    }
    if asked {
        // The checks set their statement_timeout; this connection's other calls are bounded
        // by the client's deadline instead.
        let reset = client.batch_execute("RESET statement_timeout");
        match tokio::time::timeout(cfg.db_call_deadline(), reset).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "RESET statement_timeout failed"),
            Err(_) => tracing::warn!("RESET statement_timeout did not answer in time"),
        }
    }
    Ok(())
}

/// Whether some binding wants the change (its place, event and filters; a change that could
/// not be decoded goes on, for the stage to tell the channel it was lost). Matched before
/// counting against MAX_RESUME_MESSAGES, so another room's changes do not count.
fn wanted(bindings: &[Binding], f: &FoundChange) -> bool {
    if !places(bindings, &f.schema, &f.table) {
        return false;
    }
    match crate::postgres_changes::Change::from_data(&f.value) {
        Some(change) => bindings.iter().any(|b| b.matches(&change)),
        None => true,
    }
}

/// Whether some binding listens at (schema, table).
fn places(bindings: &[Binding], schema: &str, table: &str) -> bool {
    bindings.iter().any(|b| {
        (b.schema == "*" || b.schema == schema) && b.table.as_deref().is_none_or(|t| t == table)
    })
}

/// The tables whose changes the resuming channels' bindings cover, if any asked.
async fn change_tables(
    client: &Client,
    cfg: &Config,
    requests: &[Request],
) -> Result<Option<Vec<u32>>, String> {
    let mut schemas: Vec<String> = Vec::new();
    let mut names: Vec<Option<String>> = Vec::new();
    for c in requests.iter().filter_map(|r| r.changes.as_ref()) {
        for b in &c.bindings {
            if !schemas
                .iter()
                .zip(&names)
                .any(|(s, t)| *s == b.schema && *t == b.table)
            {
                schemas.push(b.schema.clone());
                names.push(b.table.clone());
            }
        }
    }
    if schemas.is_empty() {
        return Ok(None);
    }
    let params: [&(dyn ToSql + Sync); 2] = [&schemas, &names];
    let row = tokio::time::timeout(
        cfg.db_call_deadline(),
        client.query_one(TABLES_SQL, &params),
    )
    .await
    .map_err(|_| "looking up the resumed tables did not answer in time".to_owned())?
    .map_err(|e| e.to_string())?;
    Ok(Some(row.get("oids")))
}

/// What checking one channel's resent changes came to.
enum Checked {
    Done {
        /// (position, frame, whether it is a change) in queue order: the changes it may
        /// read, and the `system` notices of those that could not be checked.
        frames: Vec<(i64, Message, bool)>,
        withheld: usize,
        /// Some check ran (the connection's statement_timeout is set).
        asked: bool,
    },
    Lost(String),
}

/// Matches and checks one resuming channel's changes as the drain's stage checks live ones
/// (`deliver::prepare`, for a set holding only this channel, with its identity at the
/// rejoin), in chunks of POLL_MAX_CHANGES, each under its own CHANGES_CHECK_TIMEOUT_MS and
/// all together under RESUME_CHECK_TIMEOUT_MS: what is left unchecked then is withheld, the
/// channel told, and the worker goes on to the next join.
async fn check_changes(
    db: &deliver::Db<'_>,
    r: &Request,
    c: &Changes,
    changes: &[&FoundChange],
    (limits, resume_check_timeout): (&deliver::Limits, Duration),
    metrics: &Metrics,
) -> Checked {
    // The channel as the stage sees it, reached through a queue of its own: what the stage
    // sends directly (a notice that a table's changes were withheld) is put in order with
    // the rest, behind the gate, instead of overtaking the history.
    let (tx, notices) = crate::out::channel(1024);
    let link = crate::out::Link::new(r.reach.conn, r.reach.vsn, 0, tx);
    let only = Subscribers::default();
    only.add(Subscriber {
        reach: link.reach(&r.reach.topic, r.reach.join_ref()),
        bindings: c.bindings.clone(),
        role: c.role.clone(),
        claims: c.claims.clone(),
        positions: false,
    });
    let mut out = Vec::new();
    let (mut withheld, mut asked) = (0, false);
    // Checked long after their commit: a version is resent only while its row still holds
    // it (`deliver::Limits::resume`).
    let limits = &deliver::Limits {
        resume: true,
        until: Some(Instant::now() + resume_check_timeout),
        ..*limits
    };
    for chunk in changes.chunks(limits.max_changes.max(1)) {
        let datas: Vec<&str> = chunk.iter().map(|c| c.data.as_str()).collect();
        let p = deliver::prepare(db, &only, &datas, limits, metrics).await;
        asked |= p.asked;
        let first = chunk.first().map_or(0, |c| c.seq);
        while let Ok(notice) = notices.try_recv() {
            withheld += 1;
            out.push((first, notice, false));
        }
        if let Some(why) = p.lost {
            return Checked::Lost(why);
        }
        for (change, frames) in chunk.iter().zip(p.frames) {
            for f in frames {
                // A notice that the table's changes were withheld comes among the frames,
                // at the first change withheld (`deliver`).
                withheld += usize::from(!f.change);
                out.push((change.seq, f.frame, f.change));
            }
        }
    }
    Checked::Done {
        frames: out,
        withheld,
        asked,
    }
}

/// The system message that ends a resume: recovered or not, and why not.
fn resume_system(
    r: &Request,
    epoch: i64,
    (asked_epoch, seq): (i64, i64),
    carry: &Carry,
    ahead: bool,
    (through, limit): (i64, usize),
    metrics: &Metrics,
) -> Message {
    let resent = carry.resent;
    let messages = if resent == 1 { "message" } else { "messages" };
    let mut payload = if asked_epoch != epoch {
        json!({"recovered": false, "epoch_changed": true, "first_missing": seq + 1,
               "message": format!("The database restarted after position {seq} of epoch {asked_epoch}: messages after it that were not delivered are lost; the {resent} {messages} the new epoch {epoch} holds were sent")})
    } else if ahead {
        json!({"recovered": false, "first_missing": null, "last_missing": null,
               "message": format!("Position {seq} is beyond the last message of this queue ({through}): it is not a position of this epoch's messages")})
    } else if let Some((cut_first, cut_last)) = carry.over_limit {
        // Evicted positions before the cut are part of what was not sent.
        let (first, last) = carry.missing.map_or((cut_first, cut_last), |(f, l)| {
            (f.min(cut_first), l.max(cut_last))
        });
        let why = match carry.cut_by {
            Some(CutBy::Bytes(bound)) => bound.why(seq),
            Some(CutBy::Decoded) => format!(
                "The changes after position {seq} decode to more than one history call returns (realtime.drain_max_decoded_size, shared among the tables it reads)"
            ),
            _ => format!("More than MAX_RESUME_MESSAGES ({limit}) messages follow position {seq}"),
        };
        json!({"recovered": false, "first_missing": first, "last_missing": last,
               "message": format!("{why}: messages {first} to {last} were not sent; the {resent} newest were")})
    } else if let Some((first, last)) = carry.missing {
        json!({"recovered": false, "first_missing": first, "last_missing": last,
               "message": format!("Messages {first} to {last} are no longer retained; the {resent} {messages} after them were sent")})
    } else if carry.withheld > 0 {
        json!({"recovered": false, "first_missing": null, "last_missing": null,
               "message": format!("Some changes after position {seq} could not be checked in time and were withheld (a system message said which table's); the {resent} {messages} that could were sent")})
    } else {
        json!({"recovered": true,
               "message": format!("Resumed after position {seq}: {resent} {messages} sent")})
    };
    let recovered = payload["recovered"] == Value::Bool(true);
    if !recovered && carry.passes == 1 {
        metrics.history_unrecovered_total.increment(1);
    }
    payload["extension"] = json!("broadcast");
    payload["status"] = json!(if recovered { "ok" } else { "error" });
    payload["channel"] = json!(r.key.topic);
    payload["epoch"] = json!(epoch.to_string());
    payload["resent"] = json!(resent);
    if let Some(changes) = carry.changes {
        // The channel's position covers its changes: the position to resume from next
        // (everything of the channel up to it was sent), and how its changes were judged.
        if !ahead {
            payload["seq"] = json!(through);
        }
        payload["changes"] = json!(changes);
        payload["withheld"] = json!(carry.withheld);
        let judged = " Changes were checked as the channel's role may read them now: an INSERT or UPDATE is resent only while its row is visible and still holds what it wrote (of a row changed since, its latest change is resent, not the versions before it), and an UPDATE's old_record keeps only the key on a table with row level security; a DELETE is resent.";
        let text = payload["message"].as_str().unwrap_or_default().to_owned() + judged;
        payload["message"] = json!(text);
    }
    system_frame(&r.reach, &payload)
}

/// A `system` message of the history (queued through the gate, after the history's frames).
fn system_frame(reach: &Reach, payload: &Value) -> Message {
    Message::text(frame::encode(
        reach.vsn,
        reach.join_ref(),
        None,
        &reach.topic,
        "system",
        payload,
    ))
}

async fn serve_replays(
    client: &Client,
    cfg: &Config,
    epoch: i64,
    requests: Vec<Request>,
    again: &mpsc::Sender<Request>,
    metrics: &Metrics,
    budget: &Budget,
) -> Served {
    let since = |r: &Request| match r.ask {
        Ask::Replay { since_ms, .. } => since_ms,
        _ => 0,
    };
    let min_since = requests.iter().map(since).min().unwrap_or(0);
    let keys = distinct_keys(&requests);
    let newest = super::ask::MAX_REPLAY as i32;
    let mut read = match read(
        client,
        cfg,
        0,
        &keys,
        Some(min_since),
        newest,
        false,
        epoch,
        None,
        metrics,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return Err((e, requests)),
    };
    if let Err(e) = add_persisted(client, cfg, &keys, min_since, epoch, &mut read).await {
        return Err((e, requests));
    }
    let index = by_topic(&read);
    for r in requests {
        let Ask::Replay { since_ms, limit } = r.ask else {
            continue;
        };
        let mine: Vec<&Found> = of_topic(&read, &index, &r.key)
            .filter(|f| f.committed_us >= since_ms.saturating_mul(1000))
            .collect();
        let skip = mine.len().saturating_sub(limit as usize);
        let mut frames: Vec<(i64, Message)> = mine[skip..]
            .iter()
            .filter_map(|f| Some((f.message.seq, f.frame(r.reach.vsn)?)))
            .collect();
        // Its bytes too (`budget`): Supabase's replay ends without a word, so the oldest
        // that do not fit are left out silently, as those beyond `limit` are.
        let address = r.permit.as_ref().and_then(|p| p.address());
        let sizes: Vec<usize> = frames.iter().map(|f| f.1.len()).collect();
        if let (first, Some(_)) = budget::keep_newest(&sizes, &budget.room(address)) {
            frames.drain(..first);
            metrics.history_cut_by_bytes_total.increment(1);
        }
        let held = budget.take(address, frames.iter().map(|f| f.1.len()).sum());
        metrics
            .history_messages_total
            .increment(frames.len() as u64);
        let skip: Vec<i64> = frames.iter().map(|f| f.0).filter(|&s| s > 0).collect();
        let carry = Carry {
            resent: frames.len(),
            passes: 1,
            skip: skip.clone(),
            ..Carry::default()
        };
        // A replay leaves messages out (before `since`, beyond `limit`, client broadcasts):
        // only what it sent is skipped live.
        tokio::spawn(send(
            r,
            epoch,
            (frames, Some(held)),
            None,
            (0, skip),
            carry,
            again.clone(),
        ));
    }
    Ok(())
}

/// The history could not be read: the channel goes live, told that nothing was recovered.
impl Waiting for Request {
    fn hold(&mut self, permit: Permit) {
        self.permit = Some(permit);
    }

    fn live(&self) -> bool {
        !self.reach.gate_closed() && !self.reach.is_closed()
    }

    fn unavailable(self, why: Option<&str>, metrics: &Metrics) {
        match why {
            Some(why) => unavailable_because(self, why, metrics),
            None => unavailable(self, metrics),
        }
    }
}

pub fn unavailable(r: Request, metrics: &Metrics) {
    unavailable_because(
        r,
        "The database could not be read to resume this channel; it is live from now on",
        metrics,
    );
}

/// The channel goes live without its history, a resume told why in `message` (a replay,
/// which Supabase ends without a word, just goes live).
pub fn unavailable_because(r: Request, message: &str, metrics: &Metrics) {
    metrics.history_unrecovered_total.increment(1);
    let sub = &r.key.topic;
    let system = matches!(r.ask, Ask::Resume { .. }).then(|| {
        system_frame(
            &r.reach,
            &json!({"extension": "broadcast", "status": "error", "channel": sub,
                    "recovered": false, "first_missing": null, "last_missing": null, "resent": 0,
                    "message": message}),
        )
    });
    // Nothing was sent from history: every held live frame passes.
    let (tx, _) = mpsc::channel(1);
    tokio::spawn(send(
        r,
        0,
        (Vec::new(), None),
        system,
        (0, Vec::new()),
        Carry::default(),
        tx,
    ));
}

/// Sends one channel's history (sequence, frame), paced so that it never takes more than
/// half the outbound queue; then opens its gate (`dedupe`: what live frames it drops),
/// `system` first. If the gate overflowed meanwhile, the join goes back to `again` for
/// another pass instead.
async fn send(
    r: Request,
    epoch: i64,
    (frames, mut held): (Vec<(i64, Message)>, Option<Held>),
    system: Option<Message>,
    dedupe: (i64, Vec<i64>),
    carry: Carry,
    again: mpsc::Sender<Request>,
) {
    let room = r.reach.max_capacity() / 2;
    let mut progress = Instant::now();
    for (seq, f) in frames {
        loop {
            if r.reach.gate_closed() || r.reach.is_closed() {
                return;
            }
            if r.reach.room() > room {
                break;
            }
            if progress.elapsed() > STALL_LIMIT {
                r.reach.close_gate();
                r.reach.cut_off();
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let bytes = f.len();
        if r.reach.send(f) != Sent::Queued {
            // A full queue closes the connection as too slow (`outbound`).
            r.reach.close_gate();
            return;
        }
        // Queued to the socket: the outbound queue's bound (MAX_OUTBOUND_BYTES) holds it now.
        if let Some(h) = &mut held {
            h.give_back(bytes);
        }
        // A persisted message the ring no longer holds has no position (sequence 0).
        if seq > 0 {
            r.reach.history_sent(At { epoch, seq });
        }
        progress = Instant::now();
    }
    let through = dedupe.0;
    let dropped_from = match r.reach.open_gate(epoch, dedupe, system) {
        Opened::ReadAgain(first) => first,
        Opened::Yes | Opened::Closed => return,
    };
    // After a resume's pass everything up to its read's end was sent; after a replay, only
    // what it replayed, so the next pass starts before the first live frame dropped.
    let from = if carry.skip.is_empty() || carry.from.is_some() {
        through
    } else {
        dropped_from - 1
    };
    if carry.passes >= MAX_PASSES {
        r.reach.close_gate();
        r.reach.cut_off();
        return;
    }
    let next = Request {
        ask: Ask::Resume { epoch, seq: from },
        carry: Some(carry),
        ..r
    };
    if let Err(e) = again.try_send(next) {
        let r = match e {
            mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
        };
        r.reach.close_gate();
        r.reach.cut_off();
    }
}

#[cfg(test)]
mod tests {
    use super::in_turn;

    /// Issue 39, H2: one address's hundred resumes were served before the next address's
    /// one. Addresses now take turns within a batch.
    #[test]
    fn one_address_s_resumes_came_before_every_other_address_s() {
        let batch = vec![("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("b", 2)];
        let served: Vec<(&str, i32)> = in_turn(batch, |r| r.0);
        assert_eq!(
            served,
            vec![("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("a", 3)]
        );
    }
}
