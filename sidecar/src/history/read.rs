//! One read of the queue's history for every waiting join (`realtime.history`), and the
//! persisted messages merged into it (`realtime.persisted_history`).
//!
//! A read is never cut short by size, so a resume's `recovered: true` means everything was
//! sent: it was once read in pages cut at 64 MB, and 80 messages of 1 MB came back as
//! `resent: 68, recovered: true` (now `resent: 80`, measured against a 256 MB queue;
//! `sidecar/tests/history.rs` sends 80 of 250 KB, what the suite's 32 MB queue holds). What
//! bounds a resume is its count and bytes (`resume`, `budget`), and the decoded bytes of a
//! table's changes per call (`realtime.drain_max_decoded_size`).

use super::request::Request;
use crate::config::Config;
use crate::frame::Vsn;
use crate::hub::{Payload, QueueMessage, TopicKey};
use crate::metrics::Metrics;
use crate::rows::{self, As, Columns, Entry};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::OnceLock;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;
use tokio_tungstenite::tungstenite::Message;

pub(super) const SQL: &str =
    "SELECT seq, kind, topic, event, payload::text AS payload, binary_payload, \
     private, (extract(epoch FROM committed_at) * 1000000)::int8 AS committed_us, id::text AS id, \
     lost_first, lost_last, origin \
     FROM realtime.history($1, $2, $3, to_timestamp($4::float8 / 1000), $5, $6, $7, $8)";

/// The newest persisted client broadcasts (`persist`) of the topics since a time, at most
/// Supabase's 25 per topic, not expired: what a replay adds from the table when the ring no
/// longer holds them.
pub(super) const PERSISTED_SQL: &str =
    "SELECT id::text AS id, topic, private, event, payload::text AS payload, \
     binary_payload, (extract(epoch FROM sent_at) * 1000000)::int8 AS committed_us \
     FROM realtime.persisted_history($1, $2, to_timestamp($3::float8 / 1000), $4)";

/// One message of a history call's result.
pub(super) struct Found {
    pub(super) key: TopicKey,
    pub(super) committed_us: i64,
    pub(super) message: QueueMessage,
    /// Its frame per serializer, encoded once for every client that gets it.
    pub(super) frames: [OnceLock<Option<Message>>; 2],
}

impl Found {
    pub(super) fn frame(&self, vsn: Vsn) -> Option<Message> {
        let i = usize::from(vsn == Vsn::V2);
        self.frames[i]
            .get_or_init(|| self.message.frame(vsn))
            .clone()
    }
}

/// A captured change of a history call, decoded.
pub(super) struct FoundChange {
    pub(super) seq: i64,
    /// The table as the queue names it (what a `cut` row names).
    pub(super) topic: String,
    pub(super) schema: String,
    pub(super) table: String,
    pub(super) data: String,
    /// `data` parsed, for the bindings' filters.
    pub(super) value: Value,
}

/// What one call of `realtime.history` returned.
#[derive(Default)]
pub(super) struct Read {
    pub(super) found: Vec<Found>,
    /// Changes of the tables asked for, in queue order.
    pub(super) changes: Vec<FoundChange>,
    /// (first, last) sequences evicted before the walk reached them.
    pub(super) gaps: Vec<(i64, i64)>,
    /// Every message up to this sequence was considered.
    pub(super) through: i64,
    /// Tables (as the queue names them) whose changes before a position were left out to
    /// bound the call's decoded bytes, with that position.
    pub(super) cuts: Vec<(String, i64)>,
}

/// Adds the persisted messages of `keys` since `since_ms` that the ring no longer holds
/// (no position: their sequence is 0), and puts everything in commit-time order.
pub(super) async fn add_persisted(
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
                dropped: false,
            },
            key,
            frames: [OnceLock::new(), OnceLock::new()],
        });
    }
    read.found.sort_by_key(|f| (f.committed_us, f.message.seq));
    Ok(())
}

/// One walk of the queue's history: the newest `newest` messages of each topic of `keys`
/// after `from` (committed at `since_ms` or later, when given), client broadcasts only when
/// `relayed`, and the captured changes of `tables`.
pub(super) struct Walk<'a> {
    pub(super) from: i64,
    pub(super) keys: &'a [TopicKey],
    pub(super) since_ms: Option<i64>,
    pub(super) newest: i32,
    pub(super) relayed: bool,
    pub(super) tables: Option<&'a [u32]>,
}

/// Reads the history of `walk`: the newest `walk.newest` messages of each topic, in one
/// call that walks to the end of what the queue has published (the extension keeps at most
/// `newest` per topic as it walks, so a call is never cut short by its size and the `end`
/// row is the queue's end: everything up to it was considered). What a request may ask for
/// is bounded by `newest`, so a resume from position 0 copies at most that many messages of
/// its topic, never the topic's whole retained history.
pub(super) async fn read(
    client: &Client,
    cfg: &Config,
    walk: Walk<'_>,
    epoch: i64,
    metrics: &Metrics,
) -> Result<Read, String> {
    let Walk {
        from,
        keys,
        since_ms,
        newest,
        relayed,
        tables,
    } = walk;
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
pub(super) fn found(committed_us: i64, message: QueueMessage) -> Found {
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

pub(super) fn distinct_keys(requests: &[Request]) -> Vec<TopicKey> {
    let mut keys: Vec<TopicKey> = requests.iter().map(|r| r.key.clone()).collect();
    keys.sort_by(|a, b| (&a.topic, a.private).cmp(&(&b.topic, b.private)));
    keys.dedup();
    keys
}

/// Each message's index per topic, in queue order.
pub(super) fn by_topic(read: &Read) -> HashMap<&TopicKey, Vec<usize>> {
    let mut map: HashMap<&TopicKey, Vec<usize>> = HashMap::new();
    for (i, f) in read.found.iter().enumerate() {
        map.entry(&f.key).or_default().push(i);
    }
    map
}

/// The messages of one topic, in queue order.
pub(super) fn of_topic<'a>(
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
