//! What the history worker is asked: a joined channel's request for its history, how to
//! reach it, and what a further pass carries.

use super::ask::Ask;
use super::budget::{self, Budget};
use super::line::Permit;
use crate::hub::TopicKey;
use crate::metrics::Metrics;
use crate::out::Reach;
use crate::postgres_changes::Binding;
use tokio::sync::mpsc;

/// A joined channel's request for history, and how to reach it.
pub struct Request {
    pub ask: Ask,
    pub key: TopicKey,
    pub reach: Reach,
    /// Set on a further pass (the gate overflowed while the last one was sent: `crate::out`).
    pub carry: Option<Carry>,
    /// The channel's Postgres Changes, when its position covers them.
    pub changes: Option<Changes>,
    /// One of its client address's MAX_RESUMES_PER_ADDRESS places (`line`), held while the
    /// history is read and sent, over every pass; given back, to the next of the line, where
    /// the request is dropped. None while it waits in the line.
    pub permit: Option<Permit>,
}

/// A resuming channel's Postgres Changes bindings and the identity it joined with: what
/// its resent changes are matched and checked against.
#[derive(Clone)]
pub struct Changes {
    pub bindings: Vec<Binding>,
    pub role: String,
    pub claims: String,
}

/// What earlier passes of one join's history came to, for its final system message.
#[derive(Clone, Debug, Default)]
pub struct Carry {
    /// The position the client resumed from (None for Supabase's replay, which ends with
    /// no system message).
    pub from: Option<(i64, i64)>,
    pub resent: usize,
    /// The first and last sequence found evicted, over all passes.
    pub missing: Option<(i64, i64)>,
    pub passes: u32,
    /// The span of positions a resume did not send because its topic held more than
    /// MAX_RESUME_MESSAGES after the position, or more bytes than its `budget` allowed
    /// (the newest were sent).
    pub over_limit: Option<(i64, i64)>,
    /// What cut it there (the first pass's).
    pub cut_by: Option<CutBy>,
    /// What a replay sent (it filters the topic's messages, so a later pass must not send
    /// these again, and must send the others).
    pub skip: Vec<i64>,
    /// The resume covered the channel's Postgres Changes: how many were resent, and how
    /// many could not be checked (withheld, the channel told why).
    pub changes: Option<usize>,
    pub withheld: usize,
    /// Messages of the topic dropped when they were sent (their notices were resent in
    /// their places): the first and last position, and how many.
    pub dropped: Option<(i64, i64, usize)>,
}

/// The bound that cut a resume short of its position.
#[derive(Clone, Copy, Debug)]
pub enum CutBy {
    /// MAX_RESUME_MESSAGES
    Messages(usize),
    /// Its bytes (`budget`).
    Bytes(budget::Bound),
    /// The decoded bytes of a table's changes in one `realtime.history` call
    /// (`realtime.drain_max_decoded_size`, shared among the call's tables).
    Decoded,
}

/// Passes at most before a client that cannot catch up is cut off as too slow.
pub(super) const MAX_PASSES: u32 = 100;

/// What serving a batch sends with: the worker's queue for further passes, the metrics and
/// the histories' bytes.
pub(super) type With<'a> = (&'a mpsc::Sender<Request>, &'a Metrics, &'a Budget);

pub(super) type Served = Result<(), (String, Vec<Request>)>;
