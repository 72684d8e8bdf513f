//! This sidecar's view of the presence of every topic one of its channels watches: the
//! members, the refs that left (tombstones), and the channels to tell. A view is built from
//! the database (`realtime.presence_state`, read by the worker) and then moved by the diffs
//! drained from the queue. Nothing in it is this sidecar's own: another sidecar, or this
//! one restarted, builds the same view from the same table and queue.
//!
//! Three rules make the view exact without lining a table snapshot up with a queue
//! position (a transaction can be visible to a snapshot before its queue record is
//! numbered, so "the state as of sequence S" cannot be read from a table):
//! - **Diffs apply idempotently, per ref.** A join of a ref already present or already
//!   left changes nothing; a leave of a ref not present only records the tombstone. So a
//!   diff that the loaded state already holds, drained after the load, is harmless, and a
//!   join drained late can never bring back a member that left (a ghost).
//! - **Diffs that arrive while the view loads are held** and applied after the load: every
//!   diff is in the loaded state, drained after the view was created, or both (a record is
//!   readable only once its transaction is visible, so what the drainer had not yet read when
//!   the view was created comes after it).
//! - **A channel gets the state before any diff.** It is registered under the view's lock
//!   and sent, right then, the state as of the last flush; the changes since reach it with
//!   everyone else's in the window's diff, through the same outbound queue. (Phoenix's client
//!   holds any diff that comes before its state forever.) That state is the members minus the
//!   window's joins plus its leaves, which no diff applied within the window changes: it is
//!   serialized once per window, however many channels register in it (in a room that fills,
//!   every member that tracks starts watching).
//!
//! Diffs are forwarded only when they change the view, coalesced per topic over one window
//! (`PRESENCE_WINDOW_MS`, 20 ms; LARGE_ROOM_WINDOW, 50 ms, for a topic with LARGE_ROOM
//! watchers or more, where every frame is multiplied by thousands): a join and a leave of
//! one ref in the same window cancel out, and a 10,000-member room that joins at once costs
//! a few diffs per watcher, not 10,000.

use crate::frame::Vsn;
use crate::hub::{ConnId, TopicKey};
use crate::metrics::Metrics;
use crate::out::Reach;
use crate::out::Sent;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;

/// A topic with this many watchers or more is a large room: its diffs go out every
/// LARGE_ROOM_WINDOW at most often. (In a 5,000-member room churning 1,000 times a second,
/// 20 ms windows queued 300,000 frames a second and swamped this 2-core box; 50 ms ones
/// delivered every change: `pgbench/RESULTS.md`, Presence.)
pub const LARGE_ROOM: usize = 1000;
pub const LARGE_ROOM_WINDOW: Duration = Duration::from_millis(50);

/// How long a tombstone is kept: longer than the database keeps it (a minute), so that a
/// view never forgets a leave that a state loaded later could still lack.
const KEEP_LEFT: Duration = Duration::from_secs(120);

/// A channel that receives a topic's presence.
pub type Watcher = Reach;

/// A member as Phoenix sends it: its key and its meta, which carries `phx_ref` (and
/// `phx_ref_prev` after an update).
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub key: String,
    pub meta: Value,
}

/// One presence diff: Phoenix's `{joins, leaves}`, each meta with its `phx_ref`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diff {
    pub joins: Vec<(String, Member)>,
    pub leaves: Vec<(String, Member)>,
}

impl Diff {
    /// Reads a diff as `realtime.queue_presence` queued it. None if it is not one.
    pub fn parse(json: &str) -> Option<Diff> {
        let v: Value = serde_json::from_str(json).ok()?;
        let side = |name: &str| -> Option<Vec<(String, Member)>> {
            let mut out = Vec::new();
            for (key, entry) in v.get(name)?.as_object()? {
                for meta in entry.get("metas")?.as_array()? {
                    let r = meta.get("phx_ref")?.as_str()?.to_owned();
                    let member = Member {
                        key: key.clone(),
                        meta: meta.clone(),
                    };
                    out.push((r, member));
                }
            }
            Some(out)
        };
        Some(Diff {
            joins: side("joins")?,
            leaves: side("leaves")?,
        })
    }
}

