//! The bytes the sidecar holds on clients' behalf, each bounded per client address and for
//! the whole sidecar: client frames being read (MAX_READING_BYTES_PER_ADDRESS,
//! MAX_READING_BYTES) and pushes waiting for the database, for the relay or for a private
//! channel's verdict (MAX_RELAY_BYTES_PER_ADDRESS, MAX_RELAY_BYTES). Each bound is passed by a client that a real one would be; small
//! messages, and what fits, go on.

mod common;

use common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;

const FREE: usize = 64 * 1024;
const READING_FROM_ADDRESS: &str = "ReadingBytesLimitReached: frames being read from this address would pass MAX_READING_BYTES_PER_ADDRESS";
const READING: &str =
    "ReadingBytesLimitReached: frames being read would pass MAX_READING_BYTES; retry later";

/// The header of a client text frame announcing `len` payload bytes, masked with a zero key
/// (so that the payload's bytes are what is written).
fn header(len: usize) -> Vec<u8> {
    let mut h = vec![0x81, 0x80 | 127];
    h.extend((len as u64).to_be_bytes());
    h.extend([0, 0, 0, 0]);
    h
}

/// The close frame the sidecar sends `c`: its code and reason.
async fn closed(c: &mut Client) -> (u16, String) {
    loop {
        match c.next(10).await {
            Some(Message::Close(Some(f))) => return (u16::from(f.code), f.reason.to_string()),
            Some(Message::Close(None)) => panic!("a close frame without a reason"),
            Some(_) => continue,
            None => panic!("expected a close frame"),
        }
    }
}

/// Waits (at most 10 s) until the sidecar's gauge `name` reads `expected`.
async fn gauge_reaches(sidecar: &Sidecar, name: &str, expected: f64) {
    gauge_until(sidecar, name, |v| v == expected, &format!("{expected}")).await;
}

/// Waits (at most 10 s) until the sidecar's gauge `name` passes `ok` (`wanted` says how).
async fn gauge_until(sidecar: &Sidecar, name: &str, ok: impl Fn(f64) -> bool, wanted: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let value = sidecar.metric(name).await;
        if ok(value) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} stayed at {value}, expected {wanted}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn heartbeat_ok(c: &mut Client) {
    let r = c.push(None, "phoenix", "heartbeat", json!({})).await;
    assert_eq!(c.reply(&r).await["status"], "ok");
}

#[tokio::test]
async fn a_frame_past_the_reading_bounds_closes_its_connection_and_small_messages_go_on() {
    let sidecar = Sidecar::start(
        "t_reading",
        &[
            ("MAX_FRAME_SIZE", "300000"),
            ("MAX_READING_BYTES_PER_ADDRESS", "400000"),
            ("MAX_READING_BYTES", "400000"),
        ],
    )
    .await;
    let port = sidecar.port;
    // A connection announces a 300,000-byte message and sends the start of it: from its
    // header on, it holds what passes the first 64 KiB.
    let mut slow = Client::connect_from("127.0.0.61", port, "1.0.0")
        .await
        .unwrap();
    let held = (300_000 - FREE) as f64;
    let stream = slow.ws.get_mut();
    stream.write_all(&header(300_000)).await.unwrap();
    stream.write_all(&[b'x'; 1000]).await.unwrap();
    gauge_reaches(&sidecar, "realtime_reading_bytes_held", held).await;

    // The same address's next large frame would pass its address's bound.
    let mut same = Client::connect_from("127.0.0.61", port, "1.0.0")
        .await
        .unwrap();
    same.ws.get_mut().write_all(&header(300_000)).await.unwrap();
    assert_eq!(closed(&mut same).await, (1013, READING_FROM_ADDRESS.into()));
    // Another address's, the sidecar's.
    let mut other = Client::connect_from("127.0.0.62", port, "1.0.0")
        .await
        .unwrap();
    other
        .ws
        .get_mut()
        .write_all(&header(300_000))
        .await
        .unwrap();
    assert_eq!(closed(&mut other).await, (1013, READING.into()));
    // A REST body of that address is refused as well, before it is kept.
    let (status, answer) = post_batch("127.0.0.61", port, "t", 260_000).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains(READING_FROM_ADDRESS), "{answer}");
    // Messages within the first 64 KiB ask nothing of the bounds.
    let mut small = Client::connect_from("127.0.0.61", port, "1.0.0")
        .await
        .unwrap();
    small
        .ws
        .send(Message::text("x".repeat(FREE - 1000)))
        .await
        .unwrap();
    heartbeat_ok(&mut small).await;
    assert_eq!(sidecar.metric("realtime_reading_refusals_total").await, 3.0);

    // The slow message ends (it is no Phoenix frame: dropped, the socket kept), and what it
    // held is given back once it is read: then a whole large message of that address fits.
    let stream = slow.ws.get_mut();
    stream.write_all(&vec![b'x'; 299_000]).await.unwrap();
    heartbeat_ok(&mut slow).await;
    gauge_reaches(&sidecar, "realtime_reading_bytes_held", 0.0).await;
    let mut whole = Client::connect_from("127.0.0.61", port, "1.0.0")
        .await
        .unwrap();
    whole
        .ws
        .send(Message::text("x".repeat(299_000)))
        .await
        .unwrap();
    heartbeat_ok(&mut whole).await;
    gauge_reaches(&sidecar, "realtime_reading_bytes_held", 0.0).await;
}

