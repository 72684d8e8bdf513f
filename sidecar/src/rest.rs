//! Supabase's REST broadcast: `POST /api/broadcast` (a batch) and
//! `POST /api/broadcast/:topic/events/:event` (one message, realtime-js's `httpSend`), both
//! also under `/realtime/v1`, where realtime-js posts them when its socket URL is
//! `.../realtime/v1`. The messages are relayed through the database like client broadcasts
//! (so every sidecar delivers them in one order) and the request is answered 202 once they
//! have committed.

use crate::address::AddressKey;
use crate::authorizer::{self, Identity, Verdict};
use crate::byte_budget::{Hold, Over};
use crate::hub::Payload;
use crate::persist::{self, PersistError};
use crate::reading;
use crate::reason;
use crate::reason::Refusal;
use crate::relay::{self, AckTo, Failure};
use crate::rest_limits::{Admitted, Sender};
use crate::state::Shared;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::oneshot;

/// The outcome: a status and a JSON body (empty for 202).
use crate::rest_limits::Outcome;

fn unauthorized() -> Outcome {
    (
        StatusCode::UNAUTHORIZED,
        Some(json!({"message": "Unauthorized"})),
    )
}

fn invalid(errors: Value) -> Outcome {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Some(json!({ "errors": errors })),
    )
}

/// One message of the request, validated as Supabase validates it.
pub(crate) struct Message {
    pub(crate) topic: String,
    event: String,
    payload: Value,
    private: bool,
    /// The id its sender named, delivered as `meta.id`.
    id: Option<String>,
}

/// A batch's messages, validated; or, past `max`, only how many it has (the rest were not
/// built: `rest_body`), which the limits refuse.
pub(crate) enum Parsed {
    Messages(Vec<Message>),
    TooMany(usize),
}

pub(crate) fn parse(body: &[u8], max: usize) -> Result<Parsed, Outcome> {
    let listed = crate::rest_body::messages(body, max)
        .map_err(|e| invalid(json!({"body": [format!("is not valid JSON: {e}")]})))?;
    let Some(listed) = listed else {
        return Err(invalid(json!({"messages": ["can't be blank"]})));
    };
    if listed.count > max {
        return Ok(Parsed::TooMany(listed.count));
    }
    let list = listed.items;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let mut errors = serde_json::Map::new();
        let text = |k: &str| {
            m.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let topic = text("topic");
        let event = text("event");
        let payload = m.get("payload").filter(|p| p.is_object()).cloned();
        match topic.as_deref().map(crate::join_config::validate_sub_topic) {
            None => {
                errors.insert("topic".into(), json!(["can't be blank"]));
            }
            Some(Err(why)) => {
                errors.insert("topic".into(), json!([why.text()]));
            }
            Some(Ok(())) => {}
        }
        match event.as_deref().map(crate::client_text::event) {
            None => {
                errors.insert("event".into(), json!(["can't be blank"]));
            }
            // A NUL or an overlong name would fail the relay's batch in the database.
            Some(Err(why)) => {
                errors.insert("event".into(), json!([why.to_string()]));
            }
            Some(Ok(())) => {}
        }
        if payload.is_none() {
            errors.insert("payload".into(), json!(["must be a JSON object"]));
        }
        let id = match m.get("id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) if message_id(id) => Some(id.clone()),
            Some(_) => {
                errors.insert("id".into(), json!([MESSAGE_ID_INVALID]));
                None
            }
        };
        if !errors.is_empty() {
            return Err(invalid(json!({ "messages": { i.to_string(): errors } })));
        }
        out.push(Message {
            topic: topic.unwrap(),
            event: event.unwrap(),
            payload: payload.unwrap(),
            private: m.get("private").and_then(Value::as_bool).unwrap_or(false),
            id,
        });
    }
    Ok(Parsed::Messages(out))
}

/// Who sends, for the policies and for the limits.
struct Caller {
    who: Arc<Identity>,
    /// The JWT's `sub`, which the per-user rate counts by.
    sub: Option<String>,
    backend: bool,
    address: AddressKey,
}

impl Caller {
    fn sender(&self) -> Sender<'_> {
        Sender {
            address: self.address,
            sub: self.sub.as_deref(),
            backend: self.backend,
        }
    }
}

