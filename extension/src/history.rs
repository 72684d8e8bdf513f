//! `realtime.history`: what the queue still holds for some topics, for the sidecars' replay
//! (Supabase's `broadcast.replay`) and resume (a client's last position) paths.
//!
//! A consumer slot reads everything in order; a rejoining client wants only its topic's
//! messages after its position, and many clients on few topics rejoin at once after a
//! sidecar restart. So one call takes a set of topics and one starting sequence, walks the
//! retained range once, and returns every matching message; the sidecar splits the result
//! among the clients that asked. The walk (from the tail: the records up to the position
//! are skipped in the same steps) holds the queue lock shared for a bounded number of
//! records at a time (committing writers need it exclusively); if the ring evicted
//! records while the lock was released, the loss is reported as a gap row, as a drain
//! reports it, so a result is never silently incomplete.
//!
//! Captured row changes are returned only for the tables a call names (`changes`: a
//! resuming channel's Postgres Changes bindings), decoded into Supabase's `data` as the
//! drain decodes them, at the call (so with the table's columns as they are now); the
//! sidecar then checks them as it checks live changes, as the rejoining channel's role
//! stands now.

use crate::capture::relid_of;
use crate::consumer::{gap_row, marker_row, message_row, DrainRow};
use crate::errors;
use crate::message::{
    MessageView, RecordHeader, FLAG_CHANGE, FLAG_PERSIST, FLAG_PRESENCE, FLAG_PRIVATE, HEADER_LEN,
};
use crate::queue::{QueueCore, Ring};
use crate::shared::queue;
use pgrx::prelude::*;
use std::collections::{HashMap, VecDeque};

/// Records walked per hold of the queue lock: a fraction of a millisecond.
const WALK_PER_LOCK: usize = 16_384;
/// Bytes of matching records copied per hold of the queue lock at most (beyond the first
/// record): copying 16,384 matching records of a kilobyte or two under one hold kept
/// committing writers waiting for tens of milliseconds (two clients resuming a 20 MB topic
/// from seq 0 every two seconds took the soak's ordinary broadcasts from p99 4 to 27 ms).
const COPY_PER_LOCK: usize = 1 << 20;
/// Bytes of matching records copied per call at most (beyond the first): a caller that
/// gets fewer messages than exist pages on from the `end` row.
const MAX_BYTES: usize = 64 << 20;

/// What one call asks for: which records match, and how many to keep.
struct Wanted {
    /// Only messages after this sequence.
    after: u64,
    topics: HashMap<(bool, Vec<u8>), usize>,
    /// Tables whose captured changes are wanted, each with its index after the topics'.
    changes: HashMap<u32, usize>,
    since: Option<i64>,
    relayed: bool,
    newest: Option<usize>,
    max_messages: usize,
}

impl Wanted {
    /// The index of the topic the record at `off` belongs to, if it matches.
    fn matches(&self, ring: &Ring, off: u64, h: &RecordHeader) -> Option<usize> {
        if self.since.is_some_and(|s| h.committed_at < s) {
            return None;
        }
        if h.flags & FLAG_CHANGE != 0 {
            if self.changes.is_empty() {
                return None;
            }
            // The table is the payload's first four bytes (`capture.rs`): read only those.
            let mut relid = [0u8; 4];
            let at = HEADER_LEN as u64 + h.topic_len as u64 + h.event_len as u64;
            if h.payload_len < 4 {
                return None;
            }
            ring.read(off + at, &mut relid);
            return self.changes.get(&relid_of(&relid)?).copied();
        }
        let relayed = h.origin != 0 && h.flags & FLAG_PERSIST == 0;
        if h.flags & FLAG_PRESENCE != 0 || (!self.relayed && relayed) {
            return None;
        }
        let mut topic = vec![0u8; h.topic_len as usize];
        ring.read(off + HEADER_LEN as u64, &mut topic);
        self.topics
            .get(&(h.flags & FLAG_PRIVATE != 0, topic))
            .copied()
    }
}

