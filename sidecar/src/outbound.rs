//! A connection's outbound queue: the frames the hub, Postgres Changes, presence, history
//! and the relay put on the socket's way out, bounded, read by the connection's own task
//! (`socket`).
//!
//! Why not tokio's mpsc channel: it allocates its first block (32 slots of 56-byte
//! messages, 1.8 KiB) when it is made, for every connection, idle or not; at 250,000
//! connections that block was the largest share of a connection's memory left
//! (`pgbench/RESULTS.md`, "Connections held"). This queue allocates at its first frame, and
//! gives its buffer back once a burst of more than `KEEP` frames has been read.
//!
//! One lock per push and per pop, never held across an await: the pushers (the hub's
//! dispatch, a history send) and the one reader take it for a few instructions.
//!
//! The queue is bounded in frames and in bytes (`MAX_OUTBOUND_FRAMES`, `MAX_OUTBOUND_BYTES`):
//! frames alone let one client that stopped reading pin 20,000 frames of up to a MiB each.
//! A frame is always taken into an empty queue, so no single frame, however large, cuts off
//! a client that reads.
//!
//! The queue also owns the rule for a client that cannot keep up: a push that finds it full
//! marks it overflowed, and the reader (the socket loop, waiting on `overflowed`) ends the
//! connection as too slow. No pusher decides that itself, and nothing more is queued once
//! the mark is set.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;

/// A buffer this large or smaller is kept when the queue empties; a larger one is freed.
const KEEP: usize = 32;

/// What became of a frame handed to `send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The queue held its capacity (or was cut off before): the frame was dropped and the
    /// connection is being closed as too slow.
    Full,
    /// The connection's task is gone.
    Closed,
}

/// Why `try_recv` returned no frame.
#[derive(Debug, PartialEq, Eq)]
pub enum TryRecvError {
    Empty,
    /// Every sender is gone and everything was read.
    Disconnected,
}

struct State {
    frames: VecDeque<Message>,
    /// The bytes of `frames`.
    bytes: usize,
    /// Senders alive; the reader sees the end when it reaches 0 and the queue is empty.
    senders: usize,
    /// The reader is gone.
    closed: bool,
    /// A push found the queue full, or a sender cut the connection off: it must close.
    overflowed: bool,
}

struct Inner {
    state: Mutex<State>,
    /// Wakes the reader after a push or when the last sender leaves.
    readable: Notify,
    /// Wakes the reader once the queue overflowed.
    cut: Notify,
    capacity: usize,
    max_bytes: usize,
}

/// The pushing side; cloned into every place that writes to the connection.
pub struct Sender {
    inner: Arc<Inner>,
}

/// The connection task's side.
pub struct Receiver {
    inner: Arc<Inner>,
}

/// A queue of at most `capacity` frames, whatever their size.
pub fn channel(capacity: usize) -> (Sender, Receiver) {
    bounded(capacity, usize::MAX)
}

/// A queue of at most `capacity` frames and `max_bytes` bytes (a connection's).
pub fn bounded(capacity: usize, max_bytes: usize) -> (Sender, Receiver) {
    let inner = Arc::new(Inner {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            bytes: 0,
            senders: 1,
            closed: false,
            overflowed: false,
        }),
        readable: Notify::new(),
        cut: Notify::new(),
        capacity,
        max_bytes,
    });
    (
        Sender {
            inner: inner.clone(),
        },
        Receiver { inner },
    )
}

impl Sender {
    /// Queues `frame` unless the queue is full or its reader gone; never waits. A full
    /// queue is marked overflowed: the connection closes as too slow.
    pub fn send(&self, frame: Message) -> Sent {
        {
            let mut s = self.inner.state.lock().unwrap();
            if s.closed {
                return Sent::Closed;
            }
            if s.overflowed {
                return Sent::Full;
            }
            let n = frame.len();
            let too_many_bytes = !s.frames.is_empty() && s.bytes + n > self.inner.max_bytes;
            if s.frames.len() >= self.inner.capacity || too_many_bytes {
                s.overflowed = true;
                drop(s);
                self.inner.cut.notify_one();
                return Sent::Full;
            }
            s.bytes += n;
            s.frames.push_back(frame);
        }
        self.inner.readable.notify_one();
        Sent::Queued
    }

