//! Cheap poisons and one-join attacks from the second security review, each performed as an
//! anonymous client would, named after what broke: the input is refused at the edge with its
//! reason, and meanwhile another client's join on the same sidecar is answered `ok` and its
//! message arrives. (Timeouts here are fail-safes only; every wait is on a condition.)

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Another client joins a topic no channel on this sidecar holds yet (so its join needs a
/// new key uploaded) and receives a message sent to it from the database.
async fn bystander_is_served(port: u16, db: &tokio_postgres::Client, topic: &str) {
    let mut b = Client::connect(port, "1.0.0").await;
    let started = Instant::now();
    b.join_public(&format!("realtime:{topic}")).await;
    send(db, json!({"n": 1}), "e", topic).await;
    loop {
        let m = b.next_json(10).await.expect("the bystander's message");
        if m["event"] == "broadcast" {
            assert_eq!(m["payload"]["payload"]["n"], 1, "{m}");
            break;
        }
    }
    // Not a latency bound: a join that waited for a poisoned upload took the whole
    // 10 s database deadline (and was refused), well past this fail-safe.
    assert!(started.elapsed() < Duration::from_secs(8));
}

fn reason(reply: &Value) -> &str {
    assert_eq!(reply["status"], "error", "{reply}");
    reply["response"]["reason"].as_str().unwrap()
}

/// What the consumer's slot listens to: None while it receives everything.
async fn listening(db: &tokio_postgres::Client, consumer: &str) -> Option<i32> {
    db.query_one(
        "SELECT listening FROM realtime.consumers() WHERE name = $1",
        &[&consumer],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn a_nul_in_a_bindings_table_name_refuses_everyones_new_joins() {
    let sidecar = Sidecar::start("t_poison_table_nul", &[]).await;
    let db = db().await;
    let mut attacker = Client::connect(sidecar.port, "2.0.0").await;
    // The attack of the review: a fresh topic each time, so each join holds a new key.
    for i in 0..3 {
        let binding = json!({"event": "*", "schema": "public", "table": "a\u{0}b"});
        let started = Instant::now();
        let told = attacker
            .join_unserved(
                &format!("realtime:p{i}"),
                json!({"postgres_changes": [binding]}),
                1,
            )
            .await;
        assert_eq!(
            told,
            ["Unable to subscribe to changes with given parameters: InvalidPostgresChanges: binding 1: table must not contain a NUL character"]
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused at once"
        );
    }
    let schema = json!({"event": "*", "schema": "pub\u{0}lic", "table": "t"});
    let told = attacker
        .join_unserved(
            "realtime:p-schema",
            json!({"postgres_changes": [schema]}),
            1,
        )
        .await;
    assert!(
        told[0].ends_with(
            "InvalidPostgresChanges: binding 1: schema must not contain a NUL character"
        ),
        "{told:?}"
    );
    let filter = json!({"event": "*", "schema": "public", "table": "t", "filter": "id=eq.a\u{0}"});
    let told = attacker
        .join_unserved(
            "realtime:p-filter",
            json!({"postgres_changes": [filter]}),
            1,
        )
        .await;
    assert!(
        told[0].ends_with(
            "InvalidPostgresChanges: binding 1: a filter value must not contain a NUL character"
        ),
        "{told:?}"
    );
    bystander_is_served(sidecar.port, &db, "poison:table-nul:bystander").await;
    assert!(
        !sidecar.log().contains("interest connection failed"),
        "{}",
        sidecar.log()
    );
}

#[tokio::test]
async fn a_join_naming_more_tables_than_the_database_takes_switches_filtering_off() {
    // The review's >16,384 tables: refused by the per-join bound, before anything is held.
    let sidecar = Sidecar::start("t_poison_many_tables", &[]).await;
    let db = db().await;
    let mut attacker = Client::connect(sidecar.port, "2.0.0").await;
    attacker.join_public("realtime:poison:many:mine").await;
    assert_eq!(listening(&db, "t_poison_many_tables").await, Some(1));
    let many: Vec<Value> = (0..16_400)
        .map(|i| json!({"event": "*", "schema": "public", "table": format!("t{i}")}))
        .collect();
    let reply = attacker
        .join("realtime:poison:many", json!({"postgres_changes": many}))
        .await;
    assert_eq!(
        reason(&reply),
        "InvalidPostgresChanges: the join has bindings: 16400; the limit is 100 (MAX_BINDINGS_PER_JOIN)"
    );
    // Past the bounds (raised here), the tables reach the database's check, which refuses
    // them: they were never uploaded, so filtering stays on.
    let loose = Sidecar::start(
        "t_poison_many_tables_loose",
        &[
            ("MAX_BINDINGS_PER_JOIN", "20000"),
            ("MAX_TABLES_PER_JOIN", "20000"),
            ("MAX_BINDINGS_PER_CONNECTION", "20000"),
            ("MAX_BINDINGS_PER_ADDRESS", "20000"),
        ],
    )
    .await;
    let mut attacker = Client::connect(loose.port, "2.0.0").await;
    attacker.join_public("realtime:poison:many:mine").await;
    // Each binding the check refused is not served: the first ten are told one by one, the
    // rest in one more message (`postgres_changes::unserved`).
    let told = attacker
        .join_unserved(
            "realtime:poison:many",
            json!({"postgres_changes": many}),
            11,
        )
        .await;
    assert!(
        told[0].contains("InvalidPostgresChanges: binding 1:"),
        "{told:?}"
    );
    assert_eq!(
        told[10],
        "16390 more postgres_changes bindings of this channel cannot be served; the first 10 were told why"
    );
    // The channel joined, so its topic is listened to; none of the tables was uploaded, and
    // filtering stays on.
    assert_eq!(listening(&db, "t_poison_many_tables_loose").await, Some(2));
    bystander_is_served(loose.port, &db, "poison:many:bystander").await;
}

#[tokio::test]
async fn never_matching_bindings_stall_the_drain() {
    // The review's drain stall: thousands of schema-wide bindings that never match, on a
    // sidecar with small configured bounds. Each bound refuses one past it, with its setting.
    let sidecar = Sidecar::start(
        "t_poison_bindings",
        &[
            ("MAX_BINDINGS_PER_JOIN", "10"),
            ("MAX_FILTER_CONDITIONS_PER_BINDING", "2"),
            ("MAX_FILTER_VALUE_BYTES", "16"),
            ("MAX_TABLES_PER_JOIN", "3"),
            ("MAX_BINDINGS_PER_CONNECTION", "25"),
        ],
    )
    .await;
    let db = db().await;
    let mut attacker = Client::connect(sidecar.port, "2.0.0").await;
    let never = json!({"event": "*", "schema": "*", "filter": "zz=eq.1"});
    let reply = attacker
        .join(
            "realtime:poison:never",
            json!({"postgres_changes": vec![never.clone(); 5000]}),
        )
        .await;
    assert_eq!(
        reason(&reply),
        "InvalidPostgresChanges: the join has bindings: 5000; the limit is 10 (MAX_BINDINGS_PER_JOIN)"
    );
    let reply = attacker
        .join(
            "realtime:poison:never",
            json!({"postgres_changes": vec![never.clone(); 11]}),
        )
        .await;
    assert!(
        reason(&reply).ends_with("(MAX_BINDINGS_PER_JOIN)"),
        "{reply}"
    );
    let three = json!({"event": "*", "schema": "*", "filter": "a=eq.1,b=eq.2,c=eq.3"});
    let reply = attacker
        .join(
            "realtime:poison:never",
            json!({"postgres_changes": [three]}),
        )
        .await;
    assert_eq!(
        reason(&reply),
        "InvalidPostgresChanges: binding 1: filter conditions: 3; the limit is 2 (MAX_FILTER_CONDITIONS_PER_BINDING)"
    );
    let long = json!({"event": "*", "schema": "*", "filter": format!("zz=eq.{}", "x".repeat(17))});
    let reply = attacker
        .join("realtime:poison:never", json!({"postgres_changes": [long]}))
        .await;
    assert!(reason(&reply).ends_with("17; the limit is 16 (MAX_FILTER_VALUE_BYTES)"));
    let tables: Vec<Value> = (0..4)
        .map(|i| json!({"event": "*", "schema": "public", "table": format!("t{i}")}))
        .collect();
    let reply = attacker
        .join("realtime:poison:never", json!({"postgres_changes": tables}))
        .await;
    assert!(reason(&reply).ends_with("4; the limit is 3 (MAX_TABLES_PER_JOIN)"));
    // At the bound the join is served (the bindings never match; nothing arrives).
    let reply = attacker
        .join(
            "realtime:poison:never",
            json!({"postgres_changes": vec![never.clone(); 10]}),
        )
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    // Rejoining replaces the channel's own bindings; more channels add up per connection.
    let reply = attacker
        .join(
            "realtime:poison:never",
            json!({"postgres_changes": vec![never.clone(); 10]}),
        )
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let reply = attacker
        .join(
            "realtime:poison:never-2",
            json!({"postgres_changes": vec![never.clone(); 10]}),
        )
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let reply = attacker
        .join(
            "realtime:poison:never-3",
            json!({"postgres_changes": vec![never; 10]}),
        )
        .await;
    assert_eq!(
        reason(&reply),
        "InvalidPostgresChanges: the connection's channels would have bindings: 30; the limit is 25 (MAX_BINDINGS_PER_CONNECTION)"
    );
    bystander_is_served(sidecar.port, &db, "poison:never:bystander").await;
}

#[tokio::test]
async fn cheap_poisons_are_refused_at_the_edge_and_the_relay_serves_others() {
    let sidecar = Sidecar::start("t_poison_cheap", &[]).await;
    let db = db().await;
    let mut attacker = Client::connect(sidecar.port, "2.0.0").await;
    attacker.join_public("realtime:poison:cheap").await;
    // A NUL in a WebSocket broadcast's event.
    let body = json!({"type": "broadcast", "event": "e\u{0}", "payload": {}});
    let r = attacker
        .push(Some("1"), "realtime:poison:cheap", "broadcast", body)
        .await;
    assert_eq!(
        reason(&attacker.reply(&r).await),
        "UnableToBroadcast: the event name must not contain a NUL character"
    );
    // Invalid JSON in a 2.0.0 binary push that says its payload is JSON.
    let (topic, event, payload) = ("realtime:poison:cheap", "e", b"{");
    let mut push = vec![
        3u8,
        1,
        2,
        topic.len() as u8,
        event.len() as u8,
        0,
        1, // JSON
    ];
    push.extend_from_slice(b"177");
    push.extend_from_slice(topic.as_bytes());
    push.extend_from_slice(event.as_bytes());
    push.extend_from_slice(payload);
    attacker.send_raw(Message::binary(push)).await;
    assert!(reason(&attacker.reply("77").await)
        .starts_with("UnableToBroadcast: the JSON payload is not valid JSON: "));
    // A `%00` event over REST, both routes.
    let auth = format!("Bearer {}", anon_key());
    let headers = [
        ("apikey", anon_key()),
        ("authorization", auth),
        ("content-type", "application/json".to_owned()),
    ];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, body) = http(
        sidecar.port,
        "POST",
        "/api/broadcast/poison:cheap/events/%00",
        &headers,
        "{}",
    )
    .await
    .unwrap();
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("the event name must not contain a NUL character"),
        "{body}"
    );
    let batch = json!({"messages": [{"topic": "poison:cheap", "event": "a\u{0}", "payload": {}}]});
    let (status, body) = http(
        sidecar.port,
        "POST",
        "/api/broadcast",
        &headers,
        &batch.to_string(),
    )
    .await
    .unwrap();
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("must not contain a NUL character"), "{body}");
    // None of them reached the relay: another client's acknowledged broadcast is relayed
    // in the first batch (no splitting), and arrives.
    let mut other = Client::connect(sidecar.port, "1.0.0").await;
    let reply = other
        .join(
            "realtime:poison:cheap:other",
            json!({"broadcast": {"self": true, "ack": true}}),
        )
        .await;
    assert_eq!(reply["status"], "ok");
    let r = other
        .broadcast("realtime:poison:cheap:other", "fine", json!({"x": 1}))
        .await;
    // The acknowledgement and the broadcast itself (`self: true`) may come in either order:
    // the relay answers when its commit returns, the drain delivers when it reads the queue.
    // (Reading the reply first threw away a broadcast that came before it.)
    let (mut acked, mut received) = (false, false);
    while !(acked && received) {
        let m = other
            .next_json(10)
            .await
            .expect("the ack and its own broadcast");
        if m["event"] == "phx_reply" && m["ref"] == r.as_str() {
            assert_eq!(m["payload"]["status"], "ok", "{m}");
            acked = true;
        } else if m["event"] == "broadcast" {
            assert_eq!(m["payload"]["event"], "fine");
            received = true;
        }
    }
    assert_eq!(
        sidecar
            .metric("realtime_client_broadcast_failures_total")
            .await,
        0.0
    );
    bystander_is_served(sidecar.port, &db, "poison:cheap:bystander").await;
}

