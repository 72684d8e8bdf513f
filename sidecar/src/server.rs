//! The listening socket and HTTP routing: WebSocket upgrades on Supabase's paths, health and
//! metrics endpoints, and the static demo page. Connect-time failures are HTTP errors with a
//! JSON body, as Supabase's.

use crate::address::{self, AddressKey};
use crate::frame::Vsn;
use crate::reason::Refusal;
use crate::rest;
use crate::socket;
use crate::state::Shared;
use crate::supabase_health;

use crate::url;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    HeaderValue, CONNECTION, ORIGIN, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use socket2::{Domain, Socket, Type};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// Binds with SO_REUSEPORT so several sidecar processes can share one port (each process is
/// limited to 20,000 open files here).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    TcpListener::from_std(socket.into())
}

/// Accepts connections until shutdown.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, peer)) => (s, peer.ip()),
                Err(e) => {
                    // Out of file descriptors, usually: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        // Its place among the connections served as HTTP, held until it is closed or handed
        // to its WebSocket (issue 39, L10); past either bound it is closed at once.
        let cfg = &shared.cfg;
        let Some(in_all) = shared.http_connections.enter((), cfg.max_http_connections) else {
            shared.metrics.http_connections_refused_total.increment(1);
            continue;
        };
        let of_peer = if cfg.trusted_proxies.contains(peer) {
            None
        } else {
            match shared
                .http_connections_by_peer
                .enter(peer, cfg.max_http_connections_per_peer)
            {
                Some(entered) => Some(entered),
                None => {
                    shared.metrics.http_connections_refused_total.increment(1);
                    continue;
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let _places = (in_all, of_peer);
            let metrics = shared.metrics.clone();
            let header_timeout = shared.cfg.http_header_timeout();
            let svc = service_fn(move |req| route(req, shared.clone(), peer));
            // A client that opens a socket and never finishes its request headers (slowloris)
            // is dropped after the timeout instead of holding one of this process's files.
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            if let Err(e) = conn.await {
                if e.is_timeout() {
                    metrics.slow_requests_closed_total.increment(1);
                }
                tracing::debug!(error = %e, "http connection error");
            }
        });
    }
}

type Resp = Response<Full<Bytes>>;

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_str(content_type).unwrap());
    r
}

fn json_error(status: StatusCode, message: &str) -> Resp {
    respond(
        status,
        "application/json",
        json!({ "error": message }).to_string(),
    )
}

async fn route(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    peer: IpAddr,
) -> Result<Resp, std::convert::Infallible> {
    let path = req.uri().path().to_owned();
    // Who the per-address limits count this request against.
    let client_ip = address::client(peer, req.headers(), &shared.cfg.trusted_proxies);
    let client = AddressKey::of(client_ip);
    if is_rest_route(api_path(&path)) {
        return Ok(rest_route(req, &shared, &path, client).await);
    }
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        if let Some(a) = supabase_health::answer(api_path(&path), req.headers(), &shared, now_ms) {
            return Ok(outcome(a));
        }
    }
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/socket/websocket" | "/realtime/v1/websocket") => {
            upgrade(req, shared, (client, client_ip))
        }
        (&Method::GET, "/healthz") => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            match shared.metrics.health(now_ms) {
                Ok(()) => respond(StatusCode::OK, "text/plain", "ok\n"),
                Err(why) => respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("{why}\n"),
                ),
            }
        }
        (&Method::GET, "/metrics") => {
            let authorization = req
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if shared.metrics_auth.allows(authorization) {
                let m = &shared.metrics;
                m.reading_bytes_held.set(shared.reading.held() as f64);
                m.relay_bytes_held.set(shared.relay_bytes.held() as f64);
                m.outbound_bytes_held.set(shared.outbound.held() as f64);
                respond(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    shared.metrics.render(),
                )
            } else {
                json_error(
                    StatusCode::FORBIDDEN,
                    "Forbidden: /metrics wants a Bearer JWT signed with METRICS_JWT_SECRET",
                )
            }
        }
        (&Method::GET, p) => static_file(&shared, p).await,
        _ => json_error(StatusCode::NOT_FOUND, "Not found"),
    })
}

/// The REST broadcast routes (after any prefix): `/api/broadcast` and everything under it.
fn is_rest_route(api_path: &str) -> bool {
    api_path == "/api/broadcast" || api_path.starts_with("/api/broadcast/")
}

