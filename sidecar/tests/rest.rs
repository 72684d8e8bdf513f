//! The REST broadcast end to end: `POST /api/broadcast` relayed and answered as Supabase
//! answers, and a body that never arrives.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

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
}

/// Fixed: one private topic the caller may not write to made the whole batch 403 and sent
/// nothing; Supabase delivers the others and answers 202. Here the answer also names the
/// topics left out.
#[tokio::test]
async fn a_rest_batch_with_one_unauthorized_topic_was_refused_whole() {
    let sidecar = Sidecar::start("t_rest_partial", &[]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:rest-partial").await;
    let auth = format!("Bearer {}", anon_key());
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    // The anon key has no write policy here.
    let batch = json!({"messages": [
        {"topic": "rest-partial", "event": "e", "payload": {"n": 1}, "private": true},
        {"topic": "rest-partial", "event": "open", "payload": {"n": 2}}
    ]})
    .to_string();
    let (status, body) = http(sidecar.port, "POST", "/api/broadcast", &headers, &batch)
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body,
        json!({"refused": [{"topic": "rest-partial", "message": "Unauthorized: You do not have permissions to write to this Channel topic: rest-partial"}]})
    );
    let m = c.next_json(5).await.unwrap();
    assert_eq!(
        without_meta(&m["payload"]),
        json!({"event": "open", "payload": {"n": 2}, "type": "broadcast"})
    );
    // One message (realtime-js's httpSend) is still refused, 403.
    let (status, body) = http(
        sidecar.port,
        "POST",
        "/api/broadcast/rest-partial/events/e?private=true",
        &headers,
        "{}",
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("Unauthorized: You do not have permissions to write"),
        "{body}"
    );
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
