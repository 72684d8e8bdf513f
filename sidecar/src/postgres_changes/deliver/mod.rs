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
//! its loop, then `check` per table on the check pool (`pool`, connections of its own),
//! off the drain's path; the channels waiting for a check hold their later frames in queue
//! order (`crate::out`, its slots). `prepare` runs both for one set of changes at once, on any
//! `Lookup`.

mod authorize;
mod lookup;
mod matching;
mod outgoing;
mod patterns;
mod shape;
#[cfg(test)]
mod tests;

use authorize::authorize;
pub(crate) use lookup::{Db, Lookup, Statements};
pub(crate) use matching::{matched, withhold, Matched, TableSet};
use outgoing::FrameKey;
pub(crate) use outgoing::{withhold_failed, Candidate, Limits, Outgoing, Prepared, Table};
use shape::{common_select, shape};

use super::subscribers::Subscribers;
use crate::metrics::Metrics;
use serde_json::Value;
use std::collections::HashMap;
use tokio_tungstenite::tungstenite::Message;

/// The frames for each change of a batch (`datas`: each change's `data` JSON, in queue
/// order), in the same order: matched, then checked table by table on `db`. A check that
/// could not be made withholds what it did not decide (its channels get a `system` notice
/// among the frames, at the first change withheld from them); when it found the connection
/// lost, `lost` says so and the other tables' checks are not tried (their changes are
/// withheld the same way). The drain runs the same steps apart (`matched`, then `check` per
/// table on the pool, `pool`); this whole is for one set of changes checked at once (a
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
