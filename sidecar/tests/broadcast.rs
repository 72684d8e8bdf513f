//! Broadcast end to end: messages sent in the database (`realtime.send`, `broadcast_changes`) in
//! both serializers, binary payloads, client broadcasts through the database with `self`
//! and `ack`, refusals reported, and what is never a broadcast.

mod common;

use common::*;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn db_broadcast_reaches_v1_client_with_supabase_envelope() {
    let sidecar = Sidecar::start("t_envelope_v1", &[]).await;
    let db = db().await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:room:v1").await;
    send(&db, json!({"text": "hi"}), "message", "room:v1").await;
    let m = c.next_json(5).await.expect("broadcast");
    let id = m["payload"]["meta"]["id"]
        .as_str()
        .expect("meta.id")
        .to_owned();
    // The position: the queue's epoch (as realtime.stats() gives it, in unix microseconds)
    // and the message's sequence.
    let (epoch, seq): (i64, i64) = queue_position(&db).await;
    let got_seq = m["payload"]["meta"]["seq"].as_i64().expect("meta.seq");
    assert!(got_seq > 0 && got_seq <= seq, "{m}");
    assert_eq!(
        m,
        json!({"topic": "realtime:room:v1", "event": "broadcast", "ref": null,
               "payload": {"event": "message", "type": "broadcast",
                           "meta": {"id": id, "epoch": epoch.to_string(), "seq": got_seq},
                           "payload": {"id": id, "text": "hi"}}})
    );
}

#[tokio::test]
async fn db_broadcast_reaches_v2_client_as_binary_kind_4() {
    let sidecar = Sidecar::start("t_envelope_v2", &[]).await;
    let db = db().await;
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    c.join_public("realtime:room:v2").await;
    send(&db, json!({"n": 1}), "INSERT", "room:v2").await;
    let Some(Message::Binary(b)) = c.next(5).await else {
        panic!("expected a binary frame")
    };
    let (topic, event, meta, encoding, payload) = decode_kind4(&b);
    let meta: Value = serde_json::from_str(&meta).unwrap();
    let payload: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(
        (topic.as_str(), event.as_str(), encoding),
        ("realtime:room:v2", "INSERT", 1)
    );
    assert_eq!(payload, json!({"id": meta["id"], "n": 1}));
}

#[tokio::test]
async fn trigger_broadcast_changes_payload_arrives() {
    let sidecar = Sidecar::start("t_trigger", &[]).await;
    let db = db().await;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS sidecar_notes (id int PRIMARY KEY, body text);
         DROP TRIGGER IF EXISTS sidecar_notes_bc ON sidecar_notes;
         CREATE TRIGGER sidecar_notes_bc AFTER INSERT ON sidecar_notes
           FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('notes:{id}', 'INSERT', 'false');",
    )
    .await
    .unwrap();
    let id: i32 = db
        .query_one("SELECT coalesce(max(id), 0) + 1 FROM sidecar_notes", &[])
        .await
        .unwrap()
        .get(0);
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public(&format!("realtime:notes:{id}")).await;
    db.execute("INSERT INTO sidecar_notes VALUES ($1, 'hello')", &[&id])
        .await
        .unwrap();
    let m = c.next_json(5).await.expect("broadcast");
    let p = &m["payload"]["payload"];
    assert_eq!(m["payload"]["event"], "INSERT");
    assert_eq!(p["record"], json!({"id": id, "body": "hello"}));
    assert_eq!(
        (
            p["operation"].as_str(),
            p["table"].as_str(),
            p["schema"].as_str()
        ),
        (Some("INSERT"), Some("sidecar_notes"), Some("public"))
    );
    assert_eq!(p["old_record"], Value::Null);
}

