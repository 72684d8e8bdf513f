//! Twenty-three attackers at fixed rates against one sidecar, each from its own loopback address,
//! for the soak of `pgbench/soak.py`: every attack of the hardening issue at once, while the
//! ordinary subscribers of the other load generators measure what it costs them. The
//! attackers hold the public anon key, except the bulk writer and the persisting user, who
//! are authenticated. Each counts what it sent and how it was answered (accepted, refused
//! with which reason, cut off), and one JSON line is printed at the end.
//!
//! Every loop is bounded by `--seconds`; everything goes to the one sidecar on 127.0.0.1
//! and the one database given.

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// The sidecar's port on 127.0.0.1.
    #[arg(long)]
    port: u16,
    #[arg(long)]
    jwt_secret: String,
    /// The database (the bulk writer's inserts).
    #[arg(long)]
    dsn: String,
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The queue's epoch (`meta.epoch`, unix microseconds), for the resumes from seq 0.
    #[arg(long)]
    epoch: i64,
    /// The authenticated user of the bulk writer and the persisting user.
    #[arg(long, default_value = "5e000000-0000-4000-8000-000000000001")]
    user: String,
    /// The ordinary subscribers' busiest topic, which the slow reader joins.
    #[arg(long, default_value = "bench-0")]
    busy_topic: String,
    /// The first attacker's address; the others follow (127.0.0.N+1, ...).
    #[arg(long, default_value_t = 10)]
    first_address: u8,
    /// Attackers to leave out, by name (to tell which one costs the others what).
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
    /// Only these attackers, by name (all when empty).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

type Ws = WebSocketStream<TcpStream>;

/// What one attacker did and was told.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    accepted: AtomicU64,
    /// Refusals and cut-offs by their reason (at most 20 distinct reasons kept).
    refused: Mutex<BTreeMap<String, u64>>,
    connect_failures: AtomicU64,
}

impl Tally {
    fn refuse(&self, why: &str) {
        let mut r = self.refused.lock().unwrap();
        let why: String = why.chars().take(120).collect();
        if r.len() < 20 || r.contains_key(&why) {
            *r.entry(why).or_insert(0) += 1;
        }
    }

    fn json(&self, name: &str, address: IpAddr) -> Value {
        json!({
            "attacker": name,
            "address": address.to_string(),
            "sent": self.sent.load(Relaxed),
            "accepted": self.accepted.load(Relaxed),
            "refused": *self.refused.lock().unwrap(),
            "connect_failures": self.connect_failures.load(Relaxed),
        })
    }
}

struct Ctx {
    a: Args,
    deadline: Instant,
}

impl Ctx {
    fn token(&self, role: &str) -> String {
        let exp = now_s() + 3600;
        let claims = match role {
            "anon" => json!({"role": "anon", "exp": exp, "iss": "supabase"}),
            _ => json!({"role": role, "sub": self.a.user, "exp": exp}),
        };
        let key = EncodingKey::from_secret(self.a.jwt_secret.as_bytes());
        encode(&Header::default(), &claims, &key).unwrap()
    }

    fn live(&self) -> bool {
        Instant::now() < self.deadline
    }

