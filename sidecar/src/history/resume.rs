//! A resume served: each channel's share of a read, bounded (MAX_RESUME_MESSAGES, its
//! bytes), its changes checked, and the `system` message that says what it recovered.

use super::ask::Ask;
use super::budget;
use super::changes::{places, wanted, Checked};
use super::pace::{send, system_frame};
use super::read::{by_topic, distinct_keys, of_topic, Found, FoundChange, Walk};
use super::request::{Carry, CutBy, Request, Served, With};
use super::source::Source;
use crate::config::Config;
use crate::metrics::Metrics;
use serde_json::{json, Value};
use std::collections::HashMap;
use tokio_tungstenite::tungstenite::Message;

pub(super) async fn serve_resumes(
    source: &impl Source,
    cfg: &Config,
    requests: Vec<Request>,
    (again, metrics, budget): With<'_>,
) -> Served {
    let epoch = source.epoch();
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
    let tables = match source.change_tables(&requests).await {
        Ok(t) => t,
        Err(e) => return Err((e, requests)),
    };
    let walk = Walk {
        from,
        keys: &keys,
        since_ms: None,
        newest,
        relayed: true,
        tables: tables.as_deref(),
    };
    let read = match source.read(walk).await {
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
            match source.check(&r, c, &changes).await {
                Checked::Lost(e) => {
                    // The connection is gone: this request and the rest are served again on
                    // the next one.
                    source.finish().await;
                    let mut rest = vec![r];
                    rest.extend(pending);
                    return Err((e, rest));
                }
                Checked::Done {
                    frames,
                    withheld: w,
                    ..
                } => {
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
        let dropped: Vec<i64> = topic
            .iter()
            .filter(|f| f.message.seq >= cut && f.message.dropped)
            .map(|f| f.message.seq)
            .collect();
        let resent_broadcasts = frames.len() - dropped.len();
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
        if let (Some(&f), Some(&l)) = (dropped.first(), dropped.last()) {
            carry.dropped = Some(carry.dropped.map_or((f, l, dropped.len()), |(a, b, n)| {
                (a.min(f), b.max(l), n + dropped.len())
            }));
        }
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
    source.finish().await;
    Ok(())
}

/// The system message that ends a resume: recovered or not, and why not.
pub(super) fn resume_system(
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
    } else if let Some((first, last, n)) = carry.dropped {
        let dropped = if n == 1 {
            "message was"
        } else {
            "messages were"
        };
        let were = if resent == 1 { "was" } else { "were" };
        json!({"recovered": false, "first_missing": first, "last_missing": last, "dropped_messages": n,
               "message": format!("{n} {dropped} dropped when sent, after position {seq} (a system message in each one's place says why); the {resent} other {messages} after it {were} sent")})
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
