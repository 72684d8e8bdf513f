//! Helpers for the end-to-end tests: a real sidecar process against a real Postgres with
//! pg_realtime, real WebSocket clients, and tokens signed like Supabase's.
//!
//! The tests need `PG_REALTIME_TEST_DSN` (a database where `CREATE EXTENSION pg_realtime`
//! was run); `scripts/test.sh` starts such a cluster. Without it they fail, loudly.
#![allow(dead_code)]

use futures_util::{SinkExt, StreamExt};
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{connect_async, MaybeTlsStream, WebSocketStream};

pub const SECRET: &str = "test-secret-with-at-least-32-characters";

pub fn dsn() -> String {
    std::env::var("PG_REALTIME_TEST_DSN").expect(
        "PG_REALTIME_TEST_DSN must name a database with pg_realtime (scripts/test.sh sets it)",
    )
}

/// What the sidecars under test connect as: the least-privilege login of
/// `scripts/sidecar_login.sql` (`PG_REALTIME_SIDECAR_DSN`), never the superuser.
pub fn sidecar_dsn() -> String {
    std::env::var("PG_REALTIME_SIDECAR_DSN").expect(
        "PG_REALTIME_SIDECAR_DSN must name the sidecar's least-privilege login (scripts/test.sh sets it)",
    )
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub fn token(claims: Value) -> String {
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// The queue's epoch (as `meta.epoch` carries it: unix microseconds) and its last sequence.
pub async fn queue_position(db: &tokio_postgres::Client) -> (i64, i64) {
    let r = db
        .query_one(
            "SELECT (extract(epoch FROM epoch) * 1000000)::int8, last_seq FROM realtime.stats()",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// A token of role authenticated for user `sub`, valid for an hour.
pub fn user_token(sub: &str) -> String {
    token(json!({"role": "authenticated", "sub": sub, "exp": now() + 3600}))
}

/// Supabase's auth helpers and the private-channel policies of `private_policies.sql`
/// (members read their rooms; those with can_write send), loaded into the test database.
pub async fn load_private_policies(db: &tokio_postgres::Client) {
    db.batch_execute(include_str!("../../../pgbench/supabase_auth.sql"))
        .await
        .unwrap();
    db.batch_execute(include_str!("../private_policies.sql"))
        .await
        .unwrap();
}

/// An anon key like Supabase's: role anon, valid for an hour.
pub fn anon_key() -> String {
    token(json!({"role": "anon", "exp": now() + 3600, "iss": "supabase"}))
}

pub async fn db() -> tokio_postgres::Client {
    db_at(&dsn()).await
}

/// Presence writes of one topic held in the database: a trigger on the members' table makes
/// each of the topic's rows wait for advisory lock `lock`, which this value's connection holds
/// until `release` (which lets them go and drops the trigger).
pub struct PresenceWritesHeld {
    holder: tokio_postgres::Client,
    lock: i64,
}

impl PresenceWritesHeld {
    pub async fn new(topic: &str, lock: i64) -> PresenceWritesHeld {
        let holder = db().await;
        holder
            .batch_execute(&format!(
                "CREATE FUNCTION public.t_presence_held_{lock}() RETURNS trigger LANGUAGE plpgsql \
                 AS $$ BEGIN IF NEW.topic = '{topic}' THEN PERFORM pg_advisory_lock_shared({lock}); \
                 PERFORM pg_advisory_unlock_shared({lock}); END IF; RETURN NEW; END $$; \
                 CREATE TRIGGER t_presence_held_{lock} BEFORE INSERT ON realtime.presences \
                 FOR EACH ROW EXECUTE FUNCTION public.t_presence_held_{lock}(); \
                 SELECT pg_advisory_lock({lock});"
            ))
            .await
            .unwrap();
        PresenceWritesHeld { holder, lock }
    }

    /// The backend of a presence write waiting for the lock, once one is (at most 10 s).
    pub async fn writer(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let row = self
                .holder
                .query_opt(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'advisory' \
                     AND query LIKE '%presence_track%' LIMIT 1",
                    &[],
                )
                .await
                .unwrap();
            if let Some(row) = row {
                return row.get(0);
            }
            assert!(Instant::now() < deadline, "no presence write waited");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn release(self) {
        let lock = self.lock;
        self.holder
            .batch_execute(&format!(
                "SELECT pg_advisory_unlock({lock}); \
                 DROP TRIGGER t_presence_held_{lock} ON realtime.presences; \
                 DROP FUNCTION public.t_presence_held_{lock}();"
            ))
            .await
            .unwrap();
    }
}

/// A connection (without TLS) to the database `dsn` names, served in the background.
pub async fn db_at(dsn: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .expect("connect to Postgres");
    tokio::spawn(conn);
    client
}

/// Ends the backend of `consumer`'s drain (as a stopped server or a cut connection would);
/// true if there was one.
pub async fn end_drain_backend(db: &tokio_postgres::Client, consumer: &str) -> bool {
    let ended: i64 = db
        .query_one(
            "SELECT count(*) FROM realtime.consumers() \
             WHERE name = $1 AND pg_terminate_backend(active_pid, 5000)",
            &[&consumer],
        )
        .await
        .unwrap()
        .get(0);
    ended == 1
}

/// Whether a presence frame names `key` among its joins (a diff) or its members (a state).
pub fn presence_names(frame: &Value, key: &str) -> bool {
    match frame["event"].as_str() {
        Some("presence_state") => frame["payload"].get(key).is_some(),
        Some("presence_diff") => frame["payload"]["joins"].get(key).is_some(),
        _ => false,
    }
}

/// A free port below the ephemeral range. A port of that range (what binding port 0 gives)
/// can be taken at any moment as the source port of one of the thousands of connections
/// the tests open: a sidecar then failed to bind it ("Address already in use"), and a test
/// waited on a port where nothing answered.
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let from = 20_000.min(low / 2);
    for _ in 0..1000 {
        let port = from + rand::random::<u16>() % (low - from);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below {low} in 1,000 tries");
}

/// How long a test's HTTP request may take: a request to a port where nothing answers (or
/// one that connected to itself) fails instead of waiting for ever.
const HTTP_DEADLINE: Duration = Duration::from_secs(30);

/// A running sidecar process; SIGTERMed and reaped on drop.
pub struct Sidecar {
    pub port: u16,
    pub consumer: String,
    child: Child,
}

impl Sidecar {
    /// A new sidecar with a new consumer slot: a slot left by an earlier run of the same
    /// test (slots live as long as the server) would resume from its old position and
    /// report the messages since evicted as lost. `start_on` keeps the slot (a restart).
    pub async fn start(consumer: &str, env: &[(&str, &str)]) -> Sidecar {
        db().await
            .execute("SELECT realtime.drop_consumer($1)", &[&consumer])
            .await
            .expect("drop the consumer slot of an earlier run");
        // Another test may take the port between its choice and the sidecar's bind: then
        // another port, at most three times.
        for _ in 0..3 {
            if let Some(s) = Self::try_start_on(free_port(), consumer, env).await {
                return s;
            }
        }
        panic!("the sidecar found its port taken three times");
    }

    pub async fn start_on(port: u16, consumer: &str, env: &[(&str, &str)]) -> Sidecar {
        Self::try_start_on(port, consumer, env)
            .await
            .unwrap_or_else(|| panic!("port {port} is taken"))
    }

    /// None when the sidecar could not bind `port`.
    pub async fn try_start_on(port: u16, consumer: &str, env: &[(&str, &str)]) -> Option<Sidecar> {
        let mut s = Self::spawn(port, consumer, env);
        match s.wait_healthy().await {
            Ok(()) => Some(s),
            Err(log) if log.contains("Address already in use") => None,
            Err(log) => panic!("the sidecar exited before it was healthy: {log}"),
        }
    }

    /// A sidecar process on `port`, not waited for: one that is not to become healthy.
    pub fn spawn(port: u16, consumer: &str, env: &[(&str, &str)]) -> Sidecar {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_realtime-sidecar"));
        cmd.env("PORT", port.to_string())
            .env("API_JWT_SECRET", SECRET)
            .env("DATABASE_URL", sidecar_dsn())
            .env("CONSUMER_NAME", consumer)
            .env("LOG_LEVEL", "warn")
            .stdout(std::fs::File::create(Self::log_path(consumer)).expect("sidecar log file"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start realtime-sidecar");
        Sidecar {
            port,
            consumer: consumer.to_owned(),
            child,
        }
    }

    /// Where a test sidecar's log (its stdout) goes.
    fn log_path(consumer: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("realtime-sidecar-test-{consumer}.log"))
    }

    /// What the sidecar has logged so far (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(Self::log_path(&self.consumer)).unwrap_or_default()
    }

    /// Waits (at most 15 s) until /healthz says the drain connection is up; the sidecar's
    /// log if it exited first (another process's answer on its port is not taken for its).
    pub async fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Err(self.log());
            }
            // A probe is short: what holds the port may accept and never answer.
            let probe = http(self.port, "GET", "/healthz", &[], "");
            if let Ok(Ok((200, _))) = tokio::time::timeout(Duration::from_secs(1), probe).await {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return Err(self.log());
                }
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "sidecar on port {} did not become healthy",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn metric(&self, name: &str) -> f64 {
        let (_, body) = http(self.port, "GET", "/metrics", &[], "").await.unwrap();
        body.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|r| r.strip_prefix(' '))
                    .map(|v| v.parse().unwrap())
            })
            .unwrap_or_else(|| panic!("metric {name} missing"))
    }

    /// SIGKILL, then reap: the process dies without a word to its clients or the database.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends `signal` (a name `kill` knows: STOP, CONT) to the process.
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal}");
    }

    /// SIGTERM, then wait for exit (graceful shutdown).
    pub fn stop(&mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
    }
}

