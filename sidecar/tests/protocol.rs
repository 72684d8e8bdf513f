//! End-to-end protocol tests: a real sidecar, a real Postgres with pg_realtime, and real
//! WebSocket clients speaking Supabase Realtime's two serializers.

mod common;

use common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;

async fn send(db: &tokio_postgres::Client, payload: Value, event: &str, topic: &str) {
    db.execute(
        "SELECT realtime.send($1::text::jsonb, $2, $3, false)",
        &[&payload.to_string(), &event, &topic],
    )
    .await
    .unwrap();
}

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

/// A captured row change is drained like a message but is never a broadcast: it must not
/// reach a channel named after its table (Postgres Changes subscribers get it instead).
#[tokio::test]
async fn a_captured_change_is_never_delivered_as_a_broadcast() {
    let sidecar = Sidecar::start("t_change_not_broadcast", &[]).await;
    let db = db().await;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS change_leak (id int PRIMARY KEY, secret text);
         ALTER PUBLICATION supabase_realtime ADD TABLE change_leak;",
    )
    .await
    .unwrap();
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:change_leak").await;
    db.execute("INSERT INTO change_leak VALUES (1, 'row data')", &[])
        .await
        .unwrap();
    send(&db, json!({"after": true}), "marker", "change_leak").await;
    // Messages arrive in queue order: the marker is the first thing the channel gets.
    let m = c.next_json(5).await.expect("the marker");
    assert_eq!(m["payload"]["event"], "marker", "{m}");
    db.batch_execute("DROP TABLE change_leak").await.unwrap();
}

/// The drain decodes only the tables some channel listens to; a drain already waiting when a
/// channel joins was asked for none. The change committed right after the join's reply comes
/// back undecoded from that drain: it is drained again, decoded, and delivered.
#[tokio::test]
async fn a_change_right_after_subscribed_reaches_a_table_the_drain_in_flight_did_not_decode() {
    let sidecar = Sidecar::start("t_redrain", &[]).await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS redrain;
         CREATE TABLE redrain (id int PRIMARY KEY, note text);
         GRANT SELECT ON redrain TO anon;
         ALTER PUBLICATION supabase_realtime ADD TABLE redrain;",
    )
    .await
    .unwrap();
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    let binding = json!({"event": "INSERT", "schema": "public", "table": "redrain"});
    let config = json!({"private": false, "postgres_changes": [binding]});
    let reply = c.join("realtime:redrain", config).await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let id = reply["response"]["postgres_changes"][0]["id"].clone();
    let subscribed = c.next_json(5).await.expect("system");
    assert_eq!(
        subscribed["payload"]["message"], "Subscribed to PostgreSQL",
        "{subscribed}"
    );
    db.execute("INSERT INTO redrain VALUES (1, 'first')", &[])
        .await
        .unwrap();
    let m = c.next_json(5).await.expect("the change");
    assert_eq!(m["event"], "postgres_changes", "{m}");
    assert_eq!(m["payload"]["ids"], json!([id]));
    assert_eq!(
        m["payload"]["data"]["record"],
        json!({"id": 1, "note": "first"})
    );
    db.batch_execute("DROP TABLE redrain").await.unwrap();
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

#[tokio::test]
async fn heartbeat_is_answered() {
    let sidecar = Sidecar::start("t_heartbeat", &[]).await;
    for vsn in ["1.0.0", "2.0.0"] {
        let mut c = Client::connect(sidecar.port, vsn).await;
        let r = c.push(None, "phoenix", "heartbeat", json!({})).await;
        let reply = c.reply(&r).await;
        assert_eq!(reply, json!({"status": "ok", "response": {}}));
    }
}

