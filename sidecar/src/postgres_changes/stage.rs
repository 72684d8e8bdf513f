//! The drain's Postgres Changes step: what the drainer does with a batch's row changes, on
//! its own path and with no database call, so that a check never holds the drain.
//!
//! 1. `begin`: the batch's changes are matched to the channels whose bindings they meet
//!    (`deliver::matched`), split by table, and each table's share is admitted to the check
//!    pool (`Pool::admit`); a share the pool has no room for is withheld at once, its
//!    channels told why (a notice among their frames, in order).
//! 2. `next_change` and `hand_out`, per change in queue order as the drainer hands the batch out:
//!    the change's notices go out, and each channel it matched gets a slot at the change's
//!    place in its order (`out::Reach::slot`), behind which whatever the drainer hands that
//!    channel later waits. A change with neither (`Step::is_quiet`) lets the drainer keep
//!    its run of broadcasts going.
//! 3. `finish`, once the batch is handed out: each channel that got a slot and asked for
//!    its position is told it (behind its slots), and each admitted share goes to the pool
//!    with the channels that hold its slots; the pool fills them when its check decides.

use super::deliver::{self, Outgoing, TableSet};
use super::pool::Checks;
use super::position::Positions;
use super::subscribers::{Subscriber, Subscribers};
use crate::metrics::Metrics;
use crate::out::Reach;
use crate::rows::{Entry, Read};
use std::collections::HashMap;
use std::sync::Arc;

/// What the step asks of the check pool (`Checks`; the tests' own in memory).
pub(crate) trait Pool {
    /// Room for a table's share of a batch: the id its slots are left under, or why not.
    fn admit(&self, set: &TableSet) -> Result<u64, String>;
    /// Admitted share `id` to be checked; `holders`: the channels given a slot of it.
    fn submit(&self, id: u64, set: TableSet, holders: Vec<Reach>);
}

impl Pool for Checks {
    fn admit(&self, set: &TableSet) -> Result<u64, String> {
        Checks::admit(self, set)
    }

    fn submit(&self, id: u64, set: TableSet, holders: Vec<Reach>) {
        Checks::submit(self, id, set, holders)
    }
}

/// One change's part: the frames it needs no check for, and the slots to leave, as (the
/// job's index, the change in the job, the channel).
#[derive(Default)]
pub struct Step {
    notices: Vec<Outgoing>,
    slots: Vec<(usize, u32, Arc<Subscriber>)>,
}

impl Step {
    /// Nothing for any channel here: no notice, no slot.
    pub fn is_quiet(&self) -> bool {
        self.notices.is_empty() && self.slots.is_empty()
    }
}

/// A batch's Postgres Changes, from `begin` to `finish`.
pub struct ChangeStage {
    steps: std::vec::IntoIter<Step>,
    /// The shares admitted, as (job id, the share).
    jobs: Vec<(u64, TableSet)>,
    /// The channels that got a slot, per job, each once (by hold).
    holders: Vec<HashMap<usize, Reach>>,
    positions: Positions,
}

impl ChangeStage {
    /// Matches the changes among `entries` (in queue order) to channels and admits each
    /// changed table's share to `pool`; `epoch` is the queue's, for the gates of channels
    /// whose history is being sent.
    pub(crate) fn begin(
        subscribers: &Subscribers,
        pool: &impl Pool,
        entries: &[Read],
        epoch: i64,
        metrics: &Metrics,
    ) -> ChangeStage {
        let (datas, seqs): (Vec<&str>, Vec<i64>) = entries
            .iter()
            .filter_map(|r| match r.entry {
                Entry::Change { data, .. } => Some((data.unwrap_or("null"), r.seq)),
                _ => None,
            })
            .unzip();
        let (steps, jobs) = if datas.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            match_changes(subscribers, pool, &datas, (epoch, &seqs), metrics)
        };
        ChangeStage {
            steps: steps.into_iter(),
            holders: jobs.iter().map(|_| HashMap::new()).collect(),
            jobs,
            positions: Positions::default(),
        }
    }

    /// The next change's part, in queue order.
    pub fn next_change(&mut self) -> Step {
        self.steps.next().unwrap_or_default()
    }

    /// Hands out the change at `seq`: its notices, then a slot in each matched channel's
    /// order (a channel cut off for holding too much gets none).
    pub fn hand_out(&mut self, step: Step, seq: i64, metrics: &Metrics) {
        for f in step.notices {
            f.send(metrics);
        }
        for (job, change, sub) in step.slots {
            if sub.reach.slot(self.jobs[job].0, change, seq) {
                // Its position follows the batch, behind the slot (`position`).
                self.positions.note_slot(&sub);
                self.holders[job]
                    .entry(sub.reach.hold_id())
                    .or_insert_with(|| sub.reach.clone());
            }
        }
    }

    /// The batch was handed out through `pos`: the positions go out, then each admitted
    /// share to `pool` with the channels that hold its slots.
    pub(crate) fn finish(self, pool: &impl Pool, epoch: i64, pos: i64, metrics: &Metrics) {
        self.positions.send(epoch, pos, metrics);
        for ((id, set), holders) in self.jobs.into_iter().zip(self.holders) {
            pool.submit(id, set, holders.into_values().collect());
        }
    }
}

