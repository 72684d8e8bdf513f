//! The pattern stage: the `like`, `ilike`, `match` and `imatch` filters judged by Postgres
//! (`realtime.match_patterns`), each pattern under its own budget.

use super::super::pattern_calls;
use super::lookup::{DbError, Lookup};
use super::outgoing::{failure, timed_out, Candidate, Columns, Limits, Outgoing, Table};
use crate::metrics::Metrics;
use crate::reason::Notice;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Keeps, of each candidate's bindings, those whose pattern conditions hold,
/// as the database judges them in calls for the table (`realtime.match_patterns`,
/// `pattern_calls`). A
/// binding whose pattern could not be judged (over its time budget, or the call failed) is
/// dropped and its channel told; a candidate left without bindings is withheld. A lost
/// connection is noted in `lost` for the caller.
#[allow(clippy::too_many_arguments)]
pub(super) async fn match_patterns<T>(
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
    let mut owners: HashMap<crate::out::ConnId, Vec<i32>> = HashMap::new();
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
pub(super) fn subject(data: Option<&Value>, column: &str) -> Option<String> {
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
