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
//!
//! Once the connection's socket is attached (`Receiver::attach`), the queue also writes:
//! a batch handed to `Sender::send_batch` while nothing is waiting goes to the socket at
//! once, in one vectored system call from the pusher's thread, and only what the socket
//! would not take is queued for the connection's task (`Receiver::write_some`). Every
//! write, the pusher's or the task's, happens under the queue's lock and takes from its
//! head, so frames leave in the order they were pushed. While the connection's task is
//! handling a client frame (`hold`) nothing is written directly: its replies are put ahead
//! of what was queued meanwhile (`put_first`), as when the task wrote them first itself.

use super::shared_bytes::SharedBytes;
use super::write::{self, Socket};
use crate::address::AddressKey;
use crate::byte_budget::Over;
use bytes::Bytes;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
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
    /// Bytes to write before `frames`: the tail of a frame the socket took in part, and
    /// tungstenite's own frames (`Raw`). Each entry ends at a frame boundary.
    rest: VecDeque<Bytes>,
    /// Where frames are written (once attached); None: the reader takes them (`recv`).
    socket: Option<Arc<dyn Socket>>,
    /// The connection's task is handling a client frame: nothing is written directly.
    held: bool,
    /// The sidecar's or the address's bound on large frames cut the connection off
    /// (`shared_bytes`); None when its own bounds did.
    cut_by: Option<Over>,
}

impl State {
    /// Whether a pusher may write to the socket now: attached, nothing waiting, not held.
    fn writable_now(&self) -> Option<Arc<dyn Socket>> {
        if self.held || !self.frames.is_empty() || !self.rest.is_empty() {
            return None;
        }
        self.socket.clone()
    }

    /// Queues `frame` within the bounds (the connection's, then the sidecar's and its
    /// address's on large frames); false (and marked overflowed) if one is reached.
    fn push(&mut self, frame: Message, inner: &Inner) -> bool {
        let n = frame.len();
        let too_many_bytes = !self.frames.is_empty() && self.bytes + n > inner.max_bytes;
        if self.frames.len() >= inner.capacity || too_many_bytes {
            self.overflowed = true;
            return false;
        }
        if let Err(over) = inner.enter(&frame, false) {
            self.overflowed = true;
            self.cut_by = Some(over);
            return false;
        }
        self.bytes += n;
        self.frames.push_back(frame);
        true
    }
}

struct Inner {
    state: Mutex<State>,
    /// Wakes the reader after a push or when the last sender leaves.
    readable: Notify,
    /// Wakes the reader once the queue overflowed.
    cut: Notify,
    capacity: usize,
    max_bytes: usize,
    /// The table of large frames every queue shares, and this connection's address there.
    counted: Option<(SharedBytes, Option<AddressKey>)>,
}

impl Inner {
    fn enter(&self, frame: &Message, force: bool) -> Result<(), Over> {
        match &self.counted {
            Some((shared, address)) => shared.enter(frame, *address, force),
            None => Ok(()),
        }
    }

    fn leave(&self, frame: &Message) {
        if let Some((shared, address)) = &self.counted {
            shared.leave(frame, *address);
        }
    }
}

/// The pushing side; cloned into every place that writes to the connection.
pub struct Sender {
    inner: Arc<Inner>,
}

/// The connection task's side.
pub struct Receiver {
    inner: Arc<Inner>,
}

/// Bytes written ahead of the queued frames (tungstenite's own frames: pongs, the answer to
/// a client's close); not a sender (it does not keep the queue open).
pub struct Raw {
    inner: Arc<Inner>,
}

impl Raw {
    /// Queues whole frames' bytes; false once the reader is gone.
    pub fn push(&self, bytes: Bytes) -> bool {
        {
            let mut s = self.inner.state.lock().unwrap();
            if s.closed {
                return false;
            }
            s.rest.push_back(bytes);
        }
        self.inner.readable.notify_one();
        true
    }
}

/// What `Receiver::write_some` left.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// Nothing is waiting.
    All,
    /// The socket takes no more for now: wait until it is writable, then write again.
    Blocked,
    /// The most frames of one call were written and more wait.
    More,
}

