//! The channel lifecycle driven as the socket loop drives it, with the database played
//! by the test (`state::testing`).

use super::*;
use crate::authorizer::{AuthRequest, Verdict};
use crate::command;
use crate::db_worker::DbFailure;
use crate::history;
use crate::hub::{Payload, QueueMessage};
use crate::postgres_changes::bounds::Bounds;
use crate::postgres_changes::{BindingError, Unserved};
use crate::presence::members::Desired;
use crate::state::testing::{self, Backends};
use serde_json::Value;

/// One connection's channels, with the hub's queue to it, and the answers its waits
/// gave while the test polled them.
struct Conn {
    c: Channels,
    ready: std::collections::VecDeque<Answer>,
    hub_rx: out::Receiver,
    be: Backends,
}

fn local() -> Option<crate::address::AddressKey> {
    Some(crate::address::AddressKey::of(
        std::net::Ipv4Addr::LOCALHOST.into(),
    ))
}

fn claims(sub: &str) -> Claims {
    let all = json!({"role": "authenticated", "sub": sub, "exp": jwt::now() + 3600});
    Claims {
        role: "authenticated".into(),
        exp: jwt::now() + 3600,
        sub: Some(sub.into()),
        all,
    }
}

fn conn() -> Conn {
    conn_with(&[])
}

/// A connection of a sidecar started with `flags`.
fn conn_with(flags: &[&str]) -> Conn {
    let (shared, be) = testing::shared(flags);
    let (tx, hub_rx) = crate::out::channel(16);
    let c = Channels::new(shared, Vsn::V2, claims("u1"), "{}".into(), tx, local());
    Conn {
        c,
        ready: Default::default(),
        hub_rx,
        be,
    }
}

impl Conn {
    fn send(&mut self, frame: Value) -> Result<(), Disconnect> {
        let f = command::from_text(Vsn::V2, &frame.to_string(), &Bounds::defaults())
            .expect("a valid frame");
        let handled = self.c.handle(f);
        self.poll_waits();
        handled
    }

    /// Polls the connection's waits once, as the socket loop does after each frame:
    /// their requests reach the backends; an answer already there is kept for `next`.
    fn poll_waits(&mut self) {
        use futures_util::FutureExt;
        while let Some(Some(a)) = self.c.next_answer().now_or_never() {
            self.ready.push_back(a);
        }
    }

    /// The next answer of the database to this connection (waiting for it).
    async fn next(&mut self) -> Answer {
        match self.ready.pop_front() {
            Some(a) => a,
            None => self.c.next_answer().await.expect("a question in flight"),
        }
    }

    /// What the connection wrote since last asked, as (topic, event, payload).
    fn written(&mut self) -> Vec<(String, String, Value)> {
        std::mem::take(&mut self.c.out)
            .into_iter()
            .map(|m| {
                let v: Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
                let s = |i: usize| v[i].as_str().unwrap_or_default().to_owned();
                (s(2), s(3), v[4].clone())
            })
            .collect()
    }

    /// Plays the authorizer: answers the next `n` requests with `verdict`, then hands
    /// the verdicts that came back to the channels, as the socket loop does.
    async fn authorize(&mut self, n: usize, verdict: impl Fn(&AuthRequest) -> Verdict) {
        self.poll_waits();
        for _ in 0..n {
            let r = self.be.authorize.recv().await.expect("a request");
            let v = verdict(&r);
            r.reply.send(v).unwrap();
        }
        let a = self.next().await;
        self.c.on_answer(a);
    }

    /// Whether a message sent to `topic` now reaches this connection through the hub.
    fn delivered(&mut self, topic: &str, private: bool) -> bool {
        self.c.shared.hub.dispatch(&QueueMessage {
            topic: topic.into(),
            event: "e".into(),
            payload: Payload::Json("{}".into()),
            private,
            id: None,
            origin: None,
            epoch: 5,
            seq: 1,
            replayed: false,
            dropped: false,
        });
        std::iter::from_fn(|| self.hub_rx.try_recv().ok()).count() > 0
    }

