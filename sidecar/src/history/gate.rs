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

use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::Message;

enum State {
    /// Live frames (sequence, frame) held until the history is sent.
    Holding(Vec<(i64, Message)>),
    /// Live frames after this sequence pass.
    Open { through: i64 },
    /// The channel left, or fell too far behind: nothing passes.
    Closed,
}

pub struct Gate {
    state: Mutex<State>,
    /// The position (epoch, sequence) of the last message queued to the socket through
    /// this gate, history included: a second join of the channel on the same socket
    /// (realtime-js may send two on a reconnect) resumes after it, not after the older
    /// position its payload still names.
    last: Mutex<Option<(i64, i64)>>,
    /// Most frames held: past it the connection is cut off as too slow, as a full outbound
    /// queue would cut it off.
    max_held: usize,
}

impl Gate {
    pub fn new(max_held: usize) -> Arc<Self> {
        Arc::new(Gate {
            state: Mutex::new(State::Holding(Vec::new())),
            last: Mutex::new(None),
            max_held,
        })
    }

    /// What the hub does with a live frame at (`epoch`, `seq`): Some to send it now.
    pub fn pass(
        &self,
        epoch: i64,
        seq: i64,
        frame: &Message,
        too_slow: &Notify,
    ) -> Option<Message> {
        let mut state = self.state.lock().unwrap();
        match &mut *state {
            State::Holding(held) => {
                if held.len() >= self.max_held {
                    *state = State::Closed;
                    too_slow.notify_one();
                } else {
                    held.push((seq, frame.clone()));
                }
                None
            }
            State::Open { through } if seq > *through => {
                self.sent(epoch, seq);
                Some(frame.clone())
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

    /// Opens the gate after the history went through `through`: the held frames after it
    /// go to `tx` (in order, under the lock, so no later live frame overtakes them).
    /// `epoch` is the queue's, which held frames are of.
    pub fn open(&self, epoch: i64, through: i64, tx: &mpsc::Sender<Message>, too_slow: &Notify) {
        let mut state = self.state.lock().unwrap();
        let State::Holding(held) = std::mem::replace(&mut *state, State::Open { through }) else {
            *state = State::Closed;
            return;
        };
        for (seq, frame) in held {
            if seq <= through {
                continue;
            }
            if tx.try_send(frame).is_err() {
                *state = State::Closed;
                too_slow.notify_one();
                return;
            }
            self.sent(epoch, seq);
        }
    }

    /// The channel left: nothing more passes, and the history still being sent stops.
    pub fn close(&self) {
        *self.state.lock().unwrap() = State::Closed;
    }

    pub fn is_closed(&self) -> bool {
        matches!(*self.state.lock().unwrap(), State::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    fn frame(n: i64) -> Message {
        Message::text(n.to_string())
    }

    fn drain(rx: &mut mpsc::Receiver<Message>) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| m.into_text().unwrap().to_string())
            .collect()
    }

    #[test]
    fn held_frames_after_the_history_pass_once_and_in_order() {
        let (tx, mut rx) = mpsc::channel(16);
        let slow = Notify::new();
        let gate = Gate::new(100);
        // Live frames 5..=8 arrive while the history (through 6) is being read.
        for n in 5..=8 {
            assert!(gate.pass(1, n, &frame(n), &slow).is_none());
        }
        assert_eq!(gate.last_sent(), None);
        gate.open(1, 6, &tx, &slow);
        assert_eq!(drain(&mut rx), vec!["7", "8"]);
        assert_eq!(gate.last_sent(), Some((1, 8)));
        // A drainer behind the history re-dispatches 6: dropped; 9 passes.
        assert!(gate.pass(1, 6, &frame(6), &slow).is_none());
        assert!(gate.pass(1, 9, &frame(9), &slow).is_some());
        assert_eq!(gate.last_sent(), Some((1, 9)));
        gate.close();
        assert!(gate.is_closed());
        assert!(gate.pass(1, 10, &frame(10), &slow).is_none());
        assert!(slow.notified().now_or_never().is_none());
    }

    #[test]
    fn holding_too_much_cuts_the_connection_off() {
        let slow = Notify::new();
        let gate = Gate::new(2);
        for n in 1..=3 {
            gate.pass(1, n, &frame(n), &slow);
        }
        assert!(slow.notified().now_or_never().is_some());
        assert!(gate.is_closed());
    }
}
