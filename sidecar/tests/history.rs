//! History at a join, end to end: Supabase's replay (`config.broadcast.replay`) and this
//! server's resume after a position (`config.broadcast.resume`), against a real sidecar,
//! a real Postgres and raw WebSocket clients. realtime-js's side is in
//! `e2e/history.test.mjs`.

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// One test at a time: one of them evicts the whole queue, which would show up as a gap
/// in the others.
static SERIAL: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(|| tokio::sync::Mutex::new(()));

const MEMBER: &str = "44444444-4444-4444-8444-444444444444";
const STRANGER: &str = "55555555-5555-4555-8555-555555555555";

/// A topic no other run of this test used (positions are per queue, topics are not).
fn topic(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}:{nanos}")
}

/// What a client got: broadcasts (n of the payload, position, replayed) and system
/// messages, in arrival order.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    Broadcast {
        n: i64,
        epoch: String,
        seq: i64,
        replayed: bool,
    },
    System(Value),
}

/// Reads a 1.0.0 client until `done` holds of what it got, or `secs` pass.
async fn read_until(c: &mut Client, secs: u64, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut got = Vec::new();
    while !done(&got) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out; got {got:?}");
        let Some(m) = c.next_json(left.as_secs().max(1)).await else {
            continue;
        };
        match m["event"].as_str() {
            Some("broadcast") => {
                let meta = &m["payload"]["meta"];
                got.push(Got::Broadcast {
                    n: m["payload"]["payload"]["n"].as_i64().unwrap_or(-1),
                    epoch: meta["epoch"].as_str().expect("meta.epoch").to_owned(),
                    seq: meta["seq"].as_i64().expect("meta.seq"),
                    replayed: meta["replayed"] == true,
                });
            }
            Some("system") => got.push(Got::System(m["payload"].clone())),
            _ => {}
        }
    }
    got
}

fn ns(got: &[Got]) -> Vec<i64> {
    got.iter()
        .filter_map(|g| match g {
            Got::Broadcast { n, .. } => Some(*n),
            _ => None,
        })
        .collect()
}

fn last_position(got: &[Got]) -> (String, i64) {
    got.iter()
        .rev()
        .find_map(|g| match g {
            Got::Broadcast { epoch, seq, .. } => Some((epoch.clone(), *seq)),
            _ => None,
        })
        .expect("a broadcast")
}

