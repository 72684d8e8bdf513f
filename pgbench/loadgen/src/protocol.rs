//! The two wire protocols the load generator speaks: Supabase Realtime's Phoenix frames
//! (serializers 1.0.0 and 2.0.0), as our sidecar serves them, and Centrifugo v5's JSON
//! protocol, for the side-by-side comparison. Parsing is typed (serde) rather than through
//! serde_json::Value: the generator parses every delivery on the same 2 cores as the
//! server it measures, so its own cost is kept low.

use crate::args::Protocol;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

/// What every benchmark payload carries: the send time in microseconds since the epoch
/// (taken by the database, or by the sending client), the stream it belongs to (topic
/// index, or the sending client) and its number in that stream, from 1.
#[derive(Deserialize, Default)]
pub struct Body {
    t: Option<i64>,
    k: Option<u64>,
    n: Option<u64>,
    /// broadcast_changes wraps the row: the fields are in payload.record.
    record: Option<Box<Body>>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Sample {
    pub t: i64,
    pub k: u64,
    pub n: u64,
    /// The message's position (`meta.epoch`, `meta.seq`) and whether it came from the
    /// queue's history at a join (`meta.replayed`), when the server sent them.
    pub pos: Option<Position>,
    pub replayed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    pub epoch: String,
    pub seq: i64,
}

/// A broadcast's `meta`, as much as the generator reads of it.
#[derive(Deserialize, Default)]
struct Meta {
    epoch: Option<String>,
    seq: Option<i64>,
    replayed: Option<bool>,
}

impl Meta {
    fn position(&self) -> Option<Position> {
        Some(Position {
            epoch: self.epoch.clone()?,
            seq: self.seq?,
        })
    }
}

impl Body {
    fn sample(&self) -> Option<Sample> {
        match (self.t, self.k, self.n, &self.record) {
            (Some(t), Some(k), Some(n), _) => Some(Sample {
                t,
                k,
                n,
                pos: None,
                replayed: false,
            }),
            (_, _, _, Some(r)) => r.sample(),
            _ => None,
        }
    }
}

fn with_meta(mut s: Sample, meta: Option<&Meta>) -> Sample {
    if let Some(m) = meta {
        s.pos = m.position();
        s.replayed = m.replayed == Some(true);
    }
    s
}

#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Delivery(Sample),
    /// A reply to a join (Supabase) or a connect/subscribe (Centrifugo): ok or not.
    Joined(bool),
    /// Centrifugo's ping, to be answered with a pong.
    Ping,
    /// The server refused a client broadcast (rate limit, size, permission).
    PushRefused,
    /// The `system` message that ends a resume: whether everything was recovered, and how
    /// many messages the server sent from its history.
    Resumed {
        recovered: bool,
        resent: u64,
    },
    /// A Postgres Changes channel's position after a batch (a channel that asked for them).
    Position(Position),
}

#[derive(Deserialize)]
struct Envelope {
    status: Option<String>,
    payload: Option<Body>,
    /// A Postgres Changes event's `{ids, data}`: the row is in data.record.
    data: Option<Body>,
    meta: Option<Meta>,
    /// A resume's system message.
    recovered: Option<bool>,
    resent: Option<u64>,
    /// A position's `system` message (Postgres Changes).
    epoch: Option<String>,
    seq: Option<i64>,
}

#[derive(Deserialize)]
struct V1 {
    #[serde(rename = "ref")]
    reference: Option<String>,
    event: String,
    payload: Envelope,
}

#[derive(Deserialize)]
struct CentrifugoLine {
    id: Option<u64>,
    error: Option<IgnoredAny>,
    push: Option<CentrifugoPush>,
}

#[derive(Deserialize)]
struct CentrifugoPush {
    #[serde(rename = "pub")]
    publication: Option<CentrifugoPub>,
}

#[derive(Deserialize)]
struct CentrifugoPub {
    data: Body,
}

pub struct Wire {
    pub protocol: Protocol,
    pub v2: bool,
}

/// Replies are told apart by their refs: joins', pushes' and heartbeats' ("hb").
const JOIN_REF: &str = "j";
const PUSH_REF: &str = "p";

