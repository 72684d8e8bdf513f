//! One WebSocket connection: connect (bounded concurrency, optional source address), wait
//! for the go signal, join its channels, then record every delivery's latency and check
//! each stream's numbering for gaps; sends too when the clients are the publishers.

use crate::args::{Args, Publisher};
use crate::plan;
use crate::protocol::{Event, Position, Wire};
use crate::report::{now_us, Totals};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

pub struct Ctx {
    pub args: Args,
    pub wire: Wire,
    pub totals: Arc<Totals>,
    /// The servers' URLs and addresses; a client connects to its topic's (`plan::route`).
    pub servers: Vec<(String, SocketAddr)>,
    /// The anon apikey (Supabase) or the connection token (Centrifugo).
    pub token: String,
    pub connect_slots: Semaphore,
    /// Joins go out when every client has connected, so joins/s measures joining.
    pub go: watch::Receiver<bool>,
    /// Clients that publish start when every join has been answered.
    pub send: watch::Receiver<bool>,
    pub stop: watch::Receiver<bool>,
    /// Turns true when every client must drop its socket and resume (`--storm-after`).
    pub storm: watch::Receiver<bool>,
    pub deadline: Instant,
}

/// How often a client notes its position, to rejoin with one from 1 to 5 s before.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Positions kept: 100 at one per 100 ms is 10 s of history.
const SAMPLES: usize = 100;

/// Lets the kernel choose the source port at connect rather than at bind
/// (IP_BIND_ADDRESS_NO_PORT). A bind to port 0 searches the ports for a free one; with
/// tens of thousands in use or in TIME_WAIT (a reconnect storm), that search cost the
/// generator more CPU than everything else it did, and made its reconnects look slow.
fn no_port_at_bind(socket: &TcpSocket) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option of the right size; failure only means the
    // kernel picks the port at bind, as without the option.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Connects under the connection-concurrency limit, within 30 s.
async fn connect_limited(
    ctx: &Ctx,
    server: usize,
    client: usize,
    route: Option<&str>,
) -> Option<WebSocketStream<TcpStream>> {
    let _permit = ctx.connect_slots.acquire().await.unwrap();
    match tokio::time::timeout(Duration::from_secs(30), connect(ctx, server, client, route)).await {
        Ok(Ok(ws)) => Some(ws),
        _ => None,
    }
}

async fn connect(
    ctx: &Ctx,
    server: usize,
    client: usize,
    route: Option<&str>,
) -> Result<WebSocketStream<TcpStream>, Box<dyn std::error::Error>> {
    let (base, addr) = &ctx.servers[server];
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    let sources = &ctx.args.source_ip;
    if !sources.is_empty() {
        no_port_at_bind(&socket);
        socket.bind(SocketAddr::new(sources[client % sources.len()], 0))?;
    }
    let stream = socket.connect(*addr).await?;
    stream.set_nodelay(true)?;
    let mut url = format!("{}{}", base, ctx.wire.path(&ctx.token, &ctx.args.vsn));
    if let (Some(name), Some(topic)) = (&ctx.args.route_param, route) {
        url.push_str(&format!("&{name}={topic}"));
    }
    // Small buffers: a load generator holding 17,000 connections must not be the limit.
    let config = WebSocketConfig::default()
        .read_buffer_size(8192)
        .write_buffer_size(0);
    let (ws, _) = tokio_tungstenite::client_async_with_config(url, stream, Some(config)).await?;
    Ok(ws)
}

fn member_token(args: &Args, client: usize) -> String {
    let claims = json!({"role": "authenticated", "sub": plan::member_uuid(client as u64 + 1),
                        "exp": now_us() / 1_000_000 + 3600});
    crate::token::sign(args, &claims)
}

