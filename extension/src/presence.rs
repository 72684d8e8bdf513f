//! Presence diffs in the queue. Presence state lives in tables (`sql/presence.sql`:
//! members, tombstones, the sidecars' leases); every change to it queues a diff in the same
//! transaction, through `realtime.queue_presence`, so that every sidecar receives the diffs
//! in the queue's one order and only if the change committed. A diff is Phoenix's
//! `presence_diff` payload, `{joins, leaves}`, with the database-made `phx_ref`s; it is
//! drained as a row of kind 'presence' and never delivered as a broadcast.

use crate::message::{FLAG_PRESENCE, FLAG_PRIVATE};
use crate::{payload, xact};
use pgrx::prelude::*;

/// Queues one presence diff for `topic`. Called by the functions of `sql/presence.sql`.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."queue_presence"(topic text, private boolean, diff text)
RETURNS void VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn queue_presence(topic: &str, private: bool, diff: &str) {
    let flags = FLAG_PRESENCE | if private { FLAG_PRIVATE } else { 0 };
    xact::append(
        crate::dropped::By::Sidecar,
        topic,
        "presence_diff",
        diff.as_bytes(),
        flags,
        payload::new_id(),
        0,
    );
}