/// What a walk found: messages (whole records, in queue order, or per topic when only the
/// newest are kept), gaps, and the sequence through which everything was considered.
#[derive(Default)]
struct Found {
    /// (first, last) sequences evicted before the walk reached them.
    gaps: Vec<(u64, u64)>,
    records: Vec<Vec<u8>>,
    per_topic: HashMap<usize, VecDeque<Vec<u8>>>,
    bytes: usize,
    through: u64,
    /// Tables the call asked changes of (each gets a share of the decoded bytes).
    tables: usize,
}

/// One hold of the lock: from `off`, walks up to WALK_PER_LOCK records, copying up to
/// COPY_PER_LOCK bytes of matching ones. Returns the offset
/// to continue from, or None when the walk is over (the end of what is published, or the
/// call's limits reached).
fn walk_once(core: &QueueCore, ring: &Ring, w: &Wanted, off: u64, f: &mut Found) -> Option<u64> {
    let mut full = false;
    let mut copied = 0;
    let next = core.walk(ring, off, WALK_PER_LOCK, |at, h| {
        if h.seq <= w.after {
            return true;
        }
        if let Some(topic) = w.matches(ring, at, h) {
            let mut rec = vec![0u8; h.len as usize];
            ring.read(at, &mut rec);
            copied += rec.len();
            match w.newest {
                Some(n) => {
                    let kept = f.per_topic.entry(topic).or_default();
                    kept.push_back(rec);
                    if kept.len() > n {
                        kept.pop_front();
                    }
                }
                None => {
                    f.bytes += rec.len();
                    f.records.push(rec);
                    full = f.records.len() >= w.max_messages || f.bytes >= MAX_BYTES;
                }
            }
        }
        f.through = h.seq;
        !full && copied < COPY_PER_LOCK
    });
    if full {
        return None;
    }
    if next >= core.published {
        f.through = core.last_seq();
        return None;
    }
    Some(next)
}

