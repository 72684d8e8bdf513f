//! Health end to end: heartbeats, metrics and health endpoints, a stuck drain reported
//! and recovered from, bad configuration refused at startup.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

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
    let mut sidecar = Sidecar::start("t_stuck_drain", &[]).await;
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
    sidecar.wait_healthy().await.unwrap();
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:after-stuck").await;
    send(&db, json!({"back": true}), "ev", "after-stuck").await;
    let m = c.next_json(10).await.expect("delivery resumes");
    assert_eq!(m["payload"]["payload"]["back"], true);
}

/// The rights through which a role could place code where pg_realtime runs it are logged
/// when the sidecar starts (realtime.check_privileges()), so that a right granted after
/// CREATE EXTENSION is seen; none is logged once it is revoked.
#[tokio::test]
async fn rights_reaching_extension_code_are_logged_at_start() {
    let db = db().await;
    db.batch_execute(
        "DROP ROLE IF EXISTS t_trigger_holder; CREATE ROLE t_trigger_holder;
         GRANT TRIGGER ON realtime.messages TO t_trigger_holder;",
    )
    .await
    .unwrap();
    let mut sidecar = Sidecar::start("t_privileges_logged", &[]).await;
    sidecar.wait_healthy().await.unwrap();
    let logged = sidecar.log();
    db.batch_execute(
        "REVOKE TRIGGER ON realtime.messages FROM t_trigger_holder; DROP ROLE t_trigger_holder;",
    )
    .await
    .unwrap();
    let line = logged
        .lines()
        .find(|l| l.contains("t_trigger_holder"))
        .unwrap_or_else(|| panic!("no line names the role; the log:\n{logged}"));
    assert!(
        line.contains("TRIGGER")
            && line.contains("realtime.messages")
            && line.contains("realtime_prober"),
        "{line}"
    );
    // The sidecar's own login writes the extension's tables (scripts/sidecar_login.sql): its
    // grants there are no one else's way in, and are not logged at every start.
    assert!(
        !logged
            .lines()
            .any(|l| l.contains("a role can place code") && l.contains("\"realtime_sidecar\"")),
        "{logged}"
    );
    drop(sidecar);
    let mut sidecar = Sidecar::start("t_privileges_logged", &[]).await;
    sidecar.wait_healthy().await.unwrap();
    assert!(
        !sidecar.log().contains("t_trigger_holder"),
        "{}",
        sidecar.log()
    );
}

/// Regression (issue 39, L8): /healthz's 503 carried the database's error text (here the
/// name of a database that does not exist; elsewhere a host, a role, a server's message)
/// to anyone who could reach the port. It says only that the database is unavailable; the
/// reason is in the sidecar's log.
#[tokio::test]
async fn healthz_answers_without_database_error_text() {
    let port = free_port();
    let log = std::env::temp_dir().join("realtime-sidecar-test-t_healthz_text.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_realtime-sidecar"))
        .env("PORT", port.to_string())
        .env("API_JWT_SECRET", SECRET)
        .env(
            "DATABASE_URL",
            format!("{} dbname=t_no_such_database_l8", sidecar_dsn()),
        )
        .env("CONSUMER_NAME", "t_healthz_text")
        .env("LOG_LEVEL", "warn")
        .stdout(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start realtime-sidecar");
    // Asked once the drain's connection has failed, with the error in hand.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("t_no_such_database_l8")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no connection failure logged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = loop {
        if let Ok(answer) = http(port, "GET", "/healthz", &[], "").await {
            break answer;
        }
        assert!(std::time::Instant::now() < deadline, "no /healthz answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(answer, (503, "database unavailable\n".to_owned()));
}

/// `/metrics` behind Supabase's METRICS_JWT_SECRET: without a Bearer JWT signed with it, or
/// with an expired one or one signed with another key, 403; with one, the metrics.
#[tokio::test]
async fn metrics_want_a_jwt_signed_with_metrics_jwt_secret() {
    const METRICS: &str = "metrics-secret-with-at-least-32-characters";
    let sidecar = Sidecar::start("t_metrics_jwt", &[("METRICS_JWT_SECRET", METRICS)]).await;
    let signed = |key: &str, exp: i64| {
        let t = jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &json!({"role": "metrics", "exp": exp}),
            &jsonwebtoken::EncodingKey::from_secret(key.as_bytes()),
        )
        .unwrap();
        format!("Bearer {t}")
    };
    for (auth, want) in [
        (None, 403),
        (Some(signed(SECRET, now() + 60)), 403),
        (Some(signed(METRICS, now() - 120)), 403),
        (Some(signed(METRICS, now() + 60)), 200),
    ] {
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        let (status, body) = http(sidecar.port, "GET", "/metrics", &headers, "")
            .await
            .unwrap();
        assert_eq!(status, want, "{auth:?}: {body}");
        assert_eq!(body.contains("realtime_connections "), want == 200);
    }
}

