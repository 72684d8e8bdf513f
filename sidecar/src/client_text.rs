//! The rules for client strings that reach SQL, in one place: every path that takes a
//! string from a client (a WebSocket push, a join's bindings and presence key, a REST route)
//! checks it here before it can join a batched database call. A string the database cannot
//! take (a NUL is valid JSON and valid UTF-8, but not valid Postgres text: SQLSTATE 22021)
//! would otherwise fail the whole call it rode in, and with it every other client's request
//! in that batch; an absurd length would be copied into every frame, row or key it reaches.
//! Rust strings are UTF-8 already (the frame and body decoders refuse anything else), so
//! what is left to check is the NUL, the length, and the JSON of a binary push's payload.

use std::fmt;

/// The longest event name (the 2.0.0 binary frames' one-byte length field).
pub const MAX_EVENT_BYTES: usize = 255;
/// The longest `join_ref`: it is echoed in every frame its channel is sent, and the 2.0.0
/// binary frames carry it with a one-byte length.
pub const MAX_JOIN_REF_BYTES: usize = 255;
/// The longest schema, table or column name a binding may name: PostgreSQL's identifiers
/// are at most NAMEDATALEN - 1 = 63 bytes, so a longer one names nothing.
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// Why a client string was refused: what it was, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadText {
    /// What the string is, as the client knows it ("the event name", "table").
    pub what: &'static str,
    pub why: Problem,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    Nul,
    Empty,
    TooLong {
        bytes: usize,
        limit: usize,
    },
    /// A binary push's JSON payload that does not parse (serde's message).
    NotJson(String),
}

impl fmt::Display for BadText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = self.what;
        match &self.why {
            Problem::Nul => write!(f, "{what} must not contain a NUL character"),
            Problem::Empty => write!(f, "{what} must not be empty"),
            Problem::TooLong { bytes, limit } => {
                write!(
                    f,
                    "{what} is {bytes} bytes long; the limit is {limit} bytes"
                )
            }
            Problem::NotJson(e) => write!(f, "{what} is not valid JSON: {e}"),
        }
    }
}

/// A string of at most `limit` bytes without a NUL (empty allowed).
pub fn text(what: &'static str, s: &str, limit: usize) -> Result<(), BadText> {
    let bad = |why| Err(BadText { what, why });
    if s.len() > limit {
        return bad(Problem::TooLong {
            bytes: s.len(),
            limit,
        });
    }
    if s.as_bytes().contains(&0) {
        return bad(Problem::Nul);
    }
    Ok(())
}

/// A broadcast's event name, on every path (WebSocket text and binary pushes, both REST
/// routes): 1 to 255 bytes, no NUL.
pub fn event(e: &str) -> Result<(), BadText> {
    if e.is_empty() {
        return Err(BadText {
            what: "the event name",
            why: Problem::Empty,
        });
    }
    text("the event name", e, MAX_EVENT_BYTES)
}

/// A schema, table or column name of a binding.
pub fn identifier(what: &'static str, s: &str) -> Result<(), BadText> {
    text(what, s, MAX_IDENTIFIER_BYTES)
}

/// A join's `join_ref`.
pub fn join_ref(r: &str) -> Result<(), BadText> {
    text("join_ref", r, MAX_JOIN_REF_BYTES)
}

/// The payload of a 2.0.0 binary push that says it is JSON: it is relayed into a `json`
/// column, whose input refuses what does not parse (and a raw NUL byte, which no valid JSON
/// holds). Checked without building the value.
pub fn json_payload(bytes: &[u8]) -> Result<(), BadText> {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
        .map(|_| ())
        .map_err(|e| BadText {
            what: "the JSON payload",
            why: Problem::NotJson(e.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_length_and_emptiness_are_refused_with_what_was_wrong() {
        assert_eq!(event("e"), Ok(()));
        assert_eq!(event(&"e".repeat(255)), Ok(()));
        assert_eq!(
            event(&"e".repeat(256)).unwrap_err().to_string(),
            "the event name is 256 bytes long; the limit is 255 bytes"
        );
        assert_eq!(
            event("a\0b").unwrap_err().to_string(),
            "the event name must not contain a NUL character"
        );
        assert_eq!(
            event("").unwrap_err().to_string(),
            "the event name must not be empty"
        );
        assert!(identifier("table", &"t".repeat(63)).is_ok());
        assert!(identifier("table", &"t".repeat(64)).is_err());
        assert!(identifier("schema", "pub\0lic").is_err());
        assert!(join_ref("1").is_ok());
        assert!(join_ref(&"1".repeat(256)).is_err());
        // Multi-byte characters count in bytes, as the database's limits do.
        assert!(text("key", &"é".repeat(3), 5).is_err());
    }

    #[test]
    fn a_binary_push_payload_must_be_json_a_raw_nul_included() {
        assert!(json_payload(br#"{"a":[1,"\u0000"]}"#).is_ok());
        assert!(json_payload(b"{").is_err());
        assert!(json_payload(b"{\"a\":\"\x00\"}").is_err());
        assert!(json_payload(b"").is_err());
        assert!(json_payload(b"1 2").is_err());
    }
}