/// One row of `realtime.presence_state`: a member present (`live`) or a ref that left.
#[derive(Clone, Debug)]
pub struct StateRow {
    pub key: String,
    pub r#ref: String,
    pub meta: Value,
    pub live: bool,
}

enum Phase {
    /// Waiting for the worker's load; the diffs drained meanwhile are held.
    Loading {
        held: Vec<Diff>,
    },
    Ready,
}

/// What changed since the last flush.
#[derive(Default)]
struct Pending {
    /// Refs that joined and are still present.
    joins: BTreeSet<String>,
    /// Members present at the last flush that left since.
    leaves: BTreeMap<String, Member>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.joins.is_empty() && self.leaves.is_empty()
    }
}

struct View {
    /// Which load completes this view: a load asked for an earlier view of the topic (since
    /// dropped) may have read before diffs that no view held, so it must not.
    load: u64,
    phase: Phase,
    members: BTreeMap<String, Member>,
    left: HashMap<String, Instant>,
    watchers: HashMap<ConnId, Watcher>,
    /// Channels registered while the view loads: sent the state once it is loaded.
    waiting: HashMap<ConnId, Watcher>,
    pending: Pending,
    /// The state as of the last flush, serialized for the channels registering meanwhile,
    /// and its frames by serializer and join_ref (realtime-js numbers a socket's joins from
    /// 1, so many channels share one): encoded once, the bytes shared.
    flushed_state: Option<String>,
    state_frames: HashMap<(Vsn, Option<Arc<str>>), Message>,
    /// When its last diff went out (a window starts with the first change after it).
    flushed_at: Instant,
}

impl View {
    fn loading(load: u64) -> Self {
        View {
            load,
            phase: Phase::Loading { held: Vec::new() },
            members: BTreeMap::new(),
            left: HashMap::new(),
            watchers: HashMap::new(),
            waiting: HashMap::new(),
            pending: Pending::default(),
            flushed_state: None,
            state_frames: HashMap::new(),
            flushed_at: Instant::now(),
        }
    }

    fn apply(&mut self, diff: Diff, now: Instant) {
        for (r, member) in diff.joins {
            if self.members.contains_key(&r) || self.left.contains_key(&r) {
                continue;
            }
            self.members.insert(r.clone(), member);
            self.pending.joins.insert(r);
        }
        for (r, _) in diff.leaves {
            self.left.insert(r.clone(), now);
            if let Some(gone) = self.members.remove(&r) {
                if !self.pending.joins.remove(&r) {
                    self.pending.leaves.insert(r, gone);
                }
            }
        }
    }

    /// Phoenix's shape of a set of members: `{key: {metas: [...]}}`.
    fn group<'a>(members: impl Iterator<Item = &'a Member>) -> Value {
        let mut by_key: Map<String, Value> = Map::new();
        for m in members {
            let entry = by_key
                .entry(m.key.clone())
                .or_insert_with(|| serde_json::json!({"metas": []}));
            if let Some(metas) = entry["metas"].as_array_mut() {
                metas.push(m.meta.clone());
            }
        }
        Value::Object(by_key)
    }

    /// The state as of the last flush: the members but the window's joins, and those who
    /// left in the window.
    fn flushed_state_json(&mut self) -> &str {
        if self.flushed_state.is_none() {
            let then = self
                .members
                .iter()
                .filter(|(r, _)| !self.pending.joins.contains(*r))
                .map(|(_, m)| m)
                .chain(self.pending.leaves.values());
            self.flushed_state = Some(Self::group(then).to_string());
        }
        self.flushed_state.as_deref().unwrap_or("{}")
    }

    /// The pending changes as one `presence_diff` payload, and forgets them.
    fn take_diff_json(&mut self) -> String {
        let pending = std::mem::take(&mut self.pending);
        self.flushed_state = None;
        self.state_frames.clear();
        let joins = Self::group(pending.joins.iter().filter_map(|r| self.members.get(r)));
        let leaves = Self::group(pending.leaves.values());
        serde_json::json!({"joins": joins, "leaves": leaves}).to_string()
    }
}

/// The views, and the topics with changes not sent yet: the flusher visits only those (a
/// sidecar may watch 10,000 quiet topics; visiting them all every tick would cost a
/// million visits a second for nothing).
#[derive(Default)]
struct Topics {
    views: HashMap<TopicKey, View>,
    dirty: HashSet<TopicKey>,
}

