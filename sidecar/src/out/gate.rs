//! The gate between a rejoining channel's history and its live messages.
//!
//! A channel that asks for history is subscribed in the hub at once, behind a gate that
//! holds its live frames while the history is read and sent. Then the gate opens at the
//! sequence the history went through: held frames after it are sent, those at or before it
//! (already sent as history) are dropped, and so are later live frames at or before it (the
//! drainer may be behind the history's read). Since the subscription comes first and the
//! history read after, every message after the client's position is sent exactly once:
//! the history covers up to its end, and the live side covers everything dispatched after
//! the subscription, which the history's end is at or past.
//!
//! The gate holds at most as many frames, and bytes, as a socket's outbound queue
//! (MAX_OUTBOUND_FRAMES, MAX_OUTBOUND_BYTES: frames alone let a burst of large messages on
//! the topic pin up to 20,000 frames of a MiB each per rejoining channel). A drainer far behind
//! (a burst on the topic while the history is read) could dispatch more: then what is held
//! is dropped and the gate, instead of opening, asks for the history to be read again from
//! where the last read ended. Everything dropped was dispatched before that next read
//! began, so the read covers it; the client catches up in passes and is never cut off for
//! it.

use super::queue::Sent;
use std::sync::{Arc, Mutex};
use tokio_tungstenite::tungstenite::Message;

enum State {
    /// Live frames held until the history is sent, each with its place in queue order
    /// (`Place`); `dropped_from`, the first sequence dropped for want of room, if any was.
    Holding {
        held: Vec<(Place, Message)>,
        /// The bytes of `held`.
        bytes: usize,
        dropped_from: Option<i64>,
    },
    /// Live frames after `through` pass, but those in `skip` (the few a Supabase replay
    /// sent, which filters what it sends, so its end says nothing of what it left out).
    Open { through: i64, skip: Vec<i64> },
    /// The channel left, or fell too far behind: nothing passes.
    Closed,
}

/// Where a held frame goes in queue order: its sequence, and whether it says something
/// *after* that sequence. A Postgres Changes position message names the end of its batch,
/// which is often the sequence of the channel's last change in it; it reaches the gate when
/// the batch is handed out, before that change's frame, which passes when its check
/// decides. Sorted by sequence alone, the position went first, and a client whose socket
/// dropped between the two resumed after a change it never got.
type Place = (i64, bool);

pub struct Gate {
    state: Mutex<State>,
    /// The position (epoch, sequence) of the last message queued to the socket through
    /// this gate, history included: a second join of the channel on the same socket
    /// (realtime-js may send two on a reconnect) resumes after it, not after the older
    /// position its payload still names.
    last: Mutex<Option<(i64, i64)>>,
    /// Most frames held: past it they are dropped, and read again from the history.
    max_held: usize,
    /// Most bytes held, the same way (a frame is always taken when nothing is held).
    max_bytes: usize,
}

/// What opening the gate came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Live from here on.
    Yes,
    /// Held frames were dropped, the first of sequence `.0`: read the history again, then
    /// open.
    ReadAgain(i64),
    /// The channel left or the socket is too slow.
    Closed,
}

impl Gate {
    pub fn new(max_held: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(Gate {
            state: Mutex::new(State::Holding {
                held: Vec::new(),
                bytes: 0,
                dropped_from: None,
            }),
            last: Mutex::new(None),
            max_held,
            max_bytes,
        })
    }

    /// What the hub does with a live frame at (`epoch`, `seq`): Some to send it now.
    pub fn pass(&self, epoch: i64, seq: i64, frame: Message) -> Option<Message> {
        self.pass_at(epoch, (seq, false), frame)
    }

    /// `pass` for a message that tells the position (`epoch`, `seq`): held, it goes after
    /// every frame of that sequence. It is not recorded as sent (`last_sent`): it names the
    /// end of its batch while the batch's changes may still wait for their checks.
    pub fn pass_position(&self, epoch: i64, seq: i64, frame: Message) -> Option<Message> {
        self.pass_at(epoch, (seq, true), frame)
    }