/// A test's sidecar once found its port taken (a port of the ephemeral range, reused as some
/// connection's source port): it exited with "Address already in use", and the test asked
/// /healthz of whatever held the port, which accepted and never answered, for ever. Starting
/// now sees the sidecar exit and says the port was taken, and every test request is bounded.
#[tokio::test]
async fn a_sidecar_whose_port_was_taken_hung_its_test() {
    // Holds the port, and accepts connections (the backlog) without ever answering.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let started = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        Sidecar::try_start_on(port, "t_port_taken", &[]),
    )
    .await
    .expect("told within a minute");
    assert!(started.is_none(), "a sidecar on a taken port");
    drop(held);
}

/// Supabase's health routes, as its docker-compose healthcheck and its clients call them
/// (`supabase_health.rs`): a tenant's health behind a Bearer token, and `/api/ping`.
#[tokio::test]
async fn supabase_s_health_routes_are_served() {
    let sidecar = Sidecar::start("t_supabase_health", &[("REGION", "local")]).await;
    let (status, body) = http(sidecar.port, "GET", "/api/ping", &[], "")
        .await
        .unwrap();
    assert_eq!((status, body.as_str()), (200, r#"{"message":"Success"}"#));
    let path = "/api/tenants/realtime-dev/health";
    // No token, or one the sidecar does not accept: 403 with an empty body, as Supabase.
    for headers in [vec![], vec![("Authorization", "Bearer not-a-token")]] {
        let (status, body) = http(sidecar.port, "GET", path, &headers, "").await.unwrap();
        assert_eq!((status, body.as_str()), (403, ""), "{headers:?}");
    }
    let auth = format!("Bearer {}", anon_key());
    let headers = [("Authorization", auth.as_str())];
    let (status, body) = http(sidecar.port, "GET", path, &headers, "").await.unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let data = &v["data"];
    assert_eq!(
        (
            &data["healthy"],
            &data["db_connected"],
            &data["replication_connected"],
            &data["region"]
        ),
        (&json!(true), &json!(true), &json!(true), &json!("local")),
        "{v}"
    );
    assert!(data["connected_cluster"].as_u64().is_some(), "{v}");
    assert!(
        data["node"].as_str().unwrap().starts_with("realtime@"),
        "{v}"
    );
    // As curl --head asks it: the status alone.
    let (status, body) = http(sidecar.port, "HEAD", path, &headers, "")
        .await
        .unwrap();
    assert_eq!((status, body.as_str()), (200, ""));
    // Another tenant is not this sidecar's.
    let (status, _) = http(
        sidecar.port,
        "GET",
        "/api/tenants/other/health",
        &headers,
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 404);
}

/// A sidecar whose login is a superuser says so at start (it needs none of that; Supabase's
/// docker-compose gives its `realtime` service `supabase_admin`).
#[tokio::test]
async fn a_superuser_login_is_warned_of_at_start() {
    let sidecar = Sidecar::start("t_superuser_login", &[("DATABASE_URL", &dsn())]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sidecar.log().contains("the sidecar's login is a superuser") {
        assert!(std::time::Instant::now() < deadline, "{}", sidecar.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
