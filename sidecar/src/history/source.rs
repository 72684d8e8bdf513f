//! The history worker's read seam: everything serving a resume or a replay asks of the
//! database (which tables a resume's bindings cover, one walk of the queue's retained
//! range, the persisted messages a replay adds, a resume's changes checked) behind one small
//! trait. `resume` and `replay` decide each join's share (what is sent, what is cut, what
//! the closing `system` message says) from what a `Source` answers, so their rules are
//! unit-tested from memory (`history/tests.rs`) as `deliver`'s are behind `Lookup`.
//! `Database` is the worker's connection.

use super::changes::{change_tables, check_changes, Checked};
use super::read::{add_persisted, read, FoundChange, Read, Walk};
use super::request::{Changes, Request};
use crate::config::Config;
use crate::hub::TopicKey;
use crate::metrics::Metrics;
use crate::postgres_changes::deliver;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_postgres::Client;

/// What serving histories reads. Every error is the text a log line gives; `check` says
/// `Lost` when the connection went away (the worker serves the joins again on the next).
pub(super) trait Source {
    /// The queue's epoch, as the positions this source returns carry it.
    fn epoch(&self) -> i64;

    /// The tables whose changes the resuming channels' bindings cover, if any asked.
    async fn change_tables(&self, requests: &[Request]) -> Result<Option<Vec<u32>>, String>;

    async fn read(&self, walk: Walk<'_>) -> Result<Read, String>;

    /// The persisted messages of `keys` since `since_ms` that `read` does not hold, merged
    /// into it in commit-time order.
    async fn add_persisted(
        &self,
        keys: &[TopicKey],
        since_ms: i64,
        read: &mut Read,
    ) -> Result<(), String>;

    /// One resuming channel's changes, checked as it may read them now.
    async fn check(&self, r: &Request, c: &Changes, changes: &[&FoundChange]) -> Checked;

    /// Called once a batch of resumes is served: what its checks changed on the connection
    /// is put back.
    async fn finish(&self);
}

/// The history worker's connection as a `Source`.
pub(super) struct Database<'a> {
    pub(super) client: &'a Client,
    pub(super) cfg: &'a Config,
    pub(super) epoch: i64,
    pub(super) metrics: &'a Metrics,
    /// The checks of resumed changes prepare their statements once per connection.
    pub(super) statements: &'a deliver::Statements,
    /// Some check ran since the last `finish`: the connection's statement_timeout is set.
    pub(super) asked: AtomicBool,
}

impl Source for Database<'_> {
    fn epoch(&self) -> i64 {
        self.epoch
    }

    async fn change_tables(&self, requests: &[Request]) -> Result<Option<Vec<u32>>, String> {
        change_tables(self.client, self.cfg, requests).await
    }

    async fn read(&self, walk: Walk<'_>) -> Result<Read, String> {
        read(self.client, self.cfg, walk, self.epoch, self.metrics).await
    }

    async fn add_persisted(
        &self,
        keys: &[TopicKey],
        since_ms: i64,
        read: &mut Read,
    ) -> Result<(), String> {
        add_persisted(self.client, self.cfg, keys, since_ms, self.epoch, read).await
    }

    async fn check(&self, r: &Request, c: &Changes, changes: &[&FoundChange]) -> Checked {
        let db = deliver::Db {
            client: self.client,
            grace: Duration::from_secs(5),
            pattern_budget_ms: self.cfg.filter_pattern_timeout_ms as i32,
            statements: self.statements,
        };
        let limits = deliver::Limits::of(self.cfg);
        let budgets = (
            &limits,
            Duration::from_millis(self.cfg.resume_check_timeout_ms),
        );
        let checked = check_changes(&db, r, c, changes, budgets, self.metrics).await;
        if let Checked::Done { asked: true, .. } = checked {
            self.asked.store(true, Ordering::Relaxed);
        }
        checked
    }

    async fn finish(&self) {
        if !self.asked.swap(false, Ordering::Relaxed) {
            return;
        }
        // The checks set their statement_timeout; this connection's other calls are bounded
        // by the client's deadline instead.
        let reset = self.client.batch_execute("RESET statement_timeout");
        match tokio::time::timeout(self.cfg.db_call_deadline(), reset).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "RESET statement_timeout failed"),
            Err(_) => tracing::warn!("RESET statement_timeout did not answer in time"),
        }
    }
}
