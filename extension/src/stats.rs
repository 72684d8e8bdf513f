//! `realtime.stats()` and `realtime.consumers()`: what the queue holds (and so how far back
//! a client's resume reaches: `oldest_seq`, `oldest_committed_at`) and how far each
//! consumer is behind.

use crate::shared::queue;
use pgrx::prelude::*;
use std::sync::atomic::Ordering::Relaxed;

#[pg_extern(volatile, parallel_safe)]
#[allow(clippy::type_complexity)]
fn stats() -> TableIterator<
    'static,
    (
        name!(epoch, TimestampWithTimeZone),
        name!(capacity_bytes, i64),
        name!(used_bytes, i64),
        name!(oldest_seq, i64),
        name!(last_seq, i64),
        name!(messages_enqueued, i64),
        name!(bytes_enqueued, i64),
        name!(transactions, i64),
        name!(messages_evicted, i64),
        name!(aborted_reservations, i64),
        name!(oversize_rejections, i64),
        name!(queue_full_errors, i64),
        name!(consumers, i32),
        name!(pending_bytes, i64),
        name!(oldest_pending_since, Option<TimestampWithTimeZone>),
        name!(oldest_committed_at, Option<TimestampWithTimeZone>),
        // Messages dropped when sent (`dropped.rs`), by reason.
        name!(dropped_invalid, i64),
        name!(dropped_too_large, i64),
        name!(dropped_queue_full, i64),
        name!(dropped_unauthorized, i64),
    ),
> {
    let q = queue();
    let ring = q.ring();
    let (used, oldest, last, evicted, pending, pending_since, oldest_at) = {
        let g = q.shared();
        let c = g.core();
        (
            c.head - c.tail,
            c.tail_seq,
            c.last_seq(),
            c.evicted,
            c.head - c.published,
            c.oldest_pending_since(&ring),
            c.oldest_committed_at(&ring),
        )
    };
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed) as i64;
    let c = &q.counters;
    TableIterator::once((
        TimestampWithTimeZone::try_from(q.epoch).expect("valid epoch"),
        q.capacity as i64,
        used as i64,
        oldest as i64,
        last as i64,
        n(&c.messages),
        n(&c.bytes),
        n(&c.transactions),
        evicted as i64,
        n(&c.aborted_after_reserve),
        n(&c.oversize_rejections),
        n(&c.queue_full_errors),
        q.slots().iter().filter(|s| s.in_use()).count() as i32,
        pending as i64,
        pending_since.and_then(|t| TimestampWithTimeZone::try_from(t).ok()),
        oldest_at.and_then(|t| TimestampWithTimeZone::try_from(t).ok()),
        n(&c.dropped_invalid),
        n(&c.dropped_too_large),
        n(&c.dropped_queue_full),
        n(&c.dropped_unauthorized),
    ))
}

#[pg_extern(volatile, parallel_safe)]
#[allow(clippy::type_complexity)]
fn consumers() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(confirmed_seq, i64),
        name!(last_read_seq, i64),
        name!(lag, i64),
        name!(gaps, i64),
        name!(lost_messages, i64),
        name!(delivered, i64),
        name!(active_pid, Option<i32>),
        name!(listening, Option<i32>),
    ),
> {
    let q = queue();
    let g = q.shared();
    let last = g.core().last_seq();
    let rows: Vec<_> = q
        .slots()
        .iter()
        .filter(|s| s.in_use())
        .map(|s| {
            let interest = q.interest_of(s);
            let confirmed = s.confirmed.load(Relaxed);
            let pid = s.pid.load(Relaxed);
            (
                s.name(),
                confirmed as i64,
                s.last_read.load(Relaxed) as i64,
                last.saturating_sub(confirmed) as i64,
                s.gaps.load(Relaxed) as i64,
                s.lost.load(Relaxed) as i64,
                s.delivered.load(Relaxed) as i64,
                (pid != 0).then_some(pid),
                // How many topics and tables it listens to; NULL: it receives everything.
                interest.filtering().then_some(interest.live() as i32),
            )
        })
        .collect();
    drop(g);
    TableIterator::new(rows)
}
