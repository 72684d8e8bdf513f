//! Supabase's own health routes, so that the sidecar can stand in for the `realtime`
//! service of Supabase's self-hosted docker-compose, whose healthcheck runs
//! `curl -sSfL --head -o /dev/null -H "Authorization: Bearer $ANON_KEY"
//! http://localhost:4000/api/tenants/realtime-dev/health`:
//!
//! - `GET`/`HEAD /api/tenants/:tenant/health`: a Bearer token the sidecar verifies (a
//!   project JWT or an `sb_` key), else 403 with an empty body, as Supabase's `check_auth`;
//!   a tenant other than `SELF_HOST_TENANT_NAME`, 404; else 200 with Supabase's shape,
//!   `{"data": {healthy, db_connected, replication_connected, connected_cluster, region,
//!   node}}`. As with Supabase the answer is 200 whether healthy or not: the body says which.
//! - `GET`/`HEAD /api/ping`: 200 `{"message": "Success"}`, no token.
//!
//! `/healthz` stays what a proxy's health check asks (503 while this sidecar cannot drain).

use crate::state::Shared;
use hyper::{HeaderMap, StatusCode};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;

/// An answer: a status and a JSON body (None: empty).
pub type Answer = (StatusCode, Option<Value>);

/// The answer to `path` (after any `/realtime/v1` prefix), or None when it is neither route.
pub fn answer(path: &str, headers: &HeaderMap, shared: &Shared, now_ms: i64) -> Option<Answer> {
    if path == "/api/ping" {
        return Some((StatusCode::OK, Some(json!({"message": "Success"}))));
    }
    let tenant = path
        .strip_prefix("/api/tenants/")?
        .strip_suffix("/health")?;
    if !authorized(headers, shared) {
        return Some((StatusCode::FORBIDDEN, None));
    }
    if tenant != shared.cfg.self_host_tenant_name {
        return Some((StatusCode::NOT_FOUND, Some(json!({"error": "Not found"}))));
    }
    let m = &shared.metrics;
    let db_connected = m.db_up.load(Relaxed) == 1;
    let draining = m.health(now_ms).is_ok();
    let data = json!({
        "healthy": draining,
        "db_connected": db_connected,
        "replication_connected": draining,
        "connected_cluster": m.connections.load(Relaxed).max(0),
        "region": shared.cfg.region,
        "node": node(),
    });
    Some((StatusCode::OK, Some(json!({ "data": data }))))
}

/// A Bearer token the sidecar accepts from a client: a project JWT or an `sb_` key (Supabase
/// checks it against its API_JWT_SECRET; self-hosted, that is the project's JWT secret).
fn authorized(headers: &HeaderMap, shared: &Shared) -> bool {
    let Some(token) = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    shared.verifier.verify_key(token, false).is_ok()
}

/// The node's name, as Supabase's `Node.self()` names it: `realtime@<host>`.
fn node() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("realtime@{}", host.trim())
}