    fn pass_at(&self, epoch: i64, (seq, after): Place, frame: Message) -> Option<Message> {
        let mut state = self.state.lock().unwrap();
        match &mut *state {
            State::Holding {
                held,
                bytes,
                dropped_from,
            } => {
                let n = frame.len();
                let too_many_bytes = !held.is_empty() && *bytes + n > self.max_bytes;
                if held.len() >= self.max_held || too_many_bytes {
                    let first = held.first().map_or(seq, |h| h.0 .0);
                    *dropped_from = Some(dropped_from.map_or(first, |d| d.min(first)));
                    held.clear();
                    *bytes = 0;
                }
                *bytes += n;
                held.push(((seq, after), frame));
                None
            }
            State::Open { through, skip } if seq > *through && !skip.contains(&seq) => {
                if !after {
                    self.sent(epoch, seq);
                }
                Some(frame)
            }
            State::Open { .. } | State::Closed => None,
        }
    }

    /// Records that the message at (`epoch`, `seq`) was queued to the socket.
    pub fn sent(&self, epoch: i64, seq: i64) {
        *self.last.lock().unwrap() = Some((epoch, seq));
    }

    /// The position of the last message queued to the socket through this gate.
    pub fn last_sent(&self) -> Option<(i64, i64)> {
        *self.last.lock().unwrap()
    }

    /// Opens the gate after the history went through `through`: `first` (the resume's
    /// system message), then the held frames after `through`, go to the channel in queue
    /// order, under the lock, so no later live frame overtakes them. They are merged among
    /// the channel's changes whose check is still pending by position (`slots`): one
    /// before such a change goes out now, one after it waits for it. `epoch` is the
    /// queue's, which held frames are of. If held frames were dropped meanwhile, the gate
    /// stays shut and says to read the history again.
    pub fn open(
        &self,
        epoch: i64,
        (through, skip): (i64, Vec<i64>),
        first: Option<Message>,
        merge: impl FnOnce(Vec<(Place, Message)>) -> Sent,
    ) -> Opened {
        let mut state = self.state.lock().unwrap();
        match &mut *state {
            State::Holding { dropped_from, .. } if dropped_from.is_some() => {
                return Opened::ReadAgain(dropped_from.take().expect("matched"));
            }
            State::Holding { .. } => {}
            State::Open { .. } => return Opened::Yes,
            State::Closed => return Opened::Closed,
        }
        let open = State::Open {
            through,
            skip: skip.clone(),
        };
        let State::Holding { held, .. } = std::mem::replace(&mut *state, open) else {
            unreachable!("matched above");
        };
        // In queue order: a change's frame reaches the gate when its check decides
        // (`postgres_changes::pool`), after broadcasts committed later may have.
        let mut held: Vec<(Place, Message)> = held
            .into_iter()
            .filter(|((seq, _), _)| *seq > through && !skip.contains(seq))
            .collect();
        held.sort_by_key(|(place, _)| *place);
        let last = held.iter().rev().find(|((_, after), _)| !after);
        let last = last.map(|((seq, _), _)| *seq);
        // The resume's system message tells of the history: after it, before anything live.
        let frames = first.map(|f| ((through, true), f)).into_iter().chain(held);
        if merge(frames.collect()) != Sent::Queued {
            // Over the connection's bounds: it closes as too slow (`queue`).
            *state = State::Closed;
            return Opened::Closed;
        }
        if let Some(seq) = last {
            self.sent(epoch, seq);
        }
        Opened::Yes
    }

    /// The channel left: nothing more passes, and the history still being sent stops.
    /// Returns the sequence its history went through, if it was sent (the gate was open).
    pub fn close(&self) -> Option<i64> {
        match std::mem::replace(&mut *self.state.lock().unwrap(), State::Closed) {
            State::Open { through, .. } => Some(through),
            State::Holding { .. } | State::Closed => None,
        }
    }

    pub fn is_closed(&self) -> bool {
        matches!(*self.state.lock().unwrap(), State::Closed)
    }
}
