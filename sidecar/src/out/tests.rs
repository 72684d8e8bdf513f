//! The way out as a whole, through its one door (`Reach`): a history's gate, the Postgres
//! Changes slots and the queue composed as the drain, the checks and the history use them.

use super::queue::{self, Sender};
use super::reach::{At, Fill, Link, Reach};
use super::Opened;
use futures_util::FutureExt;
use tokio_tungstenite::tungstenite::Message;

fn reach(tx: Sender) -> Reach {
    Link::new(1, crate::frame::Vsn::V1, 1, tx).reach("realtime:t", None)
}

fn at(seq: i64) -> At {
    At { epoch: 1, seq }
}

/// A live frame handed out alone: whether it went on (false: the gate held or dropped it).
fn live(to: &Reach, at: At, frame: Message) -> bool {
    to.live_run(&[frame], &[at]).0 == 1
}

fn fill(job: u64, change: u32, frame: Message) -> Fill {
    Fill {
        job,
        change,
        frame,
        at: None,
    }
}

fn frame(n: i64) -> Message {
    Message::text(n.to_string())
}

fn drain(rx: &mut queue::Receiver) -> Vec<String> {
    std::iter::from_fn(|| rx.try_recv().ok())
        .map(|m| m.into_text().unwrap().to_string())
        .collect()
}

#[test]
fn held_frames_after_the_history_pass_once_and_in_order() {
    let (tx, mut rx) = queue::channel(16);
    let to = reach(tx).gated(100, usize::MAX);
    // Live frames 5..=8 arrive while the history (through 6) is being read.
    for n in 5..=8 {
        assert!(!live(&to, at(n), frame(n)));
    }
    assert_eq!(to.last_sent(), None);
    let system = Some(Message::text("system"));
    assert_eq!(to.open_gate(1, (6, vec![]), system), Opened::Yes);
    assert_eq!(drain(&mut rx), vec!["system", "7", "8"]);
    assert_eq!(to.last_sent(), Some((1, 8)));
    // A drainer behind the history re-dispatches 6: dropped; 9 passes.
    assert!(!live(&to, at(6), frame(6)));
    assert!(live(&to, at(9), frame(9)));
    assert_eq!(to.last_sent(), Some((1, 9)));
    to.close_gate();
    assert!(to.gate_closed());
    assert!(!live(&to, at(10), frame(10)));
    assert!(rx.overflowed().now_or_never().is_none());
}

/// A change's frame reaches the gate when its check decides, after a broadcast
/// committed later may have; opening lets them out in queue order, and a frame after a
/// change of the channel whose check is still pending waits behind it, while one before
/// it goes out at once.
#[test]
fn a_change_checked_after_a_later_broadcast_is_let_out_before_it() {
    let (tx, mut rx) = queue::channel(16);
    let to = reach(tx).gated(100, usize::MAX);
    assert!(!live(&to, at(7), frame(7)));
    assert!(!live(&to, at(5), frame(5)));
    assert!(!live(&to, at(12), frame(12)));
    // Change 9 of the channel is still being checked when the history ends at 4.
    assert!(to.slot(1, 0, 9));
    assert_eq!(to.open_gate(1, (4, vec![]), None), Opened::Yes);
    assert_eq!(drain(&mut rx), vec!["5", "7"], "up to the pending change");
    to.fill(&[1], vec![fill(1, 0, frame(9))]);
    assert_eq!(drain(&mut rx), vec!["9", "12"]);
}

/// Regression: a position message reached the gate before the frame of the change at
/// its own sequence (which passes when its check decides), and sorting by sequence alone
/// let it out first: a socket lost between the two resumed after a change never sent.
#[test]
fn a_position_is_let_out_after_the_change_at_its_sequence() {
    let (tx, mut rx) = queue::channel(16);
    let to = reach(tx).gated(100, usize::MAX);
    assert!(to.live_position(at(9), Message::text("at 9")).is_none());
    assert!(!live(&to, at(9), frame(9)));
    assert!(!live(&to, at(8), frame(8)));
    assert_eq!(to.open_gate(1, (4, vec![]), None), Opened::Yes);
    assert_eq!(drain(&mut rx), vec!["8", "9", "at 9"]);
}

#[test]
fn holding_too_much_drops_it_and_asks_for_the_history_again() {
    let (tx, mut rx) = queue::channel(16);
    let to = reach(tx).gated(2, usize::MAX);
    // A drainer far behind dispatches 1..=5 while the first read (through 0) is sent.
    for n in 1..=5 {
        live(&to, at(n), frame(n));
    }
    assert_eq!(to.open_gate(1, (0, vec![]), None), Opened::ReadAgain(1));
    assert!(
        drain(&mut rx).is_empty(),
        "nothing passes before the history"
    );
    // The second read went through 5 (it covers what was dropped); 6 came meanwhile.
    live(&to, at(6), frame(6));
    assert_eq!(to.open_gate(1, (5, vec![]), None), Opened::Yes);
    assert_eq!(drain(&mut rx), vec!["6"]);
    assert!(
        rx.overflowed().now_or_never().is_none(),
        "never cut off for it"
    );
    to.close_gate();
    assert_eq!(to.open_gate(1, (9, vec![]), None), Opened::Closed);
}

/// Held frames are bounded in bytes as well as in count: a few large live messages while
/// the history is read are dropped and read again from the history, as too many are.
#[test]
fn holding_too_many_bytes_drops_them_and_asks_for_the_history_again() {
    let (tx, mut rx) = queue::channel(16);
    let to = reach(tx).gated(100, 10);
    live(&to, at(1), Message::text("123456"));
    live(&to, at(2), Message::text("123456"));
    assert_eq!(to.open_gate(1, (0, vec![]), None), Opened::ReadAgain(1));
    assert!(drain(&mut rx).is_empty());
    // One frame larger than the bound is still taken when nothing is held.
    let to = to.ungated().gated(100, 10);
    live(&to, at(3), Message::text("a frame of more than ten bytes"));
    assert_eq!(to.open_gate(1, (2, vec![]), None), Opened::Yes);
    assert_eq!(drain(&mut rx), vec!["a frame of more than ten bytes"]);
}

/// Regression: a replay opened its gate at the end of its read like a resume does, so a
/// live message committed after the join but before the read, which the replay's
/// `since` filtered out, was dropped as if sent, and never reached the client.
#[test]
fn a_replay_skips_only_what_it_replayed() {
    let (tx, mut rx) = queue::channel(16);
    let to = reach(tx).gated(100, usize::MAX);
    live(&to, at(30), frame(30));
    live(&to, at(31), frame(31));
    // The replay sent 30 (and older ones), not 31; its read went through 31.
    assert_eq!(to.open_gate(1, (0, vec![30]), None), Opened::Yes);
    assert_eq!(drain(&mut rx), vec!["31"]);
    assert!(!live(&to, at(30), frame(30)));
    assert!(live(&to, at(32), frame(32)));
}
