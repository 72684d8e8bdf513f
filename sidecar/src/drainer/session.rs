//! A drain session's state and vocabulary: the connection, the position handed out, the
//! form a drain's answer is read in, and the pacing and decoding the calls carry from one to
//! the next (`resume` makes one, `call` makes each drain call, the hand-out loop is
//! `drainer`'s).

use super::pace::Pacing;
use crate::hub::Hub;
use crate::postgres_changes::pool::Checks;
use crate::postgres_changes::subscribers::Subscribers;
use crate::presence::view::Views;
use crate::rows::Columns;
use std::time::{Duration, Instant};
use tokio_postgres::{Client, Statement};

/// Where drained messages go: broadcasts to the hub, row changes to the channels of
/// `changes`, presence diffs to the views of `presence`.
#[derive(Clone, Copy)]
pub(super) struct Destinations<'a> {
    pub(super) hub: &'a Hub,
    pub(super) changes: &'a Subscribers,
    pub(super) checks: &'a Checks,
    pub(super) presence: &'a Views,
}

/// One connected session.
pub(super) struct Session {
    pub(super) client: Client,
    /// The last sequence handed out in this session (a drain call confirms it).
    pub(super) pos: i64,
    /// The queue's epoch as unix microseconds: the `meta.epoch` of every message delivered.
    pub(super) epoch: i64,
    /// The drain call, and how its answer is read: None for one packed value, the columns
    /// for rows (an extension without `realtime.drain_packed`).
    pub(super) stmt: Statement,
    pub(super) col: Option<Columns>,
    pub(super) stats: Statement,
    /// The deadline of every call but the drain's.
    pub(super) setup: Duration,
    pub(super) batch: i32,
    /// How long the next call waits under load: a linger, and this sidecar's share of the
    /// drain-call budget.
    pub(super) pacing: Pacing,
    /// When the next call may be made: a linger after the last batch was handed out, unless
    /// that batch carried nothing or was full (then there is nothing to gather, or more
    /// waits).
    pub(super) next_call: Option<tokio::time::Instant>,
    /// When the drain call being answered was made.
    pub(super) called: tokio::time::Instant,
    /// Whether the batch being handed out paces the next call.
    pub(super) pace: bool,
    pub(super) stats_at: Instant,
    /// Which tables' changes the drain decodes (None: all), for which subscription
    /// generation.
    pub(super) decode: Option<Vec<u32>>,
    pub(super) decode_for: Option<u64>,
    /// The last change drained again because a channel joined its table meanwhile.
    pub(super) redrained: i64,
}

/// Why a drain session ended.
#[derive(Debug)]
pub(super) enum SessionError {
    Db(tokio_postgres::Error),
    /// A drained row could not be read.
    Lost(String),
    /// A call did not answer within its deadline: the connection is given up.
    Stuck(&'static str),
    /// realtime.drain returned no column of this name (an extension of another version).
    Missing(&'static str),
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // tokio-postgres says only "db error" for a server error: its message is the news.
            SessionError::Db(e) => write!(f, "{}", crate::db_worker::describe(e)),
            SessionError::Stuck(what) => write!(f, "{what} did not answer in time"),
            SessionError::Lost(why) => write!(f, "{why}"),
            SessionError::Missing(column) => {
                write!(f, "realtime.drain returned no column \"{column}\"")
            }
        }
    }
}

impl From<tokio_postgres::Error> for SessionError {
    fn from(e: tokio_postgres::Error) -> Self {
        SessionError::Db(e)
    }
}

/// Runs one call with a deadline.
pub(super) async fn within<T>(
    deadline: Duration,
    what: &'static str,
    call: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, SessionError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SessionError::Stuck(what)),
    }
}
