//! A channel's ordered hold: what the drain hands a channel waits behind that channel's
//! Postgres Changes whose check is still running, so the channel gets everything in queue
//! order while every other channel, and the drain, go on.
//!
//! Why: a table's check (`postgres_changes::deliver`, up to CHANGES_CHECK_TIMEOUT_MS) used
//! to run on the drain's path, so one bulk write into a table with a costly policy delayed
//! every broadcast of every channel by that long (the soak in `pgbench/RESULTS.md`). The
//! checks now run beside the drain (`postgres_changes::pool`); the drain hands out the
//! rest of the batch at once. But a channel's resume position (epoch, seq) means
//! "everything up to seq was sent on this channel": a change of that channel must not be
//! overtaken by a broadcast committed after it. So when the drain hands out a change whose
//! check is pending, it leaves a *slot* in each of the change's channels' holds; anything
//! the drain hands that channel later (a broadcast, another change, a `system` notice) queues
//! behind the slot. When the check decides, the slot is filled with what the channel gets of
//! that change (its frame, a notice that it was withheld, or nothing) and the hold lets out
//! from its front everything up to the next slot still pending, in order.
//!
//! The fast path: a channel with no slot pending queues its frames straight to its socket
//! after one atomic load (`pending`), no lock. The hold's lock is taken only by a channel that
//! has a slot pending, by the drain placing a slot, and by a check filling one.
//!
//! Bounded: the frames and slots held count against the connection's outbound bounds
//! (MAX_OUTBOUND_FRAMES, MAX_OUTBOUND_BYTES), as if they were queued already: a channel that
//! would pass them is cut off as a slow client is (its connection closes as too slow), and
//! what it held is dropped.
//!
//! A history's gate (`gate`) hands the live frames it held while the history was sent to
//! this hold in one `merge`, each put where its position falls among the slots: a frame
//! before the first pending slot of a later change goes out at once, one after it waits.
//! Queued one by one behind every pending slot, a change that passed the gate while it held
//! was let out after a later change whose check was still running when it opened.
//!
//! What the hold does not order: replies to the client's own pushes and presence (neither
//! carries a queue position) go straight to the socket, and so does a history's resent
//! frames, which precede every live frame the gate held.

use super::queue::{Sender, Sent};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio_tungstenite::tungstenite::Message;

/// A frame of change `.1` of check `.0`, as a check fills the slots it decided.
pub type Filled = (u64, u32, Message);

/// One place in the hold's queue.
enum Item {
    Frame(Message),
    /// Change `change` of check `job`, at queue position `seq`: pending until filled with
    /// that channel's frames of it.
    Slot {
        job: u64,
        change: u32,
        seq: i64,
        filled: Option<Vec<Message>>,
    },
}

#[derive(Default)]
struct Held {
    queue: VecDeque<Item>,
    /// Frames in `queue`, a pending slot counted as one (it becomes at most one frame of a
    /// change, or one notice).
    count: usize,
    /// Bytes of the frames in `queue` (a pending slot has none yet).
    bytes: usize,
    /// Over the bounds (the connection is being closed), or the channel left: nothing more
    /// is held or sent.
    cut: bool,
}

#[derive(Default)]
pub struct Hold {
    /// Slots not yet filled. Written only under `held`'s lock, at the end of the critical
    /// section (after what it let out was queued to the socket); read without the lock by
    /// the fast path: 0 means nothing is held, so a frame goes straight to the socket.
    pending: AtomicUsize,
    /// The queue of what waits. Lock rule: held for a few instructions, never across an
    /// await; the outbound queue's own lock is taken inside it (never the reverse).
    held: Mutex<Held>,
}