impl Wire {
    pub fn parse(&self, msg: &Message, out: &mut Vec<Event>) {
        match (self.protocol, msg) {
            (Protocol::Supabase, Message::Binary(b)) if b.first() == Some(&4) && b.len() > 5 => {
                let meta_at = 5 + b[1] as usize + b[2] as usize;
                let start = meta_at + b[3] as usize;
                if let Some(s) = b
                    .get(start..)
                    .and_then(|p| serde_json::from_slice::<Body>(p).ok())
                    .and_then(|b| b.sample())
                {
                    let meta = b
                        .get(meta_at..start)
                        .filter(|m| !m.is_empty())
                        .and_then(|m| serde_json::from_slice::<Meta>(m).ok());
                    out.push(Event::Delivery(with_meta(s, meta.as_ref())));
                }
            }
            (Protocol::Supabase, Message::Text(t)) => {
                let parsed = if self.v2 {
                    serde_json::from_str::<(IgnoredAny, Option<String>, IgnoredAny, String, Envelope)>(t)
                        .ok()
                        .map(|(_, r, _, e, p)| (r, e, p))
                } else {
                    serde_json::from_str::<V1>(t)
                        .ok()
                        .map(|v| (v.reference, v.event, v.payload))
                };
                let Some((reference, event, envelope)) = parsed else {
                    return;
                };
                if event == "phx_reply" {
                    let ok = envelope.status.as_deref() == Some("ok");
                    match reference.as_deref() {
                        Some(r) if r.starts_with(JOIN_REF) => out.push(Event::Joined(ok)),
                        Some(r) if r.starts_with(PUSH_REF) && !ok => out.push(Event::PushRefused),
                        _ => {}
                    }
                } else if event == "system" {
                    if let Some(recovered) = envelope.recovered {
                        let resent = envelope.resent.unwrap_or(0);
                        out.push(Event::Resumed { recovered, resent });
                    } else if let (Some(epoch), Some(seq)) = (envelope.epoch, envelope.seq) {
                        out.push(Event::Position(Position { epoch, seq }));
                    }
                } else if let Some(s) = envelope.payload.or(envelope.data).and_then(|b| b.sample())
                {
                    out.push(Event::Delivery(with_meta(s, envelope.meta.as_ref())));
                }
            }
            (Protocol::Centrifugo, Message::Text(t)) => {
                for line in t.as_str().split('\n').filter(|l| !l.is_empty()) {
                    if line == "{}" {
                        out.push(Event::Ping);
                        continue;
                    }
                    let Ok(l) = serde_json::from_str::<CentrifugoLine>(line) else {
                        continue;
                    };
                    if let Some(s) = l
                        .push
                        .and_then(|p| p.publication)
                        .and_then(|p| p.data.sample())
                    {
                        out.push(Event::Delivery(s));
                    } else if l.id.is_some_and(|id| id >= 2) || l.error.is_some() {
                        // id 1 is the connect reply; subscribes are 2.. (one per channel).
                        out.push(Event::Joined(l.error.is_none()));
                    }
                }
            }
            _ => {}
        }
    }

    /// The frames that join Postgres Changes channels (Supabase only): one per topic index
    /// in `rooms`, binding INSERTs of public.bench_changes with filter `k=eq.<room>`; with
    /// `positions`, asking for the position after each batch of changes.
    pub fn change_joins(
        &self,
        rooms: &[usize],
        prefix: &str,
        token: &str,
        positions: bool,
    ) -> Vec<String> {
        rooms
            .iter()
            .enumerate()
            .map(|(j, room)| {
                let binding = json!({"event": "INSERT", "schema": "public", "table": "bench_changes",
                                     "filter": format!("k=eq.{room}")});
                let mut broadcast = json!({"self": false, "ack": false});
                if positions {
                    broadcast["resume"] = json!({"changes": true});
                }
                let payload = json!({"config": {"broadcast": broadcast, "private": false,
                                                "postgres_changes": [binding]},
                                     "access_token": token});
                self.join_frame(j, &format!("{prefix}{room}"), payload)
            })
            .collect()
    }

    /// The join of a Postgres Changes channel (`change_joins`' first) resuming after `pos`.
    pub fn change_resume_join(
        &self,
        room: usize,
        prefix: &str,
        token: &str,
        pos: &Position,
    ) -> String {
        let binding = json!({"event": "INSERT", "schema": "public", "table": "bench_changes",
                             "filter": format!("k=eq.{room}")});
        let payload = json!({"config": {"broadcast": {"self": false, "ack": false,
                                                      "resume": {"epoch": pos.epoch, "seq": pos.seq, "changes": true}},
                                        "private": false, "postgres_changes": [binding]},
                             "access_token": token});
        self.join_frame(0, &format!("{prefix}{room}"), payload)
    }