/// Who sends: the bearer token (or the apikey), verified, with every request header (Supabase
/// passes them all to policies of REST calls).
fn identity(
    req: &Request<Incoming>,
    shared: &Shared,
    address: AddressKey,
) -> Result<Caller, Outcome> {
    let headers = req.headers();
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    let token = bearer.or_else(|| headers.get("apikey").and_then(|v| v.to_str().ok()));
    let Some(token) = token else {
        return Err(unauthorized());
    };
    // An `sb_` key in either place stands for its role's claims (`jwt::api_keys`), as
    // Supabase's gateway swaps it for that role's JWT.
    let from_browser = headers.contains_key(hyper::header::ORIGIN);
    let Ok(claims) = shared.verifier.verify_key(token, from_browser) else {
        return Err(unauthorized());
    };
    let all_headers: serde_json::Map<String, Value> = headers
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.as_str().to_owned(),
                Value::String(v.to_str().ok()?.to_owned()),
            ))
        })
        .collect();
    let headers_json = Value::Object(all_headers).to_string();
    if let Err(why) = shared.policy_headers_fit(&headers_json) {
        return Err((
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Some(json!({ "message": why.text() })),
        ));
    }
    Ok(Caller {
        who: Arc::new(Identity {
            role: claims.role.clone(),
            claims: claims.all.to_string(),
            headers: headers_json,
            address: (!claims.is_backend()).then_some(address),
        }),
        sub: claims.sub.clone(),
        backend: claims.is_backend(),
        address,
    })
}

/// The caller, admitted: a place among the requests in flight (before the body is read).
fn admit(
    req: &Request<Incoming>,
    shared: &Shared,
    address: AddressKey,
) -> Result<(Caller, Admitted), Outcome> {
    let caller = identity(req, shared, address)?;
    let admitted = shared
        .rest_limits
        .admit(&caller.sender())
        .map_err(|r| r.outcome())?;
    Ok((caller, admitted))
}

/// The request body, bounded in size (MAX_FRAME_SIZE), in time (a body that trickles in is
/// cut off like slow headers are), and in the bytes being read: past `reading::FREE`, each
/// chunk is held against its address's and the sidecar's bound before it is kept
/// (`reading`), until the request is answered (the `Hold` returned). Nothing waits for room.
async fn body(
    req: Request<Incoming>,
    shared: &Shared,
    address: Option<AddressKey>,
) -> Result<(Bytes, Hold), Outcome> {
    let max = shared.cfg.max_frame_size;
    let mut hold = shared.reading.holder(address);
    let read = async {
        let mut body = req.into_body();
        let mut kept = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return Err((
                    StatusCode::BAD_REQUEST,
                    Some(json!({"message": "the request body could not be read"})),
                ));
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let len = kept.len() + data.len();
            if len > max {
                return Err((
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Some(json!({"message": "Payload too large"})),
                ));
            }
            if let Err(over) = hold.set(len.saturating_sub(reading::FREE)) {
                shared.metrics.reading_refusals_total.increment(1);
                let (status, text) = match over {
                    Over::Address => (StatusCode::TOO_MANY_REQUESTS, reason::READING_FROM_ADDRESS),
                    Over::Sidecar => (StatusCode::SERVICE_UNAVAILABLE, reason::READING),
                };
                // The rest is read and dropped (MAX_FRAME_SIZE at most, within the body's
                // time), so that the client reads the answer: a connection closed with
                // unread bytes is reset, and the answer may be lost with it.
                let mut rest = len;
                while let Some(Ok(frame)) = body.frame().await {
                    rest += frame.data_ref().map_or(0, Bytes::len);
                    if rest > max {
                        break;
                    }
                }
                return Err((status, Some(json!({ "message": text }))));
            }
            kept.extend_from_slice(&data);
        }
        Ok(kept.freeze())
    };
    let read = tokio::time::timeout(shared.cfg.http_header_timeout(), read).await;
    match read {
        Ok(Ok(b)) => Ok((b, hold)),
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            Some(json!({"message": "the request body did not arrive in time"})),
        )),
    }
}

/// Private messages need the write verdict, checked once per topic: the topics refused, each
/// with why (a batch delivers the others, as Supabase's does; one message is refused, 403).
/// Err when the database could not answer.
async fn check_writes<'a>(
    shared: &Shared,
    who: &Arc<Identity>,
    private_topics: impl Iterator<Item = &'a str>,
) -> Result<Vec<(String, String)>, Outcome> {
    let mut checked = std::collections::HashSet::new();
    let mut denied = Vec::new();
    for topic in private_topics {
        if !checked.insert(topic) {
            continue;
        }
        match authorizer::ask(&shared.authorize, who, topic, "broadcast", true).await {
            Verdict::Allowed => {}
            Verdict::Denied(_) => {
                let message = Refusal::WriteDenied {
                    topic: topic.to_owned(),
                }
                .text();
                denied.push((topic.to_owned(), message));
            }
            Verdict::Failed(f) => {
                return Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some(json!({ "message": f.reason() })),
                ))
            }
        }
    }
    Ok(denied)
}