fn system(got: &[Got]) -> Vec<Value> {
    got.iter()
        .filter_map(|g| match g {
            Got::System(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

fn has_n(n: i64) -> impl Fn(&[Got]) -> bool {
    move |got| ns(got).contains(&n)
}

/// Sends messages n = from..to on `topic` (public), ten every 10 ms: 1,000 a second.
fn publish(topic: &str, from: i64, to: i64) -> tokio::task::JoinHandle<()> {
    let topic = topic.to_owned();
    tokio::spawn(async move {
        let db = db().await;
        let mut next = from;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while next < to {
            tick.tick().await;
            let last = (next + 10).min(to);
            db.execute(
                "SELECT realtime.send(jsonb_build_object('n', g), 'n', $1, false) FROM generate_series($2::int8, $3::int8 - 1) g",
                &[&topic, &next, &last],
            )
            .await
            .unwrap();
            next = last;
        }
    })
}

async fn send(db: &tokio_postgres::Client, topic: &str, from: i64, to: i64, private: bool) {
    db.execute(
        "SELECT realtime.send(jsonb_build_object('n', g), 'n', $1, $4) FROM generate_series($2::int8, $3::int8 - 1) g",
        &[&topic, &from, &to, &private],
    )
    .await
    .unwrap();
}

async fn resume(c: &mut Client, topic: &str, epoch: &str, seq: i64) -> Value {
    c.join(
        &format!("realtime:{topic}"),
        json!({"broadcast": {"resume": {"epoch": epoch, "seq": seq}}}),
    )
    .await
}

#[tokio::test]
async fn resume_after_a_dropped_socket_at_1000_a_second_loses_and_repeats_nothing() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start("t_history_drop", &[]).await;
    let topic = topic("resume:drop");
    let mut a = Client::connect(sidecar.port, "1.0.0").await;
    a.join_public(&format!("realtime:{topic}")).await;
    let publisher = publish(&topic, 0, 3000);
    let first = read_until(&mut a, 20, has_n(1000)).await;
    // The socket is gone without a close frame; messages keep being committed meanwhile.
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (epoch, seq) = last_position(&first);
    // It comes back through another sidecar (a second process taking the first one's
    // clients): positions are the queue's, the same for every sidecar.
    let other = Sidecar::start("t_history_drop_other", &[]).await;
    let mut b = Client::connect(other.port, "1.0.0").await;
    assert_eq!(resume(&mut b, &topic, &epoch, seq).await["status"], "ok");
    let second = read_until(&mut b, 30, has_n(2999)).await;
    publisher.await.unwrap();

    let mut all = ns(&first);
    all.extend(ns(&second));
    assert_eq!(
        all,
        (0..3000).collect::<Vec<_>>(),
        "every message once, in order"
    );
    // Replayed messages first, then the system message, then live ones.
    let sys_at = second
        .iter()
        .position(|g| matches!(g, Got::System(_)))
        .expect("a system message");
    let sys = system(&second);
    assert_eq!(sys.len(), 1, "{sys:?}");
    assert_eq!(sys[0]["recovered"], true, "{}", sys[0]);
    assert_eq!(sys[0]["status"], "ok");
    assert_eq!(sys[0]["extension"], "broadcast");
    assert_eq!(sys[0]["epoch"], epoch.as_str());
    let resent = sys[0]["resent"].as_u64().unwrap() as usize;
    assert!(
        resent > 0,
        "messages were committed while the socket was away"
    );
    assert_eq!(sys_at, resent);
    for (i, g) in second.iter().enumerate() {
        if let Got::Broadcast {
            replayed, seq: s, ..
        } = g
        {
            assert_eq!(*replayed, i < sys_at, "message {i}");
            assert!(*s > seq);
        }
    }
    assert!(other.metric("realtime_history_messages_total").await >= resent as f64);
    drop(sidecar);
}

#[tokio::test]
async fn a_resume_longer_than_the_outbound_queue_is_paced_not_cut_off() {
    let _serial = SERIAL.lock().await;
    // A history ten times the socket's outbound queue: sent all at once, it would overflow
    // it and the client would be cut off as too slow.
    let sidecar = Sidecar::start("t_history_paced", &[("MAX_OUTBOUND_FRAMES", "500")]).await;
    let db = db().await;
    let topic = topic("resume:paced");
    let mut a = Client::connect(sidecar.port, "1.0.0").await;
    a.join_public(&format!("realtime:{topic}")).await;
    send(&db, &topic, 0, 1, false).await;
    let (epoch, seq) = last_position(&read_until(&mut a, 10, has_n(0)).await);
    drop(a);
    send(&db, &topic, 1, 5001, false).await;
    let mut b = Client::connect(sidecar.port, "1.0.0").await;
    assert_eq!(resume(&mut b, &topic, &epoch, seq).await["status"], "ok");
    let got = read_until(&mut b, 60, |g| !system(g).is_empty()).await;
    assert_eq!(ns(&got), (1..5001).collect::<Vec<_>>());
    let sys = &system(&got)[0];
    assert_eq!(
        (&sys["recovered"], &sys["resent"]),
        (&json!(true), &json!(5000)),
        "{sys}"
    );
    assert_eq!(sidecar.metric("realtime_slow_disconnects_total").await, 0.0);
}

#[tokio::test]
async fn resume_after_the_sidecar_is_killed_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let mut killed = Sidecar::start("t_history_kill", &[]).await;
    let topic = topic("resume:kill");
    let mut a = Client::connect(killed.port, "1.0.0").await;
    a.join_public(&format!("realtime:{topic}")).await;
    let publisher = publish(&topic, 0, 3000);
    let first = read_until(&mut a, 20, has_n(500)).await;
    killed.kill();
    // Whatever was already in flight to the client still counts as seen.
    let mut first = first;
    while let Some(m) = a.next_json(1).await {
        if m["event"] == "broadcast" {
            let meta = &m["payload"]["meta"];
            first.push(Got::Broadcast {
                n: m["payload"]["payload"]["n"].as_i64().unwrap(),
                epoch: meta["epoch"].as_str().unwrap().to_owned(),
                seq: meta["seq"].as_i64().unwrap(),
                replayed: false,
            });
        }
    }
    // The same sidecar started again (same consumer, same port), as a supervisor would.
    let again = Sidecar::start_on(killed.port, "t_history_kill", &[]).await;
    let (epoch, seq) = last_position(&first);
    let mut b = Client::connect(again.port, "1.0.0").await;
    assert_eq!(resume(&mut b, &topic, &epoch, seq).await["status"], "ok");
    let second = read_until(&mut b, 30, has_n(2999)).await;
    publisher.await.unwrap();
    let mut all = ns(&first);
    all.extend(ns(&second));
    assert_eq!(
        all,
        (0..3000).collect::<Vec<_>>(),
        "every message once, in order"
    );
    assert_eq!(system(&second)[0]["recovered"], true);
}

#[tokio::test]
async fn resume_past_the_retained_range_says_recovered_false_with_the_gap() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start("t_history_evicted", &[]).await;
    let db = db().await;
    let topic = topic("resume:evicted");
    let mut a = Client::connect(sidecar.port, "1.0.0").await;
    a.join_public(&format!("realtime:{topic}")).await;
    send(&db, &topic, 0, 5, false).await;
    let first = read_until(&mut a, 10, has_n(4)).await;
    drop(a);
    let (epoch, seq) = last_position(&first);
    evict_everything(&db).await;
    send(&db, &topic, 5, 8, false).await;
    let oldest: i64 = db
        .query_one("SELECT oldest_seq FROM realtime.stats()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        oldest > seq + 1,
        "the ring evicted the client's next message"
    );

    let mut b = Client::connect(sidecar.port, "1.0.0").await;
    assert_eq!(resume(&mut b, &topic, &epoch, seq).await["status"], "ok");
    let got = read_until(&mut b, 10, |g| !system(g).is_empty()).await;
    let sys = &system(&got)[0];
    assert_eq!(sys["recovered"], false, "{sys}");
    assert_eq!(sys["status"], "error");
    assert_eq!(sys["first_missing"], seq + 1, "{sys}");
    assert_eq!(sys["last_missing"], oldest - 1, "{sys}");
    // What is still retained after the gap was sent before the system message.
    assert_eq!(ns(&got), vec![5, 6, 7]);
    assert_eq!(
        sidecar.metric("realtime_history_unrecovered_total").await,
        1.0
    );
}

#[tokio::test]
async fn resume_of_another_epoch_or_from_the_future_or_malformed_is_told_not_crashed() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start("t_history_bad", &[]).await;
    let db = db().await;
    let topic = topic("resume:bad");
    send(&db, &topic, 0, 3, false).await;
    let (epoch, last): (i64, i64) = queue_position(&db).await;

    // Another epoch (a position from before a database restart): what this epoch holds of
    // the topic is sent, and the system message names the change.
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    assert_eq!(resume(&mut c, &topic, "12345", 2).await["status"], "ok");
    let got = read_until(&mut c, 10, |g| !system(g).is_empty()).await;
    assert_eq!(ns(&got), vec![0, 1, 2]);
    let sys = &system(&got)[0];
    assert_eq!(
        (
            &sys["recovered"],
            &sys["epoch_changed"],
            &sys["first_missing"]
        ),
        (&json!(false), &json!(true), &json!(3)),
        "{sys}"
    );
    assert_eq!(sys["epoch"], epoch.to_string());

    // A position this queue never reached: nothing sent, recovered false, then live.
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let ahead = resume(&mut c, &topic, &epoch.to_string(), last + 1_000_000).await;
    assert_eq!(ahead["status"], "ok");
    let got = read_until(&mut c, 10, |g| !system(g).is_empty()).await;
    assert!(ns(&got).is_empty());
    let sys = &system(&got)[0];
    assert_eq!(sys["recovered"], false, "{sys}");
    assert!(sys["message"]
        .as_str()
        .unwrap()
        .contains("beyond the last message"));
    send(&db, &topic, 3, 4, false).await;
    assert_eq!(ns(&read_until(&mut c, 10, has_n(3)).await), vec![3]);

    // Not a position: the join is refused with a reason, and the socket stays.
    for bad in [
        json!({"epoch": epoch.to_string(), "seq": -1}),
        json!({"seq": "x"}),
        json!("soon"),
    ] {
        let r = c
            .join(
                &format!("realtime:{topic}:x"),
                json!({"broadcast": {"resume": bad}}),
            )
            .await;
        assert_eq!(r["status"], "error", "{bad}: {r}");
        assert!(
            r["response"]["reason"]
                .as_str()
                .unwrap()
                .starts_with("UnableToResume: "),
            "{r}"
        );
    }
    // Never another topic's messages: a resume on a topic nobody sent to, from a position
    // before the three messages sent above to another topic, gets nothing.
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let empty = topic_name_never_sent();
    assert_eq!(
        resume(&mut c, &empty, &epoch.to_string(), last - 3).await["status"],
        "ok"
    );
    let got = read_until(&mut c, 10, |g| !system(g).is_empty()).await;
    assert!(ns(&got).is_empty(), "{got:?}");
    assert_eq!(system(&got)[0]["recovered"], true);
}

