//! One joined channel after admission: what it holds. What leaving it stops and how its
//! verdicts are kept current is `lifetime.rs`'s.

use crate::authorizer::Identity;
use crate::broadcast;
use crate::hub::TopicKey;
use crate::interest::Held;
use crate::jwt::Claims;
use crate::out::Reach;
use crate::presence::channel::ChannelPresence;
use std::sync::Arc;
use std::time::Duration;

/// A joined channel.
pub struct Channel {
    pub key: TopicKey,
    /// The way to the channel's socket, under its topic and join_ref.
    pub reach: Reach,
    /// The identity its verdicts are for (the socket's token, or the join's or a refresh's).
    pub claims: Claims,
    /// The same identity as verdicts are asked for (with the socket's headers).
    pub(super) who: Arc<Identity>,
    pub broadcast: broadcast::State,
    /// The channel's presence: key, verdicts, whether it watches and tracks (`presence`).
    pub presence: ChannelPresence,
    /// The channel has Postgres Changes bindings (registered in `Shared::changes`).
    pub postgres_changes: bool,
    /// What they hold against the connection's and the address's limits.
    pub(super) bindings: crate::postgres_changes::bounds::Weight,
    /// Its topic and tables, listened to in the database while the channel lives.
    pub(super) _interest: Held,
    /// The private channel's re-checks; see `Checks`.
    pub(super) checks: Checks,
}

/// At most one authorization check is in flight per channel, and a verdict applies only to
/// the identity it was computed for. Token refreshes and TTL ticks that arrive meanwhile
/// coalesce into one more check after it; a late verdict for an older token is discarded.
#[derive(Default)]
pub(super) struct Checks {
    /// Changes whenever the channel's identity (token) changes; verdicts carry it.
    pub(super) generation: u64,
    pub(super) in_flight: bool,
    pub(super) again: bool,
    /// Delay before retrying after the database failed to answer (doubles, up to 30 s).
    pub(super) backoff: Option<Duration>,
}
