//! Phoenix channel frames as Supabase Realtime speaks them: serializer 1.0.0 (JSON objects)
//! and 2.0.0 (JSON arrays, plus binary user-broadcast frames: kind 3 from clients, kind 4
//! to clients).

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// The serializer a socket negotiated with its `vsn` query parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vsn {
    V1,
    V2,
}

impl Vsn {
    /// Phoenix uses 1.0.0 when `vsn` is absent.
    pub fn parse(vsn: Option<&str>) -> Option<Vsn> {
        match vsn {
            None | Some("1.0.0") => Some(Vsn::V1),
            Some("2.0.0") => Some(Vsn::V2),
            _ => None,
        }
    }
}

const KIND_USER_BROADCAST_PUSH: u8 = 3;
const KIND_USER_BROADCAST: u8 = 4;
pub const ENCODING_BINARY: u8 = 0;
pub const ENCODING_JSON: u8 = 1;

/// A frame from a client.
#[derive(Debug, PartialEq)]
pub struct Inbound {
    pub join_ref: Option<String>,
    pub reference: Option<String>,
    pub topic: String,
    pub event: String,
    pub payload: Value,
}

#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    NotJson(String),
    Shape(&'static str),
    Binary(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::NotJson(e) => write!(f, "frame is not valid JSON: {e}"),
            DecodeError::Shape(what) => write!(f, "frame is not a Phoenix message: {what}"),
            DecodeError::Binary(what) => write!(f, "binary frame is malformed: {what}"),
        }
    }
}

/// The longest `ref` a frame may carry. A push's ref is kept until the push is answered
/// (a presence push waits for its commit, a held push for its verdict), so it is bounded in
/// bytes as the pushes waiting are in count; 255 is what the 2.0.0 binary frames' one-byte
/// length allows, and realtime-js sends a counter. A longer one makes the frame malformed,
/// dropped as Supabase drops a frame it cannot read.
pub const MAX_REF_BYTES: usize = 255;

/// A frame's `ref`, at most MAX_REF_BYTES.
fn push_ref(v: &Value) -> Result<Option<String>, DecodeError> {
    let r = opt_ref(v)?;
    if r.as_ref().is_some_and(|r| r.len() > MAX_REF_BYTES) {
        return Err(DecodeError::Shape("ref is longer than 255 bytes"));
    }
    Ok(r)
}

fn opt_ref(v: &Value) -> Result<Option<String>, DecodeError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Number(n) => Ok(Some(n.to_string())),
        _ => Err(DecodeError::Shape(
            "ref and join_ref must be strings or null",
        )),
    }
}

fn required_str(v: &Value, what: &'static str) -> Result<String, DecodeError> {
    v.as_str()
        .map(str::to_owned)
        .ok_or(DecodeError::Shape(what))
}

/// Decodes a text frame.
pub fn decode_text(vsn: Vsn, text: &str) -> Result<Inbound, DecodeError> {
    let (mut head, payload) = decode_text_head(vsn, text)?;
    if let Some(p) = payload {
        head.payload =
            serde_json::from_str(p.get()).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    }
    Ok(head)
}

/// A 1.0.0 frame's fields; the payload left as its text.
#[derive(serde::Deserialize)]
struct V1Envelope<'a> {
    #[serde(default)]
    join_ref: Value,
    #[serde(default, rename = "ref")]
    reference: Value,
    #[serde(default)]
    topic: Value,
    #[serde(default)]
    event: Value,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
}

