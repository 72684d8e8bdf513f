//! Private channels, authorized by the database's RLS policies on realtime.messages through
//! the sidecar's batched `realtime.authorize` calls.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

const MEMBER: &str = "11111111-1111-4111-8111-111111111111";
const READER: &str = "22222222-2222-4222-8222-222222222222";
const STRANGER: &str = "33333333-3333-4333-8333-333333333333";

/// Supabase's auth helpers and the policies of `private_policies.sql`, with members who read and write room:1, a reader
/// of room:1, and a member of room:ttl. Made once per run (the tests of this file run in
/// parallel and change memberships).
async fn setup() -> tokio_postgres::Client {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::thread::spawn(|| {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(create_schema())
        })
        .join()
        .unwrap();
    });
    db().await
}

async fn create_schema() {
    let db = db().await;
    db.batch_execute(include_str!("../../pgbench/supabase_auth.sql"))
        .await
        .unwrap();
    db.batch_execute(include_str!("private_policies.sql"))
        .await
        .unwrap();
    db.batch_execute(&format!(
        "DELETE FROM private_members WHERE room IN ('room:1', 'room:ttl');
         INSERT INTO private_members VALUES ('{MEMBER}', 'room:1', true), ('{READER}', 'room:1', false), ('{MEMBER}', 'room:ttl', true);"
    ))
    .await
    .unwrap();
}

fn user_token(sub: &str) -> String {
    token(json!({"role": "authenticated", "sub": sub, "exp": now() + 3600}))
}

async fn join_private(c: &mut Client, topic: &str, token: &str, ack: bool) -> Value {
    let payload = json!({"config": {"private": true, "broadcast": {"ack": ack, "self": false}}, "access_token": token});
    let r = c.push(Some("1"), topic, "phx_join", payload).await;
    c.reply(&r).await
}

async fn next_event(c: &mut Client, event: &str) -> Value {
    loop {
        let m = c
            .next_json(10)
            .await
            .unwrap_or_else(|| panic!("no {event} within 10 s"));
        if m["event"] == event {
            return m;
        }
    }
}

#[tokio::test]
async fn private_channels_follow_rls_policies() {
    let db = setup().await;
    let sidecar = Sidecar::start("t_private", &[]).await;
    let mut member = Client::connect(sidecar.port, "1.0.0").await;
    let mut reader = Client::connect(sidecar.port, "2.0.0").await;
    let mut stranger = Client::connect(sidecar.port, "1.0.0").await;
    let mut public = Client::connect(sidecar.port, "1.0.0").await;
    assert_eq!(
        join_private(&mut member, "realtime:room:1", &user_token(MEMBER), true).await["status"],
        "ok"
    );
    assert_eq!(
        join_private(&mut reader, "realtime:room:1", &user_token(READER), true).await["status"],
        "ok"
    );
    let denied = join_private(
        &mut stranger,
        "realtime:room:1",
        &user_token(STRANGER),
        false,
    )
    .await;
    assert_eq!(
        denied,
        json!({"status": "error", "response": {"reason": "Unauthorized: You do not have permissions to read from this Channel topic: room:1"}})
    );
    public.join_public("realtime:room:1").await;

    // A private message from the database reaches the authorized private channels only.
    db.execute(
        "SELECT realtime.send('{\"secret\": 42}', 'note', 'room:1')",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        member.next_json(5).await.unwrap()["payload"]["payload"]["secret"],
        42
    );
    let Some(tokio_tungstenite::tungstenite::Message::Binary(b)) = reader.next(5).await else {
        panic!("reader gets it")
    };
    assert_eq!(decode_kind4(&b).1, "note");
    db.execute(
        "SELECT realtime.send('{\"open\": 1}', 'note', 'room:1', false)",
        &[],
    )
    .await
    .unwrap();
    let first_public = public.next_json(5).await.unwrap();
    assert_eq!(
        first_public["payload"]["payload"]["open"], 1,
        "public saw only the public one: {first_public}"
    );

    // Writing needs the INSERT policy: the member may, the reader may not (an error reply).
    let r = member.broadcast("realtime:room:1", "hi", json!({})).await;
    assert_eq!(member.reply(&r).await["status"], "ok");
    let r = reader.broadcast("realtime:room:1", "hi", json!({})).await;
    assert_eq!(
        reader.reply(&r).await["response"]["reason"],
        "Unauthorized: You do not have permissions to write to this Channel topic: room:1"
    );

    // A new token that loses permission closes the channel with Supabase's message.
    member
        .push(
            Some("1"),
            "realtime:room:1",
            "access_token",
            json!({"access_token": user_token(STRANGER)}),
        )
        .await;
    let system = next_event(&mut member, "system").await;
    assert_eq!(
        system["payload"]["message"],
        "You no longer have permission to read from this Channel topic: room:1"
    );
    next_event(&mut member, "phx_close").await;
}

#[tokio::test]
async fn revoked_permission_closes_the_channel_within_the_ttl() {
    let db = setup().await;
    let sidecar = Sidecar::start("t_private_ttl", &[("AUTHORIZATION_TTL_SECS", "1")]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    assert_eq!(
        join_private(&mut c, "realtime:room:ttl", &user_token(MEMBER), false).await["status"],
        "ok"
    );
    db.execute("DELETE FROM private_members WHERE room = 'room:ttl'", &[])
        .await
        .unwrap();
    let system = tokio::time::timeout(Duration::from_secs(10), next_event(&mut c, "system"))
        .await
        .unwrap();
    assert_eq!(
        system["payload"]["message"],
        "You no longer have permission to read from this Channel topic: room:ttl"
    );
    next_event(&mut c, "phx_close").await;
}

#[tokio::test]
async fn many_concurrent_private_joins_share_few_calls() {
    setup().await;
    let sidecar = Sidecar::start("t_private_batch", &[]).await;
    let token = user_token(MEMBER);
    let mut joins = Vec::new();
    for _ in 0..50 {
        let (port, token) = (sidecar.port, token.clone());
        joins.push(tokio::spawn(async move {
            let mut c = Client::connect(port, "1.0.0").await;
            join_private(&mut c, "realtime:room:1", &token, false).await["status"] == "ok"
        }));
    }
    for j in joins {
        assert!(j.await.unwrap());
    }
    let (batches, requests) = (
        sidecar.metric("realtime_auth_batches_total").await,
        sidecar.metric("realtime_auth_requests_total").await,
    );
    assert_eq!(requests, 100.0, "a read and a write verdict per join");
    assert!(
        batches < requests / 2.0,
        "{batches} calls for {requests} verdicts"
    );
}

#[tokio::test]
async fn rest_private_broadcast_needs_the_write_policy() {
    setup().await;
    let sidecar = Sidecar::start("t_private_rest", &[]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    assert_eq!(
        join_private(&mut c, "realtime:room:1", &user_token(READER), false).await["status"],
        "ok"
    );
    let body = json!({"messages": [{"topic": "room:1", "event": "news", "payload": {"n": 1}, "private": true}]}).to_string();
    for (sub, status) in [(READER, 403), (MEMBER, 202)] {
        let auth = format!("Bearer {}", user_token(sub));
        let (got, _) = http(
            sidecar.port,
            "POST",
            "/api/broadcast",
            &[("Authorization", &auth)],
            &body,
        )
        .await
        .unwrap();
        assert_eq!(got, status, "{sub}");
    }
    let m = next_event(&mut c, "broadcast").await;
    assert_eq!(m["payload"]["payload"], json!({"n": 1}));
}