/// A request to a REST broadcast route, any method: a browser's preflight is answered here,
/// and every answer carries the CORS headers for the request's origin, so a page on
/// another origin can read it (errors included).
async fn rest_route(
    req: Request<Incoming>,
    shared: &Shared,
    path: &str,
    client: AddressKey,
) -> Resp {
    let cors = &shared.cfg.cors_allowed_origins;
    let origin = req.headers().get(ORIGIN).cloned();
    let api = api_path(path);
    let mut resp = match *req.method() {
        Method::OPTIONS => {
            let mut r = Response::new(Full::new(Bytes::new()));
            if cors.preflight(req.headers(), r.headers_mut()) {
                *r.status_mut() = StatusCode::NO_CONTENT;
                return r;
            }
            // Not one of the allowed origins: no allow header, and the browser refuses.
            *r.status_mut() = StatusCode::FORBIDDEN;
            return r;
        }
        // realtime-js posts under its socket URL's path: `/realtime/v1/api/broadcast...`.
        Method::POST if api == "/api/broadcast" => {
            outcome(rest::broadcast(req, shared, client).await)
        }
        Method::POST => match rest::Single::from_path(api, &url::query_params(&req)) {
            Some(single) => outcome(rest::broadcast_one(req, shared, client, single).await),
            None => json_error(StatusCode::NOT_FOUND, "Not found"),
        },
        _ => json_error(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed"),
    };
    cors.decorate(origin.as_ref(), resp.headers_mut());
    resp
}

/// An API path without the `/realtime/v1` prefix Supabase's clients put before it.
fn api_path(path: &str) -> &str {
    path.strip_prefix("/realtime/v1").unwrap_or(path)
}

fn outcome(o: crate::rest_limits::Outcome) -> Resp {
    match o {
        (status, Some(body)) => respond(status, "application/json", body.to_string()),
        (status, None) => respond(status, "application/json", ""),
    }
}

/// A file from `WEB_ROOT`, by a plain name only (no directories, no dot-dot).
async fn static_file(shared: &Shared, path: &str) -> Resp {
    let not_found = || json_error(StatusCode::NOT_FOUND, "Not found");
    let Some(root) = &shared.cfg.web_root else {
        return not_found();
    };
    let name = match path.trim_start_matches('/') {
        "" => "index.html",
        n => n,
    };
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !plain || name.starts_with('.') {
        return not_found();
    }
    let content_type = match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("json") => "application/json",
        Some("css") => "text/css",
        _ => "application/octet-stream",
    };
    match tokio::fs::read(root.join(name)).await {
        Ok(body) => respond(StatusCode::OK, content_type, body),
        Err(_) => not_found(),
    }
}

