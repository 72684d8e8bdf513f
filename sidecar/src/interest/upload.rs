//! The interest worker: one connection that uploads whatever the channels' held keys
//! changed since its last round in one `realtime.listen`/`realtime.unlisten` call, replaces the
//! database's set at each (re)connection, falls back to `realtime.listen_all` when the set is
//! refused for its size, and splits an upload the database refuses for its input down to
//! the keys that sank it (`isolating`).

use super::{Interest, Key};
use crate::config::Config;
use crate::db_worker;
use crate::metrics::Metrics;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_postgres::Client;

const LISTEN_SQL: &str = "SELECT realtime.listen($1, $2::text[], $3::text[], $4, $5) AS keys";

const UNLISTEN_SQL: &str = "SELECT realtime.unlisten($1, $2::text[], $3::text[], $4) AS keys";

/// The keys as `realtime.listen` takes them: topics, tables, all tables.
fn split(keys: impl IntoIterator<Item = Key>) -> (Vec<String>, Vec<String>, bool) {
    let (mut topics, mut tables, mut all) = (Vec::new(), Vec::new(), false);
    for k in keys {
        match k {
            Key::Topic(t) => topics.push(t),
            Key::Table(t) => tables.push(t),
            Key::AllTables => all = true,
        }
    }
    (topics, tables, all)
}

/// Keeps the database's copy of `interest` current until shutdown.
pub async fn worker(
    cfg: Arc<Config>,
    interest: Arc<Interest>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let Some(client) =
            db_worker::connect_retrying(&cfg, "interest", &mut shutdown, || {}).await
        else {
            return;
        };
        match session(&cfg, &interest, &metrics, &client, &mut shutdown).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "interest connection failed; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

/// One connection: the whole set, then what changes, until an error or shutdown.
async fn session(
    cfg: &Config,
    interest: &Interest,
    metrics: &Metrics,
    client: &Client,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), tokio_postgres::Error> {
    let consumer = &cfg.consumer;
    // The drainer may not have made the slot yet; making it here is the same call.
    client
        .query_one("SELECT realtime.create_consumer($1)", &[consumer])
        .await?;
    let up = Uploader {
        client,
        listen: client.prepare(LISTEN_SQL).await?,
        consumer,
        interest,
    };
    let unlisten = client.prepare(UNLISTEN_SQL).await?;
    let mut stored: HashSet<Key> = HashSet::new();
    let mut whole = true;
    loop {
        if interest.disabled() {
            // The drainer cleared the slot's filter.
            metrics.listened_keys.set(f64::NAN);
            let _ = shutdown.changed().await;
            return Ok(());
        }
        if interest.given_up() {
            metrics.listened_keys.set(f64::NAN);
            if interest.fits_again() {
                whole = true;
            } else {
                tokio::select! {
                    _ = interest.changed.notified() => continue,
                    _ = shutdown.changed() => return Ok(()),
                }
            }
        }
        let (round, count) = if whole {
            let (round, keys) = interest.take_all();
            let Some((count, uploaded)) = up.isolating(keys.into_iter().collect(), true).await?
            else {
                continue;
            };
            whole = false;
            let count = count.unwrap_or(uploaded.len() as i32);
            stored = uploaded;
            (round, count)
        } else {
            let (round, add, drop) = interest.take_changes(&stored);
            let mut count = None;
            if !drop.is_empty() {
                let (topics, tables, all) = split(drop.iter().cloned());
                let row = client
                    .query_one(&unlisten, &[consumer, &topics, &tables, &all])
                    .await?;
                count = Some(row.get::<_, i32>("keys"));
                for k in &drop {
                    stored.remove(k);
                }
            }
            if !add.is_empty() {
                let Some((n, uploaded)) = up.isolating(add, false).await? else {
                    continue;
                };
                count = Some(n.unwrap_or(stored.len() as i32));
                stored.extend(uploaded);
            }
            (round, count.unwrap_or(stored.len() as i32))
        };
        metrics.listened_keys.set(count as f64);
        interest.applied(round);
        tokio::select! {
            _ = interest.changed.notified() => {}
            _ = shutdown.changed() => return Ok(()),
        }
    }
}

/// The worker's uploads on its connection.
struct Uploader<'a> {
    client: &'a Client,
    listen: tokio_postgres::Statement,
    consumer: &'a str,
    interest: &'a Interest,
}

/// How one `realtime.listen` call ended.
enum Listened {
    /// How many keys the slot listens to now.
    Count(i32),
    /// More keys than the database takes: the slot now receives everything.
    TooMany,
    /// The database refused the call for its input (its message).
    Refused(String),
}

/// One `realtime.listen` call: the worker's connection, or a test's stand-in, so the
/// splitting below is tested without a database.
trait ListenCall {
    async fn call(&self, keys: &[Key], reset: bool) -> Result<Listened, tokio_postgres::Error>;
}

impl ListenCall for Uploader<'_> {
    async fn call(&self, keys: &[Key], reset: bool) -> Result<Listened, tokio_postgres::Error> {
        Uploader::call(self, keys, reset).await
    }
}