    async fn tcp(&self, from: IpAddr) -> std::io::Result<TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(from, 0))?;
        let to = SocketAddr::from(([127, 0, 0, 1], self.a.port));
        tokio::time::timeout(Duration::from_secs(5), socket.connect(to))
            .await
            .map_err(|_| std::io::Error::other("connect timed out"))?
    }

    /// A WebSocket from `from`, or None (counted) when the sidecar refuses it.
    async fn ws(&self, from: IpAddr, vsn: &str, role: &str, t: &Tally) -> Option<Ws> {
        let url = format!(
            "ws://127.0.0.1:{}/realtime/v1/websocket?apikey={}&vsn={vsn}",
            self.a.port,
            self.token(role)
        );
        let stream = match self.tcp(from).await {
            Ok(s) => s,
            Err(_) => {
                t.connect_failures.fetch_add(1, Relaxed);
                return None;
            }
        };
        match tokio_tungstenite::client_async(url, stream).await {
            Ok((ws, _)) => Some(ws),
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                t.refuse(&format!("upgrade {}", r.status().as_u16()));
                None
            }
            Err(_) => {
                t.connect_failures.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// One HTTP/1.1 POST from `from`; the status (0 when it could not be sent or answered).
    async fn post(&self, from: IpAddr, path: &str, token: &str, ctype: &str, body: &[u8]) -> u16 {
        let Ok(mut s) = self.tcp(from).await else {
            return 0;
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let exchange = async {
            s.write_all(head.as_bytes()).await?;
            s.write_all(body).await?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await?;
            Ok::<_, std::io::Error>(buf)
        };
        match tokio::time::timeout(Duration::from_secs(15), exchange).await {
            Ok(Ok(buf)) => String::from_utf8_lossy(&buf)
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
            _ => 0,
        }
    }
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A 1.0.0 frame.
fn frame(topic: &str, event: &str, payload: Value, r: u64, join_ref: Option<&str>) -> Message {
    Message::text(
        json!({"topic": topic, "event": event, "payload": payload, "ref": r.to_string(), "join_ref": join_ref})
            .to_string(),
    )
}

/// Reads everything the sidecar says on `ws` and counts its answers, until the socket ends.
fn count_answers(mut read: futures_util::stream::SplitStream<Ws>, t: Arc<Tally>) {
    tokio::spawn(async move {
        while let Some(Ok(m)) = read.next().await {
            match m {
                Message::Text(text) => {
                    let Ok(v) = serde_json::from_str::<Value>(&text) else {
                        continue;
                    };
                    let p = &v["payload"];
                    match v["event"].as_str() {
                        Some("phx_reply") if p["status"] == "ok" => {
                            t.accepted.fetch_add(1, Relaxed);
                        }
                        Some("phx_reply") => t.refuse(
                            p["response"]["reason"]
                                .as_str()
                                .unwrap_or("error reply without reason"),
                        ),
                        Some("system") if p["status"] == "error" => {
                            t.refuse(&format!("system: {}", p["message"].as_str().unwrap_or("")))
                        }
                        _ => {}
                    }
                }
                Message::Close(Some(c)) => {
                    t.refuse(&format!("closed {}: {}", u16::from(c.code), c.reason))
                }
                _ => {}
            }
        }
    });
}

/// Every `period`, while the run lasts: a fresh connection from `from` sends `frames(i)`
/// (the answers counted), held for `hold` or until the sidecar ends it.
async fn join_loop(
    cx: Arc<Ctx>,
    t: Arc<Tally>,
    from: IpAddr,
    period: Duration,
    hold: Duration,
    frames: impl Fn(u64) -> Vec<Message> + Send + Sync + 'static,
) {
    let frames = Arc::new(frames);
    let mut tick = tokio::time::interval(period);
    let mut i = 0u64;
    while cx.live() {
        tick.tick().await;
        i += 1;
        let (cx, t, frames) = (cx.clone(), t.clone(), frames.clone());
        tokio::spawn(async move {
            let Some(ws) = cx.ws(from, "1.0.0", "anon", &t).await else {
                return;
            };
            let (mut write, read) = ws.split();
            count_answers(read, t.clone());
            for f in frames(i) {
                t.sent.fetch_add(1, Relaxed);
                if write.send(f).await.is_err() {
                    return;
                }
            }
            let left = cx.deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(hold.min(left)).await;
        });
    }
}

/// One connection pushing `push(i)` on a joined channel at `rate` a second; rejoins (and
/// reconnects) when the sidecar closes either.
async fn push_loop(
    cx: Arc<Ctx>,
    t: Arc<Tally>,
    from: IpAddr,
    vsn: &'static str,
    join: Value,
    rate: f64,
    push: impl Fn(u64, &str) -> Message + Send + Sync + 'static,
) {
    let mut i = 0u64;
    while cx.live() {
        let Some(ws) = cx.ws(from, vsn, "anon", &t).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let (mut write, read) = ws.split();
        if vsn == "2.0.0" {
            count_answers_v2(read, t.clone());
        } else {
            count_answers(read, t.clone());
        }
        let topic = format!("realtime:attack-{}-{i}", from);
        let join_frame = if vsn == "2.0.0" {
            Message::text(json!(["1", "1", topic, "phx_join", join]).to_string())
        } else {
            frame(&topic, "phx_join", join.clone(), 1, Some("1"))
        };
        if write.send(join_frame).await.is_err() {
            continue;
        }
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        while cx.live() {
            tick.tick().await;
            i += 1;
            t.sent.fetch_add(1, Relaxed);
            if write.send(push(i, &topic)).await.is_err() {
                break;
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let cx = Arc::new(Ctx {
        deadline: Instant::now() + Duration::from_secs(a.seconds),
        a: a.clone(),
    });
    let mut attackers: Vec<(&'static str, IpAddr, Arc<Tally>)> = Vec::new();
    let mut tasks = Vec::new();
    let mut next = a.first_address;
    // An attacker left out (`--skip`, `--only`) keeps its address but gets a run that is
    // already over: every attacker checks `live()` before it sends anything.
    let over = Arc::new(Ctx {
        deadline: Instant::now(),
        a: a.clone(),
    });
    let mut enlist = |name: &'static str| {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, next));
        next += 1;
        let t = Arc::new(Tally::default());
        let wanted = (a.only.is_empty() || a.only.iter().any(|o| o == name))
            && !a.skip.iter().any(|s| s == name);
        if wanted {
            attackers.push((name, from, t.clone()));
        }
        (if wanted { cx.clone() } else { over.clone() }, t, from)
    };
    let sec = Duration::from_secs(1);

    // 1-2. A NUL in a binding's table, and in its schema (once stopped every new join).
    for (name, schema, table) in [
        ("nul-table", "public", "a\u{0}b"),
        ("nul-schema", "p\u{0}", "t"),
    ] {
        let (cx, t, from) = enlist(name);
        tasks.push(tokio::spawn(join_loop(cx, t, from, sec, sec, move |i| {
            let pc = json!([{"event": "*", "schema": schema, "table": table}]);
            vec![frame(
                &format!("realtime:nul-{i}"),
                "phx_join",
                json!({"config": {"postgres_changes": pc}}),
                1,
                Some("1"),
            )]
        })));
    }
    // 3-4. Never-matching bindings: 25 joins of 5,000 schema-wide bindings per connection.
    for name in ["never-match-a", "never-match-b"] {
        let (cx, t, from) = enlist(name);
        let bindings: Vec<Value> = (0..5000)
            .map(|_| json!({"event": "*", "schema": "*", "filter": "zz=eq.1"}))
            .collect();
        let join = json!({"config": {"postgres_changes": bindings}});
        tasks.push(tokio::spawn(join_loop(
            cx,
            t,
            from,
            Duration::from_secs(5),
            Duration::from_secs(5),
            move |i| {
                (0..25)
                    .map(|j| {
                        frame(
                            &format!("realtime:nm-{i}-{j}"),
                            "phx_join",
                            join.clone(),
                            j + 1,
                            Some(&(j + 1).to_string()),
                        )
                    })
                    .collect()
            },
        )));
    }
    // 5. A join naming more tables than filtering can upload (once switched filtering off).
    {
        let (cx, t, from) = enlist("many-tables");
        let bindings: Vec<Value> = (0..17_000)
            .map(|k| json!({"event": "INSERT", "schema": "public", "table": format!("t{k}")}))
            .collect();
        let join = json!({"config": {"postgres_changes": bindings}});
        tasks.push(tokio::spawn(join_loop(
            cx,
            t,
            from,
            Duration::from_secs(5),
            sec,
            move |i| {
                vec![frame(
                    &format!("realtime:many-{i}"),
                    "phx_join",
                    join.clone(),
                    1,
                    Some("1"),
                )]
            },
        )));
    }
    // 6. A 200 KB presence key, and a track under it.
    {
        let (cx, t, from) = enlist("presence-key");
        tasks.push(tokio::spawn(join_loop(cx, t, from, sec, sec, |i| {
            let topic = format!("realtime:pk-{i}");
            let join =
                json!({"config": {"presence": {"key": "k".repeat(200_000), "enabled": true}}});
            let track = json!({"type": "presence", "event": "track", "payload": {"x": 1}});
            vec![
                frame(&topic, "phx_join", join, 1, Some("1")),
                frame(&topic, "presence", track, 2, Some("1")),
            ]
        })));
    }
    // 7. A presence flood: tracks as fast as one channel is let.
    {
        let (cx, t, from) = enlist("presence-flood");
        let join = json!({"config": {"presence": {"key": "", "enabled": true}}});
        tasks.push(tokio::spawn(push_loop(
            cx,
            t,
            from,
            "1.0.0",
            join,
            500.0,
            |i, topic| {
                frame(
                    topic,
                    "presence",
                    json!({"type": "presence", "event": "track", "payload": {"i": i}}),
                    i + 1,
                    Some("1"),
                )
            },
        )));
    }
    // 8. Broadcasts with a NUL in the event.
    {
        let (cx, t, from) = enlist("nul-event");
        let join = json!({"config": {"broadcast": {"ack": true}}});
        tasks.push(tokio::spawn(push_loop(
            cx,
            t,
            from,
            "1.0.0",
            join,
            20.0,
            |i, topic| {
                frame(
                    topic,
                    "broadcast",
                    json!({"type": "broadcast", "event": "a\u{0}b", "payload": {}}),
                    i + 1,
                    Some("1"),
                )
            },
        )));
    }
    // 9. 2.0.0 binary pushes whose JSON payload is not JSON.
    {
        let (cx, t, from) = enlist("bad-binary");
        let join = json!({"config": {"broadcast": {"ack": true}}});
        tasks.push(tokio::spawn(push_loop(
            cx,
            t,
            from,
            "2.0.0",
            join,
            20.0,
            |i, topic| {
                let (jr, r, ev, payload) = ("1", (i + 1).to_string(), "e", b"{not json".to_vec());
                let mut f = vec![
                    3u8,
                    jr.len() as u8,
                    r.len() as u8,
                    topic.len() as u8,
                    ev.len() as u8,
                    0,
                    1,
                ];
                for part in [jr.as_bytes(), r.as_bytes(), topic.as_bytes(), ev.as_bytes()] {
                    f.extend_from_slice(part);
                }
                f.extend_from_slice(&payload);
                Message::binary(f)
            },
        )));
    }
    // 10-11. REST floods: 18,000 messages a request (a 1 MB body), four requests at a time
    // (MAX_REST_MESSAGES_PER_REQUEST refuses more messages whatever the body's size).
    for name in ["rest-flood-a", "rest-flood-b"] {
        let (cx, t, from) = enlist(name);
        let messages: Vec<Value> = (0..18_000)
            .map(|_| json!({"topic": "f", "event": "e", "payload": {}}))
            .collect();
        let body = Arc::new(json!({ "messages": messages }).to_string().into_bytes());
        for _ in 0..4 {
            let (cx, t, body) = (cx.clone(), t.clone(), body.clone());
            tasks.push(tokio::spawn(post_loop(cx, t, from, body)));
        }
    }
    // 12. REST events with a NUL (`%00`).
    {
        let (cx, t, from) = enlist("rest-nul-event");
        tasks.push(tokio::spawn(async move {
            let token = cx.token("anon");
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while cx.live() {
                tick.tick().await;
                t.sent.fetch_add(1, Relaxed);
                match cx
                    .post(
                        from,
                        "/api/broadcast/t/events/a%00b",
                        &token,
                        "application/json",
                        b"{}",
                    )
                    .await
                {
                    202 => {
                        t.accepted.fetch_add(1, Relaxed);
                    }
                    s => t.refuse(&format!("http {s}")),
                }
            }
        }));
    }
    // 13-14. Resumes from seq 0 of a topic with a long retained history, never read.
    for name in ["history-zero-a", "history-zero-b"] {
        let (cx, t, from) = enlist(name);
        let epoch = a.epoch;
        tasks.push(tokio::spawn(join_loop(
            cx,
            t,
            from,
            Duration::from_secs(2),
            Duration::from_secs(10),
            move |i| {
                let join = json!({"config": {"broadcast": {"resume": {"epoch": epoch, "seq": 0}}}});
                vec![frame(
                    "realtime:soak-history",
                    "phx_join",
                    join,
                    i,
                    Some("1"),
                )]
            },
        )));
    }
    // 15. A slow reader on the ordinary subscribers' busiest topic: joins, never reads.
    {
        let (cx, t, from) = enlist("slow-reader");
        let topic = format!("realtime:{}", a.busy_topic);
        tasks.push(tokio::spawn(async move {
            while cx.live() {
                let Some(mut ws) = cx.ws(from, "1.0.0", "anon", &t).await else {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                };
                t.sent.fetch_add(1, Relaxed);
                let _ = ws
                    .send(frame(
                        &topic,
                        "phx_join",
                        json!({"config": {}}),
                        1,
                        Some("1"),
                    ))
                    .await;
                // Never reads: the sidecar's bounds cut it off; then again.
                let left = cx.deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(Duration::from_secs(10).min(left)).await;
                drop(ws);
            }
        }));
    }
    // 16. Huge join_refs.
    {
        let (cx, t, from) = enlist("join-ref");
        let join = json!({"config": {}});
        tasks.push(tokio::spawn(push_loop(
            cx,
            t,
            from,
            "1.0.0",
            join,
            10.0,
            |i, topic| {
                frame(
                    topic,
                    "broadcast",
                    json!({"type": "broadcast", "event": "e", "payload": {}}),
                    i + 1,
                    Some(&"j".repeat(100_000)),
                )
            },
        )));
    }
    // 17. One address holding as many connections as it can get.
    {
        let (cx, t, from) = enlist("connection-hog");
        tasks.push(tokio::spawn(async move {
            let mut held = Vec::new();
            for _ in 0..1500 {
                if !cx.live() {
                    break;
                }
                t.sent.fetch_add(1, Relaxed);
                if let Some(ws) = cx.ws(from, "1.0.0", "anon", &t).await {
                    t.accepted.fetch_add(1, Relaxed);
                    held.push(ws);
                }
            }
            let left = cx.deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(left).await;
        }));
    }
    // 18. A bulk writer (authenticated): 10,000 rows at once into a table whose SELECT
    // policy is slow, with itself subscribed to the table's changes.
    {
        let (cx, t, from) = enlist("bulk-writer");
        tasks.push(tokio::spawn(async move {
            if !cx.live() {
                return;
            }
            let Some(ws) = cx.ws(from, "1.0.0", "authenticated", &t).await else {
                return;
            };
            let (mut write, read) = ws.split();
            count_answers(read, t.clone());
            let pc = json!([{"event": "INSERT", "schema": "public", "table": "soak_costly"}]);
            let _ = write
                .send(frame("realtime:bulk", "phx_join", json!({"config": {"postgres_changes": pc}, "access_token": cx.token("authenticated")}), 1, Some("1")))
                .await;
            let Ok((db, conn)) = tokio_postgres::connect(&cx.a.dsn, tokio_postgres::NoTls).await else {
                t.connect_failures.fetch_add(1, Relaxed);
                return;
            };
            tokio::spawn(conn);
            let mut tick = tokio::time::interval(Duration::from_secs(15));
            while cx.live() {
                tick.tick().await;
                t.sent.fetch_add(1, Relaxed);
                match db.execute("INSERT INTO soak_costly (n) SELECT g FROM generate_series(1, 10000) g", &[]).await {
                    Ok(_) => t.accepted.fetch_add(1, Relaxed),
                    Err(e) => {
                        t.refuse(&format!("insert: {e}"));
                        0
                    }
                };
            }
            let _ = write.close().await;
        }));
    }
    // 19. A persisting user (authenticated): 1 KB kept broadcasts on private topics it may
    // write (a prefix policy), as fast as a connection is let, a new topic every 500: a
    // topic's quota alone let it keep MAX_PERSISTED_*_PER_TOPIC in every topic it named
    // (issue 39, M4); its sender's quota stops it.
    {
        let (cx, t, from) = enlist("persister");
        tasks.push(tokio::spawn(async move {
            while cx.live() {
                let Some(ws) = cx.ws(from, "2.0.0", "authenticated", &t).await else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let (mut write, read) = ws.split();
                count_answers_v2(read, t.clone());
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                let mut i = 0u64;
                let mut topic = String::new();
                let mut jr = String::new();
                while cx.live() {
                    if i.is_multiple_of(500) {
                        jr = (i / 500 + 1).to_string();
                        topic = format!("realtime:soak-persist-{jr}");
                        let join = json!([jr, jr, topic, "phx_join", {"config": {"private": true, "broadcast": {"ack": true}}, "access_token": cx.token("authenticated")}]);
                        if write.send(Message::text(join.to_string())).await.is_err() {
                            break;
                        }
                    }
                    tick.tick().await;
                    i += 1;
                    t.sent.fetch_add(1, Relaxed);
                    let (jr, r, ev, meta) = (jr.as_str(), (i + 1).to_string(), "kept", br#"{"persist":true}"#);
                    let payload = json!({"pad": "p".repeat(1000)}).to_string();
                    let mut f = vec![3u8, jr.len() as u8, r.len() as u8, topic.len() as u8, ev.len() as u8, meta.len() as u8, 1];
                    for part in [jr.as_bytes(), r.as_bytes(), topic.as_bytes(), ev.as_bytes(), meta] {
                        f.extend_from_slice(part);
                    }
                    f.extend_from_slice(payload.as_bytes());
                    if write.send(Message::binary(f)).await.is_err() {
                        break;
                    }
                }
            }
        }));
    }
    // 20. Many channels on one connection, each with one binding, rejoined every second.
    {
        let (cx, t, from) = enlist("many-channels");
        tasks.push(tokio::spawn(join_loop(cx, t, from, sec, sec, |i| {
            (0..150)
                .map(|j| {
                    let pc = json!([{"event": "*", "schema": "public", "table": "bench_changes", "filter": format!("k=eq.{j}")}]);
                    frame(&format!("realtime:mc-{i}-{j}"), "phx_join", json!({"config": {"postgres_changes": pc}}), j + 1, Some(&(j + 1).to_string()))
                })
                .collect()
        })));
    }
    // 21. Many patterns (issue 39, H1) on the ordinary subscribers' table: every second a
    // socket asks for 1,600 distinct `like` conditions in one join (once taken: 16,000 from
    // one socket took a backend to gigabytes), then four joins of sixteen (a connection's
    // MAX_PATTERNS_PER_CONNECTION), held five seconds, so the address holds more than its
    // MAX_PATTERNS_PER_ADDRESS.
    {
        let (cx, t, from) = enlist("many-patterns");
        tasks.push(tokio::spawn(join_loop(
            cx,
            t,
            from,
            sec,
            Duration::from_secs(5),
            |i| {
                let like = |j: u64, b: u64, c: u64| format!("body=like.%{i}-{j}-{b}-{c}%");
                let join = |j: u64, bindings: u64| {
                    let pc: Vec<Value> = (0..bindings)
                        .map(|b| {
                            let f: Vec<String> = (0..16).map(|c| like(j, b, c)).collect();
                            json!({"event": "*", "schema": "public", "table": "bench_changes", "filter": f.join(",")})
                        })
                        .collect();
                    frame(&format!("realtime:pat-{i}-{j}"), "phx_join", json!({"config": {"postgres_changes": pc}}), j + 1, Some(&(j + 1).to_string()))
                };
                let mut frames = vec![join(0, 100)];
                frames.extend((1..=4).map(|j| join(j, 1)));
                frames
            },
        )));
    }
    // 22. A slow resumer of large messages (issue 39, H2): every two seconds a socket
    // resumes from seq 0 a topic of 200 retained messages of 100 KB and reads nothing for
    // ten seconds, so its history stays with the sidecar.
    {
        let (cx, t, from) = enlist("slow-large-resumer");
        let epoch = a.epoch;
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            while cx.live() {
                tick.tick().await;
                let (cx, t) = (cx.clone(), t.clone());
                tokio::spawn(async move {
                    let Some(mut ws) = cx.ws(from, "1.0.0", "anon", &t).await else {
                        return;
                    };
                    t.sent.fetch_add(1, Relaxed);
                    let join =
                        json!({"config": {"broadcast": {"resume": {"epoch": epoch, "seq": 0}}}});
                    let _ = ws
                        .send(frame(
                            "realtime:soak-history-large",
                            "phx_join",
                            join,
                            1,
                            Some("1"),
                        ))
                        .await;
                    let left = cx.deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(Duration::from_secs(10).min(left)).await;
                    drop(ws);
                });
            }
        }));
    }
    // 23. A decode flood (issue 39, H4): 20 UPDATEs a second of a cheap column of a row
    // whose 100 KB value compresses well (each decodes to the whole row), watched by an
    // anonymous channel so that the sidecar decodes them.
    {
        let (cx, t, from) = enlist("decode-flood");
        tasks.push(tokio::spawn(async move {
            if !cx.live() {
                return;
            }
            let Some(ws) = cx.ws(from, "1.0.0", "anon", &t).await else {
                return;
            };
            let (mut write, read) = ws.split();
            count_answers(read, t.clone());
            let pc = json!([{"event": "UPDATE", "schema": "public", "table": "soak_wide"}]);
            let _ = write
                .send(frame(
                    "realtime:wide",
                    "phx_join",
                    json!({"config": {"postgres_changes": pc}}),
                    1,
                    Some("1"),
                ))
                .await;
            let Ok((db, conn)) = tokio_postgres::connect(&cx.a.dsn, tokio_postgres::NoTls).await
            else {
                t.connect_failures.fetch_add(1, Relaxed);
                return;
            };
            tokio::spawn(conn);
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while cx.live() {
                tick.tick().await;
                t.sent.fetch_add(1, Relaxed);
                match db
                    .execute("UPDATE soak_wide SET n = n + 1 WHERE id = 1", &[])
                    .await
                {
                    Ok(_) => t.accepted.fetch_add(1, Relaxed),
                    Err(e) => {
                        t.refuse(&format!("update: {e}"));
                        0
                    }
                };
            }
            let _ = write.close().await;
        }));
    }

    // 24. Slow 5 MB frames (MAX_FRAME_SIZE): eight sockets at a time each announce a frame of
    // 5,000,000 bytes and send it at 256 KB a second, holding what tungstenite gathers; the
    // reading bounds (MAX_READING_BYTES_PER_ADDRESS) close what passes them. Each socket is
    // made again when closed.
    {
        let (cx, t, from) = enlist("slow-5mb-frames");
        for _ in 0..8 {
            let (cx, t) = (cx.clone(), t.clone());
            tasks.push(tokio::spawn(async move {
                while cx.live() {
                    let Some(mut ws) = cx.ws(from, "1.0.0", "anon", &t).await else {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    };
                    t.sent.fetch_add(1, Relaxed);
                    let tcp = ws.get_mut();
                    // A text frame's header announcing 5,000,000 bytes, masked with a zero key.
                    let mut header = vec![0x81u8, 0x80 | 127];
                    header.extend(5_000_000u64.to_be_bytes());
                    header.extend([0u8; 4]);
                    let chunk = vec![b'x'; 64 * 1024];
                    let mut sent = 0;
                    let mut ok = tcp.write_all(&header).await.is_ok();
                    while ok && cx.live() && sent < 5_000_000 {
                        let n = chunk.len().min(5_000_000 - sent);
                        ok = tcp.write_all(&chunk[..n]).await.is_ok();
                        sent += n;
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    // Closed by the sidecar, or the whole frame sent (it is no Phoenix frame).
                    let mut answer = vec![0u8; 512];
                    match tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut answer))
                        .await
                    {
                        Ok(Ok(n)) if n > 4 && answer[0] == 0x88 => {
                            let code = u16::from_be_bytes([answer[2], answer[3]]);
                            let why = String::from_utf8_lossy(&answer[4..n]).into_owned();
                            t.refuse(&format!("closed {code}: {why}"));
                        }
                        _ if sent >= 5_000_000 => {
                            t.accepted.fetch_add(1, Relaxed);
                        }
                        _ => {}
                    }
                }
            }));
        }
    }
    // 25. Large broadcasts (3,000 KB, realtime.max_message_size) from a socket as fast as they
    // are answered, to a topic a second socket of the same address joined and never reads:
    // the relay's bytes (MAX_RELAY_BYTES_PER_ADDRESS) and the large frames queued for an
    // address (MAX_OUTBOUND_BYTES_PER_ADDRESS).
    {
        let (cx, t, from) = enlist("big-broadcasts");
        tasks.push(tokio::spawn(async move {
            if !cx.live() {
                return;
            }
            let topic = "realtime:big-f";
            let join = json!({"config": {"broadcast": {"ack": true, "self": false}}});
            if let Some(mut reader) = cx.ws(from, "1.0.0", "anon", &t).await {
                let _ = reader
                    .send(frame(topic, "phx_join", join.clone(), 1, Some("1")))
                    .await;
                // Held, never read, until the run ends.
                let hold = cx.deadline.saturating_duration_since(Instant::now());
                tokio::spawn(async move {
                    tokio::time::sleep(hold).await;
                    drop(reader);
                });
            }
            let Some(ws) = cx.ws(from, "1.0.0", "anon", &t).await else {
                return;
            };
            let (mut write, read) = ws.split();
            count_answers(read, t.clone());
            let _ = write
                .send(frame(topic, "phx_join", join, 1, Some("1")))
                .await;
            let payload = json!({"x": "x".repeat(3_000_000)});
            let mut r = 2;
            while cx.live() {
                t.sent.fetch_add(1, Relaxed);
                let push = json!({"type": "broadcast", "event": "big", "payload": payload});
                if write
                    .send(frame(topic, "broadcast", push, r, Some("1")))
                    .await
                    .is_err()
                {
                    break;
                }
                r += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    // 26. REST bodies of one 3,000 KB message, four requests at a time: the bodies being read
    // and the relay's bytes of one address.
    {
        let (cx, t, from) = enlist("rest-big-bodies");
        let body = Arc::new(
            json!({"messages": [{"topic": "f", "event": "e", "payload": {"x": "x".repeat(3_000_000)}}]})
                .to_string()
                .into_bytes(),
        );
        for _ in 0..4 {
            let (cx, t, body) = (cx.clone(), t.clone(), body.clone());
            tasks.push(tokio::spawn(post_loop(cx, t, from, body)));
        }
    }

    for task in tasks {
        let _ = tokio::time::timeout(
            cx.deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(20),
            task,
        )
        .await;
    }
    let report: Vec<Value> = attackers
        .iter()
        .map(|(name, from, t)| t.json(name, *from))
        .collect();
    println!("{}", json!({ "attackers": report }));
    std::process::exit(0);
}

/// Posts `body` to the REST batch route from `from`, one request after another, while the
/// run lasts, as the anonymous role.
async fn post_loop(cx: Arc<Ctx>, t: Arc<Tally>, from: IpAddr, body: Arc<Vec<u8>>) {
    let token = cx.token("anon");
    while cx.live() {
        t.sent.fetch_add(1, Relaxed);
        match cx
            .post(from, "/api/broadcast", &token, "application/json", &body)
            .await
        {
            202 => {
                t.accepted.fetch_add(1, Relaxed);
            }
            0 => {
                t.connect_failures.fetch_add(1, Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            s => t.refuse(&format!("http {s}")),
        }
    }
}

/// `count_answers` for a 2.0.0 socket (JSON arrays).
fn count_answers_v2(mut read: futures_util::stream::SplitStream<Ws>, t: Arc<Tally>) {
    tokio::spawn(async move {
        while let Some(Ok(m)) = read.next().await {
            match m {
                Message::Text(text) => {
                    let Ok(v) = serde_json::from_str::<Value>(&text) else {
                        continue;
                    };
                    let p = &v[4];
                    match v[3].as_str() {
                        Some("phx_reply") if p["status"] == "ok" => {
                            t.accepted.fetch_add(1, Relaxed);
                        }
                        Some("phx_reply") => t.refuse(
                            p["response"]["reason"]
                                .as_str()
                                .unwrap_or("error reply without reason"),
                        ),
                        Some("system") if p["status"] == "error" => {
                            t.refuse(&format!("system: {}", p["message"].as_str().unwrap_or("")))
                        }
                        _ => {}
                    }
                }
                Message::Close(Some(c)) => {
                    t.refuse(&format!("closed {}: {}", u16::from(c.code), c.reason))
                }
                _ => {}
            }
        }
    });
}
