//! The first stage, on the drain's path with no database call: which channels each change
//! of a batch matched, grouped by table into the sets the checks take.

use super::super::filter::Change;
use super::super::subscribers::Subscribers;
use super::outgoing::{withhold_failed, Candidate, Outgoing, Table};
use crate::metrics::Metrics;
use crate::reason::Notice;
use serde_json::{Map, Value};
use std::collections::HashMap;
use tokio_tungstenite::tungstenite::Message;

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
pub(super) const PARSE_PER_YIELD: usize = 256;

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
pub(super) struct Head<'a> {
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

/// A change the extension could not decode (its table dropped or altered before it was
/// drained): the channels that named that table are told it was lost and why. A channel
/// listening to whole schemas is told only that a change was lost: its role may not read
/// that table, so neither the name nor the error is its to learn.
pub(super) fn report_undeliverable(
    subscribers: &Subscribers,
    data: &Value,
    out: &mut Vec<Outgoing>,
) {
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

/// Withholds a table's candidates with `why` without asking the database (the checks'
/// backlog is full): each channel is told once, among `frames`.
pub(crate) fn withhold(set: &TableSet, why: &str, metrics: &Metrics, frames: &mut [Vec<Outgoing>]) {
    let table = Table {
        schema: &set.schema,
        name: &set.table,
    };
    withhold_failed(&set.candidates, table, why, metrics, frames);
}