#[tokio::test]
async fn invalid_tokens_are_refused_with_supabase_reasons() {
    let sidecar = Sidecar::start("t_jwt", &[]).await;
    let other = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({"role": "anon", "exp": now() + 60}),
        &jsonwebtoken::EncodingKey::from_secret(b"a-different-secret-of-enough-length"),
    )
    .unwrap();
    let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJyb2xlIjoiYW5vbiIsImV4cCI6OTk5OTk5OTk5OX0.";
    let cases = [
        (
            token(json!({"role": "anon", "exp": now() - 5})),
            "InvalidJWTToken: Token has expired",
        ),
        (
            token(json!({"exp": now() + 60})),
            "InvalidJWTToken: Fields `role` and `exp` are required in JWT",
        ),
        (other, "JwtSignatureError"),
        ("garbage".to_owned(), "MalformedJWT"),
        (none.to_owned(), "JwtSignerError"),
    ];
    for (apikey, reason) in &cases {
        // At connect: an HTTP 401 with the reason, as Supabase's connect errors.
        let path = format!("/realtime/v1/websocket?apikey={apikey}&vsn=1.0.0");
        let headers = [
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        ];
        let (status, body) = http(sidecar.port, "GET", &path, &headers, "")
            .await
            .unwrap();
        assert_eq!(status, 401, "{reason}");
        assert!(body.contains(reason), "{body} should contain {reason}");
        // At join, as access_token: an error reply with the reason.
        let mut c = Client::connect(sidecar.port, "1.0.0").await;
        let r = c
            .push(
                Some("1"),
                "realtime:jwt",
                "phx_join",
                json!({"config": {}, "access_token": apikey}),
            )
            .await;
        let reply = c.reply(&r).await;
        assert_eq!(reply["status"], "error");
        assert!(
            reply["response"]["reason"]
                .as_str()
                .unwrap()
                .starts_with(reason),
            "{reply}"
        );
    }
    let headers = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("Sec-WebSocket-Version", "13"),
    ];
    let (status, body) = http(
        sidecar.port,
        "GET",
        "/socket/websocket?vsn=1.0.0",
        &headers,
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 401);
    assert!(body.contains("MissingAPIKey"), "{body}");
}