/// More than the whole ring sent to another topic (scripts/test.sh sets
/// realtime.queue_size = 32MB): everything before is evicted.
async fn evict_everything(db: &tokio_postgres::Client) {
    let capacity: i64 = db
        .query_one("SELECT capacity_bytes FROM realtime.stats()", &[])
        .await
        .unwrap()
        .get(0);
    for _ in 0..(capacity / 900_000 + 2) {
        db.execute(
            "SELECT realtime.send(jsonb_build_object('pad', repeat('x', 900000)), 'pad', 'evict', false)",
            &[],
        )
        .await
        .unwrap();
    }
}

/// Makes MEMBER a member of `topic` (a writer with `can_write`); returns the database's
/// clock now in unix milliseconds, a replay's `since` that covers what is sent next.
async fn member_of(db: &tokio_postgres::Client, topic: &str, can_write: bool) -> i64 {
    db.execute(
        "INSERT INTO private_members VALUES ($1::text::uuid, $2, $3)",
        &[&MEMBER, &topic, &can_write],
    )
    .await
    .unwrap();
    // Rounded down: a cast rounds to the nearest millisecond, up to half a millisecond
    // past now, and messages committed within it were then older than `since` (the replay
    // test failed about one run in six).
    db.query_one("SELECT floor(extract(epoch FROM now()) * 1000)::int8", &[])
        .await
        .unwrap()
        .get(0)
}

fn topic_name_never_sent() -> String {
    topic("resume:empty")
}

async fn private_setup() -> tokio_postgres::Client {
    let db = db().await;
    load_private_policies(&db).await;
    db
}

/// `channel.httpSend` of a kept message (`persist=true`) to a private topic, as `token`.
async fn post_kept(port: u16, topic: &str, token: &str, body: &str) -> (u16, String) {
    let (status, body) = http(
        port,
        "POST",
        &format!("/api/broadcast/{topic}/events/kept?private=true&persist=true"),
        &[
            ("authorization", &format!("Bearer {token}")),
            ("apikey", &anon_key()),
        ],
        body,
    )
    .await
    .unwrap();
    (status, body)
}

async fn join_private(c: &mut Client, topic: &str, sub: &str, broadcast: Value) -> Value {
    let payload = json!({"config": {"private": true, "broadcast": broadcast},
                         "access_token": user_token(sub)});
    let r = c
        .push(Some("1"), &format!("realtime:{topic}"), "phx_join", payload)
        .await;
    c.reply(&r).await
}