    /// The `phx_join` of the j-th channel of a connection (Supabase), in this serializer.
    fn join_frame(&self, j: usize, sub_topic: &str, payload: serde_json::Value) -> String {
        let (reference, topic) = (format!("{JOIN_REF}{j}"), format!("realtime:{sub_topic}"));
        if self.v2 {
            json!([reference, reference, topic, "phx_join", payload]).to_string()
        } else {
            json!({"join_ref": reference, "ref": reference, "topic": topic, "event": "phx_join", "payload": payload})
                .to_string()
        }
    }

    /// The `phx_join` of a channel resuming after `pos` (Supabase only).
    pub fn resume_join(&self, sub_topic: &str, pos: &Position) -> String {
        let payload = json!({"config": {"broadcast": {"self": false, "ack": false,
                                                      "resume": {"epoch": pos.epoch, "seq": pos.seq}},
                                        "private": false}});
        self.join_frame(0, sub_topic, payload)
    }

    /// The frames that join `topics` (after connecting, for Centrifugo).
    pub fn joins(&self, topics: &[String], private: bool, echo: bool, token: &str) -> Vec<String> {
        match self.protocol {
            Protocol::Supabase => topics
                .iter()
                .enumerate()
                .map(|(j, topic)| {
                    let mut payload = json!({"config": {"broadcast": {"self": echo, "ack": false}, "private": private}});
                    if private {
                        payload["access_token"] = json!(token);
                    }
                    self.join_frame(j, topic, payload)
                })
                .collect(),
            Protocol::Centrifugo => {
                let mut frames = vec![json!({"id": 1, "connect": {"token": token, "name": "loadgen"}}).to_string()];
                frames.extend(topics.iter().enumerate().map(|(j, topic)| {
                    json!({"id": j + 2, "subscribe": {"channel": topic}}).to_string()
                }));
                frames
            }
        }
    }

