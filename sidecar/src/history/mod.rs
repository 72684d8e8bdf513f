//! History at a join: Supabase's replay, and resume after a position.
//!
//! Every message the hub delivers carries its position in `meta`: the queue's `epoch` (the
//! database server's lifetime; a restart starts a new one) and its `seq`. A client that
//! lost its socket rejoins with `config.broadcast.resume = {epoch, seq}` of the last
//! message it saw and gets, on that topic, everything committed after it that the queue
//! still holds, in order, then the live messages, with no duplicate and no hole; a `system`
//! message says `recovered: true`, or `recovered: false` with the first and last missing
//! sequence (evicted from the ring before the client came back, or lost in a restart).
//! Supabase's `config.broadcast.replay = {since, limit}` (private channels) sends the
//! newest `limit` (at most 25) database-originated messages committed since `since`, with
//! `meta.replayed`. Both read the queue's ring, which keeps messages by space, not time:
//! `realtime.stats()` says how far back it reaches.
//!
//! The way: the join is answered and the channel subscribed in the hub behind a gate
//! (`crate::gate`) that holds its live frames; `worker` reads the history of every waiting
//! join in one `realtime.history` call, sends each its share, paced, and opens its gate at
//! the sequence the history went through. `ask` reads what the join asked for; `line` bounds
//! the histories of one client address read or sent at once (MAX_RESUMES_PER_ADDRESS);
//! `budget` the bytes histories hold while they are sent (MAX_RESUME_BYTES and friends).

pub mod ask;
pub mod budget;
mod changes;
mod expire;
pub mod line;
mod pace;
mod read;
mod replay;
mod request;
mod resume;
mod source;
#[cfg(test)]
mod tests;
pub mod worker;

pub use request::{Changes, Request};
