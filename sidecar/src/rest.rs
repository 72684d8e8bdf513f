//! `POST /api/broadcast`: Supabase's batch REST broadcast. The messages are relayed through
//! the database like client broadcasts (so every sidecar delivers them in one order) and the
//! request is answered 202 once they have committed.

use crate::authorizer::{self, Identity, Verdict};
use crate::hub::Payload;
use crate::reason::Refusal;
use crate::relay::{self, AckTo, Failure};
use crate::state::Shared;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// The outcome: a status and a JSON body (empty for 202).
pub type Outcome = (StatusCode, Option<Value>);

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
}

pub(crate) fn parse(body: &[u8]) -> Result<Vec<Message>, Outcome> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| invalid(json!({"body": [format!("is not valid JSON: {e}")]})))?;
    let Some(list) = v.get("messages").and_then(Value::as_array) else {
        return Err(invalid(json!({"messages": ["can't be blank"]})));
    };
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
        if event.is_none() {
            errors.insert("event".into(), json!(["can't be blank"]));
        }
        if payload.is_none() {
            errors.insert("payload".into(), json!(["must be a JSON object"]));
        }
        if !errors.is_empty() {
            return Err(invalid(json!({ "messages": { i.to_string(): errors } })));
        }
        out.push(Message {
            topic: topic.unwrap(),
            event: event.unwrap(),
            payload: payload.unwrap(),
            private: m.get("private").and_then(Value::as_bool).unwrap_or(false),
        });
    }
    Ok(out)
}

pub async fn broadcast(req: Request<Incoming>, shared: &Shared) -> Outcome {
    let headers = req.headers();
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    let token = bearer.or_else(|| headers.get("apikey").and_then(|v| v.to_str().ok()));
    let Some(token) = token.map(str::to_owned) else {
        return unauthorized();
    };
    let Ok(claims) = shared.verifier.verify(&token) else {
        return unauthorized();
    };
    // Supabase passes every request header of a REST call to policies.
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
        return (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Some(json!({ "message": why.text() })),
        );
    }
    let who = Identity {
        role: claims.role.clone(),
        claims: claims.all.to_string(),
        headers: headers_json,
    };
    // A body that trickles in is cut off like slow headers are.
    let body = Limited::new(req.into_body(), shared.cfg.max_frame_size).collect();
    let body: Bytes = match tokio::time::timeout(shared.cfg.http_header_timeout(), body).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                Some(json!({"message": "Payload too large"})),
            )
        }
        Err(_) => {
            return (
                StatusCode::REQUEST_TIMEOUT,
                Some(json!({"message": "the request body did not arrive in time"})),
            )
        }
    };
    let messages = match parse(&body) {
        Ok(m) => m,
        Err(outcome) => return outcome,
    };
    // Private messages need the write verdict, checked once per topic; Supabase skips the
    // refused ones silently, here the request is refused whole and says which topic.
    let mut checked = std::collections::HashSet::new();
    for m in messages.iter().filter(|m| m.private) {
        if !checked.insert(m.topic.clone()) {
            continue;
        }
        match authorizer::ask(&shared.authorize, &who, &m.topic, "broadcast", true).await {
            Verdict::Allowed => {}
            Verdict::Denied(_) => {
                let message = Refusal::WriteDenied {
                    topic: m.topic.clone(),
                }
                .text();
                return (StatusCode::FORBIDDEN, Some(json!({ "message": message })));
            }
            Verdict::Failed(f) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some(json!({ "message": f.reason() })),
                )
            }
        }
    }
    let mut waits = Vec::with_capacity(messages.len());
    for m in messages {
        let (tx, rx) = oneshot::channel();
        let broadcast = relay::Broadcast {
            origin: shared.origin(u64::from(u32::MAX)),
            topic: m.topic,
            event: m.event,
            private: m.private,
            payload: Payload::Json(m.payload.to_string()),
            reply: AckTo::Http(tx),
        };
        if shared.relay.send(broadcast).await.is_err() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Some(json!({"message": "Server is shutting down"})),
            );
        }
        waits.push(rx);
    }
    for rx in waits {
        match rx.await {
            Ok(Ok(())) => {}
            // The database refused the message (too large, say), or could not be reached.
            Ok(Err(f @ Failure::Refused(_))) => {
                return invalid(json!({ "messages": [f.reason()] }));
            }
            Ok(Err(f @ Failure::Unavailable(_))) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some(json!({ "message": f.reason() })),
                )
            }
            Err(_) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some(json!({"message": "Server is shutting down"})),
                )
            }
        }
    }
    (StatusCode::ACCEPTED, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_like_supabase() {
        let ok = br#"{"messages":[{"topic":"room","event":"e","payload":{"a":1}}]}"#;
        assert_eq!(parse(ok).map(|m| m.len()).ok(), Some(1));
        let cases: [(&[u8], &str); 3] = [
            (b"{}", "messages"),
            (
                br#"{"messages":[{"topic":"room","event":"e","payload":[1]}]}"#,
                "payload",
            ),
            (br#"{"messages":[{"event":"e","payload":{}}]}"#, "topic"),
        ];
        for (body, field) in cases {
            let (status, errors) = parse(body).err().unwrap();
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
            assert!(errors.unwrap().to_string().contains(field), "{field}");
        }
    }
}