    /// The sequences of the public messages of `topic` this connection got, of those
    /// dispatched now with `seqs`.
    fn got(&mut self, topic: &str, seqs: &[i64]) -> Vec<i64> {
        for &seq in seqs {
            self.c.shared.hub.dispatch(&QueueMessage {
                topic: topic.into(),
                event: "e".into(),
                payload: Payload::Json("{}".into()),
                private: false,
                id: None,
                origin: None,
                epoch: 5,
                seq,
                replayed: false,
                dropped: false,
            });
        }
        std::iter::from_fn(|| self.hub_rx.try_recv().ok())
            .map(|m| {
                let Message::Binary(b) = m else {
                    panic!("a 2.0.0 broadcast")
                };
                let meta_at = 5 + b[1] as usize + b[2] as usize;
                let meta: Value =
                    serde_json::from_slice(&b[meta_at..meta_at + b[3] as usize]).unwrap();
                meta["seq"].as_i64().unwrap()
            })
            .collect()
    }
}

fn join(topic: &str, private: bool) -> Value {
    json!(["1", "1", topic, "phx_join", {"config": {"private": private, "broadcast": {"ack": true}}}])
}

/// What a join wrote, once its answers (if it asked anything) are applied.
async fn answered(t: &mut Conn) -> Vec<(String, String, Value)> {
    let w = t.written();
    if !w.is_empty() {
        return w;
    }
    let done = t.next().await;
    t.c.on_answer(done);
    t.written()
}

fn status(payload: &Value) -> (&str, &str) {
    (
        payload["status"].as_str().unwrap_or_default(),
        payload["response"]["reason"].as_str().unwrap_or_default(),
    )
}

/// Read allowed, write as given.
fn reader(write: bool) -> impl Fn(&AuthRequest) -> Verdict {
    move |r| match r.write && !write {
        true => Verdict::Denied(None),
        false => Verdict::Allowed,
    }
}

#[tokio::test]
async fn a_public_join_is_answered_at_once_and_delivered_to_until_left() {
    let mut t = conn();
    t.send(join("realtime:room", false)).unwrap();
    let w = t.written();
    assert_eq!(w.len(), 1);
    assert_eq!(
        (w[0].1.as_str(), status(&w[0].2)),
        ("phx_reply", ("ok", ""))
    );
    assert_eq!(w[0].2["response"], json!({"postgres_changes": []}));
    assert!(
        t.be.authorize.try_recv().is_err(),
        "public joins ask no one"
    );
    assert!(t.delivered("room", false));
    assert!(!t.delivered("room", true), "private messages stay private");
    assert_eq!(t.c.metrics().value("realtime_channels"), Some(1.0));
    t.send(json!(["1", "2", "realtime:room", "phx_leave", {}]))
        .unwrap();
    let events: Vec<String> = t.written().into_iter().map(|w| w.1).collect();
    assert_eq!(events, vec!["phx_reply", "phx_close"]);
    assert!(!t.delivered("room", false));
    assert_eq!(t.c.metrics().value("realtime_channels"), Some(0.0));
}

#[tokio::test]
async fn a_resuming_join_holds_live_messages_until_its_history_is_sent() {
    let mut t = conn();
    let resume = json!({"config": {"broadcast": {"resume": {"epoch": "5", "seq": 10}}}});
    t.send(json!(["1", "1", "realtime:room", "phx_join", resume]))
        .unwrap();
    assert_eq!(status(&t.written()[0].2), ("ok", ""));
    let req = t.be.history.try_recv().expect("a history request");
    assert_eq!(req.ask, history::ask::Ask::Resume { epoch: 5, seq: 10 });
    // Live messages 11 and 12 come while the history is read: held, not sent.
    assert!(t.got("room", &[11, 12]).is_empty());
    // The history went through 11: 12 follows it, once; 11 again (a drainer behind the
    // history) does not, 13 does.
    req.reach.open_gate(5, (11, vec![]), None);
    assert_eq!(t.got("room", &[11, 13]), vec![12, 13]);
    // The same join again on this socket (realtime-js may send two on a reconnect,
    // both naming the older position): it resumes after what this socket was sent.
    t.send(json!(["1", "2", "realtime:room", "phx_join", resume]))
        .unwrap();
    assert_eq!(status(&t.written()[0].2), ("ok", ""));
    let again = t.be.history.try_recv().expect("a history request");
    assert_eq!(again.ask, history::ask::Ask::Resume { epoch: 5, seq: 13 });
    assert!(req.reach.gate_closed(), "the replaced channel's gate");
    // Leaving closes the gate: the history still being sent stops.
    t.send(json!(["1", "3", "realtime:room", "phx_leave", {}]))
        .unwrap();
    assert!(again.reach.gate_closed());
}