/// Matches a batch's changes (`datas`, in queue order) to channels and admits each changed
/// table's share to the pool; a share the pool has no room for is withheld at once (its
/// channels' notices among the frames).
fn match_changes(
    subscribers: &Subscribers,
    pool: &impl Pool,
    datas: &[&str],
    (epoch, seqs): (i64, &[i64]),
    metrics: &Metrics,
) -> (Vec<Step>, Vec<(u64, TableSet)>) {
    let mut matched = deliver::matched(subscribers, datas);
    let sets = matched.split(datas);
    let notices = std::mem::take(&mut matched.notices);
    let mut steps: Vec<Step> = notices
        .into_iter()
        .map(|notices| Step {
            notices,
            slots: Vec::new(),
        })
        .collect();
    let mut jobs = Vec::with_capacity(sets.len());
    for mut set in sets {
        set.positions = set.at.iter().map(|&i| (epoch, seqs[i])).collect();
        match pool.admit(&set) {
            Ok(id) => {
                for c in &set.candidates {
                    let change = set.at[c.change];
                    steps[change]
                        .slots
                        .push((jobs.len(), c.change as u32, c.sub.clone()));
                }
                jobs.push((id, set));
            }
            Err(why) => {
                let mut frames: Vec<Vec<Outgoing>> = set.at.iter().map(|_| Vec::new()).collect();
                deliver::withhold(&set, &why, metrics, &mut frames);
                for (local, outs) in frames.into_iter().enumerate() {
                    steps[set.at[local]].notices.extend(outs);
                }
            }
        }
    }
    (steps, jobs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::out::{At, Fill, Link, Receiver};
    use crate::postgres_changes::parse_bindings;
    use serde_json::{json, Value};
    use std::sync::Mutex;
    use tokio_tungstenite::tungstenite::Message;

    /// A pool that admits (or refuses) every share and keeps what it is given.
    #[derive(Default)]
    struct Fake {
        refuse: bool,
        /// (job id, the share's changes, how many channels hold its slots)
        submitted: Mutex<Vec<(u64, usize, usize)>>,
    }

    impl Pool for Fake {
        fn admit(&self, _: &TableSet) -> Result<u64, String> {
            match self.refuse {
                true => Err("the backlog is full".into()),
                false => Ok(7),
            }
        }

        fn submit(&self, id: u64, set: TableSet, holders: Vec<Reach>) {
            let mut s = self.submitted.lock().unwrap();
            s.push((id, set.changes(), holders.len()));
        }
    }

    /// A channel listening to `table`'s changes, with its position asked for: its way, and
    /// what reaches its socket.
    fn listener(subs: &Subscribers, table: &str) -> (Reach, Receiver) {
        let (tx, rx) = crate::out::channel(64);
        let link = Link::new(1, crate::frame::Vsn::V1, 1, tx);
        let bindings = json!([{"event": "*", "schema": "public", "table": table}]);
        let sub = Subscriber {
            reach: link.reach("realtime:room", Some("1")),
            bindings: parse_bindings(Some(&bindings)).unwrap(),
            role: "authenticated".into(),
            claims: "{}".into(),
            positions: true,
        };
        let reach = sub.reach.clone();
        subs.add(sub);
        (reach, rx)
    }

    fn change(table: &str) -> String {
        json!({
            "schema": "public", "table": table, "commit_timestamp": "2026-01-01T00:00:00.000Z",
            "type": "INSERT", "columns": [{"name": "id", "type": "int8"}],
            "record": {"id": 1}, "errors": null
        })
        .to_string()
    }

    fn read(seq: i64, data: &str) -> Read<'_> {
        Read {
            seq,
            entry: Entry::Change {
                committed_us: 0,
                table: None,
                data: Some(data),
            },
        }
    }

    fn frames(rx: &Receiver) -> Vec<Value> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| serde_json::from_str::<Value>(m.to_text().unwrap()).unwrap())
            .collect()
    }

    /// The slot holds the channel's later frames, its position follows them, and the pool
    /// is given the share with the channel that holds its slot.
    #[test]
    fn a_matched_change_leaves_a_slot_that_later_frames_and_the_position_wait_behind() {
        let metrics = Metrics::default();
        let subs = Subscribers::default();
        let (reach, rx) = listener(&subs, "t");
        let pool = Fake::default();
        let data = change("t");
        let entries = [read(5, &data)];
        let mut stage = ChangeStage::begin(&subs, &pool, &entries, 1, &metrics);
        let step = stage.next_change();
        assert!(!step.is_quiet());
        stage.hand_out(step, 5, &metrics);
        // A broadcast handed out after the change, while its check runs.
        let later = Message::text(r#"{"later": true}"#);
        reach.live_run(&[later], &[At { epoch: 1, seq: 6 }]);
        stage.finish(&pool, 1, 6, &metrics);
        assert!(frames(&rx).is_empty(), "everything waits behind the slot");
        assert_eq!(*pool.submitted.lock().unwrap(), vec![(7, 1, 1)]);
        // The check decides: the change, then what waited, in queue order.
        let decided = Fill {
            job: 7,
            change: 0,
            frame: Message::text(r#"{"change": true}"#),
            at: None,
        };
        reach.fill(&[7], vec![decided]);
        let got = frames(&rx);
        assert_eq!(got[0], json!({"change": true}));
        assert_eq!(got[1], json!({"later": true}));
        assert_eq!(got[2]["payload"]["message"], "position");
        assert_eq!(got[2]["payload"]["seq"], 6);
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn a_share_the_pool_has_no_room_for_is_withheld_at_once_and_told() {
        let metrics = Metrics::default();
        let subs = Subscribers::default();
        let (reach, rx) = listener(&subs, "t");
        let pool = Fake {
            refuse: true,
            ..Fake::default()
        };
        let data = change("t");
        let entries = [read(5, &data)];
        let mut stage = ChangeStage::begin(&subs, &pool, &entries, 1, &metrics);
        let step = stage.next_change();
        stage.hand_out(step, 5, &metrics);
        stage.finish(&pool, 1, 5, &metrics);
        let got = frames(&rx);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0]["payload"]["status"], "error");
        assert!(
            got[0]["payload"]["message"]
                .as_str()
                .unwrap()
                .contains("the backlog is full"),
            "{got:?}"
        );
        assert!(pool.submitted.lock().unwrap().is_empty());
        // No slot was left: what comes next is not held.
        reach.live_run(&[Message::text("{}")], &[At { epoch: 1, seq: 6 }]);
        assert_eq!(frames(&rx).len(), 1);
    }

    #[test]
    fn a_change_no_channel_listens_to_is_quiet() {
        let metrics = Metrics::default();
        let subs = Subscribers::default();
        let (_sub, rx) = listener(&subs, "other");
        let pool = Fake::default();
        let data = change("t");
        let entries = [read(5, &data)];
        let mut stage = ChangeStage::begin(&subs, &pool, &entries, 1, &metrics);
        assert!(stage.next_change().is_quiet());
        stage.finish(&pool, 1, 5, &metrics);
        assert!(pool.submitted.lock().unwrap().is_empty());
        assert!(frames(&rx).is_empty());
    }
}