/// Decodes a text frame's header (its `payload` left `Null`) and hands its payload back
/// as text, checked to be JSON but not built as values: what the payload is read as
/// depends on the event (a join's bindings are counted before any is built:
/// `join_config::parse_join_text`).
pub fn decode_text_head(vsn: Vsn, text: &str) -> Result<(Inbound, Option<&RawValue>), DecodeError> {
    // A frame that is JSON but not of the serializer's shape says so; one that is not JSON
    // says why.
    let shape = |e: serde_json::Error, what| match serde_json::from_str::<IgnoredAny>(text) {
        Ok(_) => DecodeError::Shape(what),
        Err(_) => DecodeError::NotJson(e.to_string()),
    };
    match vsn {
        Vsn::V1 => {
            let e: V1Envelope =
                serde_json::from_str(text).map_err(|e| shape(e, "expected a JSON object"))?;
            let head = Inbound {
                join_ref: opt_ref(&e.join_ref)?,
                reference: push_ref(&e.reference)?,
                topic: required_str(&e.topic, "topic must be a string")?,
                event: required_str(&e.event, "event must be a string")?,
                payload: Value::Null,
            };
            Ok((head, e.payload))
        }
        Vsn::V2 => {
            type V2Envelope<'a> = (Value, Value, Value, Value, &'a RawValue);
            let (join_ref, reference, topic, event, payload): V2Envelope =
                serde_json::from_str(text)
                    .map_err(|e| shape(e, "expected a JSON array of 5 elements"))?;
            let head = Inbound {
                event: required_str(&event, "event must be a string")?,
                topic: required_str(&topic, "topic must be a string")?,
                reference: push_ref(&reference)?,
                join_ref: opt_ref(&join_ref)?,
                payload: Value::Null,
            };
            Ok((head, Some(payload)))
        }
    }
}

/// A client broadcast pushed as a binary frame (2.0.0, kind 3).
#[derive(Debug, PartialEq)]
pub struct BinaryPush {
    pub join_ref: Option<String>,
    pub reference: Option<String>,
    pub topic: String,
    pub event: String,
    /// The push's metadata (JSON, realtime-js's allow-listed keys: `persist`), or empty.
    pub metadata: Bytes,
    pub encoding: u8,
    pub payload: Bytes,
}

/// Decodes a binary frame: kind, join_ref_len, ref_len, topic_len, event_len, metadata_len,
/// encoding, then those fields and the payload.
pub fn decode_binary(frame: &Bytes) -> Result<BinaryPush, DecodeError> {
    if frame.len() < 7 {
        return Err(DecodeError::Binary("shorter than its header"));
    }
    if frame[0] != KIND_USER_BROADCAST_PUSH {
        return Err(DecodeError::Binary(
            "only user broadcast pushes (kind 3) are accepted",
        ));
    }
    let lens = [frame[1], frame[2], frame[3], frame[4], frame[5]].map(usize::from);
    let encoding = frame[6];
    if encoding != ENCODING_JSON && encoding != ENCODING_BINARY {
        return Err(DecodeError::Binary("unknown payload encoding"));
    }
    let mut at = 7;
    let mut field = |n: usize| -> Result<Bytes, DecodeError> {
        if at + n > frame.len() {
            return Err(DecodeError::Binary("field lengths exceed the frame"));
        }
        let b = frame.slice(at..at + n);
        at += n;
        Ok(b)
    };
    let text = |b: Bytes| {
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Binary("text field is not UTF-8"))
    };
    let join_ref = text(field(lens[0])?)?;
    let reference = text(field(lens[1])?)?;
    let topic = text(field(lens[2])?)?;
    let event = text(field(lens[3])?)?;
    let metadata = field(lens[4])?;
    let payload = frame.slice(at..);
    Ok(BinaryPush {
        join_ref: (!join_ref.is_empty()).then_some(join_ref),
        reference: (!reference.is_empty()).then_some(reference),
        topic,
        event,
        metadata,
        encoding,
        payload,
    })
}

fn ref_value(r: Option<&str>) -> Value {
    r.map_or(Value::Null, |s| Value::String(s.to_owned()))
}

/// The prefix of every channel topic on the wire.
const CHANNEL_PREFIX: &str = "realtime:";

/// A channel's topic on the wire for a sub-topic (`room` → `realtime:room`).
pub fn channel_topic(sub_topic: &str) -> String {
    format!("{CHANNEL_PREFIX}{sub_topic}")
}

