//! The `realtime` service definition of sidecar/README.md ("In Supabase's docker-compose")
//! run as docker-compose would run it: the sidecar started with exactly its environment
//! block (the `${...}` of Supabase's `.env` filled in for this machine, and `PORT` a free
//! port), then the service's own healthcheck command run against it, as the container's
//! health check runs it.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const README: &str = include_str!("../README.md");

/// The YAML block after the marker: its environment (in order) and its healthcheck command.
fn service() -> (Vec<(String, String)>, String) {
    let start = README
        .find("<!-- docker-compose realtime service")
        .expect("the service block's marker");
    let block = &README[start..];
    let block = &block[block.find("```yaml\n").unwrap() + 8..];
    let block = &block[..block.find("```").unwrap()];
    let mut env = Vec::new();
    let mut in_env = false;
    let mut command = None;
    for line in block.lines() {
        if line.trim() == "environment:" {
            in_env = true;
            continue;
        }
        if in_env {
            let Some((k, v)) = line.trim().split_once(": ") else {
                in_env = false;
                continue;
            };
            env.push((k.to_owned(), v.to_owned()));
        }
        if line.contains("curl ") {
            // A YAML string in a list: quoted, with \" inside.
            let t = line.trim().trim_end_matches(',');
            command = Some(t[1..t.len() - 1].replace("\\\"", "\""));
        }
    }
    (env, command.expect("the healthcheck command"))
}

/// Supabase's `.env` for this machine: the test cluster's socket and port, the suite's
/// secret and anon key; the sidecar's login has no password here (trust).
fn dot_env() -> BTreeMap<&'static str, String> {
    let dsn = sidecar_dsn();
    let part = |k: &str| {
        dsn.split_whitespace()
            .find_map(|p| p.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {dsn}"))
            .to_owned()
    };
    BTreeMap::from([
        ("POSTGRES_HOST", part("host")),
        ("POSTGRES_PORT", part("port")),
        ("POSTGRES_DB", part("dbname")),
        ("REALTIME_SIDECAR_PASSWORD", String::new()),
        (
            "JWT_SECRET",
            "test-secret-with-at-least-32-characters".to_owned(),
        ),
        ("ANON_KEY", anon_key()),
    ])
}

fn fill(text: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = text.to_owned();
    for (k, v) in vars {
        out = out.replace(&format!("${{{k}}}"), v);
    }
    assert!(!out.contains("${"), "an unset variable in {out}");
    out
}

/// Runs the healthcheck as the container would (`CMD-SHELL`): its exit status.
fn healthcheck(command: &str) -> i32 {
    Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .status()
        .expect("sh")
        .code()
        .unwrap_or(-1)
}

#[tokio::test]
async fn the_readme_s_service_definition_starts_and_passes_its_healthcheck() {
    let (env, command) = service();
    let vars = dot_env();
    let port = free_port();
    db().await
        .execute("SELECT realtime.drop_consumer('realtime-dev')", &[])
        .await
        .unwrap();
    let log = std::env::temp_dir().join("realtime-sidecar-test-docker-compose.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_realtime-sidecar"));
    cmd.env_clear().stdout(std::fs::File::create(&log).unwrap());
    for (k, v) in &env {
        let v = if k == "PORT" {
            port.to_string()
        } else {
            fill(v, &vars)
        };
        cmd.env(k, v);
    }
    assert!(
        env.iter().any(|(k, v)| k == "BIND" && v == "0.0.0.0"),
        "{env:?}"
    );
    let mut child = cmd.spawn().unwrap();
    let command = fill(&command, &vars).replace("localhost:4000", &format!("localhost:{port}"));
    // As docker's start_period and retries: asked until it passes, within a bound.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = healthcheck(&command);
    while status != 0 && Instant::now() < deadline {
        assert!(
            child.try_wait().unwrap().is_none(),
            "{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        status = healthcheck(&command);
    }
    assert_eq!(
        status,
        0,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // The same command with a token the sidecar refuses fails: the check can fail.
    let refused = command.replace(&vars["ANON_KEY"], "not-a-token");
    assert_ne!(healthcheck(&refused), 0);
    let _ = child.kill();
    let _ = child.wait();
    drop(
        db().await
            .execute("SELECT realtime.drop_consumer('realtime-dev')", &[])
            .await,
    );
}