impl Hold {
    /// Nothing is held: the drain's frames may go straight to the socket, in a run or one
    /// by one (the hub's batched writes ask this first). Only the drain adds slots, so a
    /// clear hold stays clear while the drain hands out its batch.
    pub fn is_clear(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// Queues `frame` to `out`, or behind the pending slots.
    pub fn send(&self, frame: Message, out: &Sender) -> Sent {
        if self.pending.load(Ordering::Acquire) == 0 {
            return out.send(frame);
        }
        let mut held = self.held.lock().unwrap();
        if held.cut {
            return Sent::Full;
        }
        if held.queue.is_empty() {
            // Filled meanwhile: everything before it was let out.
            return out.send(frame);
        }
        let n = frame.len();
        if !self.room(&held, n, out) {
            self.cut(&mut held, out);
            return Sent::Full;
        }
        held.bytes += n;
        held.count += 1;
        held.queue.push_back(Item::Frame(frame));
        Sent::Queued
    }

    /// Leaves a pending slot for change `change` of check `job`, at queue position `seq`:
    /// what the drain hands this channel after it waits until `fill`. False if the channel
    /// is over its bounds (cut off): then nothing is to be filled.
    pub fn slot(&self, job: u64, change: u32, seq: i64, out: &Sender) -> bool {
        let mut held = self.held.lock().unwrap();
        if held.cut {
            return false;
        }
        if !self.room(&held, 0, out) {
            self.cut(&mut held, out);
            return false;
        }
        held.count += 1;
        held.queue.push_back(Item::Slot {
            job,
            change,
            seq,
            filled: None,
        });
        self.pending.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Checks `jobs` (ascending ids) decided: each of their slots here gets its frames of
    /// `frames` (sorted by job, then change, as the slots were left; none for a slot without
    /// any), and everything up to the next pending slot is let out. One walk of the queue
    /// for all the jobs of a merged check: walked once per job, the fills of a check that
    /// took a hundred drained batches cost a hundred walks of every channel's hold, and at
    /// 1,000 inserts/s into a table of 1,000 subscribers they were a third of the sidecar's
    /// CPU (`pgbench/changes.py`, RESULTS.md).
    pub fn fill(&self, jobs: &[u64], frames: Vec<Filled>, out: &Sender) {
        let mut held = self.held.lock().unwrap();
        let mut frames = frames.into_iter().peekable();
        let mut filled = 0;
        let (mut added, mut count) = (0, 0);
        for item in held.queue.iter_mut() {
            let Item::Slot {
                job,
                change,
                filled: f @ None,
                ..
            } = item
            else {
                continue;
            };
            if jobs.binary_search(job).is_err() {
                continue;
            }
            let here = (*job, *change);
            // Frames of a slot no longer here (never the case while the hold is whole)
            // are passed over.
            while frames.next_if(|(j, c, _)| (*j, *c) < here).is_some() {}
            let mut got = Vec::new();
            while let Some((_, _, m)) = frames.next_if(|(j, c, _)| (*j, *c) == here) {
                added += m.len();
                got.push(m);
            }
            count += got.len();
            *f = Some(got);
            filled += 1;
        }
        held.bytes += added;
        held.count = held.count + count - filled;
        let pending = self.pending.load(Ordering::Acquire) - filled;
        self.release(&mut held, pending, out);
    }

    /// Puts the live frames a history's gate held (`gate`), sorted by their place (queue
    /// position, and whether the frame tells of the place after it, as a position message
    /// does), each before the first slot of a later position, then lets out what is no
    /// longer behind a pending slot. A frame of an earlier position than every pending slot
    /// goes out at once; one after a pending slot waits for it.
    pub fn merge(&self, frames: Vec<((i64, bool), Message)>, out: &Sender) -> Sent {
        let mut held = self.held.lock().unwrap();
        if held.cut {
            return Sent::Full;
        }
        let mut at = 0;
        for ((seq, _), frame) in frames {
            while at < held.queue.len()
                && !matches!(held.queue[at], Item::Slot { seq: s, .. } if s > seq)
            {
                at += 1;
            }
            held.bytes += frame.len();
            held.count += 1;
            held.queue.insert(at, Item::Frame(frame));
            at += 1;
        }
        let pending = self.pending.load(Ordering::Acquire);
        self.release(&mut held, pending, out);
        if held.cut {
            Sent::Full
        } else {
            Sent::Queued
        }
    }

    /// Lets out from the front of the queue everything up to the first pending slot, then
    /// publishes `pending` (the slots left) for the fast path; a queue over the
    /// connection's bounds is cut.
    fn release(&self, held: &mut Held, mut pending: usize, out: &Sender) {
        if held.cut {
            held.queue.clear();
        } else {
            while let Some(front) = held.queue.front() {
                if matches!(front, Item::Slot { filled: None, .. }) {
                    break;
                }
                match held.queue.pop_front().expect("looked at") {
                    Item::Frame(f) => {
                        held.bytes -= f.len();
                        held.count -= 1;
                        out.send(f);
                    }
                    Item::Slot { filled, .. } => {
                        for f in filled.expect("matched") {
                            held.bytes -= f.len();
                            held.count -= 1;
                            out.send(f);
                        }
                    }
                }
            }
            // What a check or a merge added behind a slot still pending may pass the bounds.
            if held.count > out.max_capacity() || held.bytes > out.max_bytes() {
                self.cut(held, out);
            }
        }
        if held.cut {
            // Nothing of it will be sent; keep the slow path (the connection is closing).
            pending = pending.max(1);
        }
        self.pending.store(pending, Ordering::Release);
    }

    /// Whether `more` bytes and one more item fit the connection's bounds beside what is
    /// held (a frame is always taken into an empty hold, as into an empty queue).
    fn room(&self, held: &Held, more: usize, out: &Sender) -> bool {
        held.queue.is_empty()
            || (held.count < out.max_capacity() && held.bytes + more <= out.max_bytes())
    }

    fn cut(&self, held: &mut Held, out: &Sender) {
        held.cut = true;
        held.queue.clear();
        held.count = 0;
        held.bytes = 0;
        self.pending.store(
            self.pending.load(Ordering::Acquire).max(1),
            Ordering::Release,
        );
        out.cut_off();
    }

    /// The channel left: what it held is dropped and nothing more passes (a frame of the
    /// channel that left must not reach a later join of the same topic on the socket).
    /// Returns the queue position of the first change after `after` it held, if any: from
    /// there on nothing was sent (the queue is in position order, and only frames behind a
    /// change are held), so a second join of the channel resumes before it. (A change at or
    /// before `after`, the end of a history sent, was sent by the history.)
    pub fn close(&self, after: i64) -> Option<i64> {
        let mut held = self.held.lock().unwrap();
        let first = held.queue.iter().find_map(|i| match i {
            Item::Slot { seq, .. } if *seq > after => Some(*seq),
            _ => None,
        });
        held.cut = true;
        held.queue.clear();
        held.count = 0;
        held.bytes = 0;
        self.pending.store(1, Ordering::Release);
        first
    }

    /// Frames and slots held.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.lock().unwrap().queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::queue;
    use super::*;
    use futures_util::FutureExt;

    fn text(n: u32) -> Message {
        Message::text(n.to_string())
    }

    fn got(rx: &queue::Receiver) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| m.into_text().unwrap().to_string())
            .collect()
    }