/// The sub-topic of a channel topic (`realtime:room` → `room`); other text as it is.
pub fn sub_topic(topic: &str) -> &str {
    topic.strip_prefix(CHANNEL_PREFIX).unwrap_or(topic)
}

/// Encodes a server message (reply, push, system, close) as a text frame.
pub fn encode(
    vsn: Vsn,
    join_ref: Option<&str>,
    reference: Option<&str>,
    topic: &str,
    event: &str,
    payload: &Value,
) -> String {
    let v = match vsn {
        Vsn::V1 => json!({
            "topic": topic,
            "event": event,
            "payload": payload,
            "ref": ref_value(reference),
            "join_ref": ref_value(join_ref),
        }),
        Vsn::V2 => json!([
            ref_value(join_ref),
            ref_value(reference),
            topic,
            event,
            payload
        ]),
    };
    v.to_string()
}

/// A `system` message on a channel (`topic` is the full `realtime:...` topic), as Supabase
/// sends them: realtime-js hands these to the app's `system` listeners.
pub fn system(
    vsn: Vsn,
    join_ref: Option<&str>,
    topic: &str,
    status: &str,
    message: &str,
) -> String {
    system_of(vsn, join_ref, topic, "system", status, message)
}

/// A `system` message about one extension of the channel (`postgres_changes`: "Subscribed
/// to PostgreSQL").
pub fn system_of(
    vsn: Vsn,
    join_ref: Option<&str>,
    topic: &str,
    extension: &str,
    status: &str,
    message: &str,
) -> String {
    let sub = sub_topic(topic);
    let payload =
        json!({"extension": extension, "status": status, "message": message, "channel": sub});
    encode(vsn, join_ref, None, topic, "system", &payload)
}

/// A `phx_reply` to a client message.
pub fn reply(vsn: Vsn, m: &Inbound, status: &str, response: Value) -> String {
    encode(
        vsn,
        m.join_ref.as_deref(),
        m.reference.as_deref(),
        &m.topic,
        "phx_reply",
        &json!({"status": status, "response": response}),
    )
}

/// Appends `s` as a JSON string literal.
fn push_json_str(out: &mut String, s: &str) {
    out.push_str(&Value::String(s.to_owned()).to_string());
}

/// A delivered message's `meta`: Supabase's `id` (database messages) and `replayed` (sent
/// from the queue's history at a join), and the message's position in the queue, which a
/// client names to resume after it (`history`). The epoch is a string: an opaque name of
/// the queue's lifetime, compared for equality only.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Meta<'a> {
    pub id: Option<&'a str>,
    pub replayed: bool,
    pub epoch: i64,
    pub seq: i64,
}

impl Meta<'_> {
    pub fn json(&self) -> String {
        let mut fields = Vec::with_capacity(4);
        if let Some(id) = self.id {
            fields.push(format!("\"id\":{}", Value::String(id.to_owned())));
        }
        if self.replayed {
            fields.push("\"replayed\":true".to_owned());
        }
        // Sequence 0: a persisted message replayed from its table after the ring dropped
        // it; it has no position any more.
        if self.seq > 0 {
            fields.push(format!("\"epoch\":\"{}\",\"seq\":{}", self.epoch, self.seq));
        }
        format!("{{{}}}", fields.join(","))
    }
}

/// A user broadcast for 1.0.0 sockets (a text frame). `payload_json` is inserted as is:
/// it is JSON text that Postgres produced.
pub fn user_broadcast_v1(topic: &str, event: &str, payload_json: &str, meta: &Meta) -> String {
    let mut s = String::with_capacity(160 + topic.len() + event.len() + payload_json.len());
    s.push_str("{\"topic\":");
    push_json_str(&mut s, topic);
    s.push_str(",\"event\":\"broadcast\",\"payload\":{\"event\":");
    push_json_str(&mut s, event);
    s.push_str(",\"payload\":");
    s.push_str(payload_json);
    s.push_str(",\"type\":\"broadcast\",\"meta\":");
    s.push_str(&meta.json());
    s.push_str("},\"ref\":null}");
    s
}