    /// Marks the connection too slow without a full queue (a history that made no progress
    /// for too long): it closes with that reason.
    pub fn cut_off(&self) {
        self.inner.state.lock().unwrap().overflowed = true;
        self.inner.cut.notify_one();
    }

    /// Frames that could be queued now; none while half the bytes are taken, so that a
    /// sender that paces itself on this (a history being sent waits for more than half of
    /// `max_capacity`) never fills the byte bound either.
    pub fn capacity(&self) -> usize {
        let s = self.inner.state.lock().unwrap();
        if s.bytes >= self.inner.max_bytes / 2 {
            return 0;
        }
        self.inner.capacity.saturating_sub(s.frames.len())
    }

    pub fn max_capacity(&self) -> usize {
        self.inner.capacity
    }

    /// The queue's bound in bytes (a channel's hold counts against it too: `change_hold`).
    pub fn max_bytes(&self) -> usize {
        self.inner.max_bytes
    }

    /// The reader (the connection's task) is gone.
    pub fn is_closed(&self) -> bool {
        self.inner.state.lock().unwrap().closed
    }
}

impl Clone for Sender {
    fn clone(&self) -> Self {
        self.inner.state.lock().unwrap().senders += 1;
        Sender {
            inner: self.inner.clone(),
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let last = {
            let mut s = self.inner.state.lock().unwrap();
            s.senders -= 1;
            s.senders == 0
        };
        if last {
            self.inner.readable.notify_one();
        }
    }
}

impl Receiver {
    /// The oldest frame; waits for one. None once every sender is gone and all was read.
    /// Cancel-safe: a frame is taken only when this returns it.
    pub async fn recv(&self) -> Option<Message> {
        loop {
            // Registered before the queue is looked at, so a push in between wakes it.
            let notified = self.inner.readable.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.take() {
                Ok(frame) => return Some(frame),
                Err(true) => return None,
                Err(false) => notified.await,
            }
        }
    }

    /// Resolves once the queue overflowed (or was cut off): the connection must close as
    /// too slow. Cancel-safe.
    pub async fn overflowed(&self) {
        loop {
            let notified = self.inner.cut.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.state.lock().unwrap().overflowed {
                return;
            }
            notified.await;
        }
    }

    /// The oldest frame if one is queued.
    pub fn try_recv(&self) -> Result<Message, TryRecvError> {
        self.take().map_err(|ended| {
            if ended {
                TryRecvError::Disconnected
            } else {
                TryRecvError::Empty
            }
        })
    }