/// A second join resumed after the last message its channel passed to the socket, even when
/// that message still waited behind a change whose check was running (`crate::out`, its slots): the
/// old channel's hold was dropped with both, and neither was ever sent. It resumes before
/// the first change the old channel held now.
#[tokio::test]
async fn a_second_join_resumes_before_what_the_first_still_held_behind_a_pending_check() {
    let mut t = conn();
    let resume = json!({"config": {"broadcast": {"resume": {"epoch": "5", "seq": 10}}}});
    t.send(json!(["1", "1", "realtime:room", "phx_join", resume]))
        .unwrap();
    assert_eq!(status(&t.written()[0].2), ("ok", ""));
    let req = t.be.history.try_recv().expect("a history request");
    req.reach.open_gate(5, (10, vec![]), None);
    assert_eq!(t.got("room", &[11]), vec![11]);
    // Change 12 of the channel is being checked; broadcast 13 passes the gate and waits
    // behind it.
    assert!(req.reach.slot(1, 0, 12));
    assert!(t.got("room", &[13]).is_empty(), "behind the pending change");
    assert_eq!(req.reach.last_sent(), Some((5, 13)));
    t.send(json!(["1", "2", "realtime:room", "phx_join", resume]))
        .unwrap();
    assert_eq!(status(&t.written()[0].2), ("ok", ""));
    let again = t.be.history.try_recv().expect("a history request");
    assert_eq!(
        again.ask,
        history::ask::Ask::Resume { epoch: 5, seq: 11 },
        "before change 12, which was dropped unsent with 13"
    );
}

#[tokio::test]
async fn history_is_refused_to_a_join_without_broadcast_read_and_to_bad_positions() {
    let mut t = conn();
    let ask = json!({"config": {"private": true, "presence": {"enabled": true},
                     "broadcast": {"replay": {"since": 1}}}});
    t.send(json!(["1", "1", "realtime:room", "phx_join", ask]))
        .unwrap();
    // Presence read alone admits a private join, but not its replay.
    t.authorize(2, |r| match r.extension {
        "presence" => Verdict::Allowed,
        _ => Verdict::Denied(None),
    })
    .await;
    assert_eq!(
        status(&t.written()[0].2),
        (
            "error",
            "Unauthorized: You do not have permissions to read from this Channel topic: room"
        )
    );
    assert!(t.be.history.try_recv().is_err());
    let bad = json!({"config": {"broadcast": {"resume": {"epoch": "5", "seq": -3}}}});
    t.send(json!(["1", "2", "realtime:b", "phx_join", bad]))
        .unwrap();
    let w = t.written();
    assert!(status(&w[0].2).1.starts_with("UnableToResume: "), "{w:?}");
    let public_replay = json!({"config": {"broadcast": {"replay": {"since": 1}}}});
    t.send(json!(["1", "3", "realtime:c", "phx_join", public_replay]))
        .unwrap();
    assert_eq!(
        status(&t.written()[0].2).1,
        "UnableToReplayMessages: Replay is not allowed for public channels"
    );
    assert!(!t.c.has_channels());
}

