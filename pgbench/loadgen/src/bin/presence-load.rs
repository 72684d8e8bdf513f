//! Presence load: one room, many members across several sidecars, some of them observing.
//!
//! 1. **Fill.** Every member connects and joins (observers with `presence.enabled`), then
//!    the members track one after another, evenly over `--fill-seconds` (a track enables
//!    presence on its channel, as in Supabase: every member then receives the room's state
//!    and diffs; the observers' are the ones checked). Measured: when
//!    every observer's view holds every member (from the first track), whether all
//!    observers' views are the same (keys and refs), the presence frames they received, and
//!    the sidecars' resident memory before and after (per member).
//! 2. **Churn.** `--churners` more clients toggle (track, then untrack, and again) at
//!    `--churn-rate` toggles a second for `--churn-seconds`. Measured: from each push to the
//!    diff that shows it at each observer (p50, p99, max over observers per toggle).
//!
//! Prints one JSON line. Every loop is bounded in count and time; it sends only to the
//! URLs given (127.0.0.x).

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser, Debug)]
struct Args {
    /// Sidecars' base URLs (ws://127.0.0.1:PORT), comma-separated; members alternate.
    #[arg(long)]
    urls: String,
    /// Where the observers connect instead (comma-separated), if given: a sidecar that holds
    /// the room's view but no tracking member, whose memory is then the view's.
    #[arg(long)]
    observer_urls: Option<String>,
    #[arg(long)]
    jwt_secret: String,
    #[arg(long, default_value = "presence-room")]
    topic: String,
    #[arg(long, default_value_t = 10_000)]
    members: usize,
    /// The first this many members also receive presence.
    #[arg(long, default_value_t = 100)]
    observers: usize,
    #[arg(long, default_value_t = 10.0)]
    fill_seconds: f64,
    #[arg(long, default_value_t = 0)]
    churners: usize,
    /// Toggles a second (each a join or a leave).
    #[arg(long, default_value_t = 2000.0)]
    churn_rate: f64,
    #[arg(long, default_value_t = 10.0)]
    churn_seconds: f64,
    /// The sidecars' process ids, to read their resident memory.
    #[arg(long, value_delimiter = ',')]
    pids: Vec<u32>,
    /// Source addresses to connect from, comma-separated (127.0.0.x).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1")]
    source_ips: Vec<std::net::IpAddr>,
    #[arg(long, default_value_t = 200)]
    connect_concurrency: usize,
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Churn toggles not yet seen by every observer, by key: (is a join, sent at µs, observers
/// that saw it).
type Pending = HashMap<String, Vec<(bool, u64, usize)>>;

/// What the client tasks tell the main task.
struct Shared {
    /// Observer index -> its view: key -> refs.
    views: Vec<Mutex<BTreeMap<String, Vec<String>>>>,
    /// When each observer's view first held `want_full` keys (µs since epoch; 0: not yet).
    full_at: Vec<AtomicU64>,
    want_full: AtomicUsize,
    frames: AtomicU64,
    /// Churn toggles waiting to be seen: key -> (is_join, sent_us, observers seen).
    pending: Mutex<Pending>,
    /// Per (toggle, observer) latency, and per toggle the time until the last observer.
    each: Mutex<Histogram<u64>>,
    all: Mutex<Histogram<u64>>,
    errors: AtomicU64,
}

enum Cmd {
    Track(Value),
    Untrack,
}

fn frame(topic: &str, event: &str, payload: Value, r: u64) -> Message {
    Message::text(json!(["1", r.to_string(), topic, event, payload]).to_string())
}

#[allow(clippy::too_many_arguments)]
async fn client(
    addr: SocketAddr,
    url: String,
    source: std::net::IpAddr,
    topic: String,
    key: String,
    observer: Option<usize>,
    shared: Arc<Shared>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    joined: Arc<AtomicUsize>,
    slots: Arc<Semaphore>,
    deadline: Instant,
) {
    // Held until the join is answered: at most `connect_concurrency` connect at once.
    let mut permit = Some(slots.acquire().await.unwrap());
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(source, 0)).unwrap();
    let stream = match sock.connect(addr).await {
        Ok(s) => s,
        Err(_) => {
            shared.errors.fetch_add(1, Relaxed);
            return;
        }
    };
    let Ok((ws, _)) = tokio_tungstenite::client_async(url, stream).await else {
        shared.errors.fetch_add(1, Relaxed);
        return;
    };
    let (mut tx, mut rx) = ws.split();
    let channel = format!("realtime:{topic}");
    let config = json!({"config": {"private": false, "presence": {"key": key, "enabled": observer.is_some()}}});
    if tx
        .send(frame(&channel, "phx_join", config, 1))
        .await
        .is_err()
    {
        shared.errors.fetch_add(1, Relaxed);
        return;
    }
    let mut next_ref = 2u64;
    let mut counted = false;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(20));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::select! {
            _ = tokio::time::sleep(left) => return,
            _ = heartbeat.tick() => {
                let hb = Message::text(json!([null, next_ref.to_string(), "phoenix", "heartbeat", {}]).to_string());
                next_ref += 1;
                if tx.send(hb).await.is_err() { return; }
            }
            cmd = cmds.recv() => {
                let Some(cmd) = cmd else { return };
                let body = match cmd {
                    Cmd::Track(meta) => json!({"type": "presence", "event": "track", "payload": meta}),
                    Cmd::Untrack => json!({"type": "presence", "event": "untrack"}),
                };
                if tx.send(frame(&channel, "presence", body, next_ref)).await.is_err() { return; }
                next_ref += 1;
            }
            m = rx.next() => {
                let Some(Ok(Message::Text(t))) = m else {
                    if matches!(m, None | Some(Err(_))) { return; }
                    continue;
                };
                // Every member that tracks receives presence (a track enables it, as in
                // Supabase); only observers' frames are read. Replies and system messages are
                // small; presence frames of a busy room are not.
                if observer.is_none() && t.len() > 512 {
                    continue;
                }
                let v: Value = match serde_json::from_str(t.as_str()) { Ok(v) => v, Err(_) => continue };
                let event = v[3].as_str().unwrap_or_default();
                match event {
                    "phx_reply" => {
                        if v[4]["status"] != "ok" {
                            shared.errors.fetch_add(1, Relaxed);
                        } else if !counted {
                            counted = true;
                            joined.fetch_add(1, Relaxed);
                            permit.take();
                        }
                    }
                    "presence_state" | "presence_diff" => {
                        let Some(o) = observer else { continue };
                        let at = now_us();
                        shared.frames.fetch_add(1, Relaxed);
                        observe(&shared, o, event, &v[4], at);
                    }
                    "system" if v[4]["status"] == "error" => { shared.errors.fetch_add(1, Relaxed); }
                    _ => {}
                }
            }
        }
    }
}

