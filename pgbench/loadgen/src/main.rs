//! WebSocket load generator for the sidecar: opens many subscriber connections speaking
//! Supabase Realtime's protocol, has Postgres send messages at a fixed rate, and measures
//! commit-to-receive latency (the timestamp is taken in the database, with clock_timestamp(),
//! as the message is sent) and deliveries per second. Prints one JSON line of results.

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser, Debug)]
struct Args {
    /// Sidecar base URL, e.g. ws://127.0.0.1:4000
    #[arg(long)]
    url: String,
    /// JWT secret the sidecar verifies tokens with.
    #[arg(long)]
    jwt_secret: String,
    /// Postgres connection string of the database pg_realtime runs in.
    #[arg(long)]
    dsn: String,
    #[arg(long, default_value = "2.0.0")]
    vsn: String,
    #[arg(long, default_value_t = 1)]
    subscribers: usize,
    #[arg(long, default_value = "load")]
    topic: String,
    /// Messages per second sent by the database.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Padding added to each payload, in bytes.
    #[arg(long, default_value_t = 64)]
    pad: usize,
    /// A label for the result line.
    #[arg(long, default_value = "")]
    label: String,
    /// Join private channels instead: subscriber i acts as member user (i % N) + 1 (role
    /// authenticated, sub = member_uuid(u)) on topic room:(u % 1000).
    #[arg(long)]
    private_members: Option<u64>,
}

/// The uuid of benchmark member `u` (pgbench/joins_setup.sql makes the same ones).
fn member_uuid(u: u64) -> String {
    format!("{u:08x}-0000-4000-8000-{u:012x}")
}

