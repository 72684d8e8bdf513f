//! WebSocket load generator for pgbench/'s scenarios: opens many connections speaking
//! Supabase Realtime's protocol (to our sidecar) or Centrifugo's (to the peer), joins
//! channels, has the database (or the clients) publish at a fixed rate, and measures
//! send-to-receive latency per delivery (HDR histogram; the database stamps each message
//! with clock_timestamp() as it is sent), deliveries/s, connect and join rates, failed
//! connections and gaps in each stream's numbering. Prints one JSON line of results;
//! with --progress, a line a second on stderr.

mod args;
mod plan;
mod protocol;
mod publisher;
mod report;
mod subscriber;
mod token;

use args::{Args, Protocol, Publisher};
use clap::Parser;
use report::{now_us, Totals};
use serde_json::json;
use std::net::ToSocketAddrs;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use subscriber::Ctx;

/// Waits until `done`, polling; panics past `limit` so no run hangs.
async fn wait_until(what: &str, since: Instant, limit: Duration, done: impl Fn() -> bool) {
    while !done() {
        assert!(
            since.elapsed() < limit,
            "clients did not {what} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let servers: Vec<_> = args
        .url
        .iter()
        .map(|url| {
            let hostport = url.split("://").nth(1).expect("url like ws://host:port");
            let addr = hostport
                .to_socket_addrs()
                .expect("server address")
                .next()
                .unwrap();
            (url.clone(), addr)
        })
        .collect();
    let claims = match args.protocol {
        Protocol::Supabase => json!({"role": "anon", "exp": now_us() / 1_000_000 + 3600}),
        Protocol::Centrifugo => json!({"sub": "loadgen", "exp": now_us() / 1_000_000 + 3600}),
    };
    let token = token::sign(&args, &claims);
    let totals = Arc::new(Totals::new(args.topics.max(1)));
    let (go_tx, go) = tokio::sync::watch::channel(false);
    let (send_tx, send) = tokio::sync::watch::channel(false);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (storm_tx, storm) = tokio::sync::watch::channel(false);
    let clients = args.clients;
    let ctx = Arc::new(Ctx {
        wire: protocol::Wire {
            protocol: args.protocol,
            v2: args.vsn == "2.0.0",
        },
        totals: totals.clone(),
        servers,
        token,
        connect_slots: tokio::sync::Semaphore::new(args.connect_concurrency.max(1)),
        go,
        send,
        stop: stop.clone(),
        storm,
        // Every run is bounded: connecting, the sending window and draining.
        deadline: Instant::now() + Duration::from_secs(args.seconds + 300),
        args,
    });
    let args = &ctx.args;
    let progress = args
        .progress
        .then(|| tokio::spawn(report::progress(totals.clone(), stop.clone())));

    let connect_start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for i in 0..clients {
        tasks.push(tokio::spawn(subscriber::run(ctx.clone(), i)));
    }
    let limit = Duration::from_secs(240);
    wait_until("connect", connect_start, limit, || {
        totals.connected.load(Relaxed) + totals.failed.load(Relaxed) >= clients as u64
    })
    .await;
    let connect_secs = connect_start.elapsed().as_secs_f64();

    let join_start = Instant::now();
    let _ = go_tx.send(true);
    let channels = (totals.connected.load(Relaxed) as usize * args.channels_per_client) as u64;
    wait_until("join", join_start, limit, || {
        totals.joined.load(Relaxed)
            + totals.join_errors.load(Relaxed)
            + totals.closed_early.load(Relaxed) * args.channels_per_client as u64
            >= channels
    })
    .await;
    let join_secs = join_start.elapsed().as_secs_f64();

    if let Some(after) = args.storm_after {
        assert!(
            args.protocol == Protocol::Supabase
                && args.channels_per_client == 1
                && (!args.postgres_changes || args.change_positions),
            "--storm-after needs the Supabase protocol, one channel per client, and broadcasts \
             or Postgres Changes with --change-positions (a change carries no position)"
        );
        let totals = totals.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(after)).await;
            totals.storm.at_us.store(now_us(), Relaxed);
            let _ = storm_tx.send(true);
        });
    }
    // Wall-clock bounds of the sending window, so a runner can take the servers' CPU over
    // it alone (without connecting and joining).
    let send_started = now_us();
    let send_secs = match args.publisher {
        Publisher::Send | Publisher::Table | Publisher::Outbox | Publisher::Changes => {
            publisher::run(args, &totals).await
        }
        Publisher::Clients => {
            let start = Instant::now();
            let _ = send_tx.send(true);
            tokio::time::sleep(Duration::from_secs(args.seconds)).await;
            let _ = send_tx.send(false);
            start.elapsed().as_secs_f64()
        }
        Publisher::None => {
            tokio::time::sleep(Duration::from_secs(args.seconds)).await;
            args.seconds as f64
        }
    };
    let send_ended = now_us();
    let held = totals.connected.load(Relaxed) - totals.closed_early.load(Relaxed);

    // Let what is in flight arrive: until all of it did, or nothing more came for 2 s, or 15 s.
    let drain_deadline = Instant::now() + Duration::from_secs(15);
    let (mut last, mut last_change) = (u64::MAX, Instant::now());
    loop {
        let got = totals.received.load(Relaxed);
        if got != last {
            (last, last_change) = (got, Instant::now());
        }
        if got >= totals.expected.load(Relaxed)
            || last_change.elapsed() > Duration::from_secs(2)
            || Instant::now() > drain_deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    if let Some(p) = progress {
        let _ = p.await;
    }

    let storm = args.storm_after.map(|_| totals.storm.json());
    let h = totals.latency();
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let (sent, expected, received) = (
        totals.sent.load(Relaxed),
        totals.expected.load(Relaxed),
        totals.received.load(Relaxed),
    );
    println!(
        "{}",
        json!({
            "label": args.label, "protocol": format!("{:?}", args.protocol).to_lowercase(), "vsn": args.vsn,
            "publisher": format!("{:?}", args.publisher).to_lowercase(), "clients": clients,
            "topics": args.topics, "channels_per_client": args.channels_per_client, "rate": args.rate,
            "pad": args.pad, "seconds": args.seconds, "source_ip": args.source_ip.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
            "connected": totals.connected.load(Relaxed), "failed_connections": totals.failed.load(Relaxed),
            "closed_early": totals.closed_early.load(Relaxed), "held_to_end": held,
            "connect_seconds": connect_secs, "connects_per_second": totals.connected.load(Relaxed) as f64 / connect_secs,
            "joined": totals.joined.load(Relaxed), "join_errors": totals.join_errors.load(Relaxed),
            "join_seconds": join_secs, "joins_per_second": totals.joined.load(Relaxed) as f64 / join_secs,
            "sent": sent, "send_seconds": send_secs,
            "send_started_unix": send_started as f64 / 1e6, "send_ended_unix": send_ended as f64 / 1e6, "expected": expected, "received": received,
            "lost": expected.saturating_sub(received), "gaps": totals.gaps.load(Relaxed),
            "reordered": totals.reordered.load(Relaxed), "push_refused": totals.push_refused.load(Relaxed),
            "deliveries_per_second": if send_secs > 0.0 { received as f64 / send_secs } else { 0.0 },
            "p50_ms": ms(0.5), "p95_ms": ms(0.95), "p99_ms": ms(0.99), "max_ms": h.max() as f64 / 1000.0,
            "slow_seconds": totals.slow_seconds(10),
            "storm": storm,
        })
    );
}