/// A message of about `bytes` bytes for the REST batch route, to `topic`.
fn batch(topic: &str, bytes: usize) -> String {
    format!(
        r#"{{"messages": [{{"topic": "{topic}", "event": "e", "payload": {{"x": "{}"}}}}]}}"#,
        "x".repeat(bytes)
    )
}

/// `batch` posted to the REST route from `from`: the answer's status and body.
async fn post_batch(from: &str, port: u16, topic: &str, bytes: usize) -> (u16, String) {
    let anon = anon_key();
    let headers = [
        ("apikey", anon.as_str()),
        ("content-type", "application/json"),
    ];
    http_from(
        from,
        port,
        "POST",
        "/api/broadcast",
        &headers,
        &batch(topic, bytes),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn broadcasts_past_the_relay_bounds_are_refused_and_what_fits_is_relayed() {
    let db = db().await;
    load_private_policies(&db).await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let kept_topic = format!("relay-bytes:{nanos}");
    let member = "0b0e0000-0000-4000-8000-000000000071";
    db.execute(
        "INSERT INTO private_members VALUES ($1::text::uuid, $2, true)",
        &[&member, &kept_topic],
    )
    .await
    .unwrap();
    let sidecar = Sidecar::start(
        "t_relay_bytes",
        &[
            ("MAX_FRAME_SIZE", "300000"),
            ("MAX_RELAY_BYTES_PER_ADDRESS", "300000"),
            ("MAX_RELAY_BYTES", "300000"),
        ],
    )
    .await;
    let port = sidecar.port;
    // The relay is held: a kept message's statement waits for the persist totals' row, which
    // this transaction locks.
    let mut locker = common::db().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE realtime.persisted_totals IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let body = format!(r#"{{"x": "{}"}}"#, "x".repeat(200_000));
    let token = user_token(member);
    let path = format!("/api/broadcast/{kept_topic}/events/kept?private=true&persist=true");
    let kept = tokio::spawn(async move {
        let auth = format!("Bearer {token}");
        http_from(
            "127.0.0.71",
            port,
            "POST",
            &path,
            &[
                ("authorization", &auth),
                ("apikey", &anon_key()),
                ("content-type", "application/json"),
            ],
            &body,
        )
        .await
        .unwrap()
    });
    // The kept message reached the relay, and waits there.
    gauge_until(
        &sidecar,
        "realtime_relay_bytes_held",
        |v| v >= 200_000.0,
        "at least 200000",
    )
    .await;

    // That address's next broadcast would pass its bound: over REST, and from its socket.
    let public = format!("relay-bytes-public:{nanos}");
    let (status, answer) = post_batch("127.0.0.71", port, &public, 150_000).await;
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer.contains("UnableToBroadcast: this client address's broadcasts waiting for the database would pass MAX_RELAY_BYTES_PER_ADDRESS; retry"),
        "{answer}"
    );
    let mut socket = Client::connect_from("127.0.0.71", port, "1.0.0")
        .await
        .unwrap();
    let joined = socket
        .join(
            &format!("realtime:{public}"),
            json!({"broadcast": {"ack": true}, "private": false}),
        )
        .await;
    assert_eq!(joined["status"], "ok", "{joined}");
    let r = socket
        .push(
            None,
            &format!("realtime:{public}"),
            "broadcast",
            json!({"type": "broadcast", "event": "e", "payload": {"x": "x".repeat(150_000)}}),
        )
        .await;
    let reply = socket.reply(&r).await;
    assert_eq!(
        reply["response"]["reason"],
        "UnableToBroadcast: this client address's broadcasts waiting for the database would pass MAX_RELAY_BYTES_PER_ADDRESS; retry",
        "{reply}"
    );
    // Another address's, the sidecar's bound.
    let (status, answer) = post_batch("127.0.0.72", port, &public, 150_000).await;
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer.contains("UnableToBroadcast: the broadcasts waiting for the database would pass MAX_RELAY_BYTES; retry"),
        "{answer}"
    );
    assert_eq!(
        sidecar.metric("realtime_relay_bytes_refusals_total").await,
        3.0
    );

    // The relay goes on: the kept message is relayed, its bytes given back, and both
    // addresses' large broadcasts fit again.
    lock.commit().await.unwrap();
    let (status, answer) = kept.await.unwrap();
    assert_eq!(status, 202, "{answer}");
    gauge_reaches(&sidecar, "realtime_relay_bytes_held", 0.0).await;
    for from in ["127.0.0.71", "127.0.0.72"] {
        let (status, answer) = post_batch(from, port, &public, 150_000).await;
        assert_eq!(status, 202, "{from}: {answer}");
    }
}

/// A private channel whose write verdicts wait for advisory lock `lock` (its policy).
struct Held<'a> {
    sidecar: &'a Sidecar,
    holder: &'a tokio_postgres::Client,
    lock: i64,
    topic: &'a str,
}