#[tokio::test]
async fn a_private_join_waits_for_its_read_verdict_and_write_is_asked_at_the_first_push() {
    let mut t = conn();
    t.send(join("realtime:room", true)).unwrap();
    assert!(t.written().is_empty(), "answered only with the verdicts");
    // Meanwhile a second join of the topic is refused, not queued twice.
    t.send(join("realtime:room", true)).unwrap();
    let w = t.written();
    assert!(status(&w[0].2).1.starts_with("JoinInProgress"), "{w:?}");
    // One verdict per join: read (write waits for a push, as Supabase asks it).
    t.authorize(1, |r| {
        assert_eq!(
            (r.who.role.as_str(), r.topic.as_str(), r.write),
            ("authenticated", "room", false)
        );
        assert!(r.who.claims.contains(r#""sub":"u1""#));
        reader(false)(r)
    })
    .await;
    let w = t.written();
    assert_eq!(status(&w[0].2), ("ok", ""));
    assert!(t.delivered("room", true));
    assert!(!t.delivered("room", false));
    // Two pushes: the first asks the write verdict, the second waits behind it; both
    // are refused, in order, and nothing is relayed.
    for r in ["3", "4"] {
        let push = json!(["1", r, "realtime:room", "broadcast", {"event": "e", "payload": {}}]);
        t.send(push).unwrap();
    }
    assert!(
        t.written().is_empty(),
        "held until the write verdict is back"
    );
    t.authorize(1, |r| {
        assert!(r.write);
        reader(false)(r)
    })
    .await;
    let w = t.written();
    assert_eq!(w.len(), 2);
    assert_eq!(status(&w[1].2).0, "error");
    assert_eq!(
        status(&w[0].2),
        (
            "error",
            "Unauthorized: You do not have permissions to write to this Channel topic: room"
        )
    );
    assert!(
        t.be.relay.try_recv().is_err(),
        "a refused push is not relayed"
    );
}

#[tokio::test]
async fn a_denied_join_and_a_failed_one_are_told_apart() {
    let mut t = conn();
    t.send(join("realtime:a", true)).unwrap();
    t.authorize(1, |_| Verdict::Denied(None)).await;
    let w = t.written();
    assert_eq!(
        status(&w[0].2),
        (
            "error",
            "Unauthorized: You do not have permissions to read from this Channel topic: a"
        )
    );
    t.send(join("realtime:b", true)).unwrap();
    t.authorize(1, |_| Verdict::Failed(DbFailure::Unreachable))
        .await;
    let w = t.written();
    assert!(
        status(&w[0].2).1.starts_with("UnableToConnectToProject"),
        "{w:?}"
    );
    assert!(!t.c.has_channels());
    assert_eq!(t.c.metrics().value("realtime_join_errors_total"), Some(2.0));
}

#[tokio::test(start_paused = true)]
async fn a_revoked_read_closes_the_channel_and_a_blip_does_not() {
    let mut t = conn();
    t.send(join("realtime:room", true)).unwrap();
    t.authorize(1, reader(true)).await;
    t.written();
    // The database cannot answer the re-check: the channel stays and is told.
    t.c.recheck_all();
    t.authorize(1, |_| Verdict::Failed(DbFailure::QueryCanceled))
        .await;
    let w = t.written();
    assert_eq!(w[0].1, "system");
    assert!(w[0].2["message"]
        .as_str()
        .unwrap()
        .contains("could not re-check"));
    assert!(t.delivered("room", true));
    // The retry is due after the backoff (1 s; the test's clock skips it), and this
    // time read is revoked.
    let retry = t.next().await;
    assert!(matches!(retry, Answer::Retry { .. }));
    t.c.on_answer(retry);
    t.authorize(1, |_| Verdict::Denied(None)).await;
    let w = t.written();
    let events: Vec<&str> = w.iter().map(|w| w.1.as_str()).collect();
    assert_eq!(events, vec!["system", "phx_close"]);
    assert_eq!(
        w[0].2["message"],
        "You no longer have permission to read from this Channel topic: room"
    );
    assert!(!t.delivered("room", true));
    assert!(!t.c.has_channels());
}

/// Presence read keeps a private channel whose broadcast read was revoked; the history it
/// was still being sent (a resume, paced to a slow reader, possibly for minutes) stops.
#[tokio::test]
async fn a_revoked_broadcast_read_stops_a_history_being_sent_though_presence_keeps_the_channel() {
    let mut t = conn();
    let ask = json!({"config": {"private": true, "presence": {"enabled": true},
                     "broadcast": {"resume": {"epoch": "5", "seq": 0}}}});
    t.send(json!(["1", "1", "realtime:room", "phx_join", ask]))
        .unwrap();
    t.authorize(2, reader(true)).await;
    assert_eq!(status(&t.written()[0].2), ("ok", ""));
    let req = t.be.history.try_recv().expect("a history request");
    assert!(!req.reach.gate_closed());
    t.c.recheck_all();
    t.authorize(2, |r| match r.extension {
        "presence" => Verdict::Allowed,
        _ => Verdict::Denied(None),
    })
    .await;
    assert!(t.c.get("realtime:room").is_some(), "presence read keeps it");
    assert!(req.reach.gate_closed(), "the history stops");
    assert!(!t.delivered("room", true));
}

#[tokio::test]
async fn a_verdict_for_a_replaced_token_is_never_applied() {
    let mut t = conn();
    t.send(join("realtime:room", true)).unwrap();
    t.authorize(1, reader(true)).await;
    t.written();
    t.c.recheck_all();
    // A new token arrives while the re-check for the old one is in flight.
    let new =
        testing::token(&json!({"role": "authenticated", "sub": "u2", "exp": jwt::now() + 3600}));
    t.send(json!(["1", "4", "realtime:room", "access_token", {"access_token": new}]))
        .unwrap();
    // The old token's check says no: discarded, and the new token is checked instead.
    t.authorize(1, |r| {
        assert!(r.who.claims.contains("u1"));
        Verdict::Denied(None)
    })
    .await;
    assert!(t.written().is_empty(), "{:?}", t.c.out);
    assert!(t.c.get("realtime:room").is_some());
    t.authorize(1, |r| {
        assert!(
            r.who.claims.contains("u2"),
            "the replacing token is checked"
        );
        Verdict::Allowed
    })
    .await;
    assert!(t.delivered("room", true));
}

#[tokio::test]
async fn a_push_without_join_ref_is_relayed_as_this_connection() {
    let mut t = conn();
    t.send(join("realtime:room", false)).unwrap();
    t.written();
    // realtime-js sends pushes with a missing or stale join_ref: accepted.
    t.send(json!([null, "5", "realtime:room", "broadcast", {"event": "e", "payload": {"n": 1}}]))
        .unwrap();
    assert!(t.written().is_empty(), "answered when the relay settles it");
    let b = t.be.relay.try_recv().expect("relayed");
    assert_eq!((b.topic.as_str(), b.event.as_str()), ("room", "e"));
    assert_eq!(b.payload, Payload::Json(r#"{"n":1}"#.into()));
    assert_eq!(b.origin, t.c.shared.origin(t.c.id()));
    // A push on a topic not joined is refused.
    t.send(json!(["1", "6", "realtime:other", "broadcast", {"event": "e"}]))
        .unwrap();
    assert_eq!(status(&t.written()[0].2), ("error", "unmatched topic"));
}

/// A leave of a topic the socket has no channel on was refused with "unmatched topic";
/// Phoenix (and so Supabase) answers it ok, and Supabase's Kotlin client sends one after a
/// refused join.
#[tokio::test]
async fn a_leave_of_an_unknown_topic_was_refused() {
    let mut t = conn();
    t.send(json!(["3", "7", "realtime:never", "phx_leave", {}]))
        .unwrap();
    assert_eq!(status(&t.written()[0].2), ("ok", ""));
}

#[tokio::test]
async fn postgres_changes_joins_are_answered_once_checked_and_registered_until_left() {
    let mut t = conn();
    let with = |bindings: Value| json!(["1", "1", "realtime:db", "phx_join", {"config": {"postgres_changes": bindings}}]);
    // A filter this server does not evaluate: the channel joins without that binding, the
    // reply lists it in its place with its id, and a system message says why, in Supabase's
    // words (realtime-js compares the reply's bindings with its own and would fail the
    // channel, and rejoin forever, on a refusal or a shorter list).
    t.send(with(
        json!([{"event": "*", "schema": "public", "table": "todos", "filter": "title=regex.a"}]),
    ))
    .unwrap();
    let w = answered(&mut t).await;
    assert_eq!(status(&w[0].2).0, "ok", "{w:?}");
    let listed = w[0].2["response"]["postgres_changes"].clone();
    assert_eq!(listed[0]["filter"], "title=regex.a");
    assert_eq!(
        (w[1].1.as_str(), &w[1].2["status"]),
        ("system", &json!("error"))
    );
    assert_eq!(w[1].2["extension"], "postgres_changes");
    assert_eq!(w[1].2["id"], listed[0]["id"]);
    let message = w[1].2["message"].as_str().unwrap();
    assert!(
        message.starts_with("Error parsing `filter` params: PostgresChangesFilterNotSupported: binding 1: operator \"regex\""),
        "{message}"
    );
    assert_eq!(w.len(), 2, "no \"Subscribed to PostgreSQL\": nothing is");
    assert!(t.c.shared.changes.of("public", "todos", None).is_empty());
    // A regular expression over MAX_FILTER_PATTERN_LENGTH (256 by default) beside a good
    // binding: the good one is checked and served, the other told.
    let long = format!("title=imatch.{}", "a".repeat(257));
    t.send(with(
        json!([{"event": "*", "schema": "public", "table": "todos"},
               {"event": "*", "schema": "public", "table": "todos", "filter": long}]),
    ))
    .unwrap();
    let r = t.be.check.recv().await.unwrap();
    assert_eq!(
        r.bindings.len(),
        1,
        "the database is asked about the good one only"
    );
    r.reply.send(Checked::Ok(r.bindings, Vec::new())).unwrap();
    let done = t.next().await;
    t.c.on_answer(done);
    let w = t.written();
    assert_eq!(
        w[0].2["response"]["postgres_changes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(w[1].2["message"], "Subscribed to PostgreSQL");
    assert_eq!(
        w[2].2["message"],
        "Error parsing `filter` params: InvalidPostgresChanges: binding 2: the imatch pattern is 257 characters long; MAX_FILTER_PATTERN_LENGTH allows 256"
    );
    assert_eq!(t.c.shared.changes.of("public", "todos", None).len(), 1);
    // Refused by the check: what the database said, named after Supabase's words.
    t.send(with(
        json!([{"event": "INSERT", "schema": "public", "table": "nope"}]),
    ))
    .unwrap();
    assert!(t.written().is_empty(), "no answer before the check");
    let r = t.be.check.recv().await.unwrap();
    let why = "table public.nope does not exist".to_owned();
    let refused = Unserved::of(&r.bindings[0], BindingError::Rejected { at: 1, why });
    r.reply
        .send(Checked::Ok(Vec::new(), vec![refused]))
        .unwrap();
    let done = t.next().await;
    t.c.on_answer(done);
    let w = t.written();
    assert_eq!(status(&w[0].2).0, "ok");
    assert_eq!(
        w[1].2["message"],
        "Unable to subscribe to changes with given parameters. Please check Realtime is enabled for the given connect parameters: [event: INSERT, schema: public, table: nope]. InvalidPostgresChanges: binding 1: table public.nope does not exist"
    );
    assert!(
        t.c.shared.changes.of("public", "todos", None).is_empty(),
        "the rejoin replaced the channel's bindings"
    );
    // Admitted: the reply echoes the binding with its id, then "Subscribed to
    // PostgreSQL"; the channel is registered before either is written.
    t.send(with(
        json!([{"event": "INSERT", "schema": "public", "table": "todos"}]),
    ))
    .unwrap();
    let r = t.be.check.recv().await.unwrap();
    assert_eq!(r.role, "authenticated");
    let id = r.bindings[0].id;
    r.reply.send(Checked::Ok(r.bindings, Vec::new())).unwrap();
    let done = t.next().await;
    t.c.on_answer(done);
    let w = t.written();
    assert_eq!(w[0].1, "phx_reply");
    assert_eq!(
        w[0].2["response"]["postgres_changes"],
        json!([{"id": id, "event": "INSERT", "schema": "public", "table": "todos"}])
    );
    assert_eq!(w[1].1, "system");
    assert_eq!(
        w[1].2,
        json!({"extension": "postgres_changes", "status": "ok", "message": "Subscribed to PostgreSQL", "channel": "db"})
    );
    let registered = t.c.shared.changes.of("public", "todos", None);
    assert_eq!(registered.len(), 1);
    assert!(registered[0].claims.contains("\"sub\":\"u1\""));
    // A new token is the identity changes are checked for from then on.
    let token = testing::token(&json!({"role": "anon", "sub": "u9", "exp": jwt::now() + 60}));
    t.send(json!(["1", "2", "realtime:db", "access_token", {"access_token": token}]))
        .unwrap();
    assert_eq!(
        t.c.shared.changes.of("public", "todos", None)[0].role,
        "anon"
    );
    t.send(json!(["1", "3", "realtime:db", "phx_leave", {}]))
        .unwrap();
    assert!(t.c.shared.changes.is_empty());
}

fn presence_join(topic: &str, private: bool, enabled: bool) -> Value {
    json!(["1", "1", topic, "phx_join",
           {"config": {"private": private, "presence": {"key": "ann", "enabled": enabled}}}])
}

fn track(topic: &str, reference: &str, meta: Value) -> Value {
    json!(["1", reference, topic, "presence", {"type": "presence", "event": "track", "payload": meta}])
}

/// The (event, payload) of what the connection's outbound queue holds.
fn queued(t: &mut Conn) -> Vec<(String, Value)> {
    std::iter::from_fn(|| t.hub_rx.try_recv().ok())
        .map(|m| {
            let v: Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
            (v[3].as_str().unwrap().to_owned(), v[4].clone())
        })
        .collect()
}

#[tokio::test]
async fn a_presence_join_gets_its_state_after_the_reply_and_its_track_becomes_a_wish() {
    let mut t = conn();
    t.send(presence_join("realtime:room", false, true)).unwrap();
    let w = t.written();
    assert_eq!(
        (w[0].1.as_str(), status(&w[0].2)),
        ("phx_reply", ("ok", ""))
    );
    let p = t.c.shared.presence.clone();
    let loads = p.views.take_loads();
    assert_eq!(loads.len(), 1, "the topic's view is loaded");
    assert!(queued(&mut t).is_empty(), "no state before it is loaded");
    p.views.loaded(&loads[0].0, loads[0].1, vec![]);
    assert_eq!(queued(&mut t), vec![("presence_state".into(), json!({}))]);
    t.send(track("realtime:room", "2", json!({"online_at": 1})))
        .unwrap();
    assert!(t.written().is_empty(), "answered once written");
    let wants = p.members.take();
    let (id, want) = wants.into_iter().next().unwrap();
    assert_eq!(id.topic.topic, "room");
    assert_eq!(
        want.desired,
        Desired::Tracked {
            key: "ann".into(),
            meta: r#"{"online_at":1}"#.into()
        }
    );
    // Leaving untracks; the view forgets the topic.
    t.send(json!(["1", "3", "realtime:room", "phx_leave", {}]))
        .unwrap();
    assert_eq!(
        p.members.take().into_values().next().unwrap().desired,
        Desired::Untracked
    );
    assert!(p.views.members(&loads[0].0).is_none());
}

#[tokio::test]
async fn a_private_track_asks_presence_write_once_and_a_denied_one_is_refused() {
    let mut t = conn();
    t.send(presence_join("realtime:room", true, false)).unwrap();
    t.authorize(1, reader(true)).await;
    assert_eq!(status(&t.written()[0].2), ("ok", ""));
    // Presence was not enabled at join: the first track asks presence read and write;
    // a second track meanwhile waits behind it.
    t.send(track("realtime:room", "2", json!({"n": 1})))
        .unwrap();
    t.send(track("realtime:room", "3", json!({"n": 2})))
        .unwrap();
    let p = t.c.shared.presence.clone();
    assert!(p.members.is_empty(), "held until the verdicts are back");
    t.authorize(2, |r| {
        assert_eq!(r.extension, "presence");
        Verdict::Allowed
    })
    .await;
    let want = p.members.take().into_values().next().unwrap();
    assert_eq!(want.replies.len(), 2, "both pushes, in order, one wish");
    assert_eq!(
        want.desired,
        Desired::Tracked {
            key: "ann".into(),
            meta: r#"{"n":2}"#.into()
        }
    );
    assert_eq!(
        p.views.take_loads().len(),
        1,
        "the track enabled presence (read allowed)"
    );
    t.send(track("realtime:room", "4", json!({"n": 3})))
        .unwrap();
    assert!(t.be.authorize.try_recv().is_err(), "the verdict is kept");
    // Another channel whose presence write is denied.
    t.send(presence_join("realtime:other", true, true)).unwrap();
    t.authorize(2, reader(true)).await;
    t.written();
    t.send(track("realtime:other", "5", json!({}))).unwrap();
    t.authorize(1, |r| match r.write {
        true => Verdict::Denied(None),
        false => Verdict::Allowed,
    })
    .await;
    let w = t.written();
    assert_eq!(
        status(&w[0].2),
        (
            "error",
            "Unauthorized: You do not have permissions to track presence on this Channel topic: other"
        )
    );
}

#[tokio::test]
async fn bad_presence_pushes_get_error_replies_and_the_rate_limit_closes_the_channel() {
    let mut t = conn_with(&["--max-client-presence-events-per-second", "3"]);
    t.send(presence_join("realtime:room", false, false))
        .unwrap();
    t.written();
    t.send(track("realtime:room", "2", json!([1]))).unwrap();
    assert_eq!(
        status(&t.written()[0].2),
        ("error", "Presence track payload must be a map")
    );
    t.send(json!(["1", "3", "realtime:room", "presence", {"event": "sync"}]))
        .unwrap();
    assert!(status(&t.written()[0].2)
        .1
        .starts_with("UnknownPresenceEvent"));
    // The third push this second is within the limit of 3; the fourth closes the channel.
    t.send(track("realtime:room", "4", json!({}))).unwrap();
    assert!(t.written().is_empty());
    t.send(track("realtime:room", "5", json!({}))).unwrap();
    let w = t.written();
    let events: Vec<&str> = w.iter().map(|w| w.1.as_str()).collect();
    assert_eq!(events, vec!["system", "phx_close"]);
    assert_eq!(w[0].2["message"], "Client presence rate limit exceeded");
    assert!(!t.c.has_channels());
}

#[tokio::test]
async fn a_revoked_presence_read_stops_presence_and_the_sidecar_limit_refuses_the_heaviest_tracks()
{
    let mut t = conn_with(&["--max-presence-events-per-second", "2"]);
    t.send(presence_join("realtime:room", true, true)).unwrap();
    t.authorize(2, reader(true)).await;
    t.written();
    let p = t.c.shared.presence.clone();
    let (key, load) = p.views.take_loads().pop().expect("presence read: watching");
    p.views.loaded(&key, load, vec![]);
    assert_eq!(queued(&mut t)[0].0, "presence_state");
    // The re-check keeps broadcast read and revokes presence read: the channel stays,
    // and stops receiving presence (its view is dropped: no one here watches).
    t.c.recheck_all();
    t.authorize(2, |r| match r.extension {
        "presence" => Verdict::Denied(None),
        _ => Verdict::Allowed,
    })
    .await;
    assert!(t.c.get("realtime:room").is_some());
    assert!(p.views.members(&key).is_none());
    // The sidecar takes 2 tracks a second, both from this (the only) address: the third is
    // refused with Supabase's text, and no channel is closed for it.
    t.send(presence_join("realtime:a", false, false)).unwrap();
    t.send(presence_join("realtime:b", false, false)).unwrap();
    t.written();
    t.send(track("realtime:a", "5", json!({}))).unwrap();
    t.send(track("realtime:b", "6", json!({}))).unwrap();
    t.send(track("realtime:a", "7", json!({"n": 2}))).unwrap();
    let w = t.written();
    // (Accepted tracks are answered once the presence worker wrote them: none runs here.)
    let refusal = w
        .iter()
        .find(|f| f.1 == "phx_reply")
        .expect("the third track is answered");
    assert_eq!(refusal.0, "realtime:a");
    assert_eq!(refusal.2["status"], "error");
    assert_eq!(
        refusal.2["response"]["reason"],
        "Too many presence messages per second"
    );
    assert!(w.iter().all(|f| f.1 != "phx_close"));
    assert!(t.c.get("realtime:a").is_some() && t.c.get("realtime:b").is_some());
}

#[tokio::test]
async fn too_many_joins_a_second_close_the_socket() {
    let (shared, _be) = testing::shared(&["--max-joins-per-second", "2"]);
    let (tx, _hub_rx) = crate::out::channel(16);
    let mut c = Channels::new(shared, Vsn::V2, claims("u1"), "{}".into(), tx, local());
    let mut send = |topic: &str| {
        let f = command::from_text(
            Vsn::V2,
            &join(topic, false).to_string(),
            &Bounds::defaults(),
        )
        .unwrap();
        c.handle(f)
    };
    assert_eq!(send("realtime:a"), Ok(()));
    assert_eq!(send("realtime:b"), Ok(()));
    assert_eq!(send("realtime:c"), Err(Disconnect::JoinRateLimit));
}

#[tokio::test]
async fn a_presence_key_counts_against_the_meta_size_limit() {
    let mut t = conn_with(&["--max-presence-meta-bytes", "100"]);
    let key = "k".repeat(90);
    let join = json!(["1", "1", "realtime:room", "phx_join",
                      {"config": {"presence": {"key": key, "enabled": true}}}]);
    t.send(join).unwrap();
    t.written();
    // 20 bytes of meta alone would fit; with the 90-byte key they do not.
    t.send(track("realtime:room", "2", json!({"pad": "0123456"})))
        .unwrap();
    let w = t.written();
    assert_eq!(w[0].2["message"], "Track message size exceeded", "{w:?}");
    assert_eq!(w[1].1, "phx_close");
}
