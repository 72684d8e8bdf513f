//! A consumer's interest: the topics (and captured tables) its clients joined, so that a
//! drain returns only what the consumer will deliver.
//!
//! # Why
//!
//! Without it every consumer reads, decodes and ships every message, and every sidecar
//! parses all of them: adding sidecars multiplies the work instead of sharing it. A
//! consumer that registers its topics gets only their messages from `realtime.drain`; the
//! rest are skipped where the queue is read, before any row is built.
//!
//! # The contract
//!
//! * A slot starts (and is reset by `realtime.listen_all`) unfiltered: it receives
//!   everything. Only `realtime.listen` turns filtering on. A consumer that forgets its
//!   interest, or a slot recreated after a server restart, therefore over-delivers, never
//!   under-delivers.
//! * `realtime.listen(consumer, topics, tables, all_tables)` counts each key once more and
//!   `realtime.unlisten` once less; a key is listened to while its count is above zero.
//! * A message whose topic is listened to, or a change whose table is (or `all_tables`), and
//!   that was published after the key was first listened to, is returned by every drain
//!   that reads it. That is what lets a sidecar answer a join only once its topic is
//!   listened to: whatever commits after the reply is published after the key is in the
//!   table (the reply follows `listen`, the commit follows the reply). A message published
//!   before is not returned, however late the drain reads it (drains sleep through commits
//!   they do not listen to, `wake.rs`): a channel that just joined is not sent what was
//!   committed before it joined. A key listened to again in a `reset` keeps when it was
//!   first listened to, so a sidecar that offers its whole set again loses nothing.
//! * Except when the listen turned filtering on: the slot was receiving everything, so the
//!   keys of that listen are wanted from the queue's start, and nothing the slot was owed and
//!   had not read yet is taken back (a slot new on a promoted standby, issue 42).
//! * Skipped messages are still read through: the drain says how far (a row of kind
//!   `filtered`), so the consumer's position moves on.
//!
//! The tables themselves (layout, keys, lock rules) are in `interest_table`.

use crate::errors;
use crate::interest_table::{all_tables_key, max_keys, table_key, topic_key, Interest};
use crate::shared::{queue, ExclusiveGuard, QueueShared};
use pgrx::prelude::*;

fn keys_of(topics: &[Option<String>], tables: &[Option<String>], all_tables: bool) -> Vec<u64> {
    let mut keys = Vec::with_capacity(topics.len() + tables.len() + 1);
    for t in topics {
        let Some(t) = t else {
            errors::invalid("topics must not contain NULL", None);
        };
        keys.push(topic_key(t));
    }
    for t in tables {
        let Some(t) = t else {
            errors::invalid("tables must not contain NULL", None);
        };
        keys.push(table_key(t));
    }
    if all_tables {
        keys.push(all_tables_key());
    }
    keys
}

/// The consumer's table, with the lock held exclusively.
fn exclusive<'q>(q: &'q QueueShared, consumer: &str) -> (ExclusiveGuard<'q>, Interest<'q>) {
    let g = q.exclusive();
    let Some(i) = q
        .slots()
        .iter()
        .position(|s| s.in_use() && s.name() == consumer)
    else {
        drop(g);
        errors::fail(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("realtime consumer \"{consumer}\" does not exist"),
            Some("Create it with realtime.create_consumer(name)."),
        );
    };
    let interest = q.interest(i);
    (g, interest)
}

/// Listens to topics (broadcasts, presence) and captured tables (Postgres Changes, by name
/// without schema, as a change's topic names its table; `all_tables` for every one); with
/// `reset`, forgets what the consumer listened to before, in the same step. From then on
/// the consumer's drains return only what it listens to. Returns how many keys it listens
/// to.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."listen"(consumer text, topics text[] DEFAULT '{}', tables text[] DEFAULT '{}', all_tables boolean DEFAULT false, reset boolean DEFAULT false)
RETURNS integer VOLATILE PARALLEL UNSAFE STRICT LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn listen(
    consumer: &str,
    topics: Vec<Option<String>>,
    tables: Vec<Option<String>>,
    all_tables: bool,
    reset: bool,
) -> i32 {
    let keys = keys_of(&topics, &tables, all_tables);
    let q = queue();
    let (mut g, interest) = exclusive(q, consumer);
    // Under the exclusive lock: a message published after this call has at least this
    // sequence, one published before it less. A slot that receives everything (new, or
    // after listen_all) was owed every message it has not read yet; the keys it now
    // listens to stay owed from the start (0), or turning the filter on would take back
    // what it was already to receive. (Issue 42: a slot new on a promoted standby reads the
    // new queue from its start, and its listen can come after other sidecars' presence diffs
    // there, which were then skipped: its views would lack those members for good.)
    let since = if interest.filtering() {
        g.core().last_seq() + 1
    } else {
        0
    };
    let mut kept = std::collections::HashMap::new();
    if reset {
        // Checked before anything changes, so a refused call leaves the table as it was.
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() > max_keys() as usize {
            drop(g);
            too_many(consumer, distinct.len() as u64);
        }
        kept = interest.live_since();
        interest.reset(&mut g, true);
    }
    if let Err(needed) = interest.listen(&mut g, &keys, since, &kept) {
        drop(g);
        too_many(consumer, needed);
    }
    interest.live() as i32
}

fn too_many(consumer: &str, needed: u64) -> ! {
    errors::fail(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "realtime consumer \"{consumer}\" would listen to {needed} topics and tables, more than realtime.max_topics_per_consumer ({})",
            max_keys()
        ),
        Some("Raise realtime.max_topics_per_consumer, or receive everything with realtime.listen_all(consumer)."),
    )
}

/// Stops listening to topics and tables, once per earlier listen. Returns how many keys
/// the consumer still listens to (it keeps filtering, also at zero).
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."unlisten"(consumer text, topics text[] DEFAULT '{}', tables text[] DEFAULT '{}', all_tables boolean DEFAULT false)
RETURNS integer VOLATILE PARALLEL UNSAFE STRICT LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn unlisten(
    consumer: &str,
    topics: Vec<Option<String>>,
    tables: Vec<Option<String>>,
    all_tables: bool,
) -> i32 {
    let keys = keys_of(&topics, &tables, all_tables);
    let q = queue();
    let (mut g, interest) = exclusive(q, consumer);
    interest.unlisten(&mut g, &keys);
    interest.live() as i32
}

/// Forgets what the consumer listened to: its drains return every message again.
#[pg_extern(volatile, parallel_unsafe)]
fn listen_all(consumer: &str) {
    let q = queue();
    let (mut g, interest) = exclusive(q, consumer);
    interest.reset(&mut g, false);
}
