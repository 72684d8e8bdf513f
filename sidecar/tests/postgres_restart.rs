//! When Postgres restarts, the sidecar reconnects with backoff, subscribers are told that the
//! database went away and that messages may have been lost, and delivery resumes.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;

fn restart_postgres() {
    let pgdata = std::env::var("PG_REALTIME_TEST_PGDATA")
        .expect("PG_REALTIME_TEST_PGDATA (set by scripts/test.sh)");
    let pg_ctl = format!(
        "{}/pg_ctl",
        String::from_utf8(
            Command::new("pg_config")
                .arg("--bindir")
                .output()
                .unwrap()
                .stdout
        )
        .unwrap()
        .trim()
    );
    let log = format!("{pgdata}/../restart.log");
    // The restarted postmaster must not inherit the test's stdout and stderr.
    let ok = Command::new("runuser")
        .args([
            "-u", "postgres", "--", &pg_ctl, "-D", &pgdata, "-l", &log, "-m", "fast", "-w",
            "restart",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "pg_ctl restart");
}

async fn next_system(c: &mut Client) -> Value {
    loop {
        let m = c.next_json(20).await.expect("a system message within 20 s");
        if m["event"] == "system" {
            return m["payload"].clone();
        }
    }
}

#[tokio::test]
async fn postgres_restart_is_survived_and_announced() {
    let sidecar = Sidecar::start("t_pg_restart", &[]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:survive").await;
    restart_postgres();
    let away = next_system(&mut c).await;
    assert_eq!(away["status"], "error");
    assert!(
        away["message"]
            .as_str()
            .unwrap()
            .starts_with("The database is unavailable"),
        "{away}"
    );
    let back = next_system(&mut c).await;
    assert_eq!(back["status"], "error");
    assert!(
        back["message"]
            .as_str()
            .unwrap()
            .starts_with("The database restarted"),
        "{back}"
    );
    sidecar.wait_healthy().await;
    let db = db().await;
    db.execute(
        "SELECT realtime.send('{\"after\": \"restart\"}', 'ev', 'survive', false)",
        &[],
    )
    .await
    .unwrap();
    let m = c.next_json(10).await.expect("delivery resumes");
    assert_eq!(m["payload"]["payload"]["after"], "restart");
}
