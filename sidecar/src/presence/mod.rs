//! Presence (realtime-js's `track`, `untrack`, `presenceState()` and its `sync`, `join` and
//! `leave` events), with one view across every sidecar, held by the database.
//!
//! # Where the truth is
//!
//! Members live in the database (`sql/presence.sql`): a table of members, each leased to
//! the session of the sidecar that tracked it, and every change queues Phoenix's
//! `presence_diff` in the same transaction. So diffs reach every sidecar in the queue's one
//! order and only if the change committed, and a member's `phx_ref` is made once, by the
//! database: the same on every sidecar, so a channel that rejoins elsewhere sees no
//! spurious join or leave (Phoenix's client compares refs).
//!
//! # A track's way: socket → channel → members → worker → queue → every sidecar's views
//!
//! 1. `channel`: the push is checked (its limits, the channel's presence write verdict,
//!    asked at the first track of a private channel) and becomes the channel's wish in
//!    `members` (tracked with this key and meta, or untracked).
//! 2. `worker` (one task and one connection per sidecar) writes every wish that changes
//!    something in one statement, under the sidecar's session, and loads views; each push
//!    is answered once its change committed; every second it runs the reaper. `lease` (a
//!    task and a connection of its own, so it never waits behind a write or the reaper)
//!    renews the session's lease.
//! 3. The drainer hands each drained diff to `view`, which applies it to its topic's view,
//!    if a channel here watches the topic, and sends the changes to the watching channels,
//!    coalesced over PRESENCE_WINDOW_MS.
//!
//! # When a sidecar dies
//!
//! Its sessions stop being renewed, and the backend that renewed them is gone. Every
//! sidecar calls the reaper each second; the reaper ends sessions whose backend is gone or
//! whose lease (PRESENCE_LEASE_SECS) ran out, and their members leave every view through the
//! queue: a killed sidecar's members within about a second, a hung or cut-off one's within
//! the lease plus a second. A restarted sidecar starts new sessions; its clients track again
//! when their channels rejoin.
//!
//! # Limits (Supabase's names and texts; each closes the channel, as Supabase does)
//!
//! - MAX_CLIENT_PRESENCE_EVENTS_PER_SECOND per channel: "Client presence rate limit
//!   exceeded" (`ClientPresenceRateLimitReached`). Default 30, so cursors and typing
//!   indicators work; Supabase's 5 per 30 seconds does not let them.
//! - MAX_CONNECTION_PRESENCE_EVENTS_PER_SECOND, MAX_PRESENCE_EVENTS_PER_SECOND_PER_ADDRESS
//!   and MAX_PRESENCE_EVENTS_PER_SECOND (the sidecar's): budgets that refuse the heaviest
//!   sources' tracks with a reason and close nobody's channel (`budget`).
//! - MAX_PRESENCE_META_BYTES per meta: "Track message size exceeded".
//! - MAX_PRESENCE_MEMBERS_PER_TOPIC: a channel's first track into a topic whose view holds
//!   that many metas is refused (issue 39, L4: every joiner is sent the whole state, and
//!   every sidecar watching keeps it). Counted in this sidecar's view, so sidecars whose
//!   tracks race each other can pass it by what they admit before each sees the others'.
//! - MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL: a channel's pushes waiting for their change to
//!   commit (the database slow or away); past it a push is refused and changes nothing.
//!
//! # Files
//!
//! `channel` a channel's presence and its pushes · `members` wishes from channels to the
//! worker · `worker` loads, batched writes and the reaper · `lease` the session and its
//! lease · `view` each sidecar's rebuildable view of the watched topics and the diffs sent
//! from it.

pub mod budget;
pub mod channel;
pub mod lease;
pub mod members;
pub mod view;
pub mod worker;

use crate::metrics::Metrics;
use std::sync::Arc;

/// Presence's shared state in one sidecar.
pub struct Presence {
    pub views: Arc<view::Views>,
    pub members: Arc<members::Members>,
    pub metrics: Arc<Metrics>,
    pub max_meta_bytes: usize,
    /// MAX_PRESENCE_MEMBERS_PER_TOPIC
    pub max_members_per_topic: usize,
    /// MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL
    pub max_pushes_waiting: usize,
    /// Tracks per second per connection, per address and in total.
    pub budgets: budget::Budgets,
}

impl Presence {
    pub fn new(metrics: Arc<Metrics>, cfg: &crate::config::Config) -> Self {
        Presence {
            views: Arc::new(view::Views::new(metrics.clone())),
            members: Arc::default(),
            metrics,
            max_meta_bytes: cfg.max_presence_meta_bytes,
            max_members_per_topic: cfg.max_presence_members_per_topic as usize,
            max_pushes_waiting: cfg.max_presence_pushes_waiting_per_channel as usize,
            budgets: budget::Budgets::new(
                cfg.max_connection_presence_events_per_second,
                cfg.max_presence_events_per_second_per_address,
                cfg.max_presence_events_per_second,
            ),
        }
    }
}
