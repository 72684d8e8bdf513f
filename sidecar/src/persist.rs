//! `persist`: a client broadcast its sender asks to keep, as realtime-js 2.119 asks for it
//! (`channel.send({..., persist})` on a private channel, sent as metadata of the 2.0.0
//! binary push; `channel.httpSend(event, payload, {persist: true | {ttl}})`, sent as
//! `?persist=true` or `?persist[ttl]=N`). A kept message is relayed like any other and also
//! written to `realtime.persisted_messages` with its expiry, in the same statement
//! (`relay`), so Supabase's replay finds it for its ttl even after the queue's ring has
//! moved on (`history::worker`), and the queue marks it so that replay includes it while
//! the ring still holds it.

use crate::address::AddressKey;
use crate::client_text;
use serde_json::Value;

/// Supabase keeps replayable messages 72 hours; that is the longest ttl here, and the
/// default.
pub const MAX_TTL_SECS: i32 = 72 * 3600;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PersistError {
    /// Only private channels keep messages (realtime-js refuses public ones too).
    Public,
    BadTtl,
}

impl PersistError {
    pub fn text(&self) -> String {
        match self {
            PersistError::Public => {
                "PersistNotAllowed: only messages on private channels can be persisted".into()
            }
            PersistError::BadTtl => format!(
                "InvalidPersist: persist must be true or {{ttl: seconds}}, the ttl from 1 to {MAX_TTL_SECS}"
            ),
        }
    }
}

fn ttl(n: i64) -> Result<Option<i32>, PersistError> {
    if (1..=i64::from(MAX_TTL_SECS)).contains(&n) {
        Ok(Some(n as i32))
    } else {
        Err(PersistError::BadTtl)
    }
}

/// The ttl (seconds) a `persist` value asks for: None for not kept (absent, null, false).
pub fn from_value(v: Option<&Value>) -> Result<Option<i32>, PersistError> {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(MAX_TTL_SECS)),
        Some(Value::Object(o)) => match o.get("ttl") {
            None | Some(Value::Null) => Ok(Some(MAX_TTL_SECS)),
            Some(t) => ttl(t.as_i64().ok_or(PersistError::BadTtl)?),
        },
        Some(_) => Err(PersistError::BadTtl),
    }
}

/// The ttl a REST query asks for (`persist=true`, `persist[ttl]=N`).
pub fn from_query(flag: Option<&str>, ttl_text: Option<&str>) -> Result<Option<i32>, PersistError> {
    match (flag, ttl_text) {
        (_, Some(t)) => ttl(t.trim().parse().map_err(|_| PersistError::BadTtl)?),
        (Some(f), None) if f.eq_ignore_ascii_case("true") => Ok(Some(MAX_TTL_SECS)),
        (Some(f), None) if f.eq_ignore_ascii_case("false") => Ok(None),
        (Some(_), None) => Err(PersistError::BadTtl),
        (None, None) => Ok(None),
    }
}

/// The longest token subject a sender is named by (Supabase's are uuids).
const MAX_SENDER_BYTES: usize = 255;

/// Who a kept message counts against (MAX_PERSISTED_*_PER_USER), as
/// `realtime.persisted_messages.sender` names it: the token's subject; for a token without
/// one (the anon key, which is public) the client's address; none for the app's backend
/// (`service_role`), which only the database's total bounds.
pub fn sender(sub: Option<&str>, address: Option<AddressKey>, backend: bool) -> Option<String> {
    if backend {
        return None;
    }
    // A subject that could not be a text parameter (a NUL) or is longer than a key should
    // be is not a name to count by: its address is.
    let sub = sub.filter(|s| client_text::text("token subject", s, MAX_SENDER_BYTES).is_ok());
    match (sub, address) {
        (Some(sub), _) => Some(format!("user {sub}")),
        (None, Some(a)) => Some(format!("address {a}")),
        (None, None) => None,
    }
}

/// Refuses keeping a message of a public channel.
pub fn check(ttl: Option<i32>, private: bool) -> Result<Option<i32>, PersistError> {
    match (ttl, private) {
        (Some(_), false) => Err(PersistError::Public),
        _ => Ok(ttl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_realtime_js_sends_is_read() {
        assert_eq!(from_value(None), Ok(None));
        assert_eq!(from_value(Some(&json!(false))), Ok(None));
        assert_eq!(from_value(Some(&json!(true))), Ok(Some(MAX_TTL_SECS)));
        assert_eq!(from_value(Some(&json!({"ttl": 60}))), Ok(Some(60)));
        assert_eq!(from_query(Some("true"), None), Ok(Some(MAX_TTL_SECS)));
        assert_eq!(from_query(None, Some("60")), Ok(Some(60)));
        assert_eq!(from_query(None, None), Ok(None));
    }

    #[test]
    fn a_kept_message_counts_against_its_user_else_its_address_and_a_backend_against_neither() {
        let a = AddressKey::of("2001:db8::1".parse().unwrap());
        assert_eq!(
            sender(Some("u1"), Some(a), false).as_deref(),
            Some("user u1")
        );
        assert_eq!(
            sender(None, Some(a), false).as_deref(),
            Some("address 2001:db8::/64")
        );
        assert_eq!(sender(Some("u1"), Some(a), true), None);
        assert_eq!(sender(None, None, false), None);
        // A subject with a NUL, or past 255 bytes, never reaches SQL: the address counts.
        let by_address = Some("address 2001:db8::/64".to_owned());
        assert_eq!(sender(Some("u\0"), Some(a), false), by_address);
        assert_eq!(sender(Some(&"u".repeat(256)), Some(a), false), by_address);
    }

    #[test]
    fn bad_ttls_and_public_channels_are_refused_by_name() {
        for bad in [
            json!({"ttl": 0}),
            json!({"ttl": "x"}),
            json!({"ttl": MAX_TTL_SECS + 1}),
            json!(5),
        ] {
            assert_eq!(from_value(Some(&bad)), Err(PersistError::BadTtl), "{bad}");
        }
        assert_eq!(from_query(None, Some("-1")), Err(PersistError::BadTtl));
        assert_eq!(from_query(Some("yes"), None), Err(PersistError::BadTtl));
        assert_eq!(check(Some(60), false), Err(PersistError::Public));
        assert_eq!(check(Some(60), true), Ok(Some(60)));
        assert_eq!(check(None, false), Ok(None));
        assert!(PersistError::Public
            .text()
            .starts_with("PersistNotAllowed: "));
    }
}