impl Held<'_> {
    /// With the lock held, `c` pushes three 120 kB `bodies` as `event`: the first asks the
    /// verdict and waits, the second waits behind it, and the third, past the address's bound
    /// of 300,000 bytes, is refused at once with `reason`. Once the lock is let go the first
    /// two are answered ok, and their bytes are given back.
    async fn third_refused(&self, c: &mut Client, event: &str, bodies: [Value; 3], reason: &str) {
        let lock = self.lock;
        self.holder
            .execute("SELECT pg_advisory_lock($1)", &[&lock])
            .await
            .unwrap();
        let mut refs = Vec::new();
        for body in bodies {
            refs.push(c.push(Some("1"), self.topic, event, body).await);
        }
        let refused = c.reply(&refs[2]).await;
        assert_eq!(refused["response"]["reason"], reason, "{refused}");
        gauge_until(
            self.sidecar,
            "realtime_relay_bytes_held",
            |v| v >= 240_000.0,
            "the two held pushes' bytes",
        )
        .await;
        self.holder
            .execute("SELECT pg_advisory_unlock($1)", &[&lock])
            .await
            .unwrap();
        for r in &refs[..2] {
            let reply = c.reply(r).await;
            assert_eq!(reply["status"], "ok", "{event} {r}: {reply}");
        }
        gauge_reaches(self.sidecar, "realtime_relay_bytes_held", 0.0).await;
    }
}