    /// What keeps the connection alive: Supabase's heartbeat (Centrifugo pings the client).
    pub fn heartbeat(&self) -> Option<&'static str> {
        match (self.protocol, self.v2) {
            (Protocol::Supabase, true) => Some(r#"[null,"hb","phoenix","heartbeat",{}]"#),
            (Protocol::Supabase, false) => {
                Some(r#"{"topic":"phoenix","event":"heartbeat","payload":{},"ref":"hb"}"#)
            }
            (Protocol::Centrifugo, _) => None,
        }
    }

    /// A client broadcast of `body` on `topic` (Supabase only: Centrifugo's client
    /// publications are not part of the comparison).
    pub fn push(&self, topic: &str, reference: u64, body: serde_json::Value) -> String {
        let payload = json!({"type": "broadcast", "event": "ev", "payload": body});
        let topic = format!("realtime:{topic}");
        if self.v2 {
            json!([
                format!("{JOIN_REF}0"),
                format!("{PUSH_REF}{reference}"),
                topic,
                "broadcast",
                payload
            ])
            .to_string()
        } else {
            json!({"join_ref": format!("{JOIN_REF}0"), "ref": format!("{PUSH_REF}{reference}"), "topic": topic, "event": "broadcast", "payload": payload})
                .to_string()
        }
    }

    pub fn path(&self, apikey: &str, vsn: &str) -> String {
        match self.protocol {
            Protocol::Supabase => format!("/realtime/v1/websocket?apikey={apikey}&vsn={vsn}"),
            Protocol::Centrifugo => "/connection/websocket".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(w: &Wire, m: Message) -> Vec<Event> {
        let mut out = vec![];
        w.parse(&m, &mut out);
        out
    }

    #[test]
    fn supabase_frames() {
        let v2 = Wire {
            protocol: Protocol::Supabase,
            v2: true,
        };
        let d = Event::Delivery(Sample {
            t: 5,
            k: 1,
            n: 2,
            pos: None,
            replayed: false,
        });
        assert_eq!(
            parse(
                &v2,
                Message::text(
                    r#"[null,null,"realtime:a","broadcast",{"type":"broadcast","event":"e","payload":{"t":5,"k":1,"n":2,"pad":"x"}}]"#
                )
            ),
            vec![d]
        );
        assert_eq!(
            parse(
                &v2,
                Message::text(
                    r#"[null,null,"realtime:a","broadcast",{"type":"broadcast","event":"INSERT","payload":{"record":{"t":5,"k":1,"n":2},"old_record":null}}]"#
                )
            ),
            vec![Event::Delivery(Sample {
                t: 5,
                k: 1,
                n: 2,
                pos: None,
                replayed: false
            })]
        );
        // A Postgres Changes event: the row is in data.record.
        assert_eq!(
            parse(
                &v2,
                Message::text(
                    r#"[null,null,"realtime:a","postgres_changes",{"ids":[7],"data":{"schema":"public","type":"INSERT","record":{"id":9,"t":5,"k":1,"n":2},"columns":[]}}]"#
                )
            ),
            vec![Event::Delivery(Sample {
                t: 5,
                k: 1,
                n: 2,
                pos: None,
                replayed: false
            })]
        );
        assert_eq!(
            parse(
                &v2,
                Message::text(
                    r#"["j0","j0","realtime:a","phx_reply",{"status":"error","response":{}}]"#
                )
            ),
            vec![Event::Joined(false)]
        );
        assert_eq!(
            parse(
                &v2,
                Message::text(r#"[null,"hb","phoenix","phx_reply",{"status":"ok","response":{}}]"#)
            ),
            vec![]
        );
        assert_eq!(
            parse(
                &v2,
                Message::text(
                    r#"["j0","p7","realtime:a","phx_reply",{"status":"error","response":{"reason":"rate"}}]"#
                )
            ),
            vec![Event::PushRefused]
        );
        let mut bin = vec![4u8, 1, 1, 1, 0, b'a', b'b', b'c'];
        bin.extend_from_slice(br#"{"t":7,"k":0,"n":1}"#);
        assert_eq!(
            parse(&v2, Message::binary(bin)),
            vec![Event::Delivery(Sample {
                t: 7,
                k: 0,
                n: 1,
                pos: None,
                replayed: false
            })]
        );
        // Positions from the binary frame's metadata, and a resume's system message.
        let meta = br#"{"epoch":"17","seq":42,"replayed":true}"#;
        let mut bin = vec![4u8, 1, 1, meta.len() as u8, 0, b'a', b'b'];
        bin.extend_from_slice(meta);
        bin.extend_from_slice(br#"{"t":7,"k":0,"n":1}"#);
        let pos = Some(Position {
            epoch: "17".into(),
            seq: 42,
        });
        assert_eq!(
            parse(&v2, Message::binary(bin)),
            vec![Event::Delivery(Sample {
                t: 7,
                k: 0,
                n: 1,
                pos,
                replayed: true
            })]
        );
        assert_eq!(
            parse(
                &v2,
                Message::text(
                    r#"["1",null,"realtime:a","system",{"extension":"broadcast","status":"ok","recovered":true,"resent":12}]"#
                )
            ),
            vec![Event::Resumed {
                recovered: true,
                resent: 12
            }]
        );
        // A Postgres Changes position (a channel that asked for them).
        assert_eq!(
            parse(
                &v2,
                Message::text(
                    r#"["1",null,"realtime:a","system",{"extension":"postgres_changes","status":"ok","message":"position","epoch":"17","seq":50}]"#
                )
            ),
            vec![Event::Position(Position {
                epoch: "17".into(),
                seq: 50
            })]
        );
        let v1 = Wire {
            protocol: Protocol::Supabase,
            v2: false,
        };
        assert_eq!(
            parse(
                &v1,
                Message::text(
                    r#"{"ref":"j1","topic":"realtime:a","event":"phx_reply","payload":{"status":"ok","response":{}}}"#
                )
            ),
            vec![Event::Joined(true)]
        );
    }

    #[test]
    fn centrifugo_frames() {
        let w = Wire {
            protocol: Protocol::Centrifugo,
            v2: false,
        };
        let frame = "{\"id\":1,\"connect\":{}}\n{\"id\":2,\"subscribe\":{}}\n{\"push\":{\"channel\":\"b:x\",\"pub\":{\"data\":{\"t\":1,\"k\":0,\"n\":3},\"offset\":9}}}\n{}";
        assert_eq!(
            parse(&w, Message::text(frame)),
            vec![
                Event::Joined(true),
                Event::Delivery(Sample {
                    t: 1,
                    k: 0,
                    n: 3,
                    pos: None,
                    replayed: false
                }),
                Event::Ping
            ]
        );
        assert_eq!(
            parse(
                &w,
                Message::text(r#"{"id":3,"error":{"code":103,"message":"permission denied"}}"#)
            ),
            vec![Event::Joined(false)]
        );
    }
}
