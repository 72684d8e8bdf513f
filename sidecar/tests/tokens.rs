//! Tokens end to end: refused with Supabase's reasons, and a channel closed when its
//! token expires.

mod common;

use common::*;
use serde_json::json;

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