/// A server push on a channel whose payload is JSON text made once for many channels
/// (`presence_state`, `presence_diff`): only the envelope, with each channel's join_ref, is
/// written per channel.
pub fn push_json(
    vsn: Vsn,
    join_ref: Option<&str>,
    topic: &str,
    event: &str,
    payload_json: &str,
) -> String {
    let mut s = String::with_capacity(64 + topic.len() + event.len() + payload_json.len());
    let join_ref = ref_value(join_ref).to_string();
    match vsn {
        Vsn::V1 => {
            s.push_str("{\"topic\":");
            push_json_str(&mut s, topic);
            s.push_str(",\"event\":");
            push_json_str(&mut s, event);
            s.push_str(",\"payload\":");
            s.push_str(payload_json);
            s.push_str(",\"ref\":null,\"join_ref\":");
            s.push_str(&join_ref);
            s.push('}');
        }
        Vsn::V2 => {
            s.push('[');
            s.push_str(&join_ref);
            s.push_str(",null,");
            push_json_str(&mut s, topic);
            s.push(',');
            push_json_str(&mut s, event);
            s.push(',');
            s.push_str(payload_json);
            s.push(']');
        }
    }
    s
}

/// A Postgres Changes event, a text frame in both serializers as Supabase sends it:
/// payload `{ids, data}`, no ref and no join_ref. `data_json` is inserted as is.
pub fn postgres_changes(vsn: Vsn, topic: &str, ids: &[u32], data_json: &str) -> String {
    let mut s = String::with_capacity(96 + topic.len() + data_json.len());
    let ids = Value::from(ids.to_vec()).to_string();
    match vsn {
        Vsn::V1 => {
            s.push_str("{\"topic\":");
            push_json_str(&mut s, topic);
            s.push_str(",\"event\":\"postgres_changes\",\"payload\":{\"ids\":");
            s.push_str(&ids);
            s.push_str(",\"data\":");
            s.push_str(data_json);
            s.push_str("},\"ref\":null,\"join_ref\":null}");
        }
        Vsn::V2 => {
            s.push_str("[null,null,");
            push_json_str(&mut s, topic);
            s.push_str(",\"postgres_changes\",{\"ids\":");
            s.push_str(&ids);
            s.push_str(",\"data\":");
            s.push_str(data_json);
            s.push_str("}]");
        }
    }
    s
}