/// The views of every watched topic, shared by the drainer (diffs), the presence worker
/// (loads) and the connections (watchers).
pub struct Views {
    topics: Mutex<Topics>,
    /// Topics whose state the worker must load, with the load's number; it is woken by
    /// `wake`.
    to_load: Mutex<HashMap<TopicKey, u64>>,
    next_load: std::sync::atomic::AtomicU64,
    pub wake: Notify,
    metrics: Arc<Metrics>,
}

impl Views {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Views {
            topics: Mutex::default(),
            to_load: Mutex::new(HashMap::new()),
            next_load: std::sync::atomic::AtomicU64::new(1),
            wake: Notify::new(),
            metrics,
        }
    }

    fn deliver(&self, w: &Watcher, frame: Message) {
        if w.send(frame) == Sent::Queued {
            self.metrics.presence_frames_total.increment(1);
        }
    }

    fn send_state(&self, view: &mut View, w: &Watcher) {
        let at = (w.vsn, w.join_ref.clone());
        let made = match view.state_frames.get(&at) {
            Some(f) => f.clone(),
            None => {
                let state = view.flushed_state_json();
                let f = w.push_json_frame("presence_state", state);
                view.state_frames.insert(at, f.clone());
                f
            }
        };
        self.deliver(w, made);
    }

    /// Sends the view's pending changes as one diff; its next window starts at `now`.
    fn flush_view(&self, view: &mut View, now: Instant) {
        if !matches!(view.phase, Phase::Ready) || view.pending.is_empty() {
            return;
        }
        let diff = view.take_diff_json();
        view.flushed_at = now;
        let mut frames: HashMap<(Vsn, Option<&str>), Message> = HashMap::new();
        for w in view.watchers.values() {
            let f = frames
                .entry((w.vsn, w.join_ref()))
                .or_insert_with(|| w.push_json_frame("presence_diff", &diff));
            self.deliver(w, f.clone());
        }
        self.metrics.presence_diffs_sent_total.increment(1);
    }

    /// Registers a channel as a watcher of `key`: it is sent the state as of the last flush
    /// now (or the state once the view is loaded), then every change. Registering the same
    /// connection again replaces its watcher (a rejoin) and sends the state again.
    pub fn watch(&self, key: &TopicKey, w: Watcher) {
        let mut topics = self.topics.lock().unwrap();
        match topics.views.get_mut(key) {
            Some(view) => match view.phase {
                Phase::Ready => {
                    self.send_state(view, &w);
                    view.watchers.insert(w.conn, w);
                }
                Phase::Loading { .. } => {
                    view.waiting.insert(w.conn, w);
                }
            },
            None => {
                let mut view = self.view_to_load();
                let load = view.load;
                view.waiting.insert(w.conn, w);
                topics.views.insert(key.clone(), view);
                self.metrics.presence_topics.increment(1.0);
                drop(topics);
                self.to_load.lock().unwrap().insert(key.clone(), load);
                self.wake.notify_one();
            }
        }
    }

    /// Stops a channel's presence; a view no channel watches is dropped (a later watcher
    /// loads it again).
    pub fn unwatch(&self, key: &TopicKey, conn: ConnId) {
        let mut topics = self.topics.lock().unwrap();
        let Some(view) = topics.views.get_mut(key) else {
            return;
        };
        view.watchers.remove(&conn);
        view.waiting.remove(&conn);
        if view.watchers.is_empty() && view.waiting.is_empty() {
            let members = view.members.len();
            topics.views.remove(key);
            topics.dirty.remove(key);
            self.metrics.presence_topics.decrement(1.0);
            self.metrics.presence_members.decrement(members as f64);
        }
    }

    /// Applies a diff drained from the queue (ignored for a topic no channel here watches).
    pub fn apply(&self, key: &TopicKey, diff_json: &str) {
        let Some(diff) = Diff::parse(diff_json) else {
            tracing::warn!(topic = %key.topic, "a presence diff that is not Phoenix's shape was skipped");
            return;
        };
        let mut topics = self.topics.lock().unwrap();
        let Some(view) = topics.views.get_mut(key) else {
            return;
        };
        match &mut view.phase {
            Phase::Loading { held } => held.push(diff),
            Phase::Ready => {
                let before = view.members.len();
                view.apply(diff, Instant::now());
                let after = view.members.len();
                self.metrics
                    .presence_members
                    .increment(after as f64 - before as f64);
                if !view.pending.is_empty() {
                    topics.dirty.insert(key.clone());
                }
            }
        }
        self.metrics.presence_diffs_applied_total.increment(1);
    }

    /// Forgets every view and loads each one again, keeping its channels, which are sent
    /// the loaded state as a new `presence_state`. The drainer calls it when diffs it never
    /// read are gone: the queue began a new epoch (Postgres restarted or failed over: what
    /// the old queue held undrained went with it, and an asynchronous standby promoted
    /// without the old primary's last transactions lacks members these views hold), or a
    /// gap (evicted records). Nothing drained can then be trusted to move the views to the
    /// table's truth, so the table is read again. A client's presence diffs its view against
    /// a new state (Phoenix's `syncState`): a member the database lacks leaves, one it
    /// gained joins.
    pub fn reload_all(&self) {
        let mut guard = self.topics.lock().unwrap();
        let Topics { views, dirty } = &mut *guard;
        dirty.clear();
        let mut members = 0;
        let mut loads = Vec::with_capacity(views.len());
        for (key, view) in views.iter_mut() {
            members += view.members.len();
            let mut fresh = self.view_to_load();
            let load = fresh.load;
            fresh.waiting = std::mem::take(&mut view.waiting);
            fresh.waiting.extend(view.watchers.drain());
            *view = fresh;
            loads.push((key.clone(), load));
        }
        drop(guard);
        self.metrics.presence_members.decrement(members as f64);
        if !loads.is_empty() {
            self.to_load.lock().unwrap().extend(loads);
            self.wake.notify_one();
        }
    }

    /// A view waiting for its state, under a load number of its own (an answer to an
    /// earlier load of the same topic is then not taken).
    fn view_to_load(&self) -> View {
        View::loading(
            self.next_load
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The topics to load, taken by the worker.
    pub fn take_loads(&self) -> Vec<(TopicKey, u64)> {
        let mut to_load = self.to_load.lock().unwrap();
        to_load.drain().collect()
    }

    /// Asks for loads again (the worker could not read them).
    pub fn retry_loads(&self, loads: Vec<(TopicKey, u64)>) {
        self.to_load.lock().unwrap().extend(loads);
    }

    /// A loaded state: the view becomes ready with the held diffs applied on top, and every
    /// waiting channel is sent it.
    pub fn loaded(&self, key: &TopicKey, load: u64, rows: Vec<StateRow>) {
        let mut topics = self.topics.lock().unwrap();
        let Some(view) = topics.views.get_mut(key).filter(|v| v.load == load) else {
            return;
        };
        let Phase::Loading { held } = std::mem::replace(&mut view.phase, Phase::Ready) else {
            // Already loaded (a load asked twice): the drained diffs keep it current.
            return;
        };
        let now = Instant::now();
        for row in rows {
            if row.live {
                let mut meta = row.meta;
                if let Some(o) = meta.as_object_mut() {
                    o.insert("phx_ref".into(), Value::String(row.r#ref.clone()));
                }
                let member = Member { key: row.key, meta };
                view.members.insert(row.r#ref, member);
            } else {
                view.left.insert(row.r#ref, now);
            }
        }
        for diff in held {
            view.apply(diff, now);
        }
        // The waiting channels get all of it as their state; there is no one to diff to yet.
        view.pending = Pending::default();
        view.flushed_state = None;
        view.state_frames.clear();
        self.metrics
            .presence_members
            .increment(view.members.len() as f64);
        for (conn, w) in std::mem::take(&mut view.waiting) {
            self.send_state(view, &w);
            view.watchers.insert(conn, w);
        }
    }

    /// Sends every topic's pending changes as one diff now.
    #[cfg(test)]
    pub fn flush(&self) {
        self.flush_at(Instant::now());
    }

    /// `flush` as if at `at`: the windows it starts are timed from `at`, so a test's
    /// later instants are measured from the same one whatever pauses its thread.
    #[cfg(test)]
    fn flush_at(&self, at: Instant) {
        self.flush_due_at(at, true, Duration::ZERO, Duration::ZERO);
    }

    /// Sends the pending changes of every topic whose window is over, as one diff each,
    /// and forgets tombstones older than KEEP_LEFT. The flusher calls it every `tick`; a
    /// window is `window`, or LARGE_ROOM_WINDOW for a large room, and ends at the tick
    /// nearest its end.
    pub fn flush_due(&self, window: Duration, tick: Duration) {
        self.flush_due_at(Instant::now(), false, window, tick);
    }

    /// As `flush_due` at `now`; `forced` flushes every topic whatever its window.
    fn flush_due_at(&self, now: Instant, forced: bool, window: Duration, tick: Duration) {
        let mut guard = self.topics.lock().unwrap();
        let Topics { views, dirty } = &mut *guard;
        dirty.retain(|key| {
            let Some(view) = views.get_mut(key) else {
                return false;
            };
            let room_window = match view.watchers.len() >= LARGE_ROOM {
                true => window.max(LARGE_ROOM_WINDOW),
                false => window,
            };
            if !forced && now.saturating_duration_since(view.flushed_at) + tick / 2 < room_window {
                return true;
            }
            self.flush_view(view, now);
            if view.left.len() > view.members.len() + 64 {
                view.left
                    .retain(|_, at| now.duration_since(*at) < KEEP_LEFT);
            }
            false
        });
    }

    /// How many metas a topic's view holds now, once it is loaded.
    pub fn count(&self, key: &TopicKey) -> Option<usize> {
        let topics = self.topics.lock().unwrap();
        let view = topics.views.get(key)?;
        matches!(view.phase, Phase::Ready).then(|| view.members.len())
    }

    /// The members a topic's view holds now, by ref.
    #[cfg(test)]
    pub fn members(&self, key: &TopicKey) -> Option<BTreeMap<String, Member>> {
        let topics = self.topics.lock().unwrap();
        let view = topics.views.get(key)?;
        matches!(view.phase, Phase::Ready).then(|| view.members.clone())
    }
}

/// Runs the flusher: every 10 ms (or `window`, if shorter), the pending changes of every
/// topic whose window is over go out.
pub async fn flusher(
    views: Arc<Views>,
    window: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let tick = window.min(Duration::from_millis(10));
    let mut every = tokio::time::interval(tick);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => views.flush_due(window, tick),
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::out;
    use serde_json::json;

    fn key() -> TopicKey {
        TopicKey {
            private: false,
            topic: "room".into(),
        }
    }

    fn watcher(conn: ConnId) -> (Watcher, out::Receiver) {
        let (tx, rx) = crate::out::channel(64);
        let link = crate::out::Link::new(conn, Vsn::V2, conn as i64, tx);
        (link.reach("realtime:room", Some(&format!("j{conn}"))), rx)
    }

    /// The (event, payload) of every frame queued to a watcher.
    fn frames(rx: &mut out::Receiver) -> Vec<(String, Value)> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|m| {
                let v: Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
                (v[3].as_str().unwrap().to_owned(), v[4].clone())
            })
            .collect()
    }

    fn join(key: &str, r: &str, meta: Value) -> String {
        let mut meta = meta;
        meta["phx_ref"] = json!(r);
        json!({"joins": {key: {"metas": [meta]}}, "leaves": {}}).to_string()
    }

    fn leave(key: &str, r: &str) -> String {
        json!({"joins": {}, "leaves": {key: {"metas": [{"phx_ref": r}]}}}).to_string()
    }

    fn row(key: &str, r: &str, live: bool) -> StateRow {
        StateRow {
            key: key.into(),
            r#ref: r.into(),
            meta: json!({"n": 1}),
            live,
        }
    }

    fn views() -> Views {
        Views::new(Arc::new(Metrics::default()))
    }

    #[test]
    fn a_watcher_gets_the_loaded_state_with_what_drained_during_the_load_then_diffs() {
        let v = views();
        let (w, mut rx) = watcher(1);
        v.watch(&key(), w);
        let loads = v.take_loads();
        assert_eq!(loads.len(), 1, "the first watcher asks for a load");
        let load = loads[0].1;
        assert!(frames(&mut rx).is_empty(), "no state before the load");
        // While the state is read: p3 joins (the read may or may not have seen it), p1
        // leaves, and p2's join drains late although the read saw it leave.
        v.apply(&key(), &join("cy", "p3", json!({})));
        v.apply(&key(), &leave("ann", "p1"));
        v.apply(&key(), &join("bob", "p2", json!({})));
        v.loaded(
            &key(),
            load,
            vec![
                row("ann", "p1", true),
                row("bob", "p2", false),
                row("cy", "p3", true),
            ],
        );
        let got = frames(&mut rx);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "presence_state");
        assert_eq!(
            got[0].1,
            json!({"cy": {"metas": [{"n": 1, "phx_ref": "p3"}]}}),
            "no ghost of p2, p1 gone, p3 once"
        );
        v.flush();
        assert!(frames(&mut rx).is_empty(), "the state held it all: no diff");
        v.apply(&key(), &join("di", "p4", json!({"typing": true})));
        v.flush();
        let got = frames(&mut rx);
        assert_eq!(
            got,
            vec![(
                "presence_diff".into(),
                json!({"joins": {"di": {"metas": [{"typing": true, "phx_ref": "p4"}]}}, "leaves": {}})
            )]
        );
    }

    /// Issue 42: a leave committed on a primary that then restarted (or failed over) before
    /// this sidecar drained it went with the old queue, and the view kept the member for
    /// ever (a ghost on every watcher); with an asynchronous standby promoted, so did a
    /// member the new primary never had.
    #[test]
    fn a_reload_sends_the_table_s_state_and_a_member_whose_leave_was_lost_leaves() {
        let v = views();
        let (w, mut rx) = watcher(1);
        v.watch(&key(), w);
        let load = v.take_loads()[0].1;
        v.loaded(
            &key(),
            load,
            vec![row("ann", "p1", true), row("bob", "p2", true)],
        );
        assert_eq!(frames(&mut rx).len(), 1, "the first state");
        // A diff of the old epoch, not yet flushed: forgotten with the views.
        v.apply(&key(), &join("cy", "p3", json!({})));
        v.reload_all();
        let loads = v.take_loads();
        assert_eq!(loads.len(), 1, "the watched topic is read again");
        assert_ne!(
            loads[0].1, load,
            "a new load: the old one's answer is not taken"
        );
        // A diff of the new epoch, drained while the state is read: held, then applied.
        v.apply(&key(), &join("di", "p5", json!({})));
        v.flush();
        assert!(
            frames(&mut rx).is_empty(),
            "nothing sent while the view reloads"
        );
        // The table: ann left (her leave was in the lost queue), bob tracked again.
        v.loaded(
            &key(),
            loads[0].1,
            vec![row("ann", "p1", false), row("bob", "p4", true)],
        );
        let got = frames(&mut rx);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, "presence_state");
        assert_eq!(
            got[0].1,
            json!({"bob": {"metas": [{"n": 1, "phx_ref": "p4"}]}, "di": {"metas": [{"phx_ref": "p5"}]}}),
            "ann and the old refs gone, the new epoch's join kept"
        );
        v.apply(&key(), &leave("bob", "p4"));
        v.flush();
        assert_eq!(frames(&mut rx)[0].0, "presence_diff", "the watcher is kept");
    }

    #[test]
    fn changes_within_a_window_are_one_diff_and_a_join_then_leave_cancels() {
        let v = views();
        let (w, mut rx) = watcher(1);
        v.watch(&key(), w);
        let load = v.take_loads()[0].1;
        v.loaded(&key(), load, vec![row("ann", "p1", true)]);
        frames(&mut rx);
        for i in 10..20 {
            v.apply(&key(), &join(&format!("u{i}"), &format!("p{i}"), json!({})));
        }
        v.apply(&key(), &leave("u15", "p15"));
        v.apply(&key(), &leave("ann", "p1"));
        // An update: the new ref joins with phx_ref_prev, the old one leaves, in one diff.
        let update = json!({"joins": {"u11": {"metas": [{"phx_ref": "p30", "phx_ref_prev": "p11"}]}},
                            "leaves": {"u11": {"metas": [{"phx_ref": "p11"}]}}});
        v.apply(&key(), &update.to_string());
        v.flush();
        let got = frames(&mut rx);
        assert_eq!(got.len(), 1, "one diff for the window");
        let joins = got[0].1["joins"].as_object().unwrap();
        let keys: Vec<&str> = joins.keys().map(String::as_str).collect();
        assert!(!keys.contains(&"u15"), "joined and left in the window");
        assert_eq!(joins.len(), 9);
        assert_eq!(joins["u11"]["metas"][0]["phx_ref"], "p30");
        assert_eq!(
            got[0].1["leaves"],
            json!({"ann": {"metas": [{"n": 1, "phx_ref": "p1"}]}}),
            "only what the watcher had seen leaves"
        );
        v.flush();
        assert!(frames(&mut rx).is_empty(), "nothing new: nothing sent");
    }

    #[test]
    fn a_late_watcher_gets_the_state_of_the_last_flush_then_the_window_with_everyone() {
        let v = views();
        let (a, mut rx_a) = watcher(1);
        v.watch(&key(), a);
        let load = v.take_loads()[0].1;
        v.loaded(&key(), load, vec![row("zoe", "p0", true)]);
        frames(&mut rx_a);
        v.apply(&key(), &join("ann", "p1", json!({})));
        v.apply(&key(), &leave("zoe", "p0"));
        // b registers within the window: it gets the state as the last flush left it (zoe,
        // not ann), and a gets nothing yet.
        let (b, mut rx_b) = watcher(2);
        v.watch(&key(), b);
        assert!(frames(&mut rx_a).is_empty());
        let got_b = frames(&mut rx_b);
        assert_eq!(got_b.len(), 1);
        assert_eq!(got_b[0].0, "presence_state");
        assert_eq!(
            got_b[0].1,
            json!({"zoe": {"metas": [{"n": 1, "phx_ref": "p0"}]}})
        );
        // The window's diff reaches both: ann joins, zoe leaves, once each.
        v.flush();
        let (da, db) = (frames(&mut rx_a), frames(&mut rx_b));
        assert_eq!(da, db);
        assert_eq!(da.len(), 1);
        assert!(da[0].1["joins"].get("ann").is_some() && da[0].1["leaves"].get("zoe").is_some());
        // A watcher after the flush gets ann in its state, and no diff of her.
        let (c, mut rx_c) = watcher(3);
        v.watch(&key(), c);
        assert_eq!(
            frames(&mut rx_c)[0].1,
            json!({"ann": {"metas": [{"phx_ref": "p1"}]}})
        );
        v.flush();
        assert!(frames(&mut rx_c).is_empty());
        // Joins and leaves that change nothing (a repeated join, a leave of an unknown
        // ref, a join of a ref that left) are never sent.
        v.apply(&key(), &join("ann", "p1", json!({})));
        v.apply(&key(), &leave("zed", "p9"));
        v.apply(&key(), &join("zed", "p9", json!({})));
        v.flush();
        assert!(frames(&mut rx_a).is_empty() && frames(&mut rx_b).is_empty());
    }

    #[test]
    fn an_unwatched_topic_is_forgotten_and_loaded_again_by_the_next_watcher() {
        let v = views();
        let (a, _rx) = watcher(1);
        v.watch(&key(), a);
        let first = v.take_loads()[0].1;
        v.unwatch(&key(), 1);
        assert!(v.members(&key()).is_none());
        // bob joins while no view holds the topic; the next watcher's view must not be
        // completed by the first load, which may have read before bob's join.
        v.apply(&key(), &join("bob", "p2", json!({})));
        let (b, mut rx_b) = watcher(2);
        v.watch(&key(), b);
        let second = v.take_loads()[0].1;
        v.loaded(&key(), first, vec![row("ann", "p1", true)]);
        assert!(
            frames(&mut rx_b).is_empty(),
            "an earlier view's load is ignored"
        );
        v.loaded(
            &key(),
            second,
            vec![row("ann", "p1", true), row("bob", "p2", true)],
        );
        assert_eq!(frames(&mut rx_b)[0].1.as_object().unwrap().len(), 2);
        assert_eq!(
            v.metrics.value("realtime_presence_topics"),
            Some(1.0),
            "one topic watched"
        );
    }

    #[test]
    fn channels_with_the_same_join_ref_share_one_encoded_frame_and_others_get_their_own() {
        let v = views();
        let mut rxs = Vec::new();
        for (conn, join_ref) in [(1, "1"), (2, "1"), (3, "4")] {
            let (mut w, rx) = watcher(conn);
            w.join_ref = Some(join_ref.into());
            v.watch(&key(), w);
            rxs.push(rx);
        }
        let load = v.take_loads()[0].1;
        v.loaded(&key(), load, vec![]);
        v.apply(&key(), &join("ann", "p1", json!({})));
        v.flush();
        let (w4, mut rx4) = watcher(4);
        let mut w4 = w4;
        w4.join_ref = Some("1".into());
        v.watch(&key(), w4);
        let (w5, mut rx5) = watcher(5);
        let mut w5 = w5;
        w5.join_ref = Some("1".into());
        v.watch(&key(), w5);
        let texts = |rx: &mut out::Receiver| -> Vec<Message> {
            std::iter::from_fn(|| rx.try_recv().ok()).collect()
        };
        let (a, b, c) = (texts(&mut rxs[0]), texts(&mut rxs[1]), texts(&mut rxs[2]));
        let ptr = |m: &Message| m.to_text().unwrap().as_ptr();
        assert_eq!(ptr(&a[1]), ptr(&b[1]), "one diff encoded for join_ref 1");
        assert_ne!(ptr(&a[1]), ptr(&c[1]));
        let v3: Value = serde_json::from_str(c[1].to_text().unwrap()).unwrap();
        assert_eq!(v3[0], "4", "its own join_ref");
        let (s4, s5) = (texts(&mut rx4), texts(&mut rx5));
        assert_eq!(
            ptr(&s4[0]),
            ptr(&s5[0]),
            "one state encoded per window and join_ref"
        );
    }

    #[test]
    fn a_large_room_waits_out_its_longer_window_and_a_small_one_does_not() {
        let v = views();
        let small = key();
        let large = TopicKey {
            private: false,
            topic: "hall".into(),
        };
        let (w, mut rx_small) = watcher(0);
        v.watch(&small, w);
        let mut rx_large = None;
        for conn in 1..=LARGE_ROOM as u64 {
            let (w, rx) = watcher(conn);
            v.watch(&large, w);
            if conn == 1 {
                rx_large = Some(rx);
            }
        }
        let mut rx_large = rx_large.unwrap();
        for (k, load) in v.take_loads() {
            v.loaded(&k, load, vec![]);
        }
        frames(&mut rx_small);
        frames(&mut rx_large);
        // A first change after a quiet spell goes out at once, and starts a window. Every
        // instant below is measured from the one that flush is timed at: the test failed
        // under load when the flush took its own clock reading later than `flushed`.
        let flushed = Instant::now();
        let at = |ms: u64| flushed + Duration::from_millis(ms);
        v.apply(&small, &join("zoe", "p0", json!({})));
        v.apply(&large, &join("yan", "p9", json!({})));
        v.flush_at(flushed);
        assert_eq!(
            (frames(&mut rx_small).len(), frames(&mut rx_large).len()),
            (1, 1)
        );
        v.apply(&small, &join("ann", "p1", json!({})));
        v.apply(&large, &join("bob", "p2", json!({})));
        // Ticks of 10 ms: the small room's 20 ms window is not over at 10 ms and is by 30,
        // the large room's 50 ms one is not at 40 and is by 60.
        let (window, tick) = (Duration::from_millis(20), Duration::from_millis(10));
        v.flush_due_at(at(10), false, window, tick);
        assert!(frames(&mut rx_small).is_empty() && frames(&mut rx_large).is_empty());
        v.flush_due_at(at(30), false, window, tick);
        assert_eq!(
            frames(&mut rx_small).len(),
            1,
            "the small room's window is over"
        );
        v.flush_due_at(at(40), false, window, tick);
        assert!(frames(&mut rx_large).is_empty(), "the large room's is not");
        v.flush_due_at(at(60), false, window, tick);
        assert_eq!(frames(&mut rx_large).len(), 1);
    }

    #[test]
    fn a_diff_that_is_not_phoenix_shaped_is_skipped() {
        assert!(Diff::parse("[]").is_none());
        assert!(Diff::parse(r#"{"joins": {"k": {"metas": [{}]}}, "leaves": {}}"#).is_none());
        let d = Diff::parse(r#"{"joins": {}, "leaves": {"k": {"metas": [{"phx_ref": "p1"}]}}}"#);
        assert_eq!(d.unwrap().leaves[0].0, "p1");
    }
}
