//! A client frame parsed once into what it asks for, as mini-redis parses a frame into a
//! `Command`: the connection dispatches on the type, never on event strings, and a binary
//! broadcast push arrives as the same command as a text one.

use crate::client_text;
use crate::frame::{self, DecodeError, Inbound, Vsn};
use crate::hub::Payload;
use crate::join_config::{self, JoinConfig};
use crate::persist::{self, PersistError};
use crate::postgres_changes::bounds::Bounds;
use crate::presence::channel::PresencePush;
use bytes::Bytes;
use serde_json::Value;

/// A decoded client frame: its header (`join_ref`, `ref`, topic, event; the payload taken
/// out) and its command.
#[derive(Debug)]
pub struct Frame {
    pub head: Inbound,
    pub command: Command,
}

#[derive(Debug)]
pub enum Command {
    /// `heartbeat` on topic `phoenix`.
    Heartbeat,
    Join(Box<JoinConfig>),
    Leave,
    /// A new token for the channel (None when the payload has none).
    AccessToken(Option<String>),
    /// A client broadcast, or why it cannot be one (answered with an error reply).
    Broadcast(Result<ClientBroadcast, String>),
    /// A presence `track` or `untrack` (`presence::channel`).
    Presence(PresencePush),
    Unknown(String),
}

#[derive(Debug, PartialEq)]
pub struct ClientBroadcast {
    pub event: String,
    pub payload: Payload,
    /// The ttl (seconds) to keep it for, if its sender asked (`persist`), or why what it
    /// asked is not a ttl.
    pub persist: Result<Option<i32>, PersistError>,
}

fn broadcast(
    event: String,
    payload: Payload,
    persist: Result<Option<i32>, PersistError>,
) -> Result<ClientBroadcast, String> {
    client_text::event(&event).map_err(|e| e.to_string())?;
    Ok(ClientBroadcast {
        event,
        payload,
        persist,
    })
}

/// Parses a text frame of either serializer; a join's bindings are counted against `bounds`
/// before they are parsed.
pub fn from_text(vsn: Vsn, text: &str, bounds: &Bounds) -> Result<Frame, DecodeError> {
    let (head, raw) = frame::decode_text_head(vsn, text)?;
    let raw = raw.map_or("null", |p| p.get());
    // JSON by its grammar (the envelope's parse checked it), but a value may still not be
    // one serde_json holds (a number past f64's range): then not JSON, as before.
    let not_json = |e: serde_json::Error| DecodeError::NotJson(e.to_string());
    if head.event == "phx_join" {
        let config = join_config::parse_join_text(raw, bounds).map_err(not_json)?;
        return Ok(Frame {
            head,
            command: Command::Join(Box::new(config)),
        });
    }
    let payload: Value = serde_json::from_str(raw).map_err(not_json)?;
    let command = match (head.topic.as_str(), head.event.as_str()) {
        ("phoenix", "heartbeat") => Command::Heartbeat,
        (_, "phx_leave") => Command::Leave,
        (_, "access_token") => Command::AccessToken(
            payload
                .get("access_token")
                .and_then(Value::as_str)
                .map(str::to_owned),
        ),
        (_, "broadcast") => {
            Command::Broadcast(match payload.get("event").and_then(Value::as_str) {
                None => Err("a broadcast needs an event name".to_owned()),
                Some(event) => {
                    let body = payload.get("payload").unwrap_or(&Value::Null);
                    let persist = persist::from_value(payload.get("persist"));
                    broadcast(event.to_owned(), Payload::Json(body.to_string()), persist)
                }
            })
        }
        (_, "presence") => Command::Presence(PresencePush::parse(&payload)),
        (_, other) => Command::Unknown(other.to_owned()),
    };
    Ok(Frame { head, command })
}