/// Uploads `keys` (first forgetting the slot's set, with `reset`), splitting a call the
/// database refuses for its input down to the keys that sank it, which are refused to their
/// joins (`Interest::refuse`). Some((keys the slot listens to, when a call went through),
/// the keys uploaded); None when the database refused that many keys (the caller then
/// makes the slot receive everything). Err: the connection is lost.
async fn isolating(
    db: &impl ListenCall,
    interest: &Interest,
    keys: Vec<Key>,
    reset: bool,
) -> Result<Option<(Option<i32>, HashSet<Key>)>, tokio_postgres::Error> {
    let mut uploaded = HashSet::new();
    let mut count = None;
    // Halves in order; only the first call of all forgets the slot's set.
    let mut work = vec![(keys, reset)];
    while let Some((mut part, reset)) = work.pop() {
        match db.call(&part, reset).await? {
            Listened::Count(n) => {
                count = Some(n);
                uploaded.extend(part);
            }
            Listened::TooMany => return Ok(None),
            Listened::Refused(why) if part.len() <= 1 => {
                if let Some(k) = part.pop() {
                    interest.refuse(k, why);
                }
                if reset {
                    // The reset still has to happen, whatever the key.
                    if let Listened::Count(n) = db.call(&[], true).await? {
                        count = Some(n);
                    }
                }
            }
            Listened::Refused(why) => {
                tracing::debug!(error = %why, keys = part.len(), "interest upload refused; splitting");
                let back = part.split_off(part.len() / 2);
                work.push((back, false));
                work.push((part, reset));
            }
        }
    }
    Ok(Some((count, uploaded)))
}

impl Uploader<'_> {
    /// `isolating` on this connection; the slot told to receive everything when the
    /// database refuses that many keys.
    async fn isolating(
        &self,
        keys: Vec<Key>,
        reset: bool,
    ) -> Result<Option<(Option<i32>, HashSet<Key>)>, tokio_postgres::Error> {
        match isolating(self, self.interest, keys, reset).await? {
            Some(done) => Ok(Some(done)),
            None => {
                self.receive_everything().await?;
                Ok(None)
            }
        }
    }

    async fn call(&self, keys: &[Key], reset: bool) -> Result<Listened, tokio_postgres::Error> {
        let (topics, tables, all) = split(keys.iter().cloned());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&self.consumer, &topics, &tables, &all, &reset];
        match self.client.query_one(&self.listen, &params).await {
            Ok(row) => Ok(Listened::Count(row.get("keys"))),
            Err(e) if too_many(&e) => {
                tracing::warn!(error = %e, "the database refuses this many topics for one consumer; this sidecar now receives every message");
                Ok(Listened::TooMany)
            }
            // An error on a connection still open is the database refusing this input (a
            // cancel is not: the call is tried again on a new connection).
            Err(e)
                if !self.client.is_closed()
                    && e.as_db_error().is_some()
                    && e.code() != Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) =>
            {
                let why = e.as_db_error().map(|d| d.message().to_owned());
                Ok(Listened::Refused(why.unwrap_or_default()))
            }
            Err(e) => Err(e),
        }
    }

    /// The database refused the set: the slot is told to return everything, and only then
    /// are the joins waiting for this round answered (a reply before would let the drain
    /// skip what commits after it).
    async fn receive_everything(&self) -> Result<(), tokio_postgres::Error> {
        self.client
            .execute("SELECT realtime.listen_all($1)", &[&self.consumer])
            .await?;
        self.interest.give_up_filtering();
        Ok(())
    }
}

fn too_many(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::CONFIGURATION_LIMIT_EXCEEDED)
}

#[cfg(test)]
mod tests {
    use super::super::NotReady;
    use super::*;
    use std::sync::Mutex;

    fn topic(t: &str) -> Key {
        Key::Topic(t.to_owned())
    }

    #[tokio::test]
    async fn a_new_key_waits_for_its_round_and_a_held_one_does_not() {
        let i = Interest::new(true);
        let (a1, round) = i.hold(vec![topic("a")]);
        assert_eq!(round, Some(1), "a first hold waits for the next upload");
        // A second hold of a key not yet uploaded waits for the same round.
        let (a2, again) = i.hold(vec![topic("a")]);
        assert_eq!(again, Some(1));
        let (r, keys) = i.take_all();
        assert_eq!((r, keys.len()), (1, 1));
        assert!(a1.ready(1, Duration::from_millis(10)).await.is_err());
        i.applied(1);
        assert!(a1.ready(1, Duration::from_millis(10)).await.is_ok());
        let (_a3, now) = i.hold(vec![topic("a")]);
        assert_eq!(now, None, "uploaded: no wait");
        drop((a1, a2));
    }