fn refs(entry: &Value) -> Vec<String> {
    entry["metas"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|x| x["phx_ref"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn observe(shared: &Shared, o: usize, event: &str, payload: &Value, at: u64) {
    let mut view = shared.views[o].lock().unwrap();
    let mut seen: Vec<(String, bool)> = Vec::new();
    if event == "presence_state" {
        view.clear();
        for (k, e) in payload.as_object().into_iter().flatten() {
            view.insert(k.clone(), refs(e));
        }
    } else {
        for (k, e) in payload["joins"].as_object().into_iter().flatten() {
            let mut r = refs(e);
            let have = view.entry(k.clone()).or_default();
            have.retain(|x| !r.contains(x));
            have.append(&mut r);
            seen.push((k.clone(), true));
        }
        for (k, e) in payload["leaves"].as_object().into_iter().flatten() {
            let r = refs(e);
            if let Some(have) = view.get_mut(k) {
                have.retain(|x| !r.contains(x));
                if have.is_empty() {
                    view.remove(k);
                }
            }
            seen.push((k.clone(), false));
        }
    }
    let want = shared.want_full.load(Relaxed);
    if want > 0 && view.len() >= want && shared.full_at[o].load(Relaxed) == 0 {
        shared.full_at[o].store(at, Relaxed);
    }
    drop(view);
    if seen.is_empty() {
        return;
    }
    let observers = shared.views.len();
    let mut pending = shared.pending.lock().unwrap();
    for (k, join) in seen {
        let Some(list) = pending.get_mut(&k) else {
            continue;
        };
        let Some(i) = list.iter().position(|(j, _, _)| *j == join) else {
            continue;
        };
        let (_, sent, ref mut n) = list[i];
        let _ = shared
            .each
            .lock()
            .unwrap()
            .record(at.saturating_sub(sent).max(1));
        *n += 1;
        if *n == observers {
            let _ = shared
                .all
                .lock()
                .unwrap()
                .record(at.saturating_sub(sent).max(1));
            list.remove(i);
        }
    }
}

fn quantiles(h: &Histogram<u64>) -> Value {
    json!({"count": h.len(), "p50_ms": h.value_at_quantile(0.5) as f64 / 1000.0,
           "p99_ms": h.value_at_quantile(0.99) as f64 / 1000.0, "max_ms": h.max() as f64 / 1000.0})
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let urls: Vec<String> = a.urls.split(',').map(str::to_owned).collect();
    let key = jsonwebtoken::EncodingKey::from_secret(a.jwt_secret.as_bytes());
    let claims = json!({"role": "anon", "exp": now_us() / 1_000_000 + 3600});
    let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
    let total = a.members + a.churners;
    let shared = Arc::new(Shared {
        views: (0..a.observers)
            .map(|_| Mutex::new(BTreeMap::new()))
            .collect(),
        full_at: (0..a.observers).map(|_| AtomicU64::new(0)).collect(),
        want_full: AtomicUsize::new(0),
        frames: AtomicU64::new(0),
        pending: Mutex::new(HashMap::new()),
        each: Mutex::new(Histogram::new(3).unwrap()),
        all: Mutex::new(Histogram::new(3).unwrap()),
        errors: AtomicU64::new(0),
    });
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(a.fill_seconds + a.churn_seconds + 240.0);
    let joined = Arc::new(AtomicUsize::new(0));
    let slots = Arc::new(Semaphore::new(a.connect_concurrency));
    let observer_urls: Vec<String> = match &a.observer_urls {
        Some(u) => u.split(',').map(str::to_owned).collect(),
        None => urls.clone(),
    };
    let mut senders = Vec::with_capacity(total);
    for i in 0..total {
        let base = if i < a.observers {
            &observer_urls[i % observer_urls.len()]
        } else {
            &urls[i % urls.len()]
        };
        let hostport = base.split("://").nth(1).unwrap();
        let addr: SocketAddr = hostport.parse().expect("ws://IP:PORT");
        let url = format!("{base}/realtime/v1/websocket?apikey={token}&vsn=2.0.0");
        let source = a.source_ips[i % a.source_ips.len()];
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        let observer = (i < a.observers).then_some(i);
        let name = if i < a.members {
            format!("m{i}")
        } else {
            format!("c{i}")
        };
        tokio::spawn(client(
            addr,
            url,
            source,
            a.topic.clone(),
            name,
            observer,
            shared.clone(),
            rx,
            joined.clone(),
            slots.clone(),
            deadline,
        ));
    }
    let connect_limit = Instant::now() + Duration::from_secs(180);
    while joined.load(Relaxed) < total {
        assert!(
            Instant::now() < connect_limit,
            "only {} of {total} joined",
            joined.load(Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connect_seconds = started.elapsed().as_secs_f64();
    // Let the joins' presence states arrive (an empty room) before anyone tracks.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before: Vec<u64> = a.pids.iter().map(|&p| rss_kb(p)).collect();

    // Fill: member i tracks at i * fill / members.
    shared.want_full.store(a.members, Relaxed);
    let fill_start = Instant::now();
    let fill_start_us = now_us();
    for (i, tx) in senders.iter().take(a.members).enumerate() {
        let due =
            fill_start + Duration::from_secs_f64(a.fill_seconds * i as f64 / a.members as f64);
        tokio::time::sleep_until(due.into()).await;
        let _ = tx.send(Cmd::Track(json!({"n": i, "online_at": now_us() / 1000})));
    }
    let fill_sent = fill_start.elapsed().as_secs_f64();
    let fill_limit = Instant::now() + Duration::from_secs(120);
    while shared.full_at.iter().any(|t| t.load(Relaxed) == 0) {
        if Instant::now() > fill_limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let complete: Vec<u64> = shared.full_at.iter().map(|t| t.load(Relaxed)).collect();
    let all_complete = complete.iter().all(|&t| t > 0);
    let last = complete.iter().copied().max().unwrap_or(0);
    let fill_frames = shared.frames.load(Relaxed);
    // The same view everywhere: once every observer is complete, compare them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = shared.views[0].lock().unwrap().clone();
    let same = shared.views.iter().all(|v| *v.lock().unwrap() == first);
    let rss_after: Vec<u64> = a.pids.iter().map(|&p| rss_kb(p)).collect();
    // Again once the states sent to every tracking member have left the sidecars' buffers.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_settled: Vec<u64> = a.pids.iter().map(|&p| rss_kb(p)).collect();

    // Churn.
    let mut churn = json!(null);
    if a.churners > 0 {
        let frames_before = shared.frames.load(Relaxed);
        let start = Instant::now();
        let n = (a.churn_rate * a.churn_seconds) as usize;
        let mut tracked = vec![false; a.churners];
        for t in 0..n {
            let due = start + Duration::from_secs_f64(t as f64 / a.churn_rate);
            tokio::time::sleep_until(due.into()).await;
            let c = t % a.churners;
            let key = format!("c{}", a.members + c);
            let join = !tracked[c];
            tracked[c] = join;
            shared
                .pending
                .lock()
                .unwrap()
                .entry(key)
                .or_default()
                .push((join, now_us(), 0));
            let cmd = if join {
                Cmd::Track(json!({"t": t}))
            } else {
                Cmd::Untrack
            };
            let _ = senders[a.members + c].send(cmd);
        }
        let sent_seconds = start.elapsed().as_secs_f64();
        let settle = Instant::now() + Duration::from_secs(30);
        while shared
            .pending
            .lock()
            .unwrap()
            .values()
            .any(|l| !l.is_empty())
            && Instant::now() < settle
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let unseen: usize = shared.pending.lock().unwrap().values().map(Vec::len).sum();
        churn = json!({
            "toggles": n, "seconds": sent_seconds, "toggles_per_second": n as f64 / sent_seconds,
            "unseen": unseen,
            "each_observer": quantiles(&shared.each.lock().unwrap()),
            "every_observer": quantiles(&shared.all.lock().unwrap()),
            "observer_frames_per_second": (shared.frames.load(Relaxed) - frames_before) as f64 / sent_seconds,
        });
    }
    let out = json!({
        "members": a.members, "observers": a.observers, "churners": a.churners, "sidecars": urls.len(),
        "connect_seconds": connect_seconds,
        "fill": {
            "seconds": a.fill_seconds, "sent_seconds": fill_sent,
            "tracks_per_second": a.members as f64 / fill_sent,
            "all_complete": all_complete,
            "complete_after_seconds": if all_complete { (last - fill_start_us) as f64 / 1e6 } else { -1.0 },
            "after_last_track_ms": if all_complete { (last as f64 - fill_start_us as f64) / 1000.0 - fill_sent * 1000.0 } else { -1.0 },
            "same_everywhere": same,
            "keys_seen": first.len(),
            "observer_frames": fill_frames,
            "observer_frames_per_second": fill_frames as f64 / fill_sent,
            "rss_kb_before": rss_before, "rss_kb_after": rss_after, "rss_kb_settled": rss_settled,
        },
        "churn": churn,
        "errors": shared.errors.load(Relaxed),
    });
    println!("{out}");
    std::process::exit(0);
}