#[tokio::test]
async fn supabase_replay_sends_the_newest_database_messages_once_and_needs_read() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start("t_history_replay", &[]).await;
    let db = private_setup().await;
    let topic = topic("replay:room");
    let since = member_of(&db, &topic, false).await;
    send(&db, &topic, 0, 30, true).await;
    // A public message of the same name is another topic.
    send(&db, &topic, 100, 101, false).await;

    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let r = join_private(
        &mut c,
        &topic,
        MEMBER,
        json!({"replay": {"since": since, "limit": 10}}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    let got = read_until(&mut c, 10, has_n(29)).await;
    assert_eq!(
        ns(&got),
        (20..30).collect::<Vec<_>>(),
        "the newest 10, oldest first"
    );
    assert!(
        got.iter()
            .all(|g| matches!(g, Got::Broadcast { replayed: true, .. })),
        "{got:?}"
    );
    assert!(
        system(&got).is_empty(),
        "Supabase sends no system message for a replay"
    );
    // Then live, with nothing replayed twice.
    send(&db, &topic, 30, 31, true).await;
    let live = read_until(&mut c, 10, has_n(30)).await;
    assert_eq!(ns(&live), vec![30]);
    assert!(
        matches!(
            live.last(),
            Some(Got::Broadcast {
                replayed: false,
                ..
            })
        ),
        "{live:?}"
    );
    assert!(system(&live).is_empty(), "{live:?}");

    // Without a limit: Supabase's 25. A limit above it is capped.
    for replay in [
        json!({"since": since}),
        json!({"since": since, "limit": 1000}),
    ] {
        let mut c = Client::connect(sidecar.port, "1.0.0").await;
        let r = join_private(&mut c, &topic, MEMBER, json!({ "replay": replay })).await;
        assert_eq!(r["status"], "ok", "{r}");
        let got = read_until(&mut c, 10, has_n(30)).await;
        assert_eq!(ns(&got), (6..31).collect::<Vec<_>>());
    }
    // A `since` after everything: nothing.
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let later = since + 50_000;
    let r = join_private(&mut c, &topic, MEMBER, json!({"replay": {"since": later}})).await;
    assert_eq!(r["status"], "ok");
    send(&db, &topic, 31, 32, true).await;
    let got = read_until(&mut c, 10, has_n(31)).await;
    assert_eq!(ns(&got), vec![31]);

    // No read permission: refused, for replay and for resume alike.
    let mut s = Client::connect(sidecar.port, "1.0.0").await;
    for ask in [
        json!({"replay": {"since": since}}),
        json!({"resume": {"epoch": "1", "seq": 1}}),
    ] {
        let r = join_private(&mut s, &topic, STRANGER, ask).await;
        assert_eq!(
            r["response"]["reason"],
            format!("Unauthorized: You do not have permissions to read from this Channel topic: {topic}"),
            "{r}"
        );
    }
    // Public channels: Supabase's refusal; bad parameters: Supabase's text.
    let r = s
        .join(
            &format!("realtime:{topic}"),
            json!({"broadcast": {"replay": {"since": since}}}),
        )
        .await;
    assert_eq!(
        r["response"]["reason"],
        "UnableToReplayMessages: Replay is not allowed for public channels"
    );
    let r = join_private(
        &mut s,
        &topic,
        MEMBER,
        json!({"replay": {"since": "yesterday"}}),
    )
    .await;
    assert!(
        r["response"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("UnableToReplayMessages: Replay params are not valid"),
        "{r}"
    );
    // A `since` ten minutes ahead of the server's clock (a minute of skew is allowed).
    let ahead = json!({"replay": {"since": since + 600_000}});
    let r = join_private(&mut s, &topic, MEMBER, ahead).await;
    assert_eq!(
        r["response"]["reason"],
        "UnableToReplayMessages: Replay params are not valid: since is in the future",
        "{r}"
    );
}

/// A 2.0.0 binary push (kind 3) with `metadata` (realtime-js puts `persist` there).
fn binary_push(
    topic: &str,
    event: &str,
    metadata: &str,
    payload: &str,
) -> tokio_tungstenite::tungstenite::Message {
    let (join_ref, reference) = ("1", "9");
    let mut f = vec![
        3u8,
        join_ref.len() as u8,
        reference.len() as u8,
        topic.len() as u8,
        event.len() as u8,
        metadata.len() as u8,
        1,
    ];
    for part in [join_ref, reference, topic, event, metadata, payload] {
        f.extend_from_slice(part.as_bytes());
    }
    tokio_tungstenite::tungstenite::Message::binary(f)
}

#[tokio::test]
async fn persisted_client_broadcasts_are_replayed_even_after_the_ring_dropped_them() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start("t_history_persist", &[]).await;
    let db = private_setup().await;
    let topic = topic("persist:room");
    let since = member_of(&db, &topic, true).await;
    let mut w = Client::connect(sidecar.port, "2.0.0").await;
    let r = join_private(&mut w, &topic, MEMBER, json!({"ack": true})).await;
    assert_eq!(r["status"], "ok", "{r}");
    let channel = format!("realtime:{topic}");
    // Kept (binary push metadata, as realtime-js sends it), not kept, kept for 60 s (a
    // text push's `persist`).
    w.send_raw(binary_push(
        &channel,
        "kept",
        r#"{"persist":true}"#,
        r#"{"n":1}"#,
    ))
    .await;
    assert_eq!(w.reply("9").await["status"], "ok");
    let r = w.broadcast(&channel, "fleeting", json!({"n": 2})).await;
    assert_eq!(w.reply(&r).await["status"], "ok");
    let body =
        json!({"type": "broadcast", "event": "kept", "payload": {"n": 3}, "persist": {"ttl": 60}});
    let r = w.push(Some("1"), &channel, "broadcast", body).await;
    assert_eq!(w.reply(&r).await["status"], "ok");
    let rows = db
        .query(
            "SELECT event, extract(epoch FROM expires_at - sent_at)::int AS ttl FROM realtime.persisted_messages \
             WHERE topic = $1 ORDER BY sent_at",
            &[&topic],
        )
        .await
        .unwrap();
    let kept: Vec<(String, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(kept, vec![("kept".into(), 259_200), ("kept".into(), 60)]);

    // Refused by name, in `response.error` too (realtime-js hands that to the app): a
    // public channel, a bad ttl.
    let mut p = Client::connect(sidecar.port, "1.0.0").await;
    p.join_public(&format!("realtime:{topic}:public")).await;
    let body = json!({"type": "broadcast", "event": "e", "payload": {}, "persist": true});
    let r = p
        .push(
            Some("1"),
            &format!("realtime:{topic}:public"),
            "broadcast",
            body,
        )
        .await;
    let reply = p.reply(&r).await;
    assert_eq!(
        reply["response"]["error"],
        "PersistNotAllowed: only messages on private channels can be persisted",
        "{reply}"
    );
    let body = json!({"type": "broadcast", "event": "e", "payload": {}, "persist": {"ttl": 0}});
    let r = w.push(Some("1"), &channel, "broadcast", body).await;
    let reply = w.reply(&r).await;
    assert!(
        reply["response"]["error"]
            .as_str()
            .unwrap()
            .starts_with("InvalidPersist: "),
        "{reply}"
    );

    // REST (realtime-js's httpSend): kept on a private topic; refused on a public one.
    let auth = format!("Bearer {}", user_token(MEMBER));
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let path =
        format!("/realtime/v1/api/broadcast/{topic}/events/kept?private=true&persist%5Bttl%5D=120");
    let (status, body) = http(sidecar.port, "POST", &path, &headers, r#"{"n":4}"#)
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    let path = format!("/api/broadcast/{topic}/events/kept?persist=true");
    let (status, body) = http(sidecar.port, "POST", &path, &headers, r#"{"n":5}"#)
        .await
        .unwrap();
    assert_eq!(status, 422);
    assert!(body.contains("PersistNotAllowed"), "{body}");

    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let r = join_private(&mut c, &topic, MEMBER, json!({"replay": {"since": since}})).await;
    assert_eq!(r["status"], "ok", "{r}");
    // Everything replayed comes before this live message.
    send(&db, &topic, 99, 100, true).await;
    let got = read_until(&mut c, 10, has_n(99)).await;
    assert_eq!(ns(&got), vec![1, 3, 4, 99], "the kept ones, then live");

    // The ring moves on (more than its size sent on another topic): the kept messages are
    // still replayed, from their table, without a position; the database's are gone.
    evict_everything(&db).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let r = join_private(&mut c, &topic, MEMBER, json!({"replay": {"since": since}})).await;
    assert_eq!(r["status"], "ok", "{r}");
    send(&db, &topic, 100, 101, true).await;
    let mut metas = Vec::new();
    loop {
        let m = c
            .next_json(10)
            .await
            .expect("the replayed and the live messages");
        if m["event"] != "broadcast" {
            continue;
        }
        let n = m["payload"]["payload"]["n"].as_i64().unwrap();
        metas.push((n, m["payload"]["meta"].clone()));
        if n == 100 {
            break;
        }
    }
    let ns: Vec<i64> = metas.iter().map(|(n, _)| *n).collect();
    assert_eq!(ns, vec![1, 3, 4, 100]);
    for (n, meta) in &metas[..3] {
        assert_eq!(meta["replayed"], true, "{n}: {meta}");
        assert!(
            meta.get("seq").is_none(),
            "{n}: no position once the ring dropped it: {meta}"
        );
        assert!(meta["id"].is_string(), "{n}: {meta}");
    }
}

/// Sends 80 messages n = from..from+80 of about 250 KB each on `topic` (public).
async fn send_large(db: &tokio_postgres::Client, topic: &str, from: i64) {
    db.execute(
        "SELECT realtime.send(jsonb_build_object('n', g, 'x', repeat('a', 250000)), 'n', $1, false) \
         FROM generate_series($2::int8, $2::int8 + 79) g",
        &[&topic, &from],
    )
    .await
    .unwrap();
}

/// A resume used to be read in pages cut at 64 MB and stop after the first short one while
/// saying `recovered: true` (80 messages of 1 MB: the last dozen never came). A resume is
/// now one walk to the queue's end that keeps at most MAX_RESUME_MESSAGES per topic: 80
/// large messages (20 MB, what the suite's 32 MB queue holds) all arrive, then recovered.
#[tokio::test]
async fn a_resume_of_large_messages_sends_every_one_before_saying_recovered() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start("t_history_large", &[]).await;
    let db = db().await;
    let topic = topic("resume:large");
    let mut a = Client::connect(sidecar.port, "1.0.0").await;
    a.join_public(&format!("realtime:{topic}")).await;
    send(&db, &topic, 0, 1, false).await;
    let (epoch, seq) = last_position(&read_until(&mut a, 10, has_n(0)).await);
    drop(a);
    send_large(&db, &topic, 1).await;
    let mut b = Client::connect(sidecar.port, "1.0.0").await;
    assert_eq!(resume(&mut b, &topic, &epoch, seq).await["status"], "ok");
    let got = read_until(&mut b, 60, |g| !system(g).is_empty()).await;
    assert_eq!(ns(&got), (1..81).collect::<Vec<_>>());
    let sys = &system(&got)[0];
    assert_eq!(
        (&sys["recovered"], &sys["resent"]),
        (&json!(true), &json!(80)),
        "{sys}"
    );
}

/// How much history one resume may make the sidecar hold is bounded: past
/// MAX_RESUME_MESSAGES the newest are sent and the client is told which positions were
/// not, with `recovered: false` (never a silent cut).
#[tokio::test]
async fn a_resume_further_behind_than_max_resume_messages_gets_the_newest_and_the_range_not_sent() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start("t_history_limit", &[("MAX_RESUME_MESSAGES", "50")]).await;
    let db = db().await;
    let topic = topic("resume:limit");
    let mut a = Client::connect(sidecar.port, "1.0.0").await;
    a.join_public(&format!("realtime:{topic}")).await;
    send(&db, &topic, 0, 1, false).await;
    let (epoch, seq) = last_position(&read_until(&mut a, 10, has_n(0)).await);
    drop(a);
    send_large(&db, &topic, 1).await;
    let mut b = Client::connect(sidecar.port, "1.0.0").await;
    assert_eq!(resume(&mut b, &topic, &epoch, seq).await["status"], "ok");
    let got = read_until(&mut b, 60, |g| !system(g).is_empty()).await;
    assert_eq!(ns(&got), (31..81).collect::<Vec<_>>(), "the newest 50");
    let first_sent = match &got[0] {
        Got::Broadcast { seq, .. } => *seq,
        other => panic!("{other:?}"),
    };
    let sys = &system(&got)[0];
    assert_eq!(sys["recovered"], false, "{sys}");
    assert_eq!(sys["status"], "error");
    assert_eq!(sys["first_missing"], seq + 1, "{sys}");
    assert_eq!(sys["last_missing"], first_sent - 1, "{sys}");
    assert_eq!(sys["resent"], 50);
    assert_eq!(
        sys["message"],
        format!(
            "More than MAX_RESUME_MESSAGES (50) messages follow position {seq}: messages {} to {} were not sent; the 50 newest were",
            seq + 1,
            first_sent - 1
        )
    );
    // Live messages follow.
    send(&db, &topic, 81, 82, false).await;
    let live = read_until(&mut b, 10, has_n(81)).await;
    assert_eq!(ns(&live), vec![81]);
}

/// Issue 39, H2: a resume was bounded by its number of messages only, and messages may be a
/// megabyte each, so slow readers made the sidecar hold gigabytes of frames. Now a resume
/// is bounded in bytes (MAX_RESUME_BYTES), the histories of one address being sent together
/// (MAX_RESUME_BYTES_PER_ADDRESS) and all of them (MAX_RESUME_BYTES_IN_FLIGHT); the newest
/// that fit are sent and the client is told, `recovered: false`, which positions were not
/// and which bound cut them. A reader that stops reading holds its own address's share,
/// never another address's.
#[tokio::test]
async fn a_resume_was_bounded_in_messages_not_bytes() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start(
        "t_history_bytes",
        &[
            ("MAX_RESUME_BYTES", "12000000"),
            ("MAX_RESUME_BYTES_PER_ADDRESS", "14000000"),
            ("MAX_OUTBOUND_BYTES", "2097152"),
        ],
    )
    .await;
    let db = db().await;
    let topic = topic("resume:bytes");
    let mut a = Client::connect(sidecar.port, "1.0.0").await;
    a.join_public(&format!("realtime:{topic}")).await;
    send(&db, &topic, 0, 1, false).await;
    let (epoch, seq) = last_position(&read_until(&mut a, 10, has_n(0)).await);
    drop(a);
    // 80 messages of about 250 KB (20 MB).
    send_large(&db, &topic, 1).await;
    // One that stops reading, from 127.0.0.6: its history is cut to what fits 12 MB, and
    // what its socket does not take stays with its sending (its queue takes 1 MiB).
    let mut slow = Client::connect_from_small_buffer("127.0.0.6", sidecar.port, "1.0.0").await;
    assert_eq!(resume(&mut slow, &topic, &epoch, seq).await["status"], "ok");
    let deadline = Instant::now() + Duration::from_secs(20);
    while sidecar.metric("realtime_history_bytes_held").await < 4_000_000.0 {
        assert!(
            Instant::now() < deadline,
            "the slow reader's history was never held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another connection of the same address gets what is left of the address's share.
    let mut same = Client::connect_from("127.0.0.6", sidecar.port, "1.0.0")
        .await
        .unwrap();
    assert_eq!(resume(&mut same, &topic, &epoch, seq).await["status"], "ok");
    let got = read_until(&mut same, 60, |g| !system(g).is_empty()).await;
    let sys = &system(&got)[0];
    let sent = ns(&got);
    assert!(
        sent.len() < 47,
        "the address's share was not spent: {sent:?}"
    );
    assert_eq!(sys["recovered"], false, "{sys}");
    assert_eq!(sys["resent"], sent.len(), "{sys}");
    let prefix = format!(
        "This client address's histories being sent would hold more than MAX_RESUME_BYTES_PER_ADDRESS (14000000 bytes) with the messages after position {seq}: messages {} to ",
        seq + 1
    );
    assert!(
        sys["message"].as_str().unwrap().starts_with(&prefix),
        "{sys}"
    );
    if let Some(first) = sent.first() {
        assert_eq!(sent, (*first..81).collect::<Vec<_>>(), "the newest");
    }
    // Another address: a share of its own, cut by the resume's own bound only. 47 messages
    // of a little over 250,000 bytes fit 12,000,000; 48 do not.
    let mut other = Client::connect_from("127.0.0.7", sidecar.port, "1.0.0")
        .await
        .unwrap();
    assert_eq!(
        resume(&mut other, &topic, &epoch, seq).await["status"],
        "ok"
    );
    let got = read_until(&mut other, 60, |g| !system(g).is_empty()).await;
    assert_eq!(ns(&got), (34..81).collect::<Vec<_>>(), "the newest 47");
    let first_sent = match &got[0] {
        Got::Broadcast { seq, .. } => *seq,
        other => panic!("{other:?}"),
    };
    let sys = &system(&got)[0];
    assert_eq!(
        (
            &sys["recovered"],
            &sys["first_missing"],
            &sys["last_missing"]
        ),
        (&json!(false), &json!(seq + 1), &json!(first_sent - 1)),
        "{sys}"
    );
    assert_eq!(
        sys["message"],
        format!(
            "The messages after position {seq} take more than MAX_RESUME_BYTES (12000000 bytes): messages {} to {} were not sent; the 47 newest were",
            seq + 1,
            first_sent - 1
        )
    );
    assert!(sidecar.metric("realtime_history_cut_by_bytes_total").await >= 3.0);
    drop(slow);
}

/// A user allowed to write one room could fill `realtime.persisted_messages` at the
/// database's write rate for 72 hours. A topic now keeps at most
/// MAX_PERSISTED_MESSAGES_PER_TOPIC messages and MAX_PERSISTED_BYTES_PER_TOPIC bytes: a
/// push past either is refused with the reason, in `response.error` too (realtime-js hands
/// it to the app), nothing of it relayed; pushes not kept still go through.
#[tokio::test]
async fn persisted_messages_past_a_topic_s_quota_are_refused_with_the_reason() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start(
        "t_history_quota",
        &[
            ("MAX_PERSISTED_MESSAGES_PER_TOPIC", "3"),
            ("MAX_PERSISTED_BYTES_PER_TOPIC", "2000"),
        ],
    )
    .await;
    let db = private_setup().await;
    let topic = topic("persist:quota");
    member_of(&db, &topic, true).await;
    let mut w = Client::connect(sidecar.port, "1.0.0").await;
    let r = join_private(&mut w, &topic, MEMBER, json!({"ack": true})).await;
    assert_eq!(r["status"], "ok", "{r}");
    let channel = format!("realtime:{topic}");
    let kept = |n: i64, pad: usize| {
        json!({"type": "broadcast", "event": "kept", "payload": {"n": n, "pad": "x".repeat(pad)},
               "persist": {"ttl": 60}})
    };
    for n in 1..=3 {
        let r = w.push(Some("1"), &channel, "broadcast", kept(n, 0)).await;
        assert_eq!(w.reply(&r).await["status"], "ok", "message {n}");
    }
    let r = w.push(Some("1"), &channel, "broadcast", kept(4, 0)).await;
    let reply = w.reply(&r).await;
    let reason = format!(
        "UnableToBroadcast: PersistQuotaExceeded: topic {topic} keeps at most 3 persisted messages \
         and 2000 bytes (MAX_PERSISTED_MESSAGES_PER_TOPIC, MAX_PERSISTED_BYTES_PER_TOPIC) until some expire"
    );
    assert_eq!(reply["status"], "error", "{reply}");
    assert_eq!(reply["response"]["reason"], reason.as_str(), "{reply}");
    assert_eq!(reply["response"]["error"], reason.as_str(), "{reply}");
    // Not kept: relayed as ever.
    let r = w.broadcast(&channel, "fleeting", json!({"n": 5})).await;
    assert_eq!(w.reply(&r).await["status"], "ok");

    // Bytes: one message larger than the topic's byte quota, on a topic with none kept.
    let big_topic = format!("{topic}:big");
    member_of(&db, &big_topic, true).await;
    let r = join_private(&mut w, &big_topic, MEMBER, json!({"ack": true})).await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = w
        .push(
            Some("1"),
            &format!("realtime:{big_topic}"),
            "broadcast",
            kept(1, 3000),
        )
        .await;
    let reply = w.reply(&r).await;
    assert!(
        reply["response"]["reason"]
            .as_str()
            .unwrap()
            .contains("PersistQuotaExceeded"),
        "{reply}"
    );
    let counts: Vec<(String, i64)> = db
        .query(
            "SELECT topic, count(*) FROM realtime.persisted_messages WHERE topic IN ($1, $2) GROUP BY topic",
            &[&topic, &big_topic],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        counts,
        vec![(topic.clone(), 3)],
        "nothing past the quota was kept"
    );
    db.execute(
        "DELETE FROM realtime.persisted_messages WHERE topic IN ($1, $2)",
        &[&topic, &big_topic],
    )
    .await
    .unwrap();
}

/// A user pushing kept messages into a full topic as fast as a connection is let made each
/// push a failed relay statement and its splitting in the database (the soak's persister:
/// a quarter of a core of Postgres at 200 pushes a second), delaying whichever broadcasts
/// shared its batches. Once the database refused one for the quota, the topic's kept
/// pushes are refused with the same reason where they arrive, over WebSocket and REST,
/// without entering the relay; pushes not kept, and other topics, are relayed as ever.
#[tokio::test]
async fn kept_pushes_to_a_full_topic_are_refused_without_asking_the_database_each_time() {
    let _serial = SERIAL.lock().await;
    let sidecar = Sidecar::start(
        "t_history_full_topic",
        &[("MAX_PERSISTED_MESSAGES_PER_TOPIC", "1")],
    )
    .await;
    let db = private_setup().await;
    let topic = topic("persist:full");
    member_of(&db, &topic, true).await;
    let mut w = Client::connect(sidecar.port, "1.0.0").await;
    let r = join_private(&mut w, &topic, MEMBER, json!({"ack": true})).await;
    assert_eq!(r["status"], "ok", "{r}");
    let channel = format!("realtime:{topic}");
    let kept = |n: i64| json!({"type": "broadcast", "event": "kept", "payload": {"n": n}, "persist": {"ttl": 60}});
    let r = w.push(Some("1"), &channel, "broadcast", kept(1)).await;
    assert_eq!(w.reply(&r).await["status"], "ok");
    let reason = format!(
        "UnableToBroadcast: PersistQuotaExceeded: topic {topic} keeps at most 1 persisted messages \
         and 10000000 bytes (MAX_PERSISTED_MESSAGES_PER_TOPIC, MAX_PERSISTED_BYTES_PER_TOPIC) until some expire"
    );
    // The database's refusal, then the same reason for the pushes after it.
    for n in 2..=6 {
        let r = w.push(Some("1"), &channel, "broadcast", kept(n)).await;
        let reply = w.reply(&r).await;
        assert_eq!(
            reply["response"]["reason"],
            reason.as_str(),
            "push {n}: {reply}"
        );
    }
    let known = sidecar.metric("realtime_persist_full_refusals_total").await;
    assert!(known >= 1.0, "every push went to the database");
    // Over REST, to the same topic: refused with the reason too.
    let token = user_token(MEMBER);
    let (status, body) = post_kept(sidecar.port, &topic, &token, r#"{"n": 7}"#).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("PersistQuotaExceeded"), "{body}");
    // Not kept: relayed.
    let r = w.broadcast(&channel, "fleeting", json!({"n": 8})).await;
    assert_eq!(w.reply(&r).await["status"], "ok");
    let kept_rows: i64 = db
        .query_one(
            "SELECT count(*) FROM realtime.persisted_messages WHERE topic = $1",
            &[&topic],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept_rows, 1);
    db.execute(
        "DELETE FROM realtime.persisted_messages WHERE topic = $1",
        &[&topic],
    )
    .await
    .unwrap();
}

/// The persist quota was per topic only (issue 39, M4): a user with a write policy on a
/// prefix kept MAX_PERSISTED_MESSAGES_PER_TOPIC in every topic it named, and nothing bounded
/// the table. A sender (the token's `sub`) now keeps at most MAX_PERSISTED_MESSAGES_PER_USER
/// over all its topics, and everyone together MAX_PERSISTED_MESSAGES, each refusal naming
/// its settings, over WebSocket and REST alike.
#[tokio::test]
async fn one_user_kept_a_topic_s_quota_in_every_topic_it_named() {
    let _serial = SERIAL.lock().await;
    let db = private_setup().await;
    // Counted again from the table, so the total below starts where the table is.
    db.execute("SELECT realtime.expire_persisted()", &[])
        .await
        .unwrap();
    let held: i64 = db
        .query_one("SELECT messages FROM realtime.persisted_totals", &[])
        .await
        .unwrap()
        .get(0);
    let total = (held + 3).to_string();
    let sidecar = Sidecar::start(
        "t_history_user_quota",
        &[
            ("MAX_PERSISTED_MESSAGES_PER_USER", "2"),
            ("MAX_PERSISTED_MESSAGES", &total),
        ],
    )
    .await;
    let prefix = topic("persist:user");
    let mut w = Client::connect(sidecar.port, "1.0.0").await;
    let kept =
        json!({"type": "broadcast", "event": "kept", "payload": {"n": 1}, "persist": {"ttl": 60}});
    let mut replies = Vec::new();
    for n in 1..=3 {
        let topic = format!("{prefix}-{n}");
        member_of(&db, &topic, true).await;
        let r = join_private(&mut w, &topic, MEMBER, json!({"ack": true})).await;
        assert_eq!(r["status"], "ok", "{r}");
        let r = w
            .push(
                Some("1"),
                &format!("realtime:{topic}"),
                "broadcast",
                kept.clone(),
            )
            .await;
        replies.push(w.reply(&r).await);
    }
    assert_eq!(replies[0]["status"], "ok", "{replies:?}");
    assert_eq!(replies[1]["status"], "ok", "{replies:?}");
    let reason = format!(
        "UnableToBroadcast: PersistQuotaExceeded: user {MEMBER} keeps at most 2 persisted messages \
         and 100000000 bytes (MAX_PERSISTED_MESSAGES_PER_USER, MAX_PERSISTED_BYTES_PER_USER) until some expire"
    );
    assert_eq!(
        replies[2]["response"]["error"],
        reason.as_str(),
        "{replies:?}"
    );

    // Another user is not refused by that quota, until the database's total is reached.
    let other = format!("{prefix}-other");
    db.execute(
        "INSERT INTO private_members VALUES ($1::text::uuid, $2, true)",
        &[&STRANGER, &other],
    )
    .await
    .unwrap();
    let token = user_token(STRANGER);
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let (status, body) = post_kept(sidecar.port, &other, &token, r#"{"n": 2}"#).await;
        statuses.push((status, body));
    }
    assert_eq!(statuses[0].0, 202, "{statuses:?}");
    assert_eq!(statuses[1].0, 422, "{statuses:?}");
    let total_reason = format!(
        "UnableToBroadcast: PersistQuotaExceeded: this database keeps at most {total} persisted \
         messages and 1000000000 bytes (MAX_PERSISTED_MESSAGES, MAX_PERSISTED_BYTES) until some expire"
    );
    assert!(statuses[1].1.contains(&total_reason), "{statuses:?}");

    let kept_by: Vec<(String, i64)> = db
        .query(
            "SELECT sender, count(*) FROM realtime.persisted_messages WHERE topic LIKE $1 || '%'
             GROUP BY sender ORDER BY sender",
            &[&prefix],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        kept_by,
        vec![
            (format!("user {MEMBER}"), 2),
            (format!("user {STRANGER}"), 1)
        ]
    );
    db.execute(
        "DELETE FROM realtime.persisted_messages WHERE topic LIKE $1 || '%'",
        &[&prefix],
    )
    .await
    .unwrap();
    db.execute("SELECT realtime.expire_persisted()", &[])
        .await
        .unwrap();
}

/// A mass expiry used to be one DELETE under a 5 s statement timeout: once enough rows
/// expired together it was cancelled every minute and never caught up. Expiry deletes in
/// chunks of 10,000 through realtime.expire_persisted, at most ten a round: 150,000 expired
/// rows lose 100,000 in the sidecar's first round and the rest in the next.
#[tokio::test]
async fn a_mass_expiry_of_persisted_messages_is_worked_off_in_bounded_chunks() {
    let _serial = SERIAL.lock().await;
    let db = db().await;
    db.batch_execute(
        "DELETE FROM realtime.persisted_messages;
         INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, expires_at)
         SELECT gen_random_uuid(), 'expiry:' || (g % 100), true, 'old', '{}',
                now() - interval '1 hour' + g * interval '1 millisecond'
         FROM generate_series(1, 150000) g;",
    )
    .await
    .unwrap();
    let sidecar = Sidecar::start("t_history_expiry", &[]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while sidecar.metric("realtime_persisted_expired_total").await < 100_000.0 {
        assert!(Instant::now() < deadline, "the first round did not finish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let left: i64 = db
        .query_one("SELECT count(*) FROM realtime.persisted_messages", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 50_000, "ten chunks of 10,000 in one round, no more");
    assert_eq!(
        sidecar.metric("realtime_persisted_expired_total").await,
        100_000.0
    );
    assert!(!sidecar
        .log()
        .contains("deleting expired persisted messages"));
    db.execute("DELETE FROM realtime.persisted_messages", &[])
        .await
        .unwrap();
}

/// Rows the app inserted into realtime.messages are kept for Supabase's 72 hours: the
/// sidecar's expiry round deletes the older ones (realtime.expire_messages, as the table's
/// owner) and keeps the newer.
#[tokio::test]
async fn rows_inserted_into_realtime_messages_go_after_72_hours() {
    let _serial = SERIAL.lock().await;
    let db = db().await;
    db.batch_execute(
        "DELETE FROM realtime.messages WHERE topic LIKE 'inserted-expiry:%';
         INSERT INTO realtime.messages (topic, extension, inserted_at) VALUES
             ('inserted-expiry:old', 'broadcast', now() - interval '73 hours'),
             ('inserted-expiry:older', 'broadcast', now() - interval '90 hours'),
             ('inserted-expiry:kept', 'broadcast', now() - interval '71 hours');",
    )
    .await
    .unwrap();
    let sidecar = Sidecar::start("t_history_inserted_expiry", &[]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while sidecar.metric("realtime_inserted_expired_total").await < 2.0 {
        assert!(
            Instant::now() < deadline,
            "the first round did not delete them"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let left: Vec<String> = db
        .query(
            "SELECT topic FROM realtime.messages WHERE topic LIKE 'inserted-expiry:%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["inserted-expiry:kept"]);
    assert!(!sidecar.log().contains("deleting expired rows"));
    db.execute(
        "DELETE FROM realtime.messages WHERE topic LIKE 'inserted-expiry:%'",
        &[],
    )
    .await
    .unwrap();
}
