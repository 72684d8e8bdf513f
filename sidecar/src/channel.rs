//! What a `phx_join` asks for: Supabase's join payload, read leniently as Supabase does
//! (booleans may be strings; an invalid payload falls back to defaults).

use serde_json::Value;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct JoinConfig {
    /// Deliver the client's own broadcasts back to it.
    pub self_broadcast: bool,
    /// Reply to each client broadcast once it is accepted.
    pub ack: bool,
    pub private: bool,
    pub presence: bool,
    pub has_postgres_changes: bool,
    pub access_token: Option<String>,
}

/// Supabase's FlexibleBoolean: true/false or their case-insensitive string forms.
fn flexible_bool(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

pub fn parse_join(payload: &Value) -> JoinConfig {
    let config = payload.get("config");
    let get = |a: &str, b: &str| config.and_then(|c| c.get(a)).and_then(|x| x.get(b));
    let token = payload
        .get("access_token")
        .or_else(|| payload.get("user_token"));
    JoinConfig {
        self_broadcast: flexible_bool(get("broadcast", "self")),
        ack: flexible_bool(get("broadcast", "ack")),
        private: flexible_bool(config.and_then(|c| c.get("private"))),
        presence: flexible_bool(get("presence", "enabled")),
        has_postgres_changes: config
            .and_then(|c| c.get("postgres_changes"))
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty()),
        access_token: token.and_then(Value::as_str).map(str::to_owned),
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
        let c = parse_join(&p);
        assert!(c.ack && c.self_broadcast && !c.private && !c.presence && !c.has_postgres_changes);
        assert_eq!(c.access_token.as_deref(), Some("tok"));
    }

    #[test]
    fn invalid_payload_falls_back_to_defaults() {
        assert_eq!(parse_join(&json!("nonsense")), JoinConfig::default());
        assert_eq!(
            parse_join(&json!({"config": {"private": 1}})),
            JoinConfig::default()
        );
        assert!(
            parse_join(&json!({"config": {"postgres_changes": [{"event": "*"}]}}))
                .has_postgres_changes
        );
        assert_eq!(
            parse_join(&json!({"user_token": "t"}))
                .access_token
                .as_deref(),
            Some("t")
        );
    }
}