/// Pushes held while a private channel's verdict is asked (`held`) wait for the database as
/// broadcasts queued for the relay do, but held their bytes nowhere: while a slow verdict was
/// asked, one client could hold frames of megabytes at its events-per-second rate. Now each
/// holds its bytes against MAX_RELAY_BYTES_PER_ADDRESS until the verdict is back. Here the
/// member's write verdicts wait on a lock the test holds.
#[tokio::test]
async fn pushes_held_for_a_slow_verdict_held_their_bytes_nowhere() {
    const LOCK: i64 = 4245;
    let db = db().await;
    load_private_policies(&db).await;
    let room = format!("held-bytes:{}", now());
    let member = "0b0e0000-0000-4000-8000-000000000073";
    db.batch_execute(&format!(
        "INSERT INTO private_members VALUES ('{member}', '{room}', false);
         CREATE OR REPLACE FUNCTION public.t_held_bytes_wait() RETURNS boolean LANGUAGE plpgsql
             AS $$ BEGIN PERFORM pg_advisory_lock_shared({LOCK});
                   PERFORM pg_advisory_unlock_shared({LOCK}); RETURN true; END $$;
         GRANT EXECUTE ON FUNCTION public.t_held_bytes_wait() TO authenticated;
         DROP POLICY IF EXISTS t_held_bytes ON realtime.messages;
         CREATE POLICY t_held_bytes ON realtime.messages FOR INSERT TO authenticated
             WITH CHECK ((SELECT realtime.topic()) LIKE 'held-bytes:%' AND public.t_held_bytes_wait());"
    ))
    .await
    .unwrap();
    let sidecar = Sidecar::start(
        "t_held_bytes",
        &[
            ("MAX_FRAME_SIZE", "300000"),
            ("MAX_RELAY_BYTES_PER_ADDRESS", "300000"),
            ("MAX_RELAY_BYTES", "300000"),
            ("MAX_PRESENCE_META_BYTES", "200000"),
        ],
    )
    .await;
    let holder = common::db().await;
    let mut c = Client::connect_from("127.0.0.73", sidecar.port, "1.0.0")
        .await
        .unwrap();
    let topic = format!("realtime:{room}");
    let config = json!({"private": true, "broadcast": {"ack": true},
                        "presence": {"key": "m", "enabled": true}});
    let r = c
        .push(
            Some("1"),
            &topic,
            "phx_join",
            json!({"config": config, "access_token": user_token(member)}),
        )
        .await;
    let joined = c.reply(&r).await;
    assert_eq!(joined["status"], "ok", "{joined}");

    // Broadcasts: the first asks the write verdict, which waits; the second waits behind it;
    // the third would pass the address's bound and is refused at once.
    let large = |event: &str| json!({"type": "broadcast", "event": event, "payload": {"x": "x".repeat(120_000)}});
    let held = Held {
        sidecar: &sidecar,
        holder: &holder,
        lock: LOCK,
        topic: &topic,
    };
    held.third_refused(
        &mut c,
        "broadcast",
        [large("a"), large("b"), large("c")],
        "UnableToBroadcast: this client address's broadcasts waiting for the database would pass MAX_RELAY_BYTES_PER_ADDRESS; retry",
    )
    .await;
    // Presence: the same, with the presence write verdict asked at the first track.
    let track = |n: u32| json!({"type": "presence", "event": "track", "payload": {"n": n, "x": "x".repeat(120_000)}});
    held.third_refused(
        &mut c,
        "presence",
        [track(1), track(2), track(3)],
        "UnableToTrackPresence: this client address's presence pushes waiting for the database would pass MAX_RELAY_BYTES_PER_ADDRESS; retry",
    )
    .await;
    db.batch_execute("DROP POLICY t_held_bytes ON realtime.messages;")
        .await
        .unwrap();
}