    /// A frame, or Err(whether every sender is gone).
    fn take(&self) -> Result<Message, bool> {
        let mut s = self.inner.state.lock().unwrap();
        match s.frames.pop_front() {
            Some(frame) => {
                s.bytes -= frame.len();
                if s.frames.is_empty() && s.frames.capacity() > KEEP {
                    s.frames = VecDeque::new();
                }
                Ok(frame)
            }
            None => Err(s.senders == 0),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut s = self.inner.state.lock().unwrap();
        s.closed = true;
        s.frames = VecDeque::new();
        s.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Message {
        Message::text(s)
    }

    #[tokio::test]
    async fn frames_come_out_in_order_up_to_the_capacity_and_the_end_is_seen() {
        let (tx, rx) = channel(2);
        assert_eq!(tx.max_capacity(), 2);
        assert_eq!(tx.send(text("a")), Sent::Queued);
        let tx2 = tx.clone();
        assert_eq!(tx2.send(text("b")), Sent::Queued);
        assert_eq!(tx.capacity(), 0);
        assert_eq!(tx.send(text("c")), Sent::Full);
        assert_eq!(rx.recv().await, Some(text("a")));
        assert_eq!(rx.try_recv(), Ok(text("b")));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        drop((tx, tx2));
        assert_eq!(rx.recv().await, None, "every sender gone");
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_at_a_push_and_a_gone_reader_refuses_frames() {
        let (tx, rx) = channel(4);
        let reader = tokio::spawn(async move {
            let first = rx.recv().await;
            (first, rx)
        });
        tokio::task::yield_now().await;
        assert_eq!(tx.send(text("late")), Sent::Queued);
        let (first, rx) = reader.await.unwrap();
        assert_eq!(first, Some(text("late")));
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.send(text("x")), Sent::Closed);
    }

    #[tokio::test]
    async fn a_recv_cancelled_by_another_branch_loses_nothing() {
        let (tx, rx) = channel(4);
        for _ in 0..3 {
            tokio::select! {
                biased;
                _ = std::future::ready(()) => {}
                _ = rx.recv() => unreachable!("nothing queued yet"),
            }
        }
        assert_eq!(tx.send(text("kept")), Sent::Queued);
        assert_eq!(rx.recv().await, Some(text("kept")));
    }

    #[tokio::test]
    async fn a_full_queue_marks_itself_overflowed_and_takes_nothing_more() {
        use futures_util::FutureExt;
        let (tx, rx) = channel(1);
        assert!(rx.overflowed().now_or_never().is_none());
        assert_eq!(tx.send(text("a")), Sent::Queued);
        assert!(rx.overflowed().now_or_never().is_none(), "full is not over");
        assert_eq!(tx.send(text("b")), Sent::Full);
        assert!(rx.overflowed().now_or_never().is_some());
        // Room again, but the connection is being closed: nothing more goes in.
        assert_eq!(rx.try_recv(), Ok(text("a")));
        assert_eq!(tx.send(text("c")), Sent::Full);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    #[test]
    fn bytes_are_bounded_as_frames_are_and_one_large_frame_still_passes() {
        let (tx, rx) = bounded(100, 10);
        // Larger than the bound, into an empty queue: taken (a reading client is not cut
        // off by one large message).
        assert_eq!(tx.send(text(&"a".repeat(12))), Sent::Queued);
        assert_eq!(rx.try_recv(), Ok(text(&"a".repeat(12))));
        assert_eq!(tx.send(text("12345")), Sent::Queued);
        assert_eq!(
            tx.capacity(),
            0,
            "half the bytes taken: a paced sender waits"
        );
        assert_eq!(tx.send(text("6789")), Sent::Queued);
        assert_eq!(tx.send(text("xy")), Sent::Full, "11 bytes > 10");
        assert_eq!(tx.send(text("")), Sent::Full, "overflowed: nothing more");
        assert_eq!(rx.try_recv(), Ok(text("12345")));
        assert_eq!(tx.inner.state.lock().unwrap().bytes, 4);
    }

    #[tokio::test]
    async fn a_cut_off_wakes_a_waiting_reader() {
        let (tx, rx) = channel(8);
        let waiting = tokio::spawn(async move { rx.overflowed().await });
        tokio::task::yield_now().await;
        tx.cut_off();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .unwrap();
    }

    #[test]
    fn nothing_is_allocated_before_the_first_frame_and_a_burst_gives_its_buffer_back() {
        let (tx, rx) = channel(100);
        assert_eq!(tx.inner.state.lock().unwrap().frames.capacity(), 0);
        for i in 0..KEEP * 2 {
            assert_eq!(tx.send(text(&i.to_string())), Sent::Queued);
        }
        while rx.try_recv().is_ok() {}
        assert_eq!(tx.inner.state.lock().unwrap().frames.capacity(), 0);
        assert_eq!(tx.send(text("small")), Sent::Queued);
        rx.try_recv().unwrap();
        let kept = tx.inner.state.lock().unwrap().frames.capacity();
        assert!(kept > 0 && kept <= KEEP, "a small buffer is kept: {kept}");
    }
}