/// One message to relay: topic, event, private, payload, the ttl to keep it for, and the id
/// its sender named.
type ToRelay = (String, String, bool, Payload, Option<i32>, Option<String>);

/// Why a batch message's `id` was refused. Supabase takes any string; pg_realtime carries a
/// message's id as a `uuid` (the queue's records, `realtime.messages`), and delivers exactly
/// what was sent, so it takes a UUID in the form Postgres prints one.
const MESSAGE_ID_INVALID: &str =
    "is invalid: a message's id must be a UUID, lowercase, as 8-4-4-4-12 hexadecimal digits";

/// Whether `id` is a UUID as Postgres prints one (lowercase 8-4-4-4-12): what the relay's
/// cast takes and gives back unchanged.
fn message_id(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// Relays the messages and answers once every one of them is settled: 202 when all have
/// committed; 503 when the database could not be reached for one; else 422 naming each
/// reason the database refused one for. Each message is relayed on its own, as Supabase's
/// are, so the others of a 422 were relayed. The answer waits for all of them, and REST's
/// half of the relay stays held until then (an answer at the first refusal gave the half
/// back while the rest were still in the relay: issue 39, L5). `sender`: whose persist quota
/// the kept ones count against.
async fn relay_all(
    shared: &Shared,
    address: Option<AddressKey>,
    sender: Option<String>,
    messages: Vec<ToRelay>,
) -> Outcome {
    let _room = match shared
        .rest_limits
        .relay_room(messages.len(), shared.cfg.http_header_timeout())
        .await
    {
        Ok(room) => room,
        Err(refused) => return refused.outcome(),
    };
    let origin = shared.origin(u64::from(u32::MAX));
    let mut waits = Vec::with_capacity(messages.len());
    let mut refused = Vec::new();
    let mut unavailable = None;
    for (topic, event, private, payload, persist, id) in messages {
        let held = match relay::hold_bytes(
            &shared.relay_bytes,
            address,
            &topic,
            &event,
            &payload,
            &shared.metrics,
        ) {
            Ok(held) => held,
            Err(busy) => {
                unavailable = Some(busy.reason());
                break;
            }
        };
        let (tx, rx) = oneshot::channel();
        let broadcast = relay::Broadcast {
            origin,
            topic,
            event,
            private,
            payload,
            persist,
            sender: sender.clone(),
            id,
            reply: AckTo::Http(tx),
            held,
        };
        if let Some(f) = relay::known_full(&shared.persist_full, &broadcast, &shared.metrics) {
            refused.push(f.reason());
            continue;
        }
        if shared.relay.send(broadcast).await.is_err() {
            unavailable = Some("Server is shutting down".to_owned());
            break;
        }
        waits.push(rx);
    }
    for rx in waits {
        match rx.await {
            Ok(Ok(())) => {}
            // The database refused the message (too large, say), or could not be reached.
            Ok(Err(f @ Failure::Refused(_))) => refused.push(f.reason()),
            Ok(Err(f @ Failure::Unavailable(_))) => {
                unavailable.get_or_insert(f.reason());
            }
            Err(_) => {
                unavailable.get_or_insert("Server is shutting down".to_owned());
            }
        }
    }
    if let Some(why) = unavailable {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Some(json!({ "message": why })),
        );
    }
    if !refused.is_empty() {
        return invalid(json!({ "messages": refused }));
    }
    (StatusCode::ACCEPTED, None)
}