    #[test]
    fn only_the_last_release_drops_a_key_and_a_quick_rejoin_keeps_it() {
        let i = Interest::new(true);
        let (a1, _) = i.hold(vec![topic("a"), Key::AllTables]);
        let (a2, _) = i.hold(vec![topic("a")]);
        let (r, stored) = i.take_all();
        i.applied(r);
        drop(a1);
        let (_, add, drop_) = i.take_changes(&stored);
        assert!(add.is_empty());
        assert_eq!(drop_, vec![Key::AllTables], "'a' is still held by a2");
        drop(a2);
        // Left and joined again before the worker looked: nothing to upload, and the
        // rejoin waits for the next round all the same.
        let (_a4, round) = i.hold(vec![topic("a")]);
        assert_eq!(round, Some(3));
        let stored: HashSet<Key> = [topic("a")].into();
        let (r, add, drop_) = i.take_changes(&stored);
        assert_eq!((r, add.len(), drop_.len()), (3, 0, 0));
    }

    #[test]
    fn a_key_held_after_the_worker_took_its_round_waits_for_the_next() {
        let i = Interest::new(true);
        let (r, _) = i.take_all();
        assert_eq!(r, 1);
        let (_b, round) = i.hold(vec![topic("b")]);
        assert_eq!(round, Some(2), "round 1 was taken before b was held");
    }

    #[tokio::test]
    async fn unfiltered_holds_are_ready_at_once_and_giving_up_releases_waiters() {
        let off = Interest::new(false);
        assert_eq!(off.hold(vec![topic("a")]).1, None);
        let on = Interest::new(true);
        let (a, round) = on.hold(vec![topic("a")]);
        on.give_up_filtering();
        assert!(a
            .ready(round.unwrap(), Duration::from_millis(10))
            .await
            .is_ok());
        assert_eq!(on.hold(vec![topic("b")]).1, None);
    }

    #[test]
    fn filtering_comes_back_once_fewer_keys_are_held_than_were_refused() {
        let i = Interest::new(true);
        let (a, _) = i.hold(vec![topic("a")]);
        let (b, _) = i.hold(vec![topic("b")]);
        i.give_up_filtering();
        assert!(i.given_up() && !i.fits_again());
        // Held while everything is received: ready at once, and counted.
        let (c, now) = i.hold(vec![topic("c")]);
        assert_eq!(now, None);
        drop((a, b));
        assert!(i.fits_again(), "1 key held, 2 were refused");
        let (round, keys) = i.take_all();
        assert_eq!(keys, [topic("c")].into());
        assert!(
            !i.given_up(),
            "filtering again: a new hold waits for a round"
        );
        let (_d, wait) = i.hold(vec![topic("d")]);
        assert_eq!(wait, Some(round + 1));
        drop(c);
    }

    /// Refuses every call holding table "bad"; counts the calls.
    struct Refusing {
        calls: std::sync::atomic::AtomicUsize,
        resets: Mutex<Vec<bool>>,
    }

    impl ListenCall for Refusing {
        async fn call(&self, keys: &[Key], reset: bool) -> Result<Listened, tokio_postgres::Error> {
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.resets.lock().unwrap().push(reset);
            if keys.contains(&Key::Table("bad".into())) {
                return Ok(Listened::Refused("invalid byte sequence".into()));
            }
            Ok(Listened::Count(keys.len() as i32))
        }
    }

    #[tokio::test]
    async fn a_refused_upload_refuses_its_bad_key_alone_and_uploads_the_rest() {
        let i = Interest::new(true);
        let good_keys: Vec<Key> = (0..64).map(|n| topic(&n.to_string())).collect();
        let (bad, round) = i.hold(vec![topic("0"), Key::Table("bad".into())]);
        let (good, _) = i.hold(good_keys.clone());
        let mut keys = good_keys;
        keys.insert(40, Key::Table("bad".into()));
        let db = Refusing {
            calls: 0.into(),
            resets: Mutex::new(Vec::new()),
        };
        let (_, uploaded) = isolating(&db, &i, keys.clone(), true)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(uploaded.len(), 64, "every key but the bad one");
        assert!(!uploaded.contains(&Key::Table("bad".into())));
        // Halving finds one key among 65 in at most 2 calls per level.
        let calls = db.calls.load(std::sync::atomic::Ordering::Relaxed);
        assert!(calls <= 2 * 8, "{calls} calls");
        // The refused whole call and its first half reset the slot; no later half does
        // (it would forget what the halves before it listened to).
        let resets = db.resets.lock().unwrap().clone();
        assert_eq!(resets[..2], [true, true]);
        assert!(resets[2..].iter().all(|r| !r), "{resets:?}");
        i.applied(round.unwrap());
        let why = bad.ready(round.unwrap(), Duration::from_millis(10)).await;
        assert_eq!(
            why,
            Err(NotReady::Refused(
                Key::Table("bad".into()),
                "invalid byte sequence".into()
            ))
        );
        assert!(good
            .ready(round.unwrap(), Duration::from_millis(10))
            .await
            .is_ok());
        // Never offered again while held; forgotten with its last holder.
        let (_, all) = i.take_all();
        assert!(!all.contains(&Key::Table("bad".into())));
        let (again, _) = i.hold(vec![Key::Table("bad".into())]);
        assert!(again.ready(0, Duration::from_millis(10)).await.is_err());
        drop((bad, again));
        assert!(i.refused_among(&[Key::Table("bad".into())]).is_none());
    }
}