pub async fn run(ctx: Arc<Ctx>, client: usize) {
    let (args, totals) = (&ctx.args, &ctx.totals);
    let topics = plan::topics_of(args, client);
    let names: Vec<String> = topics
        .iter()
        .map(|k| format!("{}{k}", args.topic_prefix))
        .collect();
    let server = names
        .first()
        .map_or(0, |t| plan::route(t, ctx.servers.len()));
    let Some(mut ws) =
        connect_limited(&ctx, server, client, names.first().map(String::as_str)).await
    else {
        totals.failed.fetch_add(1, Relaxed);
        return;
    };
    totals.connected.fetch_add(1, Relaxed);
    // Signed before the go: the join is timed, not this generator's signing.
    let token = if args.private || args.postgres_changes {
        member_token(args, client)
    } else {
        ctx.token.clone()
    };
    let (mut go, mut send, mut stop) = (ctx.go.clone(), ctx.send.clone(), ctx.stop.clone());
    if go.wait_for(|&g| g).await.is_err() {
        return;
    }
    let echo = args.publisher == Publisher::Clients;
    let frames = if args.postgres_changes {
        ctx.wire
            .change_joins(&topics, &args.topic_prefix, &token, args.change_positions)
    } else {
        ctx.wire.joins(&names, args.private, echo, &token)
    };
    for frame in frames {
        if ws.send(Message::text(frame)).await.is_err() {
            totals.closed_early.fetch_add(1, Relaxed);
            return;
        }
    }

    // Heartbeats spread over their period instead of all firing in the same instant.
    let period = Duration::from_secs(20);
    let phase = period.mul_f64(plan::phase(client));
    let mut heartbeat = tokio::time::interval_at((Instant::now() + phase).into(), period);
    let send_period = Duration::from_secs_f64(1.0 / args.rate.max(0.001));
    let mut sending = false;
    let mut next_send = tokio::time::Instant::now() + Duration::from_secs(86_400);
    let mut seq = 0u64;
    let mut replies = 0usize;
    let mut last_seen: HashMap<u64, u64> = HashMap::new();
    let mut events = Vec::new();
    // The resume storm: positions noted as messages arrive, and the highest message number
    // seen before the drop (replayed ones up to it are deliveries the client already had).
    let storm_on = args.storm_after.is_some();
    let mut storm = ctx.storm.clone();
    let mut stormed = false;
    let mut max_before = 0u64;
    let mut samples: VecDeque<(Instant, Position, u64)> = VecDeque::new();
    loop {
        tokio::select! {
            m = ws.next() => match m {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    totals.closed_early.fetch_add(1, Relaxed);
                    break;
                }
                Some(Ok(msg)) => {
                    ctx.wire.parse(&msg, &mut events);
                    for e in events.drain(..) {
                        match e {
                            Event::Delivery(s) => {
                                if stormed && s.replayed {
                                    totals.storm.replayed.fetch_add(1, Relaxed);
                                    if s.n <= max_before {
                                        totals.storm.redelivered.fetch_add(1, Relaxed);
                                    } else {
                                        totals.record_late();
                                    }
                                } else {
                                    totals.record(client, s.t);
                                }
                                if let (true, Some(pos)) = (storm_on, &s.pos) {
                                    if !stormed {
                                        max_before = max_before.max(s.n);
                                    }
                                    if samples.back().is_none_or(|b| b.0.elapsed() >= SAMPLE_EVERY) {
                                        samples.push_back((Instant::now(), pos.clone(), s.n));
                                        if samples.len() > SAMPLES {
                                            samples.pop_front();
                                        }
                                    }
                                }
                                let last = last_seen.entry(s.k).or_insert(0);
                                if s.n > *last + 1 {
                                    totals.gaps.fetch_add(s.n - *last - 1, Relaxed);
                                } else if s.n <= *last {
                                    totals.reordered.fetch_add(1, Relaxed);
                                }
                                *last = (*last).max(s.n);
                            }
                            Event::Joined(ok) if stormed => {
                                totals.storm.replied();
                                let c = if ok { &totals.storm.rejoined } else { &totals.storm.rejoin_errors };
                                c.fetch_add(1, Relaxed);
                            }
                            Event::Resumed { recovered, resent } => {
                                totals.storm.live_again(resent, recovered);
                            }
                            Event::Position(pos) => {
                                // A change carries no position: its batch's system message
                                // does, after it (the changes up to it are those seen).
                                if storm_on && !stormed && samples.back().is_none_or(|b| b.0.elapsed() >= SAMPLE_EVERY) {
                                    let n = topics.first().and_then(|&k| last_seen.get(&(k as u64))).copied().unwrap_or(0);
                                    samples.push_back((Instant::now(), pos, n));
                                    if samples.len() > SAMPLES {
                                        samples.pop_front();
                                    }
                                }
                            }
                            Event::Joined(ok) => {
                                if ok {
                                    totals.joined.fetch_add(1, Relaxed);
                                    if let Some(&k) = topics.get(replies) {
                                        totals.subscribers[k].fetch_add(1, Relaxed);
                                    }
                                } else {
                                    totals.join_errors.fetch_add(1, Relaxed);
                                }
                                replies += 1;
                            }
                            Event::PushRefused => {
                                totals.push_refused.fetch_add(1, Relaxed);
                            }
                            Event::Ping => {
                                let _ = ws.send(Message::text("{}")).await;
                            }
                        }
                    }
                }
            },
            _ = heartbeat.tick() => {
                if let Some(hb) = ctx.wire.heartbeat() {
                    let _ = ws.send(Message::text(hb)).await;
                }
            }
            Ok(()) = send.changed(), if echo => {
                // On at the start of the sending window (at a per-client phase), off at its end.
                sending = *send.borrow();
                next_send = tokio::time::Instant::now() + send_period.mul_f64(plan::phase(client));
            }
            _ = tokio::time::sleep_until(next_send), if sending => {
                next_send += send_period;
                seq += 1;
                let body = json!({"t": now_us(), "k": client, "n": seq});
                if ws.send(Message::text(ctx.wire.push(&names[0], seq, body))).await.is_err() {
                    totals.closed_early.fetch_add(1, Relaxed);
                    break;
                }
                totals.sent_to(topics[0]);
            }
            Ok(()) = storm.changed(), if storm_on && !stormed => {
                // Every client at once: the socket is dropped (no close frame), then the
                // client reconnects and rejoins after a position it had a while ago.
                stormed = true;
                totals.storm.dropped.fetch_add(1, Relaxed);
                let behind = args.behind_min + (args.behind_max - args.behind_min) * plan::phase(client);
                let target = Instant::now().checked_sub(Duration::from_secs_f64(behind));
                let pick = samples
                    .iter()
                    .rev()
                    .find(|s| target.is_some_and(|t| s.0 <= t))
                    .or(samples.front())
                    .cloned();
                drop(ws);
                let Some(new) = connect_limited(&ctx, server, client, names.first().map(String::as_str)).await else {
                    totals.closed_early.fetch_add(1, Relaxed);
                    return;
                };
                ws = new;
                totals.storm.connected();
                let frames = match (&pick, topics.first()) {
                    (Some((_, pos, n)), Some(&k)) => {
                        last_seen.insert(k as u64, *n);
                        if args.postgres_changes {
                            vec![ctx.wire.change_resume_join(k, &args.topic_prefix, &token, pos)]
                        } else {
                            vec![ctx.wire.resume_join(&names[0], pos)]
                        }
                    }
                    _ => {
                        totals.storm.without_position.fetch_add(1, Relaxed);
                        if args.postgres_changes {
                            ctx.wire.change_joins(&topics, &args.topic_prefix, &token, args.change_positions)
                        } else {
                            ctx.wire.joins(&names, args.private, echo, &token)
                        }
                    }
                };
                for frame in frames {
                    if ws.send(Message::text(frame)).await.is_err() {
                        totals.closed_early.fetch_add(1, Relaxed);
                        return;
                    }
                }
            }
            _ = stop.changed() => break,
            _ = tokio::time::sleep_until(ctx.deadline.into()) => break,
        }
    }
    let _ = ws.close(None).await;
}
