//! A join waiting for the database: what it keeps until its answer arrives.

use crate::authorizer::Identity;
use crate::frame::Inbound;
use crate::interest::Held;
use crate::join_config::JoinConfig;
use crate::jwt::Claims;
use crate::postgres_changes::bounds::Weight;
use std::sync::Arc;
/// A join waiting for its verdicts (a private channel), its bindings' check or its keys'
/// upload; its bindings are with the check.
pub(super) struct PendingJoin {
    pub(super) m: Inbound,
    pub(super) config: JoinConfig,
    pub(super) claims: Claims,
    pub(super) who: Arc<Identity>,
    pub(super) sub_topic: String,
    /// Its topic and tables, listened to in the database before the join is answered.
    pub(super) held: Held,
    /// What its Postgres Changes bindings (with the check meanwhile) hold against the
    /// connection's and the address's limits.
    pub(super) bindings: Weight,
}