#[derive(Deserialize)]
struct Stamp {
    t: i64,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// The database timestamp in a delivered broadcast, from either serializer.
fn stamp(msg: &Message) -> Option<i64> {
    match msg {
        Message::Binary(b) if b.first() == Some(&4) && b.len() > 5 => {
            let start = 5 + b[1] as usize + b[2] as usize + b[3] as usize;
            serde_json::from_slice::<Stamp>(b.get(start..)?)
                .ok()
                .map(|s| s.t)
        }
        Message::Text(t) => {
            let v: Value = serde_json::from_str(t.as_str()).ok()?;
            let p = if v.is_array() { &v[4] } else { &v["payload"] };
            p["payload"]["t"].as_i64()
        }
        _ => None,
    }
}

struct Totals {
    received: AtomicU64,
    connected: AtomicU64,
    joined: AtomicU64,
    join_errors: AtomicU64,
    failed: AtomicU64,
    latency: Mutex<Histogram<u64>>,
}

async fn subscriber(
    args: Arc<Args>,
    index: u64,
    apikey: String,
    totals: Arc<Totals>,
    mut go: tokio::sync::watch::Receiver<bool>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    deadline: Instant,
) {
    let url = format!(
        "{}/realtime/v1/websocket?apikey={apikey}&vsn={}",
        args.url, args.vsn
    );
    let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url).await else {
        totals.failed.fetch_add(1, Relaxed);
        return;
    };
    // Everyone connects first; the joins all go out together, so joins/s measures joining.
    totals.connected.fetch_add(1, Relaxed);
    if go.wait_for(|&g| g).await.is_err() {
        return;
    }
    let (topic, join) = match args.private_members {
        None => (
            format!("realtime:{}", args.topic),
            json!({"config": {"broadcast": {"self": false, "ack": false}, "private": false}}),
        ),
        Some(n) => {
            let u = index % n + 1;
            let token = jsonwebtoken::encode(
                &jsonwebtoken::Header::default(),
                &json!({"role": "authenticated", "sub": member_uuid(u), "exp": now_us() / 1_000_000 + 3600}),
                &jsonwebtoken::EncodingKey::from_secret(args.jwt_secret.as_bytes()),
            )
            .unwrap();
            (
                format!("realtime:room:{}", u % 1000),
                json!({"config": {"broadcast": {"self": false, "ack": false}, "private": true}, "access_token": token}),
            )
        }
    };
    let frame = if args.vsn == "2.0.0" {
        json!(["1", "1", topic, "phx_join", join]).to_string()
    } else {
        json!({"join_ref": "1", "ref": "1", "topic": topic, "event": "phx_join", "payload": join})
            .to_string()
    };
    if ws.send(Message::text(frame)).await.is_err() {
        totals.failed.fetch_add(1, Relaxed);
        return;
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut joined = false;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(20));
    loop {
        tokio::select! {
            m = ws.next() => match m {
                Some(Ok(msg)) => {
                    if let Some(t) = stamp(&msg) {
                        hist.saturating_record((now_us() - t).max(1) as u64);
                        totals.received.fetch_add(1, Relaxed);
                    } else if !joined && matches!(&msg, Message::Text(t) if t.as_str().contains("phx_reply")) {
                        joined = true;
                        let ok = matches!(&msg, Message::Text(t) if t.as_str().contains("\"ok\""));
                        let counter = if ok { &totals.joined } else { &totals.join_errors };
                        counter.fetch_add(1, Relaxed);
                    }
                }
                _ => {
                    totals.failed.fetch_add(1, Relaxed);
                    break;
                }
            },
            _ = heartbeat.tick() => {
                let hb = if args.vsn == "2.0.0" { r#"[null,"hb","phoenix","heartbeat",{}]"#.to_string() }
                         else { r#"{"topic":"phoenix","event":"heartbeat","payload":{},"ref":"hb"}"#.to_string() };
                let _ = ws.send(Message::text(hb)).await;
            }
            _ = stop.changed() => break,
            _ = tokio::time::sleep_until(deadline.into()) => break,
        }
    }
    totals.latency.lock().unwrap().add(&hist).unwrap();
    let _ = ws.close(None).await;
}

#[tokio::main]
async fn main() {
    let args = Arc::new(Args::parse());
    let exp = (now_us() / 1_000_000) + 3600;
    let apikey = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({"role": "anon", "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(args.jwt_secret.as_bytes()),
    )
    .unwrap();
    let totals = Arc::new(Totals {
        received: AtomicU64::new(0),
        connected: AtomicU64::new(0),
        joined: AtomicU64::new(0),
        join_errors: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        latency: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()),
    });
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    // Every run is bounded: connecting, the sending window and draining.
    let hard_deadline = Instant::now() + Duration::from_secs(args.seconds + 90);
    let (go, go_rx) = tokio::sync::watch::channel(false);
    let connect_start = Instant::now();
    let mut tasks = Vec::with_capacity(args.subscribers);
    for i in 0..args.subscribers {
        tasks.push(tokio::spawn(subscriber(
            args.clone(),
            i as u64,
            apikey.clone(),
            totals.clone(),
            go_rx.clone(),
            stop.clone(),
            hard_deadline,
        )));
        if i % 100 == 99 {
            tokio::task::yield_now().await;
        }
    }
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        assert!(
            connect_start.elapsed() < Duration::from_secs(120),
            "subscribers did not {what} within 120 s"
        );
        !done()
    };
    let connected =
        || totals.connected.load(Relaxed) + totals.failed.load(Relaxed) >= args.subscribers as u64;
    while wait("connect", &connected) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let connect_secs = connect_start.elapsed().as_secs_f64();
    let join_start = Instant::now();
    let _ = go.send(true);
    let settled = || {
        totals.joined.load(Relaxed) + totals.join_errors.load(Relaxed) + totals.failed.load(Relaxed)
            >= args.subscribers as u64
    };
    while wait("join", &settled) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let join_secs = join_start.elapsed().as_secs_f64();

    let (db, conn) = tokio_postgres::connect(&args.dsn, tokio_postgres::NoTls)
        .await
        .expect("connect to Postgres");
    tokio::spawn(conn);
    let stmt = db
        .prepare(
            "SELECT count(realtime.send(jsonb_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000000)::int8, \
             'pad', $3::text), 'ev', $1, false)) FROM generate_series(1, $2::int4)",
        )
        .await
        .unwrap();
    let pad = "x".repeat(args.pad);
    let tick = Duration::from_millis(10);
    let ticks = args.seconds * 100;
    let mut interval = tokio::time::interval(tick);
    let mut sent = 0u64;
    let start = Instant::now();
    for k in 0..ticks {
        interval.tick().await;
        // Spread the rate over 10 ms ticks, keeping the total exact.
        let due = (args.rate * (k + 1)) / 100 - (args.rate * k) / 100;
        if due > 0 {
            db.query_one(&stmt, &[&args.topic, &(due as i32), &pad])
                .await
                .unwrap();
            sent += due;
        }
    }
    let send_secs = start.elapsed().as_secs_f64();
    // Let what is in flight arrive: until all of it did, or nothing more came for 2 s, or 15 s.
    let expected = sent * args.subscribers as u64;
    let drain_deadline = Instant::now() + Duration::from_secs(15);
    let (mut last, mut last_change) = (0, Instant::now());
    loop {
        let got = totals.received.load(Relaxed);
        if got != last {
            (last, last_change) = (got, Instant::now());
        }
        if got >= expected
            || last_change.elapsed() > Duration::from_secs(2)
            || Instant::now() > drain_deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(true);
    for t in tasks.drain(..) {
        let _ = t.await;
    }
    let h = totals.latency.lock().unwrap();
    let received = totals.received.load(Relaxed);
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{}",
        json!({
            "label": args.label, "vsn": args.vsn, "subscribers": args.subscribers, "rate": args.rate,
            "seconds": args.seconds, "sent": sent, "expected": expected, "received": received,
            "lost": expected.saturating_sub(received), "failed_connections": totals.failed.load(Relaxed),
            "connect_seconds": connect_secs, "joined": totals.joined.load(Relaxed),
            "join_errors": totals.join_errors.load(Relaxed),
            "join_seconds": join_secs,
            "joins_per_second": totals.joined.load(Relaxed) as f64 / join_secs,
            "deliveries_per_second": if send_secs > 0.0 { received as f64 / send_secs } else { 0.0 },
            "p50_ms": ms(0.5), "p95_ms": ms(0.95), "p99_ms": ms(0.99), "max_ms": h.max() as f64 / 1000.0,
        })
    );
}
