//! What a `phx_join` asks for: Supabase's join payload, read leniently as Supabase does
//! (booleans may be strings; an invalid payload falls back to defaults).

use crate::history::ask::{self, Ask, AskError};
use crate::postgres_changes::bounds::Bounds;
use crate::postgres_changes::{self, Binding, BindingError, Unserved};
use crate::reason::InvalidTopic;
use serde_json::Value;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct JoinConfig {
    /// Deliver the client's own broadcasts back to it.
    pub self_broadcast: bool,
    /// Reply to each client broadcast once it is accepted.
    pub ack: bool,
    /// Send a `system` message once the replication stream is up
    /// (`config.broadcast.replication_ready`): here, the drain connection.
    pub replication_ready: bool,
    pub private: bool,
    pub presence: bool,
    /// `config.presence.key`: the member's key (empty: one is made for the join).
    pub presence_key: String,
    /// The `postgres_changes` bindings that parsed, in the client's order (`postgres_changes.rs`).
    pub postgres_changes: Vec<Binding>,
    /// Those that did not: the channel joins without them (`postgres_changes/unserved.rs`).
    pub postgres_changes_unserved: Vec<Unserved>,
    /// Why the bindings cannot be served, if they cannot: the join is refused with it.
    pub postgres_changes_error: Option<BindingError>,
    /// What the join asks of the queue's history (`replay` or `resume`), if anything; an
    /// error refuses the join.
    pub history: Option<Result<Ask, AskError>>,
    /// The channel's position covers its Postgres Changes (`ask::change_positions`).
    pub change_positions: bool,
    pub access_token: Option<String>,
}

/// The longest sub-topic: with the `realtime:` prefix it fits the 255-byte topic field of
/// the 2.0.0 binary frames (the extension refuses longer ones in `realtime.send` too).
pub const MAX_SUB_TOPIC_BYTES: usize = 255 - "realtime:".len();

/// Checks a sub-topic as `realtime.send` does, so that no topic a client names can make a
/// database call fail (a NUL is valid JSON but not valid Postgres text).
pub fn validate_sub_topic(sub: &str) -> Result<(), InvalidTopic> {
    if sub.contains('\0') {
        return Err(InvalidTopic::Nul);
    }
    if sub.len() > MAX_SUB_TOPIC_BYTES {
        return Err(InvalidTopic::TooLong {
            bytes: sub.len(),
            limit: MAX_SUB_TOPIC_BYTES,
        });
    }
    Ok(())
}