/// `POST /api/broadcast`: a batch of messages.
pub async fn broadcast(req: Request<Incoming>, shared: &Shared, address: AddressKey) -> Outcome {
    let (caller, _admitted) = match admit(&req, shared, address) {
        Ok(admitted) => admitted,
        Err(outcome) => return outcome,
    };
    // A backend's request counts against the sidecar's bounds only, as its socket does.
    let counted = (!caller.backend).then_some(address);
    let (body, _reading) = match body(req, shared, counted).await {
        Ok(b) => b,
        Err(outcome) => return outcome,
    };
    let (messages, n) = match parse(&body, shared.rest_limits.max_messages()) {
        Ok(Parsed::Messages(m)) => {
            let n = m.len();
            (m, n)
        }
        Ok(Parsed::TooMany(n)) => (Vec::new(), n),
        Err(outcome) => return outcome,
    };
    // A batch past the per-request bound is refused here, its address's second spent.
    if let Err(refused) = shared.rest_limits.charge(&caller.sender(), n) {
        return refused.outcome();
    }
    let who = caller.who;
    let private = messages
        .iter()
        .filter(|m| m.private)
        .map(|m| m.topic.as_str());
    let denied = match check_writes(shared, &who, private).await {
        Ok(denied) => denied,
        Err(outcome) => return outcome,
    };
    // As Supabase: the messages of private topics the caller may not write to are left out
    // and the others delivered, 202; unlike Supabase, the answer names those left out.
    let messages = messages
        .into_iter()
        .filter(|m| !m.private || !denied.iter().any(|(t, _)| *t == m.topic))
        .map(|m| {
            let payload = Payload::Json(m.payload.to_string());
            // Supabase's batch endpoint does not persist (realtime-js says so too).
            (m.topic, m.event, m.private, payload, None, m.id)
        })
        .collect();
    match relay_all(shared, counted, None, messages).await {
        (StatusCode::ACCEPTED, None) if !denied.is_empty() => {
            let refused: Vec<Value> = denied
                .into_iter()
                .map(|(topic, message)| json!({"topic": topic, "message": message}))
                .collect();
            (StatusCode::ACCEPTED, Some(json!({ "refused": refused })))
        }
        outcome => outcome,
    }
}

/// What `POST /api/broadcast/:topic/events/:event` names: the path's topic and event
/// (percent-decoded) and its query.
#[derive(Debug, PartialEq)]
pub struct Single {
    pub topic: String,
    pub event: String,
    pub private: bool,
    /// `persist=true` or `persist[ttl]=N`: keep the message for replay (realtime-js's
    /// `httpSend(..., {persist})`), for this ttl in seconds; or why it cannot be kept.
    pub persist: Result<Option<i32>, PersistError>,
}

impl Single {
    /// The route's parts from a path (after any `/realtime/v1` prefix) and its query, or
    /// None when the path is not this route.
    pub fn from_path(path: &str, query: &HashMap<String, String>) -> Option<Single> {
        let rest = path.strip_prefix("/api/broadcast/")?;
        let (topic, event) = rest.split_once("/events/")?;
        if topic.is_empty() || event.is_empty() || event.contains('/') {
            return None;
        }
        let flag = |k: &str| query.get(k).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        Some(Single {
            topic: crate::url::decode_path(topic),
            event: crate::url::decode_path(event),
            private: flag("private"),
            persist: persist::from_query(
                query.get("persist").map(String::as_str),
                query.get("persist[ttl]").map(String::as_str),
            ),
        })
    }
}

/// `POST /api/broadcast/:topic/events/:event[?private=true]`: one message, its body the
/// payload (JSON, or raw bytes with `application/octet-stream`), as realtime-js's
/// `channel.httpSend` posts it. Answered 202 once committed.
pub async fn broadcast_one(
    req: Request<Incoming>,
    shared: &Shared,
    address: AddressKey,
    single: Single,
) -> Outcome {
    let (caller, _admitted) = match admit(&req, shared, address) {
        Ok(admitted) => admitted,
        Err(outcome) => return outcome,
    };
    let persist = match single
        .persist
        .clone()
        .and_then(|ttl| persist::check(ttl, single.private))
    {
        Ok(ttl) => ttl,
        Err(why) => return invalid_error(&why.text()),
    };
    if let Err(why) = crate::join_config::validate_sub_topic(&single.topic) {
        return invalid_error(&why.text());
    }
    // The event is percent-decoded from the path: `%00` is a NUL.
    if let Err(why) = crate::client_text::event(&single.event) {
        return invalid_error(&why.to_string());
    }
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    let binary = match content_type.as_deref() {
        None | Some("application/json") => false,
        Some("application/octet-stream") => true,
        Some(other) => {
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Some(
                    json!({ "error": format!("Unsupported Media Type: {other}; send application/json or application/octet-stream") }),
                ),
            )
        }
    };
    // A backend's request counts against the sidecar's bounds only, as its socket does.
    let counted = (!caller.backend).then_some(address);
    let (body, _reading) = match body(req, shared, counted).await {
        Ok(b) => b,
        Err(outcome) => return outcome,
    };
    let payload = if binary {
        Payload::Binary(body)
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) => Payload::Json(v.to_string()),
            Err(e) => return invalid_error(&format!("the body is not valid JSON: {e}")),
        }
    };
    if let Err(refused) = shared.rest_limits.charge(&caller.sender(), 1) {
        return refused.outcome();
    }
    let topics = std::iter::once(single.topic.as_str()).filter(|_| single.private);
    match check_writes(shared, &caller.who, topics).await {
        Ok(denied) => {
            if let Some((_, message)) = denied.into_iter().next() {
                return (StatusCode::FORBIDDEN, Some(json!({ "message": message })));
            }
        }
        Err(outcome) => return outcome,
    }
    let sender = persist
        .and_then(|_| crate::persist::sender(caller.sub.as_deref(), Some(address), caller.backend));
    relay_all(
        shared,
        counted,
        sender,
        vec![(
            single.topic,
            single.event,
            single.private,
            payload,
            persist,
            None,
        )],
    )
    .await
}