#[tokio::test]
async fn an_unbounded_join_ref_and_presence_key_are_refused() {
    let sidecar = Sidecar::start("t_poison_refs", &[("MAX_PRESENCE_KEY_BYTES", "64")]).await;
    let db = db().await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let long_ref = "1".repeat(256);
    let r = c
        .push(
            Some(&long_ref),
            "realtime:poison:ref",
            "phx_join",
            json!({"config": {}}),
        )
        .await;
    assert_eq!(
        reason(&c.reply(&r).await),
        "InvalidJoinRef: join_ref is 256 bytes long; the limit is 255 bytes"
    );
    let key = |k: &str| json!({"presence": {"enabled": true, "key": k}});
    let reply = c.join("realtime:poison:key", key(&"k".repeat(65))).await;
    assert_eq!(
        reason(&reply),
        "InvalidPresenceKey: the presence key is 65 bytes long; the limit is 64 bytes (MAX_PRESENCE_KEY_BYTES)"
    );
    let reply = c.join("realtime:poison:key", key("a\u{0}b")).await;
    assert_eq!(
        reason(&reply),
        "InvalidPresenceKey: the presence key must not contain a NUL character"
    );
    let reply = c.join("realtime:poison:key", key(&"k".repeat(64))).await;
    assert_eq!(reply["status"], "ok", "{reply}");
    bystander_is_served(sidecar.port, &db, "poison:refs:bystander").await;
}