#[tokio::test]
async fn binary_payloads_reach_v2_only_and_private_stays_apart() {
    let sidecar = Sidecar::start("t_binary", &[]).await;
    let db = db().await;
    let mut v1 = Client::connect(sidecar.port, "1.0.0").await;
    let mut v2 = Client::connect(sidecar.port, "2.0.0").await;
    v1.join_public("realtime:bin").await;
    v2.join_public("realtime:bin").await;
    db.execute(
        "SELECT realtime.send_binary('\\x00ff'::bytea, 'raw', 'bin', false)",
        &[],
    )
    .await
    .unwrap();
    // A private message to the same topic must not reach public channels.
    db.execute(
        "SELECT realtime.send('{\"secret\": 1}', 'ev', 'bin', true)",
        &[],
    )
    .await
    .unwrap();
    send(&db, json!({"after": true}), "marker", "bin").await;
    let Some(Message::Binary(b)) = v2.next(5).await else {
        panic!("binary frame")
    };
    let (_, event, _, encoding, payload) = decode_kind4(&b);
    assert_eq!(
        (event.as_str(), encoding, payload),
        ("raw", 0, vec![0x00, 0xff])
    );
    let Some(Message::Binary(b)) = v2.next(5).await else {
        panic!("marker frame")
    };
    assert_eq!(decode_kind4(&b).1, "marker");
    // The 1.0.0 client gets only the marker: no binary payload, no private message.
    let m = v1.next_json(5).await.unwrap();
    assert_eq!(m["payload"]["event"], "marker");
}

/// A kind-3 binary push, as realtime-js 2.0.0 sends a broadcast.
fn binary_push(
    join_ref: &str,
    reference: &str,
    topic: &str,
    event: &str,
    payload: &[u8],
) -> Message {
    let mut f = vec![
        3u8,
        join_ref.len() as u8,
        reference.len() as u8,
        topic.len() as u8,
        event.len() as u8,
        0,
        1,
    ];
    for part in [
        join_ref.as_bytes(),
        reference.as_bytes(),
        topic.as_bytes(),
        event.as_bytes(),
        payload,
    ] {
        f.extend_from_slice(part);
    }
    Message::binary(f)
}

#[tokio::test]
async fn client_broadcasts_go_through_the_database_with_self_and_ack() {
    let one = Sidecar::start("t_client_bc_1", &[]).await;
    let two = Sidecar::start("t_client_bc_2", &[]).await;
    let mut a = Client::connect(one.port, "1.0.0").await;
    let mut b = Client::connect(one.port, "2.0.0").await;
    let mut c = Client::connect(two.port, "1.0.0").await;
    let ok = |r: Value| assert_eq!(r["status"], "ok", "{r}");
    ok(a.join(
        "realtime:chat",
        json!({"broadcast": {"self": false, "ack": true}}),
    )
    .await);
    ok(b.join(
        "realtime:chat",
        json!({"broadcast": {"self": true, "ack": false}}),
    )
    .await);
    ok(c.join("realtime:chat", json!({})).await);

    // A (self false, ack true): acknowledged, not echoed; B and C (on the other sidecar) get it.
    let r = a.broadcast("realtime:chat", "msg", json!({"t": 1})).await;
    assert_eq!(a.reply(&r).await, json!({"status": "ok", "response": {}}));
    let Some(Message::Binary(frame)) = b.next(5).await else {
        panic!("B gets a binary frame")
    };
    let (topic, event, meta, encoding, payload) = decode_kind4(&frame);
    assert_eq!(
        (topic.as_str(), event.as_str(), encoding),
        ("realtime:chat", "msg", 1)
    );
    // A client broadcast carries its position but no id, as in Supabase.
    let meta: Value = serde_json::from_str(&meta).unwrap();
    assert!(meta.get("id").is_none() && meta["seq"].is_i64(), "{meta}");
    assert_eq!(
        serde_json::from_slice::<Value>(&payload).unwrap(),
        json!({"t": 1})
    );
    let m = c.next_json(5).await.unwrap();
    assert_eq!(
        m["payload"],
        json!({"event": "msg", "payload": {"t": 1}, "type": "broadcast",
               "meta": {"epoch": meta["epoch"], "seq": meta["seq"]}})
    );

    // B (self true) pushes a binary kind-3 frame: everyone, B included, gets it.
    b.send_raw(binary_push("1", "7", "realtime:chat", "bin", b"{\"x\":2}"))
        .await;
    let Some(Message::Binary(frame)) = b.next(5).await else {
        panic!("B gets its own broadcast")
    };
    assert_eq!(decode_kind4(&frame).1, "bin");
    for client in [&mut a, &mut c] {
        let m = client.next_json(5).await.unwrap();
        assert_eq!(
            without_meta(&m["payload"]),
            json!({"event": "bin", "payload": {"x": 2}, "type": "broadcast"})
        );
    }

    // Many from A arrive at C, on the other sidecar, in order.
    for i in 0..20 {
        a.broadcast("realtime:chat", "n", json!({"i": i})).await;
    }
    let mut seen = Vec::new();
    while seen.len() < 20 {
        let m = c.next_json(5).await.expect("20 broadcasts");
        if m["event"] == "broadcast" {
            seen.push(m["payload"]["payload"]["i"].as_i64().unwrap());
        }
    }
    assert_eq!(seen, (0..20).collect::<Vec<i64>>());
    // Counted once the relay committed, which may be just after delivery elsewhere.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while one.metric("realtime_client_broadcasts_total").await < 21.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "relayed broadcasts were not counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // A broadcast without an event name is refused with a reason.
    let r = a
        .push(
            Some("1"),
            "realtime:chat",
            "broadcast",
            json!({"type": "broadcast"}),
        )
        .await;
    assert_eq!(
        a.reply(&r).await["response"]["reason"],
        "UnableToBroadcast: a broadcast needs an event name"
    );
}