/// Supabase's FlexibleBoolean: true/false or their case-insensitive string forms.
fn flexible_bool(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

/// A join's payload as asked; its bindings are counted against `bounds` before one is
/// parsed, and their other bounds are judged where the join is admitted (`channels/join.rs`).
pub fn parse_join(payload: &Value, bounds: &Bounds) -> JoinConfig {
    let config = payload.get("config");
    let get = |a: &str, b: &str| config.and_then(|c| c.get(a)).and_then(|x| x.get(b));
    let token = payload
        .get("access_token")
        .or_else(|| payload.get("user_token"));
    let listed = config.and_then(|c| c.get("postgres_changes"));
    let counted = match listed.and_then(Value::as_array) {
        Some(list) => bounds.count(list.len()),
        None => Ok(()),
    };
    let (postgres_changes, postgres_changes_unserved, postgres_changes_error) =
        match counted.and_then(|()| postgres_changes::parse_each(listed)) {
            Ok((served, unserved)) => (served, unserved, None),
            Err(e) => (Vec::new(), Vec::new(), Some(e)),
        };
    let private = flexible_bool(config.and_then(|c| c.get("private")));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    JoinConfig {
        history: ask::parse(config.and_then(|c| c.get("broadcast")), private, now_ms),
        change_positions: ask::change_positions(config.and_then(|c| c.get("broadcast"))),
        self_broadcast: flexible_bool(get("broadcast", "self")),
        ack: flexible_bool(get("broadcast", "ack")),
        replication_ready: flexible_bool(get("broadcast", "replication_ready")),
        private,
        presence: flexible_bool(get("presence", "enabled")),
        presence_key: match get("presence", "key") {
            Some(Value::String(k)) => k.clone(),
            // Phoenix keys are strings; realtime-js users pass user ids, numbers included.
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        },
        postgres_changes,
        postgres_changes_unserved,
        postgres_changes_error,
        access_token: token.and_then(Value::as_str).map(str::to_owned),
    }
}

/// A join's payload as text: its bindings are counted as the text is scanned, and a join
/// with more than MAX_BINDINGS_PER_JOIN is refused with only its token read, none of its
/// bindings (nor the rest of it) built as JSON values. Built whole and then counted, a
/// join of 17,000 bindings cost its tree of values and the freeing of it: a quarter of the
/// sidecar's CPU under the soak's binding floods (`pgbench/RESULTS.md`).
pub fn parse_join_text(text: &str, bounds: &Bounds) -> Result<JoinConfig, serde_json::Error> {
    if let Ok(outline) = serde_json::from_str::<Outline>(text) {
        let listed = outline.config.and_then(|c| c.postgres_changes);
        if let Some(list) = listed {
            if let Err(e) = bounds.count(list.len()) {
                let token = match (outline.access_token, outline.user_token) {
                    (Maybe::Present(t), _) | (Maybe::Absent, Maybe::Present(t)) => t,
                    (Maybe::Absent, Maybe::Absent) => Value::Null,
                };
                return Ok(JoinConfig {
                    postgres_changes_error: Some(e),
                    access_token: token.as_str().map(str::to_owned),
                    ..JoinConfig::default()
                });
            }
        }
    }
    let payload: Value = serde_json::from_str(text)?;
    Ok(parse_join(&payload, bounds))
}

/// What `parse_join_text` reads of a join before it builds anything.
#[derive(serde::Deserialize)]
struct Outline {
    #[serde(default)]
    config: Option<ConfigOutline>,
    #[serde(default)]
    access_token: Maybe,
    #[serde(default)]
    user_token: Maybe,
}

#[derive(serde::Deserialize)]
struct ConfigOutline {
    /// The bindings, each skipped as it is scanned (`IgnoredAny` takes no memory): only
    /// their count is kept. A list that is not an array fails the outline, and the join is
    /// read whole, where `parse_bindings` refuses it.
    #[serde(default)]
    postgres_changes: Option<Vec<serde::de::IgnoredAny>>,
}

/// A field given (null included: `parse_join` then reads no token, and does not fall back
/// to `user_token`), or not.
#[derive(Default)]
enum Maybe {
    #[default]
    Absent,
    Present(Value),
}

impl<'de> serde::Deserialize<'de> for Maybe {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(Maybe::Present)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_realtime_js_join_payload() {
        let p = json!({
            "config": {"broadcast": {"ack": true, "self": "TRUE"}, "presence": {"key": "", "enabled": false},
                       "postgres_changes": [], "private": false},
            "access_token": "tok", "version": "realtime-js/2.119.1"
        });
        let c = parse_join(&p, &Bounds::defaults());
        assert!(c.ack && c.self_broadcast && !c.private && !c.presence);
        assert!(c.postgres_changes.is_empty() && c.postgres_changes_error.is_none());
        assert_eq!(c.access_token.as_deref(), Some("tok"));
    }

    #[test]
    fn a_join_of_too_many_bindings_is_refused_by_their_count_before_one_is_parsed() {
        let limit = Bounds::defaults().bindings;
        let good = json!({"event": "*", "schema": "public"});
        let mut list = vec![good; limit];
        // Parsed, this one would refuse the join as malformed; counted first, it is not read.
        list.push(json!("not a binding"));
        let c = parse_join(
            &json!({"config": {"postgres_changes": list}}),
            &Bounds::defaults(),
        );
        assert_eq!(
            c.postgres_changes_error.map(|e| e.text()).as_deref(),
            Some("InvalidPostgresChanges: the join has bindings: 101; the limit is 100 (MAX_BINDINGS_PER_JOIN)")
        );
        assert!(c.postgres_changes.is_empty());
        // At the limit, every binding is parsed.
        list.pop();
        let c = parse_join(
            &json!({"config": {"postgres_changes": list}}),
            &Bounds::defaults(),
        );
        assert_eq!(c.postgres_changes.len(), limit);
    }

    #[test]
    fn a_join_of_too_many_bindings_is_refused_from_its_text_before_any_is_built() {
        let bounds = Bounds::defaults();
        let limit = bounds.bindings;
        // Built as JSON values, this list could not be (a number past f64's range), and the
        // frame was refused as not JSON; counted from the text, none is built.
        let mut list: Vec<String> = vec![r#"{"event":"*","schema":"public"}"#.into(); limit];
        list.push(r#"{"event":"*","schema":"public","n":1e400}"#.into());
        let join = |token: &str, list: &[String]| {
            format!(
                r#"{{{token}"config":{{"postgres_changes":[{}]}}}}"#,
                list.join(",")
            )
        };
        let c = parse_join_text(&join(r#""access_token":"tok","#, &list), &bounds).unwrap();
        assert_eq!(
            c.postgres_changes_error.map(|e| e.text()).as_deref(),
            Some("InvalidPostgresChanges: the join has bindings: 101; the limit is 100 (MAX_BINDINGS_PER_JOIN)")
        );
        assert_eq!(c.access_token.as_deref(), Some("tok"), "its token is read");
        // The token as parse_join reads it: access_token, else user_token; a null
        // access_token is no token.
        let c = parse_join_text(&join(r#""user_token":"u","#, &list), &bounds).unwrap();
        assert_eq!(c.access_token.as_deref(), Some("u"));
        let c = parse_join_text(
            &join(r#""access_token":null,"user_token":"u","#, &list),
            &bounds,
        )
        .unwrap();
        assert_eq!(c.access_token, None);
        // Within the bound, that number is not JSON serde_json holds: as before.
        assert!(parse_join_text(&join("", &list[1..]), &bounds).is_err());
        // Within it, the text reads as the values do.
        for payload in [
            join(r#""access_token":"tok","#, &list[..limit]),
            r#"{"config":{"broadcast":{"ack":true},"presence":{"key":"k"},"private":true,"postgres_changes":[{"event":"INSERT","schema":"public","table":"t","filter":"id=eq.1"}]},"access_token":"tok"}"#.into(),
            r#"{"config":{"postgres_changes":{"not":"a list"}}}"#.into(),
            r#"{"config":{"postgres_changes":"nope"}}"#.into(),
            r#"{"config":5}"#.into(),
            r#"[1,2]"#.into(),
            "null".into(),
        ] {
            let v: Value = serde_json::from_str(&payload).unwrap();
            assert_eq!(parse_join_text(&payload, &bounds).unwrap(), parse_join(&v, &bounds), "{payload}");
        }
    }

    #[test]
    fn topics_are_checked_like_realtime_send() {
        assert!(validate_sub_topic("room:1").is_ok());
        assert!(validate_sub_topic(&"t".repeat(MAX_SUB_TOPIC_BYTES)).is_ok());
        let long = validate_sub_topic(&"t".repeat(MAX_SUB_TOPIC_BYTES + 1)).unwrap_err();
        assert_eq!(
            long.text(),
            "InvalidTopic: the topic is 247 bytes long; the limit is 246 bytes"
        );
        let nul = validate_sub_topic("a\0b").unwrap_err();
        assert_eq!(nul, InvalidTopic::Nul);
    }

    #[test]
    fn invalid_payload_falls_back_to_defaults() {
        assert_eq!(
            parse_join(&json!("nonsense"), &Bounds::defaults()),
            JoinConfig::default()
        );
        assert_eq!(
            parse_join(&json!({"config": {"private": 1}}), &Bounds::defaults()),
            JoinConfig::default()
        );
        let no_schema = parse_join(
            &json!({"config": {"postgres_changes": [{"event": "*"}]}}),
            &Bounds::defaults(),
        );
        // Neither schema nor table: that binding is not served; the join is not refused.
        assert!(no_schema.postgres_changes_error.is_none());
        assert_eq!(no_schema.postgres_changes_unserved.len(), 1);
        let one = json!({"config": {"postgres_changes": [{"event": "*", "schema": "public"}]}});
        assert_eq!(
            parse_join(&one, &Bounds::defaults()).postgres_changes.len(),
            1
        );
        assert_eq!(
            parse_join(&json!({"user_token": "t"}), &Bounds::defaults())
                .access_token
                .as_deref(),
            Some("t")
        );
    }
}
