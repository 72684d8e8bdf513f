//! The way out: how a frame reaches a client's socket, in order, through one door.
//!
//! Every registry that sends to a joined channel (the hub's broadcasts, Postgres Changes'
//! listeners and checks, presence, a history being sent, the relay's answers) holds the
//! channel's `Reach` and sends through it; the gate, the slots and the queue behind it are
//! private to this wing, so no caller composes them. Replies to the client's own frames go
//! the same way without a channel (`queue::Sender`, from the connection's task).
//!
//! A live frame's way (a broadcast, a change, a position: a frame the drain hands out at
//! its place in the queue's order, `At`):
//!
//! 1. **The gate** (`gate.rs`), only while the channel's history is read and sent after a
//!    rejoin. The frame is held, with its place; when the history ends at sequence S the
//!    gate opens and lets out what it held after S, in queue order, and drops what the
//!    history already sent. May drop: a frame at or before S (it was sent as history), and
//!    everything held when the gate holds more than an outbound queue may
//!    (MAX_OUTBOUND_FRAMES, MAX_OUTBOUND_BYTES); then the history is read again from where
//!    it stopped, so nothing is lost and the client is never cut off for it.
//! 2. **The slots** (`slots.rs`), only while a change of the channel waits for its RLS check
//!    beside the drain (`postgres_changes::pool`). The drain leaves a slot at the change's
//!    place; anything live handed to the channel after it waits behind it; the check fills
//!    it with the channel's frame, a notice, or nothing, and everything up to the next
//!    pending slot goes on. May cut off: a channel whose held frames and slots exceed its
//!    connection's outbound bounds closes its connection as too slow; what it held is
//!    dropped.
//! 3. **The queue** (`queue.rs`), bounded in frames and bytes; its large frames are also
//!    counted, each distinct frame once, for the sidecar and the client's address
//!    (`shared_bytes.rs`). May cut off: a push that finds it full, or whose frame would pass
//!    one of those bounds, marks it overflowed, and the socket loop closes the connection as
//!    too slow (`Disconnect::TooSlow` and friends: close 1008, "too slow: ..."); nothing
//!    more is queued.
//! 4. **The write** (`write.rs`): when nothing waits in the queue and the connection's task
//!    is not answering a client frame, the pusher writes the frames to the socket itself in
//!    one vectored `send(2)`; what the socket does not take, and everything pushed while
//!    something waits, is written by the connection's task (`Receiver::write_some`), from
//!    the queue's head, so frames leave in the order they were pushed. tungstenite's own
//!    writes (pongs, its close) join the queue at a frame boundary (`duplex.rs`).
//!
//! What does not pass the gate or the slots: replies, presence and a history's resent
//! frames carry no queue place of their own (`Reach::send`); a history's frames all precede
//! what its gate held.
//!
//! Locks, each held for a few instructions and never across an await, always taken in this
//! order: a registry's (the hub's topics, the listeners) → the gate's → the slots' → the
//! queue's → the shared large frames' table. The gate merges what it held into the slots under its own lock, so no live
//! frame overtakes them; the slots let frames out into the queue under theirs.

mod duplex;
mod gate;
mod queue;
mod reach;
mod shared_bytes;
mod slots;
#[cfg(test)]
mod tests;
mod write;

pub use duplex::Duplex;
pub use gate::Opened;
pub use queue::{bounded, channel, connection, Receiver, Sender, Sent, TryRecvError, Written};
pub use reach::{At, ConnId, Fill, Link, Reach, ReplyTo};
pub use shared_bytes::SharedBytes;
pub use write::{close_frame, encode, socket, Socket};