/// A user broadcast for 2.0.0 sockets (binary, kind 4): kind, topic_len, event_len,
/// metadata_len, encoding, then topic, event, metadata JSON and the raw payload. Returns None
/// when a field does not fit its one-byte length (the metadata always does: at most an id,
/// `replayed`, a 64-bit epoch and a 64-bit sequence, about 110 bytes).
pub fn user_broadcast_v2(
    topic: &str,
    event: &str,
    encoding: u8,
    payload: &[u8],
    meta: &Meta,
) -> Option<Bytes> {
    let meta = meta.json();
    let lens = [topic.len(), event.len(), meta.len()];
    if lens.iter().any(|&l| l > 255) {
        return None;
    }
    let mut b = BytesMut::with_capacity(5 + lens.iter().sum::<usize>() + payload.len());
    b.put_u8(KIND_USER_BROADCAST);
    for l in lens {
        b.put_u8(l as u8);
    }
    b.put_u8(encoding);
    b.put_slice(topic.as_bytes());
    b.put_slice(event.as_bytes());
    b.put_slice(meta.as_bytes());
    b.put_slice(payload);
    Some(b.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_with_ready_json_is_the_frame_encode_makes() {
        let payload = json!({"joins": {"k": {"metas": [{"phx_ref": "p1"}]}}, "leaves": {}});
        for vsn in [Vsn::V1, Vsn::V2] {
            for join_ref in [None, Some("3")] {
                let made = push_json(
                    vsn,
                    join_ref,
                    "realtime:r",
                    "presence_diff",
                    &payload.to_string(),
                );
                let want = encode(vsn, join_ref, None, "realtime:r", "presence_diff", &payload);
                let (a, b): (Value, Value) = (
                    serde_json::from_str(&made).unwrap(),
                    serde_json::from_str(&want).unwrap(),
                );
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn postgres_changes_events_are_valid_json_in_both_serializers() {
        let data = r#"{"schema":"public","table":"t","type":"INSERT","record":{"id":1}}"#;
        let v1: Value =
            serde_json::from_str(&postgres_changes(Vsn::V1, "realtime:a\"b", &[3, 7], data))
                .unwrap();
        assert_eq!(v1["topic"], "realtime:a\"b");
        assert_eq!(v1["event"], "postgres_changes");
        assert_eq!(v1["payload"]["ids"], json!([3, 7]));
        assert_eq!(v1["payload"]["data"]["record"]["id"], 1);
        let v2: Value =
            serde_json::from_str(&postgres_changes(Vsn::V2, "realtime:a", &[3], data)).unwrap();
        assert_eq!(
            v2,
            json!([null, null, "realtime:a", "postgres_changes",
                   {"ids": [3], "data": serde_json::from_str::<Value>(data).unwrap()}])
        );
    }

    #[test]
    fn decodes_both_text_serializers() {
        let v1 = r#"{"topic":"realtime:a","event":"phx_join","payload":{"x":1},"ref":"1","join_ref":"1"}"#;
        let v2 = r#"["1","1","realtime:a","phx_join",{"x":1}]"#;
        let want = Inbound {
            join_ref: Some("1".into()),
            reference: Some("1".into()),
            topic: "realtime:a".into(),
            event: "phx_join".into(),
            payload: json!({"x": 1}),
        };
        assert_eq!(decode_text(Vsn::V1, v1).unwrap(), want);
        assert_eq!(decode_text(Vsn::V2, v2).unwrap(), want);
        assert!(matches!(
            decode_text(Vsn::V2, v1),
            Err(DecodeError::Shape(_))
        ));
        assert!(matches!(
            decode_text(Vsn::V1, "{oops"),
            Err(DecodeError::NotJson(_))
        ));
        // The header read with the payload left as text, as `command` reads frames.
        let (head, payload) = decode_text_head(Vsn::V2, v2).unwrap();
        assert_eq!(
            (head.topic.as_str(), head.payload.is_null()),
            ("realtime:a", true)
        );
        assert_eq!(payload.map(|p| p.get()), Some(r#"{"x":1}"#));
        let (_, none) = decode_text_head(Vsn::V1, r#"{"topic":"t","event":"e"}"#).unwrap();
        assert!(none.is_none());
        let null = r#"{"topic":"t","event":"e","payload":null}"#;
        assert!(decode_text_head(Vsn::V1, null).unwrap().1.is_none());
        for (vsn, bad) in [
            (Vsn::V1, "[1,2]"),
            (Vsn::V2, r#"["1","1","t","e"]"#),
            (Vsn::V2, r#"["1","1","t","e",{},6]"#),
            (Vsn::V2, "{}"),
        ] {
            assert!(
                matches!(decode_text(vsn, bad), Err(DecodeError::Shape(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            decode_text(Vsn::V2, r#"["1","1","t","e",{"n":1e400}]"#),
            Err(DecodeError::NotJson(_))
        ));
        assert!(matches!(
            decode_text(Vsn::V1, r#"{"topic":5,"event":"e"}"#),
            Err(DecodeError::Shape("topic must be a string"))
        ));
    }

    #[test]
    fn a_ref_longer_than_255_bytes_makes_the_frame_malformed() {
        for (n, ok) in [(MAX_REF_BYTES, true), (MAX_REF_BYTES + 1, false)] {
            let r = "7".repeat(n);
            let v1 = json!({"topic": "t", "event": "e", "ref": r}).to_string();
            let v2 = json!([null, r, "t", "e", {}]).to_string();
            for (vsn, text) in [(Vsn::V1, v1), (Vsn::V2, v2)] {
                let decoded = decode_text(vsn, &text);
                assert_eq!(decoded.is_ok(), ok, "{n} bytes: {decoded:?}");
            }
        }
        // A long join_ref reaches the join, which refuses it with its reason.
        let long = "7".repeat(MAX_REF_BYTES + 1);
        let join = json!([long, "1", "realtime:a", "phx_join", {}]).to_string();
        assert!(decode_text(Vsn::V2, &join).is_ok());
    }

    #[test]
    fn heartbeat_reply_has_phoenix_shape() {
        let hb = decode_text(Vsn::V2, r#"[null,"5","phoenix","heartbeat",{}]"#).unwrap();
        assert_eq!(
            reply(Vsn::V2, &hb, "ok", json!({})),
            r#"[null,"5","phoenix","phx_reply",{"response":{},"status":"ok"}]"#
        );
    }

    #[test]
    fn binary_push_round_trip() {
        let mut f = vec![3u8, 1, 2, 10, 2, 0, 1];
        f.extend_from_slice(b"412realtime:aev{\"a\":1}");
        let p = decode_binary(&Bytes::from(f)).unwrap();
        assert_eq!(p.join_ref.as_deref(), Some("4"));
        assert_eq!(p.reference.as_deref(), Some("12"));
        assert_eq!(p.topic, "realtime:a");
        assert_eq!(p.event, "ev");
        assert_eq!(p.encoding, ENCODING_JSON);
        assert_eq!(&p.payload[..], b"{\"a\":1}");
        assert!(decode_binary(&Bytes::from_static(&[3, 9, 0, 0, 0, 0, 1])).is_err());
        assert!(decode_binary(&Bytes::from_static(&[4, 0, 0, 0, 0, 0, 1])).is_err());
    }

    #[test]
    fn user_broadcast_frames() {
        let meta = Meta {
            id: Some("u-1"),
            replayed: false,
            epoch: 1_795_000_000_000_000,
            seq: 42,
        };
        let v1 = user_broadcast_v1("realtime:room", "INSERT", "{\"a\": 1}", &meta);
        let v: Value = serde_json::from_str(&v1).unwrap();
        assert_eq!(
            v,
            json!({"topic":"realtime:room","event":"broadcast","ref":null,
                   "payload":{"event":"INSERT","payload":{"a":1},"type":"broadcast",
                              "meta":{"id":"u-1","epoch":"1795000000000000","seq":42}}})
        );
        let v2 = user_broadcast_v2("realtime:room", "INSERT", ENCODING_JSON, b"{}", &meta).unwrap();
        let meta_json = br#"{"id":"u-1","epoch":"1795000000000000","seq":42}"#;
        assert_eq!(&v2[..5], &[4, 13, 6, meta_json.len() as u8, 1]);
        assert_eq!(&v2[5 + 13 + 6..5 + 13 + 6 + meta_json.len()], meta_json);
        assert!(user_broadcast_v2(&"t".repeat(256), "e", 1, b"", &meta).is_none());
    }

    #[test]
    fn the_largest_meta_fits_the_binary_frames_metadata_field() {
        let id = "00000000-0000-0000-0000-000000000000";
        let meta = Meta {
            id: Some(id),
            replayed: true,
            epoch: i64::MIN,
            seq: i64::MAX,
        };
        let json = meta.json();
        assert!(json.len() <= 255, "{} bytes", json.len());
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["replayed"], true);
        assert_eq!(v["seq"], i64::MAX);
        assert_eq!(v["epoch"], i64::MIN.to_string());
    }
}
