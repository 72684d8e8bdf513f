//! Supabase's replay served: the newest `limit` database-originated messages since `since`,
//! with `meta.replayed`.

use super::ask::Ask;
use super::budget;
use super::pace::send;
use super::read::{by_topic, distinct_keys, of_topic, Found, Walk};
use super::request::{Carry, Request, Served, With};
use super::source::Source;
use tokio_tungstenite::tungstenite::Message;

pub(super) async fn serve_replays(
    source: &impl Source,
    requests: Vec<Request>,
    (again, metrics, budget): With<'_>,
) -> Served {
    let epoch = source.epoch();
    let since = |r: &Request| match r.ask {
        Ask::Replay { since_ms, .. } => since_ms,
        _ => 0,
    };
    let min_since = requests.iter().map(since).min().unwrap_or(0);
    let keys = distinct_keys(&requests);
    let newest = super::ask::MAX_REPLAY as i32;
    let walk = Walk {
        from: 0,
        keys: &keys,
        since_ms: Some(min_since),
        newest,
        relayed: false,
        tables: None,
    };
    let mut read = match source.read(walk).await {
        Ok(r) => r,
        Err(e) => return Err((e, requests)),
    };
    if let Err(e) = source.add_persisted(&keys, min_since, &mut read).await {
        return Err((e, requests));
    }
    let index = by_topic(&read);
    for r in requests {
        let Ask::Replay { since_ms, limit } = r.ask else {
            continue;
        };
        let mine: Vec<&Found> = of_topic(&read, &index, &r.key)
            .filter(|f| f.committed_us >= since_ms.saturating_mul(1000))
            // Supabase's replay reads its table, which never held a dropped message.
            .filter(|f| !f.message.dropped)
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
