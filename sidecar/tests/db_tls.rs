//! TLS to Postgres (`DB_SSL`, `DB_SSL_CA_CERT`, `sidecar/src/db_tls.rs`) end to end: a
//! cluster of its own with `ssl = on` and a certificate for `localhost` from a CA made here;
//! the sidecar served with the right CA over TLS only, and refused with another CA and with
//! a host name the certificate does not name.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run a command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new("openssl").current_dir(dir).args(args));
}

/// A CA (its key and certificate) named `name`.
fn ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
}

/// The repository's root (scripts/cluster.sh, scripts/sidecar_login.sql).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The cluster, stopped when dropped.
struct Cluster(PathBuf);

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(root().join("scripts/cluster.sh"))
            .arg("stop")
            .arg(&self.0)
            .output();
    }
}

/// /healthz until it says `want`, for at most `secs`: the last answer.
async fn health_until(s: &Sidecar, want: u16, secs: u64) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (status, body) = http(s.port, "GET", "/healthz", &[], "")
            .await
            .unwrap_or((0, String::new()));
        if status == want || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (at most 20 s) until the sidecar's log holds `needle`.
async fn log_until(s: &Sidecar, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !s.log().contains(needle) {
        assert!(Instant::now() < deadline, "{needle} not in {}", s.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn tls_to_postgres_is_verified_against_the_configured_ca_and_host() {
    let dir = std::env::temp_dir().join(format!("pg_realtime_tls_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    ca(&dir, "ca1");
    ca(&dir, "ca2");
    openssl(
        &dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost\n").unwrap();
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca1.pem",
            "-CAkey",
            "ca1.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ],
    );
    run(Command::new("chown")
        .arg("postgres:")
        .arg(dir.join("server.key"))
        .arg(dir.join("server.pem")));
    run(Command::new("chmod").arg("600").arg(dir.join("server.key")));
    let port = free_port();
    let data = dir.join("cluster");
    run(Command::new(root().join("scripts/cluster.sh"))
        .arg("start")
        .arg(&data)
        .arg(port.to_string())
        .arg("ssl = on")
        .arg(format!(
            "ssl_cert_file = '{}'",
            dir.join("server.pem").display()
        ))
        .arg(format!(
            "ssl_key_file = '{}'",
            dir.join("server.key").display()
        )));
    let _cluster = Cluster(data.clone());
    let admin = format!(
        "host={} port={port} user=postgres dbname=postgres",
        data.display()
    );
    let db = db_at(&admin).await;
    db.batch_execute("CREATE EXTENSION pg_realtime")
        .await
        .unwrap();
    db.batch_execute(&std::fs::read_to_string(root().join("scripts/sidecar_login.sql")).unwrap())
        .await
        .unwrap();
    let ca1 = dir.join("ca1.pem").display().to_string();
    let ca2 = dir.join("ca2.pem").display().to_string();
    let url = |host: &str| format!("host={host} port={port} user=realtime_sidecar dbname=postgres");

    // The right CA and host: served, and every connection of the sidecar is over TLS.
    let good = url("localhost");
    let s = Sidecar::spawn(
        free_port(),
        "t_tls_good",
        &[
            ("DATABASE_URL", &good),
            ("DB_SSL", "true"),
            ("DB_SSL_CA_CERT", &ca1),
        ],
    );
    assert_eq!(health_until(&s, 200, 20).await.0, 200, "{}", s.log());
    let r = db
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.usename = 'realtime_sidecar'",
            &[],
        )
        .await
        .unwrap();
    let (tls, all): (i64, i64) = (r.get(0), r.get(1));
    assert!(all > 0 && tls == all, "{tls} of {all} connections over TLS");
    drop(s);

    // Another CA: the certificate is not trusted, nothing is served.
    let s = Sidecar::spawn(
        free_port(),
        "t_tls_other_ca",
        &[
            ("DATABASE_URL", &good),
            ("DB_SSL", "true"),
            ("DB_SSL_CA_CERT", &ca2),
        ],
    );
    assert_eq!(health_until(&s, 503, 20).await.0, 503);
    // The good sidecar was served within a second: this one, given three, never is.
    assert_eq!(health_until(&s, 200, 3).await.0, 503, "never served");
    // The log says why, with the cause under "error performing TLS handshake".
    log_until(&s, "invalid peer certificate: UnknownIssuer").await;
    drop(s);

    // The right CA, but a host name the certificate does not name.
    let s = Sidecar::spawn(
        free_port(),
        "t_tls_wrong_host",
        &[
            ("DATABASE_URL", &url("127.0.0.1")),
            ("DB_SSL", "true"),
            ("DB_SSL_CA_CERT", &ca1),
        ],
    );
    log_until(
        &s,
        "invalid peer certificate: certificate not valid for name \"127.0.0.1\"",
    )
    .await;
    assert_eq!(health_until(&s, 200, 3).await.0, 503, "never served");
    drop(s);

    // A CA file that is none refuses the start.
    let out = Command::new(env!("CARGO_BIN_EXE_realtime-sidecar"))
        .env("DATABASE_URL", &good)
        .env("API_JWT_SECRET", "test-secret-with-at-least-32-characters")
        .env("DB_SSL", "true")
        .env("DB_SSL_CA_CERT", dir.join("san.ext"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("DB_SSL_CA_CERT"),
        "{out:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
