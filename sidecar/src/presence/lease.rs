//! This sidecar's presence session and its lease. A task of its own, on a connection of its
//! own, renews the lease every second and does nothing else: it never waits behind the
//! worker's writes nor behind the reaper (which the worker runs, and which may wait for row
//! locks), so a sidecar that is busy (a room filling, a slow or blocked statement) does not
//! lose its members, while one that is killed, hung or cut off does.
//!
//! A session has a generation. When its lease turns out lost (the sidecar stalled past it
//! and was reaped) or the worker's connection broke (a write in flight may or may not have
//! committed), the sidecar takes a new session rather than guessing: whatever was written
//! under the old one belongs to a session that no longer exists, and the reaper makes it
//! leave, so no member is ever left twice in the table. The worker writes only under a
//! session that has been renewed (`ready`), and tracks its members again under each new one.

use crate::config::Config;
use crate::db_worker;
use crate::metrics::Metrics;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio_postgres::{Client, Statement};

/// How often the lease is renewed (and the worker calls the reaper).
pub const TICK: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, PartialEq)]
struct Current {
    id: String,
    generation: u64,
    /// The lease of this generation has been taken in the database.
    ready: bool,
}

/// The session the worker writes under.
pub struct Session {
    name: String,
    current: Mutex<Current>,
    /// Wakes the worker when a session becomes ready.
    pub ready: Notify,
}

impl Session {
    /// Sessions named `{consumer}/{instance}/{generation}`.
    pub fn new(consumer: &str, instance: u32) -> Self {
        let name = format!("{consumer}/{instance:08x}");
        Session {
            current: Mutex::new(Current {
                id: format!("{name}/1"),
                generation: 1,
                ready: false,
            }),
            name,
            ready: Notify::new(),
        }
    }

    /// The session to write under and its generation, if its lease is taken.
    pub fn ready_id(&self) -> Option<(String, u64)> {
        let c = self.current.lock().unwrap();
        c.ready.then(|| (c.id.clone(), c.generation))
    }

    pub fn generation(&self) -> u64 {
        self.current.lock().unwrap().generation
    }

    /// Gives up the current session for a new one (not ready until renewed); returns the
    /// one given up.
    pub fn replace(&self) -> String {
        let mut c = self.current.lock().unwrap();
        let old = c.id.clone();
        c.generation += 1;
        c.id = format!("{}/{}", self.name, c.generation);
        c.ready = false;
        old
    }

    fn snapshot(&self) -> Current {
        self.current.lock().unwrap().clone()
    }

    fn mark_ready(&self, generation: u64) {
        let mut c = self.current.lock().unwrap();
        if c.generation == generation && !c.ready {
            c.ready = true;
            drop(c);
            self.ready.notify_one();
        }
    }
}

/// Renews the lease every TICK until `shutdown` (sent once the worker has stopped); then
/// ends the session, so its members leave at once.
pub async fn run(
    cfg: Arc<Config>,
    session: Arc<Session>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Sessions given up whose end is still to be written.
    let mut to_end: Vec<String> = Vec::new();
    loop {
        let Some(client) =
            db_worker::connect_retrying(&cfg, "presence lease", &mut shutdown, || {}).await
        else {
            return;
        };
        let statements = match within(&cfg, Statements::prepare(&client)).await {
            Ok(statements) => statements,
            Err(why) => {
                tracing::warn!(error = %why, "presence lease connection failed; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = shutdown.changed() => return,
                }
                continue;
            }
        };
        loop {
            let step = async {
                for old in std::mem::take(&mut to_end) {
                    if let Err(e) = within(&cfg, client.query_one(&statements.end, &[&old])).await {
                        tracing::warn!(error = %e, "could not end a presence session; the reaper will");
                    }
                }
                renew(&cfg, &client, &statements, &session, &metrics).await?;
                Ok::<(), String>(())
            };
            let failed = tokio::select! {
                r = step => r.err(),
                _ = shutdown.changed() => None,
            };
            if *shutdown.borrow() {
                return end(&cfg, &client, &statements, &session).await;
            }
            if let Some(why) = failed {
                tracing::warn!(error = %why, "presence lease connection failed; reconnecting");
                break;
            }
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return end(&cfg, &client, &statements, &session).await;
            }
        }
        // This connection's backend was the session's: once it is gone the reaper ends the
        // session. Take a new one; the worker tracks its members again under it.
        to_end.push(session.replace());
        metrics.presence_sessions_lost_total.increment(1);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// The lease connection's statements, prepared once a connection: a renewal each second is
/// then one round trip that the primary neither parses nor plans.
struct Statements {
    renew: Statement,
    end: Statement,
}

impl Statements {
    async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Statements {
            renew: client
                .prepare("SELECT realtime.presence_renew($1, $2::text::interval) AS held")
                .await?,
            end: client.prepare("SELECT realtime.presence_end($1)").await?,
        })
    }
}

/// Ends the session on shutdown: this sidecar's members leave at once.
async fn end(cfg: &Config, client: &Client, statements: &Statements, session: &Session) {
    let id = session.snapshot().id;
    // Another sidecar's reaper may pick it as a deadlock's victim: try again (three times
    // at most; past that, the reaper ends the session once this backend is gone).
    for attempt in 1..=3 {
        match within(cfg, client.query_one(&statements.end, &[&id])).await {
            Ok(_) => return,
            Err(e) if attempt < 3 => {
                tracing::debug!(error = %e, "ending the presence session failed; again")
            }
            Err(e) => tracing::warn!(error = %e, "could not end the presence session on shutdown"),
        }
    }
}

async fn within<T>(
    cfg: &Config,
    call: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(cfg.db_call_deadline(), call).await {
        Ok(r) => r.map_err(|e| {
            e.as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned())
        }),
        Err(_) => Err("did not answer in time".into()),
    }
}

async fn renew(
    cfg: &Config,
    client: &Client,
    statements: &Statements,
    session: &Session,
    metrics: &Metrics,
) -> Result<(), String> {
    let lease = format!("{} seconds", cfg.presence_lease_secs);
    loop {
        let now = session.snapshot();
        let row = within(cfg, client.query_one(&statements.renew, &[&now.id, &lease])).await?;
        let held: bool = row.get("held");
        if held || !now.ready {
            // Held, or taken just now for a new session.
            session.mark_ready(now.generation);
            return Ok(());
        }
        // The session was ready and its lease is gone: the sidecar stalled past it and its
        // members were reaped. Take a new session (renewed on the next pass of this loop).
        tracing::warn!(session = %now.id, "the presence lease was lost (the sidecar stalled past it); its members are tracked again under a new session");
        metrics.presence_sessions_lost_total.increment(1);
        session.replace();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_session_is_not_written_under_until_renewed() {
        let s = Session::new("sc", 0xab);
        assert_eq!(s.ready_id(), None);
        s.mark_ready(1);
        assert_eq!(s.ready_id(), Some(("sc/000000ab/1".into(), 1)));
        assert_eq!(s.replace(), "sc/000000ab/1");
        assert_eq!(s.ready_id(), None, "a new session waits for its lease");
        s.mark_ready(1);
        assert_eq!(
            s.ready_id(),
            None,
            "a late renewal of the old one does not count"
        );
        s.mark_ready(2);
        assert_eq!(s.ready_id(), Some(("sc/000000ab/2".into(), 2)));
    }
}