/// A 422 whose `error` realtime-js's `httpSend` hands to the app.
fn invalid_error(why: &str) -> Outcome {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Some(json!({ "error": why })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_single_message_route_is_read_from_its_path_and_query() {
        let q = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            Single::from_path(
                "/api/broadcast/room%3A1%2Fa+b/events/ping%20it",
                &q(&[("private", "true")])
            ),
            Some(Single {
                topic: "room:1/a+b".into(),
                event: "ping it".into(),
                private: true,
                persist: Ok(None),
            })
        );
        let ttl = Single::from_path("/api/broadcast/t/events/e", &q(&[("persist[ttl]", "60")]));
        assert_eq!(ttl.unwrap().persist, Ok(Some(60)));
        let bad = Single::from_path("/api/broadcast/t/events/e", &q(&[("persist[ttl]", "0")]));
        assert_eq!(bad.unwrap().persist, Err(PersistError::BadTtl));
        assert_eq!(Single::from_path("/api/broadcast", &q(&[])), None);
        assert_eq!(Single::from_path("/api/broadcast/t/events/", &q(&[])), None);
        assert_eq!(
            Single::from_path("/api/broadcast/t/events/a/b", &q(&[])),
            None
        );
    }

    #[test]
    fn validates_like_supabase() {
        let ok = br#"{"messages":[{"topic":"room","event":"e","payload":{"a":1}}]}"#;
        assert!(matches!(parse(ok, 10), Ok(Parsed::Messages(m)) if m.len() == 1));
        // Past the bound, counted and not validated (the limits refuse it).
        let two = br#"{"messages":[{"topic":"room","event":"e","payload":{}}, 1]}"#;
        assert!(matches!(parse(two, 1), Ok(Parsed::TooMany(2))));
        let cases: [(&[u8], &str); 3] = [
            (b"{}", "messages"),
            (
                br#"{"messages":[{"topic":"room","event":"e","payload":[1]}]}"#,
                "payload",
            ),
            (br#"{"messages":[{"event":"e","payload":{}}]}"#, "topic"),
        ];
        for (body, field) in cases {
            let Err((status, errors)) = parse(body, 10) else {
                panic!("{field}: accepted");
            };
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
            assert!(errors.unwrap().to_string().contains(field), "{field}");
        }
    }

    #[test]
    fn a_message_id_is_a_uuid_as_postgres_prints_one() {
        let with = |id: &str| {
            format!(r#"{{"messages":[{{"topic":"t","event":"e","payload":{{}},"id":{id}}}]}}"#)
        };
        let id = |body: String| match parse(body.as_bytes(), 10) {
            Ok(Parsed::Messages(m)) => Ok(m.into_iter().next().unwrap().id),
            Ok(Parsed::TooMany(_)) => panic!("one message"),
            Err((_, errors)) => Err(errors.unwrap()["errors"]["messages"]["0"]["id"][0].clone()),
        };
        let uuid = "0b0c0d0e-0000-4000-8000-00000000000a";
        assert_eq!(id(with(&format!("\"{uuid}\""))), Ok(Some(uuid.to_owned())));
        assert_eq!(id(with("null")), Ok(None));
        for bad in [
            r#""msg-123""#,
            r#""0B0C0D0E-0000-4000-8000-00000000000A""#,
            r#""{0b0c0d0e-0000-4000-8000-00000000000a}""#,
            r#""0b0c0d0e00004000800000000000000a""#,
            r#""0b0c0d0e-0000-4000-8000-00000000000a ""#,
            "12",
            "{}",
        ] {
            assert_eq!(id(with(bad)), Err(json!(MESSAGE_ID_INVALID)), "{bad}");
        }
    }
}