    #[test]
    fn frames_behind_a_pending_change_wait_and_go_out_in_queue_order() {
        let (tx, rx) = queue::channel(100);
        let hold = Hold::default();
        assert_eq!(hold.send(text(1), &tx), Sent::Queued);
        // Changes 0 and 1 of job 7 are pending; frame 3 comes between them.
        assert!(hold.slot(7, 0, 2, &tx));
        assert_eq!(hold.send(text(3), &tx), Sent::Queued);
        assert!(hold.slot(7, 1, 4, &tx));
        assert!(hold.slot(8, 0, 5, &tx));
        assert_eq!(hold.send(text(6), &tx), Sent::Queued);
        assert_eq!(got(&rx), vec!["1"], "only what came before the slot");
        // Job 7 decided: change 0 gets frame 2, change 1 nothing (withheld).
        hold.fill(&[7], vec![(7, 0, text(2))], &tx);
        assert_eq!(got(&rx), vec!["2", "3"], "up to job 8's slot");
        hold.fill(&[8], vec![(8, 0, text(4)), (8, 0, text(5))], &tx);
        assert_eq!(got(&rx), vec!["4", "5", "6"]);
        assert_eq!(hold.held(), 0);
        assert_eq!(
            hold.pending.load(Ordering::Relaxed),
            0,
            "the fast path again"
        );
        assert_eq!(hold.send(text(7), &tx), Sent::Queued);
        assert_eq!(got(&rx), vec!["7"]);
    }