#[tokio::test]
async fn token_that_expires_closes_the_channel() {
    let sidecar = Sidecar::start("t_expiry", &[]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let short = token(json!({"role": "anon", "exp": now() + 2}));
    let r = c
        .push(
            Some("1"),
            "realtime:exp",
            "phx_join",
            json!({"config": {}, "access_token": short}),
        )
        .await;
    assert_eq!(c.reply(&r).await["status"], "ok");
    let system = c.next_json(6).await.expect("system message on expiry");
    assert_eq!(system["event"], "system");
    assert_eq!(system["payload"]["status"], "error");
    assert!(
        system["payload"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Token has expired"),
        "{system}"
    );
    assert_eq!(c.next_json(2).await.unwrap()["event"], "phx_close");
}

#[tokio::test]
async fn malformed_frames_are_dropped_and_the_socket_kept() {
    let sidecar = Sidecar::start("t_malformed", &[]).await;
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    c.send_raw(Message::text("{not json")).await;
    c.send_raw(Message::text("{\"an\": \"object, not an array\"}"))
        .await;
    c.send_raw(Message::binary(vec![9u8, 1, 2])).await;
    let r = c.push(None, "phoenix", "heartbeat", json!({})).await;
    assert_eq!(c.reply(&r).await["status"], "ok");
    assert_eq!(sidecar.metric("realtime_malformed_frames_total").await, 3.0);
    // Events on a topic that was never joined, and unknown events, get error replies.
    let r = c
        .push(Some("9"), "realtime:nowhere", "broadcast", json!({}))
        .await;
    assert_eq!(c.reply(&r).await["response"]["reason"], "unmatched topic");
    c.join_public("realtime:known").await;
    let r = c
        .push(Some("1"), "realtime:known", "dance", json!({}))
        .await;
    assert!(c.reply(&r).await["response"]["reason"]
        .as_str()
        .unwrap()
        .starts_with("UnknownEvent"));
}

#[tokio::test]
async fn oversize_frame_closes_only_that_connection() {
    let sidecar = Sidecar::start("t_oversize", &[("MAX_FRAME_SIZE", "10000")]).await;
    let mut big = Client::connect(sidecar.port, "1.0.0").await;
    let mut other = Client::connect(sidecar.port, "1.0.0").await;
    let _ = big.ws.send(Message::text("x".repeat(20_000))).await;
    let closed = loop {
        match big.next(5).await {
            Some(Message::Close(f)) => break f,
            Some(_) => continue,
            None => panic!("expected a close frame"),
        }
    };
    assert_eq!(u16::from(closed.expect("close frame").code), 1009);
    let r = other.push(None, "phoenix", "heartbeat", json!({})).await;
    assert_eq!(other.reply(&r).await["status"], "ok");
}

#[tokio::test]
async fn too_many_channels_and_bad_topics_are_refused() {
    let sidecar = Sidecar::start("t_channels", &[("MAX_CHANNELS_PER_CLIENT", "3")]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    for i in 0..3 {
        c.join_public(&format!("realtime:c{i}")).await;
    }
    let reply = c.join("realtime:c3", json!({})).await;
    assert_eq!(
        reply,
        json!({"status": "error", "response": {"reason": "ChannelRateLimitReached: Too many channels"}})
    );
    let reply = c.join("notrealtime", json!({})).await;
    assert_eq!(
        reply["response"]["reason"],
        "TopicNameRequired: You must provide a topic name"
    );
    // A private channel that no policy opens (the anon key here) is refused.
    let mut other = Client::connect(sidecar.port, "1.0.0").await;
    let reply = other.join("realtime:p", json!({"private": true})).await;
    assert!(reply["response"]["reason"].as_str().unwrap().starts_with(
        "Unauthorized: You do not have permissions to read from this Channel topic: p"
    ));
    // Leaving frees a slot.
    let r = c
        .push(Some("1"), "realtime:c0", "phx_leave", json!({}))
        .await;
    assert_eq!(c.reply(&r).await["status"], "ok");
    assert_eq!(c.next_json(2).await.unwrap()["event"], "phx_close");
    c.join_public("realtime:c3").await;
}

#[tokio::test]
async fn slow_client_is_cut_off_while_others_keep_receiving() {
    // Bursts (drain batches) stay well under the queue bound, so only a client that stops
    // reading can fill it.
    let sidecar = Sidecar::start(
        "t_slow",
        &[("MAX_OUTBOUND_FRAMES", "1000"), ("DRAIN_BATCH", "100")],
    )
    .await;
    let db = db().await;
    let mut slow = Client::connect_small_buffer(sidecar.port, "1.0.0").await;
    let mut fast = Client::connect(sidecar.port, "1.0.0").await;
    slow.join_public("realtime:flood").await;
    fast.join_public("realtime:flood").await;
    // 30 rounds of 100 messages of 8 kB (about 24 MB in all: far more than the slow client's
    // socket buffers and queue hold). The fast client reads each round before the next is
    // sent, so its backlog never nears the bound, however busy the machine is.
    let (rounds, per_round): (i64, i64) = (30, 100);
    for _ in 0..rounds {
        db.execute(
            "SELECT count(realtime.send(jsonb_build_object('i', i, 'pad', repeat('x', 8000)), 'flood', 'flood', false))
             FROM generate_series(1, $1::int8) i",
            &[&per_round],
        )
        .await
        .unwrap();
        let mut got = 0;
        while got < per_round {
            let m = fast
                .next_json(20)
                .await
                .expect("the fast client keeps receiving");
            if m["event"] == "broadcast" {
                got += 1;
            }
        }
    }
    assert_eq!(sidecar.metric("realtime_slow_disconnects_total").await, 1.0);
    // Reading at last, the slow client finds a close frame (policy violation) after what
    // was already in flight.
    let close = loop {
        match slow.next(10).await {
            Some(Message::Close(f)) => break f,
            Some(_) => continue,
            None => panic!("slow client was not closed"),
        }
    };
    assert_eq!(u16::from(close.unwrap().code), 1008);
}

#[tokio::test]
async fn metrics_and_health_are_served() {
    let sidecar = Sidecar::start("t_metrics", &[]).await;
    let (status, body) = http(sidecar.port, "GET", "/healthz", &[], "")
        .await
        .unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, body) = http(sidecar.port, "GET", "/metrics", &[], "")
        .await
        .unwrap();
    assert_eq!(status, 200);
    for name in [
        "realtime_connections ",
        "realtime_deliveries_total ",
        "realtime_db_up 1",
        "realtime_commit_to_dispatch_seconds",
    ] {
        assert!(body.contains(name), "metrics lack {name}");
    }
    let (status, _) = http(sidecar.port, "GET", "/nope", &[], "").await.unwrap();
    assert_eq!(status, 404);
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

#[tokio::test]
async fn rest_broadcast_is_relayed_and_answers_like_supabase() {
    let sidecar = Sidecar::start("t_rest", &[]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:rest").await;
    let key = anon_key();
    let auth = format!("Bearer {key}");
    let body = json!({"messages": [
        {"topic": "rest", "event": "one", "payload": {"n": 1}},
        {"topic": "rest", "event": "two", "payload": {"n": 2}, "private": false}
    ]})
    .to_string();
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let (status, _) = http(sidecar.port, "POST", "/api/broadcast", &headers, &body)
        .await
        .unwrap();
    assert_eq!(status, 202);
    for (event, n) in [("one", 1), ("two", 2)] {
        let m = c.next_json(5).await.unwrap();
        assert_eq!(
            without_meta(&m["payload"]),
            json!({"event": event, "payload": {"n": n}, "type": "broadcast"})
        );
    }
    // The apikey header works too; no token, or a bad one, is 401.
    let (status, _) = http(
        sidecar.port,
        "POST",
        "/api/broadcast",
        &[("apikey", key.as_str())],
        &body,
    )
    .await
    .unwrap();
    assert_eq!(status, 202);
    let (status, body401) = http(sidecar.port, "POST", "/api/broadcast", &[], &body)
        .await
        .unwrap();
    assert_eq!(
        (status, body401.as_str()),
        (401, r#"{"message":"Unauthorized"}"#)
    );
    let (status, _) = http(
        sidecar.port,
        "POST",
        "/api/broadcast",
        &[("Authorization", "Bearer nope")],
        &body,
    )
    .await
    .unwrap();
    assert_eq!(status, 401);
    // Invalid bodies are 422 with the field at fault; private messages are refused for now.
    for (bad, field) in [
        (json!({}), "messages"),
        (
            json!({"messages": [{"topic": "rest", "event": "e", "payload": "text"}]}),
            "payload",
        ),
        (
            json!({"messages": [{"event": "e", "payload": {}}]}),
            "topic",
        ),
    ] {
        let (status, body) = http(
            sidecar.port,
            "POST",
            "/api/broadcast",
            &headers,
            &bad.to_string(),
        )
        .await
        .unwrap();
        assert_eq!(status, 422, "{bad}");
        assert!(body.contains(field), "{body} names {field}");
    }
    // A private message needs the write policy; the anon key has none here: 403, nothing sent.
    let private =
        json!({"messages": [{"topic": "rest", "event": "e", "payload": {}, "private": true}]})
            .to_string();
    let (status, body) = http(sidecar.port, "POST", "/api/broadcast", &headers, &private)
        .await
        .unwrap();
    assert_eq!(status, 403);
    assert!(
        body.contains(
            "Unauthorized: You do not have permissions to write to this Channel topic: rest"
        ),
        "{body}"
    );
}

#[tokio::test]
async fn joins_and_messages_per_second_are_limited() {
    let sidecar = Sidecar::start(
        "t_rates",
        &[
            ("MAX_JOINS_PER_SECOND", "3"),
            ("MAX_EVENTS_PER_SECOND", "5"),
        ],
    )
    .await;
    // Too many joins in a second: an error reply, then the socket is closed.
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    for i in 0..3 {
        c.join_public(&format!("realtime:j{i}")).await;
    }
    let reply = c.join("realtime:j3", json!({})).await;
    assert_eq!(
        reply["response"]["reason"],
        "ClientJoinRateLimitReached: Too many joins per second"
    );
    let close = loop {
        match c.next(5).await {
            Some(Message::Close(f)) => break f,
            Some(_) => continue,
            None => panic!("expected a close frame"),
        }
    };
    assert_eq!(u16::from(close.unwrap().code), 1008);
    // Too many messages in a second on a channel: a system error and phx_close for it.
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:chatty").await;
    for _ in 0..6 {
        c.broadcast("realtime:chatty", "e", json!({})).await;
    }
    let system = loop {
        let m = c.next_json(5).await.expect("system message");
        if m["event"] == "system" {
            break m;
        }
    };
    assert_eq!(system["payload"]["message"], "Too many messages per second");
    assert_eq!(system["payload"]["status"], "error");
    loop {
        let m = c.next_json(5).await.expect("phx_close");
        if m["event"] == "phx_close" {
            break;
        }
    }
}

/// Fixed bug: sockets that sent half a request stayed open (50 of them were still open 45 s
/// later); a few thousand could use up the process's 20,000 files and shut everyone out.
#[tokio::test]
async fn slowloris_sockets_are_closed_and_do_not_stop_joins() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sidecar = Sidecar::start("t_slowloris", &[("HTTP_HEADER_TIMEOUT_SECS", "2")]).await;
    let mut slow = Vec::new();
    for _ in 0..1000 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", sidecar.port))
            .await
            .unwrap();
        s.write_all(b"GET /realtime/v1/websocket HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    c.join_public("realtime:despite-slowloris").await;
    for s in &mut slow {
        // Closed by the server (EOF or a reset after whatever it says), within the bound.
        let closed = async {
            let mut buf = [0u8; 256];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(15), closed)
            .await
            .expect("closed within the header timeout");
    }
    // Hyper shuts the socket before the server counts the timeout, so the count may trail
    // what the clients saw for a moment (a single read here once came out short).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let closed = sidecar.metric("realtime_slow_requests_closed_total").await;
        if closed >= 1000.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{closed} slow requests counted as closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// MAX_CONNECTIONS is answered as Supabase answers an over-limit connection, and counted.
#[tokio::test]
async fn connections_over_max_connections_are_refused() {
    let sidecar = Sidecar::start("t_max_conn", &[("MAX_CONNECTIONS", "2")]).await;
    let _a = Client::connect(sidecar.port, "1.0.0").await;
    let _b = Client::connect(sidecar.port, "1.0.0").await;
    let refused = connect_async(url(sidecar.port, "1.0.0", &anon_key())).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), 429);
            let body = String::from_utf8(r.body().clone().unwrap_or_default()).unwrap();
            assert!(
                body.contains("ConnectionRateLimitReached: Too many connected users"),
                "{body}"
            );
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        sidecar
            .metric("realtime_connections_over_limit_total")
            .await,
        1.0
    );
}

/// Fixed bug: a client broadcast the database refused was dropped silently unless the
/// channel had `ack: true`; realtime-js ignores replies to pushes without ack, so it is now
/// reported as a system message on the channel, and counted.
#[tokio::test]
async fn a_refused_broadcast_without_ack_is_reported_on_the_channel() {
    let sidecar = Sidecar::start("t_refused_noack", &[("MAX_FRAME_SIZE", "4194304")]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:too-big").await;
    // Over realtime.max_message_size (1 MB), under the frame limit.
    c.broadcast(
        "realtime:too-big",
        "big",
        json!({"blob": "x".repeat(1_500_000)}),
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

/// Bad configuration is refused at startup with a message naming the setting.
#[tokio::test]
async fn bad_configuration_is_refused_at_startup() {
    for (k, v, says) in [
        (
            "API_JWT_SECRET",
            "short",
            "API_JWT_SECRET must be at least 32 bytes",
        ),
        (
            "IDLE_TIMEOUT_SECS",
            "0",
            "IDLE_TIMEOUT_SECS must be between",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_realtime-sidecar"))
            .env("API_JWT_SECRET", SECRET)
            .env("DATABASE_URL", sidecar_dsn())
            .env(k, v)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{k}={v}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{k}={v}: {err}");
    }
}

/// A drain call that stops answering (here: its backend is stopped with SIGSTOP) makes
/// /healthz answer 503 with the reason, and the sidecar replaces the connection and
/// resumes once the database answers again.
#[tokio::test]
async fn healthz_reports_a_stuck_drain_and_the_sidecar_recovers() {
    let sidecar = Sidecar::start("t_stuck_drain", &[]).await;
    let db = db().await;
    let pid: i32 = db
        .query_one(
            "SELECT active_pid FROM realtime.consumers() WHERE name = 't_stuck_drain'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (status, body) = http(sidecar.port, "GET", "/healthz", &[], "")
            .await
            .unwrap();
        if status == 503 {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "/healthz stayed 200");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    signal("-CONT");
    assert!(
        body.starts_with("drain stuck: the database has not answered for"),
        "{body}"
    );
    sidecar.wait_healthy().await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:after-stuck").await;
    send(&db, json!({"back": true}), "ev", "after-stuck").await;
    let m = c.next_json(10).await.expect("delivery resumes");
    assert_eq!(m["payload"]["payload"]["back"], true);
}

/// A REST body that does not arrive is cut off like slow headers (408), not waited on.
#[tokio::test]
async fn a_rest_body_that_never_arrives_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sidecar = Sidecar::start("t_slow_body", &[("HTTP_HEADER_TIMEOUT_SECS", "1")]).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", sidecar.port))
        .await
        .unwrap();
    let head = format!(
        "POST /api/broadcast HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"mess",
        anon_key()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut answer))
        .await
        .expect("answered within the bound")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
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