/// Returns the retained messages of `topics` (each with its `private` flag) committed after
/// `after_seq`, in queue order, followed by one row of kind 'end' whose seq is the last
/// sequence the walk considered: every matching message up to it was returned, unless a
/// row of kind 'gap' says it was evicted first. With `since`, only messages committed at
/// or after it; with `relayed` false, no client broadcasts (relayed by a sidecar) but those
/// sent with `persist`; with
/// `newest`, only the newest that many per topic. At most `max_messages` are returned; when
/// the limit cut the walk short, the 'end' row says where to go on from. Captured row
/// changes are returned only of the tables in `changes` (with `newest`, the newest that
/// many per table), as rows of kind 'change' like the drain's: topic is the table, event
/// the type, payload Supabase's `data`, decoded now. They are never checked here: the
/// caller authorizes them per subscriber, as live changes are. Decoded change data is
/// bounded by `realtime.drain_max_decoded_size` (see `rows`): with `newest`, a table whose
/// newest changes decode to more than its share gets a row of kind 'cut' (topic: the table,
/// seq: its first change returned), its older ones left out. Presence diffs are never
/// returned: a joining channel gets the current presence state instead.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."history"(after_seq bigint, topics text[], private boolean[], since timestamptz DEFAULT NULL, newest integer DEFAULT NULL, relayed boolean DEFAULT true, max_messages integer DEFAULT 100000, changes oid[] DEFAULT NULL)
RETURNS TABLE(seq bigint, kind text, topic text, event text, payload json, binary_payload bytea, private boolean, committed_at timestamptz, id uuid, origin bigint, lost_first bigint, lost_last bigint)
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn history(
    after_seq: i64,
    topics: Vec<Option<String>>,
    private: Vec<Option<bool>>,
    since: Option<TimestampWithTimeZone>,
    newest: Option<i32>,
    relayed: bool,
    max_messages: i32,
    changes: Option<Vec<Option<pg_sys::Oid>>>,
) -> TableIterator<
    'static,
    (
        name!(seq, i64),
        name!(kind, &'static str),
        name!(topic, Option<String>),
        name!(event, Option<String>),
        name!(payload, Option<String>),
        name!(binary_payload, Option<Vec<u8>>),
        name!(private, Option<bool>),
        name!(committed_at, Option<TimestampWithTimeZone>),
        name!(id, Option<pgrx::Uuid>),
        name!(origin, Option<i64>),
        name!(lost_first, Option<i64>),
        name!(lost_last, Option<i64>),
    ),
> {
    if after_seq < 0 {
        errors::invalid("after_seq must not be negative", None);
    }
    if topics.len() != private.len() {
        errors::invalid("topics and private must have the same length", None);
    }
    if newest.is_some_and(|n| n < 1) {
        errors::invalid("newest must be at least 1", None);
    }
    if max_messages < 1 {
        errors::invalid("max_messages must be at least 1", None);
    }
    let n_topics = topics.len();
    let mut wanted = Wanted {
        after: after_seq as u64,
        topics: HashMap::new(),
        changes: HashMap::new(),
        since: since.map(|t| t.into_inner()),
        relayed,
        newest: newest.map(|n| n as usize),
        max_messages: max_messages as usize,
    };
    for (i, (t, p)) in topics.into_iter().zip(private).enumerate() {
        let (Some(t), Some(p)) = (t, p) else {
            errors::invalid("topics and private must not contain NULL", None);
        };
        wanted.topics.entry((p, t.into_bytes())).or_insert(i);
    }
    // Tables are numbered after every topic, so a table never shares a topic's `newest`.
    let first_table = n_topics;
    for (i, oid) in changes.into_iter().flatten().enumerate() {
        let Some(oid) = oid else {
            errors::invalid("changes must not contain NULL", None);
        };
        wanted
            .changes
            .entry(oid.to_u32())
            .or_insert(first_table + i);
    }

    let q = queue();
    let ring = q.ring();
    let mut found = Found {
        through: after_seq as u64,
        tables: wanted.changes.len(),
        ..Found::default()
    };
    // Where the walk starts: the tail, the records up to `after_seq` skipped in the same
    // bounded steps (finding the position first would walk them under one hold of the
    // lock, which writers would wait for).
    let mut off = {
        let g = q.shared();
        let core = g.core();
        let want = after_seq as u64 + 1;
        if want > core.next_seq {
            // A position this queue never reached (another epoch's): nothing after it.
            found.through = core.last_seq();
            None
        } else {
            if want < core.tail_seq {
                found.gaps.push((want, core.tail_seq - 1));
            }
            Some(core.tail)
        }
    };
    while let Some(at) = off {
        let g = q.shared();
        let core = g.core();
        let at = if at < core.tail {
            // Evicted while the lock was released: say what was lost, go on from the tail.
            if found.through + 1 < core.tail_seq {
                found.gaps.push((found.through + 1, core.tail_seq - 1));
            }
            core.tail
        } else {
            at
        };
        off = walk_once(core, &ring, &wanted, at, &mut found);
        drop(g);
        pgrx::check_for_interrupts!();
    }
    TableIterator::new(rows(found))
}

/// The rows of what the walk found, its changes decoded, within
/// `realtime.drain_max_decoded_size` of decoded change data (issue 39, H4: a table's 10,001
/// newest changes of a row that decodes to 150 kB were 1.5 GB in one call, and as much
/// again in the sidecar):
/// - with `newest`, each table of the call gets an equal share of it: its changes are
///   decoded newest first, and those older than the one that passed its share (at least
///   one is kept) are left out, said by a row of kind 'cut' (topic: the table; seq: the
///   first of its changes that was kept), so the caller knows that table's history after
///   `after_seq` is complete only from there on;
/// - without, the rows end after the change that passed it, and the 'end' row says where
///   to go on from.
fn rows(found: Found) -> Vec<DrainRow> {
    let budget = crate::gucs::drain_max_decoded_bytes();
    let mut decoder = crate::change::Decoder::default();
    let mut through = found.through;
    let mut records = found.records;
    let mut decoded: HashMap<u64, String> = HashMap::new();
    let mut cuts: Vec<(u64, String)> = Vec::new();
    if !found.per_topic.is_empty() {
        let tables: Vec<VecDeque<Vec<u8>>> = found
            .per_topic
            .into_values()
            .map(|mut kept| {
                let changes = kept
                    .front()
                    .is_some_and(|r| MessageView::parse(r).is_change());
                if changes {
                    let share = budget / found.tables.max(1);
                    let mut used = 0usize;
                    let mut keep = kept.len();
                    for (i, rec) in kept.iter().enumerate().rev() {
                        let m = MessageView::parse(rec);
                        let data = change_data(&m, &mut decoder);
                        used += data.len();
                        decoded.insert(m.header.seq, data);
                        keep = i;
                        if used >= share {
                            break;
                        }
                    }
                    if keep > 0 {
                        let first = MessageView::parse(&kept[keep]);
                        cuts.push((first.header.seq, first.topic.to_owned()));
                        kept.drain(..keep);
                    }
                }
                kept
            })
            .collect();
        records = tables.into_iter().flatten().collect();
        records.sort_by_key(|r| RecordHeader::decode(&r[..HEADER_LEN]).seq);
    } else {
        let mut used = 0usize;
        for (i, rec) in records.iter().enumerate() {
            let m = MessageView::parse(rec);
            if !m.is_change() {
                continue;
            }
            let data = change_data(&m, &mut decoder);
            used += data.len();
            decoded.insert(m.header.seq, data);
            if used >= budget && i + 1 < records.len() {
                through = m.header.seq;
                records.truncate(i + 1);
                break;
            }
        }
    }
    let mut out: Vec<DrainRow> =
        Vec::with_capacity(records.len() + found.gaps.len() + cuts.len() + 1);
    let mut gaps = found.gaps.into_iter().filter(|g| g.0 <= through).peekable();
    for rec in &records {
        let m = MessageView::parse(rec);
        while let Some(&(first, last)) = gaps.peek() {
            if first > m.header.seq {
                break;
            }
            out.push(gap_row(first, last));
            gaps.next();
        }
        match decoded.remove(&m.header.seq) {
            Some(data) => out.push(change_row(&m, data)),
            None => out.push(message_row(&m)),
        }
    }
    out.extend(gaps.map(|(first, last)| gap_row(first, last.min(through))));
    for (seq, table) in cuts {
        let mut row = marker_row(seq, "cut");
        row.2 = Some(table);
        out.push(row);
    }
    out.push(marker_row(through, "end"));
    out
}

/// A change's `data`, decoded now, after the walk, with no lock held (decoding reads the
/// table's catalog entry).
fn change_data(m: &MessageView, decoder: &mut crate::change::Decoder) -> String {
    decoder.record(m)
}

/// A row of kind 'change', as `realtime.drain` returns one.
fn change_row(m: &MessageView, data: String) -> DrainRow {
    (
        m.header.seq as i64,
        "change",
        Some(m.topic.to_owned()),
        Some(m.event.to_owned()),
        Some(data),
        None,
        None,
        TimestampWithTimeZone::try_from(m.header.committed_at).ok(),
        None,
        None,
        None,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::tests::ring;

    #[test]
    fn a_hold_of_the_lock_copies_about_a_mebibyte_of_matches_and_the_walk_goes_on() {
        let mut r = ring(8 << 20);
        let big = "m".repeat(300_000);
        r.commit(&[big.as_str(); 10]).unwrap();
        let w = Wanted {
            after: 0,
            topics: HashMap::from([((false, b"t".to_vec()), 0)]),
            changes: HashMap::new(),
            since: None,
            relayed: true,
            newest: None,
            max_messages: 100,
        };
        let mut f = Found::default();
        let mut holds = Vec::new();
        let mut off = Some(r.core.tail);
        while let Some(at) = off {
            off = walk_once(&r.core, &r.ring, &w, at, &mut f);
            holds.push(f.records.len());
        }
        // 300 KB records: the fourth passes a mebibyte, and the hold ends after it.
        assert_eq!(holds, vec![4, 8, 10]);
        assert_eq!(f.through, 10);
    }
}