/// Parses a binary frame (2.0.0 only): a client broadcast push.
pub fn from_binary(bytes: &Bytes) -> Result<Frame, DecodeError> {
    let push = frame::decode_binary(bytes)?;
    // A JSON payload that does not parse would fail the relay's whole batch in the
    // database (`json` input): refused here, with serde's reason.
    let payload = match push.encoding {
        frame::ENCODING_JSON => match String::from_utf8(push.payload.to_vec()) {
            Ok(json) => match client_text::json_payload(json.as_bytes()) {
                Ok(()) => Ok(Payload::Json(json)),
                Err(e) => Err(e.to_string()),
            },
            Err(_) => Err("the JSON payload is not UTF-8".to_owned()),
        },
        _ => Ok(Payload::Binary(push.payload)),
    };
    let head = Inbound {
        join_ref: push.join_ref,
        reference: push.reference,
        topic: push.topic,
        event: "broadcast".into(),
        payload: Value::Null,
    };
    // realtime-js puts `persist` (and only its allow-listed keys) in the metadata.
    let persist = match serde_json::from_slice::<Value>(&push.metadata) {
        Ok(meta) => persist::from_value(meta.get("persist")),
        Err(_) if push.metadata.is_empty() => Ok(None),
        Err(_) => Err(PersistError::BadTtl),
    };
    let command = Command::Broadcast(payload.and_then(|p| broadcast(push.event, p, persist)));
    Ok(Frame { head, command })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_event_becomes_its_command() {
        let parse = |v: Value| {
            from_text(Vsn::V2, &v.to_string(), &Bounds::defaults())
                .unwrap()
                .command
        };
        assert!(matches!(
            parse(json!([null, "1", "phoenix", "heartbeat", {}])),
            Command::Heartbeat
        ));
        // A heartbeat event on a channel topic is not a heartbeat.
        assert!(
            matches!(parse(json!([null, "1", "realtime:a", "heartbeat", {}])), Command::Unknown(e) if e == "heartbeat")
        );
        match parse(json!(["1", "1", "realtime:a", "phx_join", {"config": {"private": true}}])) {
            Command::Join(c) => assert!(c.private),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(json!(["1", "2", "realtime:a", "phx_leave", {}])),
            Command::Leave
        ));
        assert!(
            matches!(parse(json!(["1", "3", "realtime:a", "access_token", {"access_token": "t"}])),
            Command::AccessToken(Some(t)) if t == "t")
        );
        assert!(matches!(
            parse(
                json!(["1", "4", "realtime:a", "presence", {"type": "presence", "event": "untrack"}])
            ),
            Command::Presence(PresencePush::Untrack)
        ));
        match parse(
            json!(["1", "5", "realtime:a", "broadcast", {"type": "broadcast", "event": "e", "payload": {"x": 1}}]),
        ) {
            Command::Broadcast(Ok(b)) => assert_eq!(
                b,
                ClientBroadcast {
                    event: "e".into(),
                    payload: Payload::Json(r#"{"x":1}"#.into()),
                    persist: Ok(None),
                }
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(json!(["1", "6", "realtime:a", "broadcast", {"payload": {}}])),
            Command::Broadcast(Err(e)) if e == "a broadcast needs an event name"
        ));
        let long = "e".repeat(256);
        assert!(matches!(
            parse(json!(["1", "7", "realtime:a", "broadcast", {"event": long}])),
            Command::Broadcast(Err(_))
        ));
    }

    #[test]
    fn a_binary_push_is_the_same_broadcast_command() {
        let mut push = vec![3u8, 1, 1, 12, 1, 0, frame::ENCODING_BINARY, b'1', b'2'];
        push.extend_from_slice(b"realtime:abce\x00\xff");
        let f = from_binary(&Bytes::from(push.clone())).unwrap();
        assert_eq!(
            (f.head.topic.as_str(), f.head.join_ref.as_deref()),
            ("realtime:abc", Some("1"))
        );
        match f.command {
            Command::Broadcast(Ok(b)) => {
                assert_eq!(b.event, "e");
                assert_eq!(b.payload, Payload::Binary(Bytes::from_static(b"\x00\xff")));
            }
            other => panic!("{other:?}"),
        }
        push[6] = frame::ENCODING_JSON;
        let f = from_binary(&Bytes::from(push)).unwrap();
        assert!(matches!(
            f.command,
            Command::Broadcast(Err(e)) if e == "the JSON payload is not UTF-8"
        ));
    }
}