/// Restarts the test cluster (`pg_ctl restart -m fast`): the queue begins a new epoch.
pub fn restart_postgres() {
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

/// A minimal HTTP/1.1 request; returns status and body.
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    http_from("127.0.0.1", port, method, path, headers, body).await
}

/// A connection to the sidecar on 127.0.0.1 from the loopback address `from` (any
/// 127.0.0.x), so that tests can be several clients to the per-address limits.
pub async fn tcp_from(from: &str, port: u16) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(from.parse().unwrap(), 0))?;
    socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
}

/// `http`, from the loopback address `from`.
pub async fn http_from(
    from: &str,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 30 s");
    let request = async {
        let mut s = tcp_from(from, port).await?;
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(HTTP_DEADLINE, request)
        .await
        .map_err(|_| timed_out())?
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A Phoenix client speaking one serializer.
pub struct Client {
    pub ws: Ws,
    pub v2: bool,
    next_ref: u64,
}

pub fn url(port: u16, vsn: &str, apikey: &str) -> String {
    format!("ws://127.0.0.1:{port}/realtime/v1/websocket?apikey={apikey}&vsn={vsn}&log_level=info")
}

impl Client {
    pub async fn connect(port: u16, vsn: &str) -> Client {
        Self::connect_with(port, vsn, &anon_key()).await
    }

    pub async fn connect_with(port: u16, vsn: &str, apikey: &str) -> Client {
        let (ws, _) = connect_async(url(port, vsn, apikey))
            .await
            .expect("websocket connect");
        Self::over(ws, vsn)
    }

    /// A client connecting from the loopback address `from`; the upgrade's refusal (its
    /// HTTP status and body) when the sidecar refuses it.
    pub async fn connect_from(from: &str, port: u16, vsn: &str) -> Result<Client, (u16, String)> {
        Self::connect_from_with(from, port, vsn, &anon_key()).await
    }

    /// `connect_from` with `apikey` as the socket's key.
    pub async fn connect_from_with(
        from: &str,
        port: u16,
        vsn: &str,
        apikey: &str,
    ) -> Result<Client, (u16, String)> {
        let stream = tcp_from(from, port).await.expect("tcp connect");
        match tokio_tungstenite::client_async(url(port, vsn, apikey), MaybeTlsStream::Plain(stream))
            .await
        {
            Ok((ws, _)) => Ok(Self::over(ws, vsn)),
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err((
                r.status().as_u16(),
                String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned(),
            )),
            Err(e) => panic!("websocket connect: {e}"),
        }
    }

    /// A client from the loopback address `from` whose request says, in `X-Forwarded-For`,
    /// that it comes from `forwarded` (believed when `from` is a trusted proxy), with
    /// `apikey` as the socket's key.
    pub async fn connect_forwarded(
        from: &str,
        forwarded: &str,
        port: u16,
        vsn: &str,
        apikey: &str,
    ) -> Result<Client, (u16, String)> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let stream = tcp_from(from, port).await.expect("tcp connect");
        let mut request = url(port, vsn, apikey).into_client_request().unwrap();
        request
            .headers_mut()
            .insert("x-forwarded-for", forwarded.parse().unwrap());
        match tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(stream)).await {
            Ok((ws, _)) => Ok(Self::over(ws, vsn)),
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err((
                r.status().as_u16(),
                String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned(),
            )),
            Err(e) => panic!("websocket connect: {e}"),
        }
    }

    /// A client whose kernel receive buffer is small and fixed (no autotuning), so that not
    /// reading backs up into the server quickly.
    pub async fn connect_small_buffer(port: u16, vsn: &str) -> Client {
        Self::connect_buffered("127.0.0.1", port, vsn, 64 * 1024).await
    }

    /// A client from the loopback address `from` whose kernel receive buffer is small and
    /// fixed: one that stops reading backs up into the server after a few kilobytes.
    pub async fn connect_from_small_buffer(from: &str, port: u16, vsn: &str) -> Client {
        Self::connect_buffered(from, port, vsn, 4096).await
    }

    /// A client from `from` whose kernel receive buffer is fixed at `bytes`.
    async fn connect_buffered(from: &str, port: u16, vsn: &str, bytes: u32) -> Client {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        socket
            .bind(std::net::SocketAddr::new(from.parse().unwrap(), 0))
            .unwrap();
        let stream = socket
            .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .expect("tcp connect");
        let (ws, _) = tokio_tungstenite::client_async(
            url(port, vsn, &anon_key()),
            MaybeTlsStream::Plain(stream),
        )
        .await
        .expect("websocket connect");
        Self::over(ws, vsn)
    }

    fn over(ws: Ws, vsn: &str) -> Client {
        Client {
            ws,
            v2: vsn == "2.0.0",
            next_ref: 1,
        }
    }

    pub async fn send_raw(&mut self, m: Message) {
        self.ws.send(m).await.unwrap();
    }

    /// Sends a frame in this client's serializer; returns its ref.
    pub async fn push(
        &mut self,
        join_ref: Option<&str>,
        topic: &str,
        event: &str,
        payload: Value,
    ) -> String {
        let r = self.next_ref.to_string();
        self.next_ref += 1;
        let text = if self.v2 {
            json!([join_ref, r, topic, event, payload]).to_string()
        } else {
            json!({"join_ref": join_ref, "ref": r, "topic": topic, "event": event, "payload": payload}).to_string()
        };
        self.ws.send(Message::text(text)).await.unwrap();
        r
    }

    /// Pushes a client broadcast (a text frame) on a joined channel; returns its ref.
    pub async fn broadcast(&mut self, topic: &str, event: &str, payload: Value) -> String {
        let body = json!({"type": "broadcast", "event": event, "payload": payload});
        self.push(Some("1"), topic, "broadcast", body).await
    }

    /// Next frame as JSON (text frames) or the raw binary, within `secs`.
    pub async fn next(&mut self, secs: u64) -> Option<Message> {
        match tokio::time::timeout(Duration::from_secs(secs), self.ws.next()).await {
            Ok(Some(Ok(m))) => Some(m),
            _ => None,
        }
    }

    /// Reads frames for at most `secs` until a presence frame names `key` (`presence_names`).
    pub async fn sees_presence_of(&mut self, key: &str, secs: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match tokio::time::timeout(left, self.next_json(secs)).await {
                Ok(Some(frame)) if presence_names(&frame, key) => return true,
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
        false
    }

    /// Text frames normalized to {join_ref, ref, topic, event, payload}.
    pub async fn next_json(&mut self, secs: u64) -> Option<Value> {
        loop {
            match self.next(secs).await? {
                Message::Text(t) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    return Some(if self.v2 {
                        json!({"join_ref": v[0], "ref": v[1], "topic": v[2], "event": v[3], "payload": v[4]})
                    } else {
                        v
                    });
                }
                Message::Ping(_) | Message::Pong(_) => continue,
                other => panic!("expected a text frame, got {other:?}"),
            }
        }
    }

    /// Waits for the reply to `reference`, passing over anything else (broadcasts included).
    pub async fn reply(&mut self, reference: &str) -> Value {
        loop {
            let Message::Text(t) = self.next(10).await.expect("reply within 10 s") else {
                continue;
            };
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            let (r, event, payload) = if self.v2 {
                (&v[1], &v[3], &v[4])
            } else {
                (&v["ref"], &v["event"], &v["payload"])
            };
            if event == "phx_reply" && r == reference {
                return payload.clone();
            }
        }
    }

    pub async fn join(&mut self, topic: &str, config: Value) -> Value {
        let r = self
            .push(Some("1"), topic, "phx_join", json!({ "config": config }))
            .await;
        self.reply(&r).await
    }

    /// Joins with `postgres_changes` bindings of which `n` cannot be served: the join is
    /// answered ok, and each of those is told in a `system` message (Supabase's words, then
    /// ours); returns those messages' texts, in the client's order.
    pub async fn join_unserved(&mut self, topic: &str, config: Value, n: usize) -> Vec<String> {
        let reply = self.join(topic, config).await;
        assert_eq!(reply["status"], "ok", "{reply}");
        let mut told = Vec::new();
        while told.len() < n {
            let m = self
                .next_json(10)
                .await
                .expect("a system message within 10 s");
            let p = &m["payload"];
            if m["event"] == "system"
                && p["extension"] == "postgres_changes"
                && p["status"] == "error"
            {
                told.push(p["message"].as_str().unwrap().to_owned());
            }
        }
        told
    }

    pub async fn join_public(&mut self, topic: &str) {
        let reply = self
            .join(
                topic,
                json!({"broadcast": {"self": false, "ack": false}, "private": false}),
            )
            .await;
        assert_eq!(reply["status"], "ok", "join {topic}: {reply}");
    }
}

/// Decodes a kind-4 user broadcast: (topic, event, metadata, encoding, payload).
pub fn decode_kind4(b: &[u8]) -> (String, String, String, u8, Vec<u8>) {
    assert_eq!(b[0], 4, "kind 4 frame");
    let (t, e, m, enc) = (b[1] as usize, b[2] as usize, b[3] as usize, b[4]);
    let s = |from: usize, n: usize| String::from_utf8(b[from..from + n].to_vec()).unwrap();
    (
        s(5, t),
        s(5 + t, e),
        s(5 + t + e, m),
        enc,
        b[5 + t + e + m..].to_vec(),
    )
}

/// A broadcast's payload without its `meta` (the position, which every test need not check).
pub fn without_meta(payload: &Value) -> Value {
    let mut p = payload.clone();
    if let Some(o) = p.as_object_mut() {
        o.remove("meta");
    }
    p
}

/// Sends a public message from the database (`realtime.send`).
pub async fn send(db: &tokio_postgres::Client, payload: Value, event: &str, topic: &str) {
    db.execute(
        "SELECT realtime.send($1::text::jsonb, $2, $3, false)",
        &[&payload.to_string(), &event, &topic],
    )
    .await
    .unwrap();
}