/// A queue of at most `capacity` frames, whatever their size.
pub fn channel(capacity: usize) -> (Sender, Receiver) {
    bounded(capacity, usize::MAX)
}

/// A queue of at most `capacity` frames and `max_bytes` bytes.
pub fn bounded(capacity: usize, max_bytes: usize) -> (Sender, Receiver) {
    made(capacity, max_bytes, None)
}

/// A connection's queue: `bounded`, its large frames counted in `shared` for `address`
/// (None: a backend's).
pub fn connection(
    capacity: usize,
    max_bytes: usize,
    shared: SharedBytes,
    address: Option<AddressKey>,
) -> (Sender, Receiver) {
    made(capacity, max_bytes, Some((shared, address)))
}

fn made(
    capacity: usize,
    max_bytes: usize,
    counted: Option<(SharedBytes, Option<AddressKey>)>,
) -> (Sender, Receiver) {
    let inner = Arc::new(Inner {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            bytes: 0,
            senders: 1,
            closed: false,
            overflowed: false,
            rest: VecDeque::new(),
            socket: None,
            held: false,
            cut_by: None,
        }),
        readable: Notify::new(),
        cut: Notify::new(),
        capacity,
        max_bytes,
        counted,
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
    pub(super) fn send(&self, frame: Message) -> Sent {
        {
            let mut s = self.inner.state.lock().unwrap();
            if s.closed {
                return Sent::Closed;
            }
            if s.overflowed {
                return Sent::Full;
            }
            if !s.push(frame, &self.inner) {
                drop(s);
                self.inner.cut.notify_one();
                return Sent::Full;
            }
        }
        self.inner.readable.notify_one();
        Sent::Queued
    }

    /// Sends `frames` in order, as `send` each would, except that when nothing is waiting
    /// they are written to the attached socket at once (the connection's task is not woken
    /// for them), and only what the socket would not take is queued. Returns how many were
    /// taken (written or queued), and what became of the first one that was not.
    pub(super) fn send_batch(&self, frames: &[Message]) -> (usize, Sent) {
        self.send_run(frames, None)
    }

    /// `send_batch` with the frames already encoded, back to back, as `encoded`
    /// (`write::encode`): the same bytes for every subscriber of a run, made once, and
    /// written in one piece.
    pub(super) fn send_encoded(&self, frames: &[Message], encoded: &Bytes) -> (usize, Sent) {
        self.send_run(frames, Some(encoded))
    }

    fn send_run(&self, frames: &[Message], encoded: Option<&Bytes>) -> (usize, Sent) {
        let mut queued = false;
        let result = {
            let mut s = self.inner.state.lock().unwrap();
            if s.closed {
                return (0, Sent::Closed);
            }
            if s.overflowed {
                return (0, Sent::Full);
            }
            let mut start = 0;
            if let Some(socket) = s.writable_now() {
                // An error other than a full socket is left to the connection's task, which
                // meets it at its next write or read; the frames are queued meanwhile.
                let written = match encoded {
                    Some(bytes) => write::encoded(&*socket, frames, bytes),
                    None => write::direct(&*socket, frames),
                };
                if let Ok((done, cut)) = written {
                    start = done;
                    if let Some(cut) = cut {
                        s.rest.push_back(cut);
                        queued = true;
                    }
                }
            }
            let mut taken = (frames.len(), Sent::Queued);
            for (i, f) in frames.iter().enumerate().skip(start) {
                if !s.push(f.clone(), &self.inner) {
                    taken = (i, Sent::Full);
                    break;
                }
                queued = true;
            }
            taken
        };
        if result.1 == Sent::Full {
            self.inner.cut.notify_one();
        }
        if queued {
            self.inner.readable.notify_one();
        }
        result
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

    /// The queue's bound in bytes (a channel's hold counts against it too: `slots`).
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
    /// From now on frames are written to `socket` (by `send_batch` and `write_some`).
    pub fn attach(&self, socket: Arc<dyn Socket>) {
        self.inner.state.lock().unwrap().socket = Some(socket);
    }

    pub fn raw(&self) -> Raw {
        Raw {
            inner: self.inner.clone(),
        }
    }

    /// The connection's task is about to handle something that may answer the client:
    /// pushers queue rather than write until `put_first`.
    pub fn hold(&self) {
        self.inner.state.lock().unwrap().held = true;
    }

    /// Puts the task's own replies ahead of every queued frame (outside the bounds: they
    /// answer the client's own frames), and lets pushers write again.
    pub fn put_first(&self, replies: Vec<Message>) {
        let mut s = self.inner.state.lock().unwrap();
        s.held = false;
        for m in replies.into_iter().rev() {
            // Replies are always taken (they answer what the client asked): counted, never
            // refused.
            let _ = self.inner.enter(&m, true);
            s.bytes += m.len();
            s.frames.push_front(m);
        }
    }

    /// Resolves once something waits to be written. Cancel-safe.
    pub async fn pending(&self) {
        loop {
            let notified = self.inner.readable.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.inner.state.lock().unwrap();
                if !s.frames.is_empty() || !s.rest.is_empty() {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Writes what is waiting to the attached socket, oldest first, until all is written,
    /// the socket takes no more, or `max_frames` were written (so that a connection whose
    /// queue never empties still gets back to its other work between calls).
    pub fn write_some(&self, max_frames: usize) -> io::Result<Written> {
        let mut s = self.inner.state.lock().unwrap();
        let Some(socket) = s.socket.clone() else {
            return Ok(Written::All);
        };
        while let Some(head) = s.rest.front_mut() {
            match socket.try_write_vectored(&[IoSlice::new(head)]) {
                Ok(n) if n >= head.len() => {
                    s.rest.pop_front();
                }
                Ok(n) => {
                    let _ = head.split_to(n);
                    return Ok(Written::Blocked);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Written::Blocked),
                Err(e) => return Err(e),
            }
        }
        let mut budget = max_frames;
        while !s.frames.is_empty() {
            if budget == 0 {
                return Ok(Written::More);
            }
            let n = s.frames.len().min(write::WRITE_FRAMES).min(budget);
            budget -= n;
            let (done, cut) = write::direct(&*socket, &s.frames.make_contiguous()[..n])?;
            let st = &mut *s;
            for m in st.frames.drain(..done) {
                st.bytes -= m.len();
                self.inner.leave(&m);
            }
            if let Some(cut) = cut {
                s.rest.push_back(cut);
                return Ok(Written::Blocked);
            }
            if done < n {
                return Ok(Written::Blocked);
            }
        }
        if s.frames.capacity() > KEEP {
            s.frames = VecDeque::new();
        }
        Ok(Written::All)
    }

    /// Drops the frames not yet written, keeping the tail of one written in part (the
    /// stream must end at a frame boundary): a closing connection sends its last words only.
    pub fn discard_queued(&self) {
        let mut s = self.inner.state.lock().unwrap();
        for m in std::mem::take(&mut s.frames) {
            self.inner.leave(&m);
        }
        s.bytes = 0;
    }

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

    /// Which shared bound on large frames cut the connection off, if one did.
    pub fn cut_by(&self) -> Option<Over> {
        self.inner.state.lock().unwrap().cut_by
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
                self.inner.leave(&frame);
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
        for m in std::mem::take(&mut s.frames) {
            self.inner.leave(&m);
        }
        s.bytes = 0;
        s.rest = VecDeque::new();
        s.socket = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

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

    /// A socket that takes up to `room` bytes, then would block.
    struct Fake {
        taken: Mutex<Vec<u8>>,
        room: Mutex<usize>,
        calls: Mutex<usize>,
    }

    impl Fake {
        fn new(room: usize) -> Arc<Fake> {
            Arc::new(Fake {
                taken: Mutex::new(Vec::new()),
                room: Mutex::new(room),
                calls: Mutex::new(0),
            })
        }

        /// The messages written so far, read back by tungstenite as a client would.
        fn messages(&self) -> Vec<Message> {
            use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};
            let bytes = self.taken.lock().unwrap().clone();
            let mut ws = WebSocket::from_raw_socket(
                std::io::Cursor::new(bytes),
                Role::Client,
                Some(Default::default()),
            );
            // Whole frames until the bytes end (a cut frame is not read).
            std::iter::from_fn(|| ws.read().ok()).collect()
        }
    }

    impl Socket for Fake {
        fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            *self.calls.lock().unwrap() += 1;
            let mut room = self.room.lock().unwrap();
            if *room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut taken = self.taken.lock().unwrap();
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(*room - n);
                taken.extend_from_slice(&b[..k]);
                n += k;
            }
            *room -= n;
            Ok(n)
        }
    }

    fn attached(capacity: usize, max_bytes: usize, room: usize) -> (Sender, Receiver, Arc<Fake>) {
        let (tx, rx) = bounded(capacity, max_bytes);
        let fake = Fake::new(room);
        rx.attach(fake.clone());
        (tx, rx, fake)
    }

    fn texts(n: std::ops::Range<usize>) -> Vec<Message> {
        n.map(|i| text(&format!("frame {i}"))).collect()
    }

    #[test]
    fn a_batch_is_written_at_once_in_one_call_when_nothing_waits() {
        let (tx, rx, fake) = attached(100, 1 << 20, usize::MAX);
        assert_eq!(tx.send_batch(&texts(0..5)), (5, Sent::Queued));
        assert_eq!(*fake.calls.lock().unwrap(), 1, "one vectored write");
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty), "nothing queued");
        assert!(
            rx.pending().now_or_never().is_none(),
            "the task is not woken"
        );
        assert_eq!(fake.messages(), texts(0..5));
    }

    #[test]
    fn what_the_socket_does_not_take_is_queued_and_written_after_in_order() {
        // Room for the first frame and 3 bytes of the second.
        let first = write::parts(&text("frame 0")).map(|(h, p)| h.as_slice().len() + p.len());
        let (tx, rx, fake) = attached(100, 1 << 20, first.unwrap() + 3);
        assert_eq!(tx.send_batch(&texts(0..4)), (4, Sent::Queued));
        assert!(rx.pending().now_or_never().is_some(), "the task is woken");
        // Later frames queue behind, however much room there is now.
        *fake.room.lock().unwrap() = usize::MAX;
        assert_eq!(tx.send_batch(&texts(4..6)), (2, Sent::Queued));
        assert_eq!(fake.messages(), texts(0..1));
        assert_eq!(rx.write_some(usize::MAX).unwrap(), Written::All);
        assert_eq!(fake.messages(), texts(0..6));
        assert_eq!(tx.inner.state.lock().unwrap().bytes, 0);
    }

    #[test]
    fn a_blocked_socket_fills_the_queue_to_its_bounds_and_cuts_the_client_off() {
        let (tx, rx, fake) = attached(3, 1 << 20, 0);
        assert_eq!(tx.send_batch(&texts(0..2)), (2, Sent::Queued));
        assert_eq!(tx.send_batch(&texts(2..5)), (1, Sent::Full));
        assert!(rx.overflowed().now_or_never().is_some());
        assert_eq!(tx.send_batch(&texts(5..6)), (0, Sent::Full), "nothing more");
        assert_eq!(rx.write_some(usize::MAX).unwrap(), Written::Blocked);
        *fake.room.lock().unwrap() = usize::MAX;
        assert_eq!(rx.write_some(usize::MAX).unwrap(), Written::All);
        assert_eq!(fake.messages(), texts(0..3));
    }

    /// The hub writes with `send(2)` past tokio (`Socket::send_now`), so tokio never sees
    /// the socket fill up: the connection's task, which waits on tokio's readiness, must
    /// still finish what the hub could not write, in order, once the client reads again.
    #[tokio::test]
    async fn a_socket_the_hubs_sends_filled_is_finished_by_the_task_in_order() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_read, write) = server.into_split();
        let write = Arc::new(write);
        let (tx, rx) = bounded(100_000, 1 << 30);
        rx.attach(write.clone());
        // Encoded runs, as the hub sends them, until the socket stops taking them.
        let frame = |i: usize| text(&format!("{i:08}{}", "x".repeat(16 << 10)));
        let mut sent = Vec::new();
        let mut runs = 0;
        while rx.pending().now_or_never().is_none() {
            assert!(
                runs < 10_000,
                "a loopback socket takes no more than a few MB"
            );
            let frames: Vec<Message> = (sent.len()..sent.len() + 4).map(frame).collect();
            let encoded = write::encode(&frames);
            assert_eq!(tx.send_encoded(&frames, &encoded), (4, Sent::Queued));
            sent.extend(frames);
            runs += 1;
        }
        assert!(runs > 1, "the first run went out whole, without the task");
        // The client reads everything while the task writes what waits, as `socket.rs` does.
        let expected: usize = sent.iter().map(write::encoded_len).sum();
        let reader = tokio::spawn(async move {
            let mut got = Vec::with_capacity(expected);
            let mut buf = vec![0u8; 1 << 16];
            while got.len() < expected {
                let n = client.read(&mut buf).await.unwrap();
                assert!(n > 0, "the server closed early");
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let task = async {
            for _ in 0..100_000 {
                match rx.write_some(usize::MAX).unwrap() {
                    Written::All => return,
                    Written::More => {}
                    Written::Blocked => write.writable().await.unwrap(),
                }
            }
            panic!("the task did not finish the queue");
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), task)
            .await
            .expect("the task stalled");
        let got = tokio::time::timeout(std::time::Duration::from_secs(30), reader)
            .await
            .expect("the client stalled")
            .unwrap();
        assert_eq!(
            got,
            write::encode(&sent).to_vec(),
            "every frame, once, in order"
        );
    }

    #[test]
    fn replies_go_ahead_of_what_was_pushed_while_held() {
        let (tx, rx, fake) = attached(100, 1 << 20, usize::MAX);
        rx.hold();
        // A channel's broadcast while its join is being handled: queued, not written.
        assert_eq!(tx.send_batch(&texts(1..3)), (2, Sent::Queued));
        assert!(fake.messages().is_empty());
        rx.put_first(vec![text("reply")]);
        assert_eq!(rx.write_some(usize::MAX).unwrap(), Written::All);
        let mut want = vec![text("reply")];
        want.extend(texts(1..3));
        assert_eq!(fake.messages(), want);
        // Released: written at once again.
        assert_eq!(tx.send_batch(&texts(3..4)), (1, Sent::Queued));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        want.extend(texts(3..4));
        assert_eq!(fake.messages(), want);
    }

    #[test]
    fn raw_frames_go_out_at_a_frame_boundary() {
        // The socket takes 3 bytes of a frame; a pong pushed meanwhile follows that frame.
        let (tx, rx, fake) = attached(100, 1 << 20, 3);
        assert_eq!(tx.send_batch(&texts(0..2)), (2, Sent::Queued));
        let pong_msg = Message::Pong(Bytes::from_static(b"p"));
        let (h, p) = write::parts(&pong_msg).unwrap();
        let mut pong = h.as_slice().to_vec();
        pong.extend_from_slice(p);
        assert!(rx.raw().push(Bytes::from(pong)));
        *fake.room.lock().unwrap() = usize::MAX;
        assert_eq!(rx.write_some(usize::MAX).unwrap(), Written::All);
        let got = fake.messages();
        assert_eq!(got[0], texts(0..1)[0]);
        assert_eq!(got[1], Message::Pong(Bytes::from_static(b"p")));
        assert_eq!(got[2..], texts(1..2)[..]);
    }

    #[test]
    fn the_task_writes_at_most_its_budget_per_call() {
        let (tx, rx, fake) = attached(100, 1 << 20, 0);
        assert_eq!(tx.send_batch(&texts(0..5)), (5, Sent::Queued));
        *fake.room.lock().unwrap() = usize::MAX;
        assert_eq!(rx.write_some(2).unwrap(), Written::More);
        assert_eq!(fake.messages(), texts(0..2));
        assert_eq!(rx.write_some(3).unwrap(), Written::All);
        assert_eq!(fake.messages(), texts(0..5));
    }
}