/// A push's ref is kept until the push is answered (a presence push until its commit, up to
/// MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL of them), and a text frame's ref had no bound but
/// the frame's size: megabytes each. Now a ref over 255 bytes (what a binary frame can carry)
/// makes the frame malformed: dropped, as Supabase drops one it cannot read, the socket kept.
#[tokio::test]
async fn a_ref_of_any_length_was_kept_with_every_waiting_push() {
    let sidecar = Sidecar::start("t_poison_long_ref", &[]).await;
    let db = db().await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let heartbeat = |r: &str| {
        let frame = json!({"topic": "phoenix", "event": "heartbeat", "payload": {}, "ref": r});
        Message::text(frame.to_string())
    };
    let (long, longest) = ("1".repeat(256), "2".repeat(255));
    c.send_raw(heartbeat(&long)).await;
    c.send_raw(heartbeat(&longest)).await;
    // Frames are read in order: the long ref's reply, if any, would come first.
    let first = c
        .next_json(10)
        .await
        .expect("a reply to the second heartbeat");
    assert_eq!(first["event"], "phx_reply", "{first}");
    assert_eq!(first["ref"], longest.as_str(), "the first reply: {first}");
    assert_eq!(sidecar.metric("realtime_malformed_frames_total").await, 1.0);
    bystander_is_served(sidecar.port, &db, "poison:long-ref:bystander").await;
}
