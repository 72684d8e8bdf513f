//! The history worker: answers the joins that asked for replay or resume, with one
//! `realtime.history` call per batch of joins (one walk of the queue's retained range for
//! all their topics, not one per client: a thousand clients of one topic rejoining after
//! a restart cost one walk), on its own connection, as the authorizer batches verdicts.
//! Each join's share is then sent to its socket by a task of its own, paced so that it
//! never fills more than half the socket's outbound queue (live messages of the
//! connection's other channels keep their room, and a long catch-up is not taken for a
//! slow client), and finally its gate opens (`crate::out`).
//!
//! The worker's rooms: `request` (what it is asked), `source` (the read seam: what serving
//! asks of the database, `Database` this worker's connection), `read` (one
//! `realtime.history` call and the persisted messages merged in), `resume` and `replay`
//! (each join's share, decided from what a `Source` answers and unit-tested from memory in
//! `tests`), `changes` (a resume's Postgres Changes checked), `pace` (the paced send and the
//! gate's opening), `expire` (what is kept past its retention: persisted messages, inserted rows).
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
use super::budget::Budget;
use super::expire::{expire_round, EXPIRE_EVERY};
use super::pace::unavailable;
use super::replay::serve_replays;
use super::request::Request;
use super::resume::serve_resumes;
use super::source::Database;
use crate::config::Config;
use crate::db_worker;
use crate::metrics::Metrics;
use crate::postgres_changes::deliver;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Most joins answered by one call.
const BATCH: usize = 10_000;

/// How long a batch that found other joins waiting gathers more before its walk
/// (`db_worker::gather_storm`). A storm of rejoins (10,000 clients after a network blip)
/// is then served by a few dozen walks of the ring instead of hundreds of small ones, each
/// of which walks the whole range since the oldest position asked for; a lone resume waits
/// for nothing.
const STORM_GATHER: Duration = Duration::from_millis(50);

const EPOCH_SQL: &str =
    "SELECT (extract(epoch FROM epoch) * 1000000)::int8 AS epoch FROM realtime.stats()";

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
        let statements = deliver::Statements::default();
        let source = Database {
            client: &client,
            cfg: &cfg,
            epoch,
            metrics: &metrics,
            statements: &statements,
            asked: Default::default(),
        };
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
                        expire_round(&client, &cfg, &metrics).await;
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
                let with = (&again, &*metrics, budget);
                let served = if resume {
                    serve_resumes(&source, &cfg, fair(group), with).await
                } else {
                    serve_replays(&source, group, with).await
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
