//! The RLS stage: one `realtime.visible` call per table for the rows each identity may see,
//! in chunks no call can grow past (`POLL_MAX_CHANGES`, `CHANGES_CHECK_MAX_IDENTITIES`).

use super::lookup::{Lookup, VisibleCall, VisibleRow};
use super::outgoing::{
    failure, timed_out, withhold_failed, Candidate, Columns, Kept, Limits, Outgoing, Table,
};
use super::patterns::match_patterns;
use super::shape::key_only;
use crate::metrics::Metrics;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// Keeps the candidates of one table that may see their change, within the table's
/// budget. Channels whose check could not be made are told; `lost` is set when it found
/// the connection gone.
#[allow(clippy::too_many_arguments)]
pub(super) async fn authorize(
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
pub(super) struct Built {
    call: VisibleCall,
    identities: Vec<i32>,
    records: Vec<i32>,
}

/// Marks the pairs a call's answer says are visible (`distinct`: the pairs as (record,
/// identity), sorted); an identity's error is counted.
pub(super) fn read_visible(
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
pub(super) fn chunks_of(pairs: &[(i32, i32)], limits: &Limits) -> (Vec<(i32, i32)>, Vec<usize>) {
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