/// Fixed bug: a client broadcast the database refused was dropped silently unless the
/// channel had `ack: true`; realtime-js ignores replies to pushes without ack, so it is now
/// reported as a system message on the channel, and counted.
#[tokio::test]
async fn a_refused_broadcast_without_ack_is_reported_on_the_channel() {
    let sidecar = Sidecar::start("t_refused_noack", &[]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:too-big").await;
    // Over realtime.max_message_size (3000 kB), under the frame limit (5 MB).
    c.broadcast(
        "realtime:too-big",
        "big",
        json!({"blob": "x".repeat(3_200_000)}),
    )
    .await;
    let m = loop {
        let m = c.next_json(10).await.expect("a report");
        if m["event"] == "system" {
            break m;
        }
    };
    assert_eq!(m["payload"]["status"], "error");
    let msg = m["payload"]["message"].as_str().unwrap();
    assert!(msg.starts_with("UnableToBroadcast: "), "{msg}");
    assert_eq!(
        sidecar
            .metric("realtime_client_broadcast_failures_total")
            .await,
        1.0
    );
}

/// SDK clients send broadcast pushes with a missing or stale join_ref; they are accepted, as
/// Supabase's patched Phoenix accepts them.
#[tokio::test]
async fn broadcasts_with_a_missing_or_stale_join_ref_are_accepted() {
    let sidecar = Sidecar::start("t_stale_join_ref", &[]).await;
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    let reply = c
        .join(
            "realtime:refs",
            json!({"broadcast": {"ack": true, "self": true}, "private": false}),
        )
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    for join_ref in [None, Some("999")] {
        let body = json!({"type": "broadcast", "event": "e", "payload": {"ref": join_ref}});
        let r = c.push(join_ref, "realtime:refs", "broadcast", body).await;
        assert_eq!(c.reply(&r).await["status"], "ok", "join_ref {join_ref:?}");
    }
}

/// Presence diffs travel through the queue (sql/presence.sql) but are not broadcasts: a
/// channel of the same topic never receives one as a message.
#[tokio::test]
async fn a_presence_diff_is_never_delivered_as_a_broadcast() {
    let sidecar = Sidecar::start("t_presence_not_broadcast", &[]).await;
    let db = db().await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:room:presence").await;
    db.batch_execute(
        "SELECT realtime.presence_renew('t_presence_session');
         SELECT realtime.presence_track('t_presence_session', 'room:presence', false, 'ann', '{}');
         SELECT realtime.presence_end('t_presence_session');",
    )
    .await
    .unwrap();
    send(&db, json!({"after": "presence"}), "marker", "room:presence").await;
    let m = c.next_json(10).await.expect("the marker");
    assert_eq!(m["payload"]["event"], "marker", "{m}");
}