/// Sends a 400 kB broadcast `i` to `topic` from the database and waits until `reader` has it.
async fn send_large(db: &tokio_postgres::Client, topic: &str, i: i64, reader: &mut Client) {
    db.execute(
        "SELECT realtime.send(jsonb_build_object('i', $1::int8, 'pad', repeat('x', 400000)), 'big', $2, false)",
        &[&i, &topic],
    )
    .await
    .unwrap();
    loop {
        let m = reader
            .next_json(20)
            .await
            .expect("the reading client keeps receiving");
        if m["event"] == "broadcast" {
            assert_eq!(m["payload"]["payload"]["i"], i);
            return;
        }
    }
}

const TOO_SLOW_FOR_SIDECAR: &str =
    "too slow: large frames queued for every client would pass MAX_SIDECAR_OUTBOUND_BYTES";
const TOO_SLOW_FOR_ADDRESS: &str =
    "too slow: large frames queued for this address would pass MAX_OUTBOUND_BYTES_PER_ADDRESS";

#[tokio::test]
async fn a_large_frame_queued_for_many_slow_subscribers_counts_once_against_the_sidecar() {
    let sidecar = Sidecar::start(
        "t_outbound_shared",
        &[
            ("MAX_SIDECAR_OUTBOUND_BYTES", "3000000"),
            ("MAX_OUTBOUND_BYTES_PER_ADDRESS", "3000000"),
        ],
    )
    .await;
    let db = db().await;
    let topic = "outbound-shared";
    // Four clients of four addresses stop reading; each frame of theirs is the same one.
    let mut slow = Vec::new();
    for i in 81..=84 {
        let from = format!("127.0.0.{i}");
        let mut c = Client::connect_from_small_buffer(&from, sidecar.port, "1.0.0").await;
        c.join_public(&format!("realtime:{topic}")).await;
        slow.push(c);
    }
    let mut fast = Client::connect(sidecar.port, "1.0.0").await;
    fast.join_public(&format!("realtime:{topic}")).await;
    // 400 kB messages until the slow queues hold 1.2 MB of them (the sockets' buffers take
    // the first few): the same frames, counted once. Four queues counted apart would hold
    // about four times as much, past the bound; none is cut off.
    let mut i = 0;
    loop {
        send_large(&db, topic, i, &mut fast).await;
        i += 1;
        if sidecar.metric("realtime_outbound_bytes_held").await >= 1_200_000.0 {
            break;
        }
        assert!(i < 40, "the slow clients' queues never held 1.2 MB");
    }
    assert_eq!(sidecar.metric("realtime_slow_disconnects_total").await, 0.0);
    // New frames pass the sidecar's bound: every slow client is cut off, naming it; the
    // reading one receives every message.
    while sidecar.metric("realtime_slow_disconnects_total").await < 4.0 {
        send_large(&db, topic, i, &mut fast).await;
        i += 1;
        assert!(i < 60, "the slow clients were not cut off");
    }
    let closes = futures_util::future::join_all(slow.iter_mut().map(closed)).await;
    for close in closes {
        assert_eq!(close, (1008, TOO_SLOW_FOR_SIDECAR.into()));
    }
    gauge_reaches(&sidecar, "realtime_outbound_bytes_held", 0.0).await;
}

#[tokio::test]
async fn large_frames_queued_for_one_address_past_its_bound_cut_it_off() {
    let sidecar = Sidecar::start(
        "t_outbound_address",
        &[("MAX_OUTBOUND_BYTES_PER_ADDRESS", "1048576")],
    )
    .await;
    let db = db().await;
    let topic = "outbound-address";
    let mut slow = Client::connect_from_small_buffer("127.0.0.85", sidecar.port, "1.0.0").await;
    slow.join_public(&format!("realtime:{topic}")).await;
    let mut fast = Client::connect(sidecar.port, "1.0.0").await;
    fast.join_public(&format!("realtime:{topic}")).await;
    let mut i = 0;
    while sidecar.metric("realtime_slow_disconnects_total").await < 1.0 {
        send_large(&db, topic, i, &mut fast).await;
        i += 1;
        assert!(i < 40, "the slow client was not cut off");
    }
    assert_eq!(closed(&mut slow).await, (1008, TOO_SLOW_FOR_ADDRESS.into()));
}