fn upgrade(
    mut req: Request<Incoming>,
    shared: Arc<Shared>,
    (client, client_ip): (AddressKey, IpAddr),
) -> Resp {
    let refuse = |status, message: &str| {
        shared.metrics.connections_refused.increment(1);
        json_error(status, message)
    };
    let is_upgrade = req
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = req
        .headers()
        .get(SEC_WEBSOCKET_KEY)
        .cloned()
        .filter(|_| is_upgrade)
    else {
        return refuse(StatusCode::BAD_REQUEST, "Expected a WebSocket upgrade");
    };
    let params = url::query_params(&req);
    let header = |h: &str| {
        req.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    // As Supabase reads it: `x-api-key` (where Kong puts the JWT it swapped an `sb_` key
    // for) before the `apikey` query parameter (which may still hold the `sb_` key); an
    // `apikey` header, which Supabase does not read, last.
    let apikey = header("x-api-key")
        .or_else(|| params.get("apikey").cloned())
        .or_else(|| header("apikey"));
    let Some(apikey) = apikey else {
        return refuse(StatusCode::UNAUTHORIZED, &Refusal::MissingApiKey.text());
    };
    let Some(vsn) = Vsn::parse(params.get("vsn").map(String::as_str)) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "Unsupported vsn: use 1.0.0 or 2.0.0",
        );
    };
    // A browser's upgrade carries its page's Origin: a secret key is refused there.
    let from_browser = req.headers().contains_key(hyper::header::ORIGIN);
    let claims = match shared.verifier.verify_key(&apikey, from_browser) {
        Ok(c) => c,
        Err(e) => return refuse(StatusCode::UNAUTHORIZED, &e.reason()),
    };

    // Phoenix passes only the `x-` request headers to channels; policies read them.
    let x_headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-"))
        .filter_map(|(k, v)| {
            Some((
                k.as_str().to_owned(),
                serde_json::Value::String(v.to_str().ok()?.to_owned()),
            ))
        })
        .collect();
    let headers = serde_json::Value::Object(x_headers).to_string();
    if let Err(why) = shared.policy_headers_fit(&headers) {
        return refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, &why.text());
    }
    let accept = derive_accept_key(key.as_bytes());
    let cfg = &shared.cfg;
    // Clients send small frames (joins, heartbeats, pushes); a larger one grows the buffer
    // as it comes. Every connection holds its read buffer for its life: 4 KiB of the 16.5 KiB
    // a connection cost (heaptrack, pgbench/RESULTS.md), 1 KiB now.
    let ws_config = WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(8192)
        .max_message_size(Some(cfg.max_frame_size))
        .max_frame_size(Some(cfg.max_frame_size));
    // The connection's place is taken before the 101 is sent, in one atomic step: counting
    // it later, when the socket task starts, let a burst of upgrades overshoot the limit.
    let m = &shared.metrics;
    // One address may not take the whole process: its connections are counted apart, for as
    // long as each lives. A backend's (a `service_role` apikey) are not: one server may hold
    // many, and its per-address limits count none of its connection's bindings, resumes or
    // tracks (`counted: None`).
    let counted = (!claims.is_backend()).then_some(client);
    // And its wider blocks (an IPv6 /56 and /48, an IPv4 /24), each with a limit of its own.
    let mut in_blocks = Vec::new();
    if !claims.is_backend() {
        for block in crate::address::Block::of(client_ip) {
            match shared
                .connections_by_block
                .enter(block, cfg.max_connections_per_block(&block))
            {
                Some(entered) => in_blocks.push(entered),
                None => {
                    m.connections_over_limit_total.increment(1);
                    return refuse(
                        StatusCode::TOO_MANY_REQUESTS,
                        &Refusal::TooManyConnectionsFromBlock(block.to_string()).text(),
                    );
                }
            }
        }
    }
    let from_address = match counted {
        Some(address) => match shared
            .connections_by_address
            .enter(address, cfg.max_connections_per_address)
        {
            Some(entered) => Some(entered),
            None => {
                m.connections_over_limit_total.increment(1);
                return refuse(
                    StatusCode::TOO_MANY_REQUESTS,
                    &Refusal::TooManyConnectionsFromAddress.text(),
                );
            }
        },
        None => None,
    };
    // Backends may use the whole of MAX_CONNECTIONS; other clients leave
    // BACKEND_RESERVE_PERCENT of it to them.
    let total = shared.cfg.max_connections as u64;
    let room = if claims.is_backend() {
        total
    } else {
        shared.cfg.clients_share(total)
    };
    if m.connections.fetch_add(1, Relaxed) >= room as i64 {
        m.connections.fetch_sub(1, Relaxed);
        m.connections_over_limit_total.increment(1);
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            &Refusal::ConnectionRateLimitReached.text(),
        );
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let shared2 = shared.clone();
    tokio::spawn(async move {
        let _from_address = from_address;
        let _in_blocks = in_blocks;
        match on_upgrade.await {
            // The sidecar writes the socket itself (`crate::out`): the upgraded connection is the
            // TcpStream it accepted, with what the HTTP server read past the request.
            Ok(upgraded) => match upgraded.downcast::<TokioIo<tokio::net::TcpStream>>() {
                Ok(parts) => {
                    socket::serve(
                        parts.io.into_inner(),
                        parts.read_buf,
                        ws_config,
                        shared2,
                        vsn,
                        claims,
                        headers,
                        counted,
                    )
                    .await;
                }
                Err(_) => {
                    shared2.metrics.connections.fetch_sub(1, Relaxed);
                    tracing::warn!("upgraded connection is not a TCP stream");
                }
            },
            Err(e) => {
                shared2.metrics.connections.fetch_sub(1, Relaxed);
                tracing::debug!(error = %e, "upgrade failed");
            }
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).unwrap(),
    );
    r
}