    /// A merged check fills every slot of its jobs in one walk, those with no frame too,
    /// and leaves another table's job pending among them.
    #[test]
    fn one_fill_decides_every_slot_of_a_merged_check_s_jobs() {
        let (tx, rx) = queue::channel(100);
        let hold = Hold::default();
        assert!(hold.slot(3, 0, 1, &tx));
        assert!(hold.slot(3, 1, 2, &tx));
        assert!(hold.slot(4, 0, 3, &tx), "another table's job");
        assert!(hold.slot(5, 0, 4, &tx));
        assert_eq!(hold.send(text(5), &tx), Sent::Queued);
        // Jobs 3 and 5 decided together: 3's change 1 was withheld (no frame).
        let frames = vec![(3, 0, text(1)), (5, 0, text(4))];
        hold.fill(&[3, 5], frames, &tx);
        assert_eq!(got(&rx), vec!["1"], "up to job 4's pending slot");
        assert_eq!(hold.pending.load(Ordering::Relaxed), 1);
        hold.fill(&[4], vec![(4, 0, text(3))], &tx);
        assert_eq!(got(&rx), vec!["3", "4", "5"]);
        assert_eq!(hold.pending.load(Ordering::Relaxed), 0);
        assert_eq!(hold.held(), 0);
    }

    /// Regression: the frames a history's gate held were queued behind every pending slot,
    /// so change 5, held while the history was sent, came out after change 9, whose check was
    /// still running when the gate opened. Merged by position, 5 goes out at once and 12 (a
    /// broadcast drained after 9) waits for it.
    #[test]
    fn frames_a_gate_held_are_merged_among_the_pending_slots_by_position() {
        let (tx, rx) = queue::channel(100);
        let hold = Hold::default();
        assert!(hold.slot(1, 0, 9, &tx));
        let merged = vec![((5, false), text(5)), ((12, false), text(12))];
        assert_eq!(hold.merge(merged, &tx), Sent::Queued);
        assert_eq!(got(&rx), vec!["5"], "before the pending change 9");
        hold.fill(&[1], vec![(1, 0, text(9))], &tx);
        assert_eq!(got(&rx), vec!["9", "12"]);
        assert_eq!(hold.pending.load(Ordering::Relaxed), 0);
        // With nothing pending, a merge goes straight out, in order.
        let merged = vec![((13, false), text(13)), ((13, true), text(14))];
        assert_eq!(hold.merge(merged, &tx), Sent::Queued);
        assert_eq!(got(&rx), vec!["13", "14"]);
    }

    #[test]
    fn a_channel_holding_more_than_its_connection_may_queue_is_cut_off() {
        let (tx, rx) = queue::channel(4);
        let hold = Hold::default();
        assert!(hold.slot(1, 0, 1, &tx));
        for n in 0..3 {
            assert_eq!(hold.send(text(n), &tx), Sent::Queued);
        }
        // The slot and three frames fill the connection's four: the fifth is too many.
        assert_eq!(hold.send(text(9), &tx), Sent::Full);
        assert!(
            rx.overflowed().now_or_never().is_some(),
            "closed as too slow"
        );
        assert_eq!(hold.held(), 0, "what it held is dropped");
        assert!(!hold.slot(2, 0, 2, &tx));
        hold.fill(&[1], vec![(1, 0, text(1))], &tx);
        assert!(got(&rx).is_empty(), "nothing more is sent");
    }

    #[test]
    fn a_channel_that_left_gets_nothing_more() {
        let (tx, rx) = queue::channel(100);
        let hold = Hold::default();
        assert!(hold.slot(1, 0, 1, &tx));
        assert_eq!(hold.send(text(1), &tx), Sent::Queued);
        assert_eq!(
            hold.close(0),
            Some(1),
            "what was not sent begins at the change"
        );
        hold.fill(&[1], vec![(1, 0, text(0))], &tx);
        assert_eq!(hold.send(text(2), &tx), Sent::Full);
        assert!(got(&rx).is_empty());
        assert!(
            rx.overflowed().now_or_never().is_none(),
            "the connection stays"
        );
    }

    #[test]
    fn held_bytes_count_against_the_connection_s_bytes() {
        let (tx, rx) = queue::bounded(100, 10);
        let hold = Hold::default();
        assert!(hold.slot(1, 0, 1, &tx));
        assert_eq!(hold.send(Message::text("12345678"), &tx), Sent::Queued);
        assert_eq!(hold.send(Message::text("12345"), &tx), Sent::Full);
        assert!(rx.overflowed().now_or_never().is_some());
    }
}
