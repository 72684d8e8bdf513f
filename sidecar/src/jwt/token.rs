//! A token as it arrives, before anything in it is trusted: Supabase's cleaning, and the
//! two fields of its header that choose the key.

use super::errors::JwtError;
use base64::Engine;
use serde_json::Value;

/// The longest token verified, in bytes after cleaning: Supabase's own tokens are under
/// 2 KB; one of 16 KB is parsed no further.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Supabase's `clean_token`: percent-decoded (`%2E` is a `.`), then every whitespace
/// character removed, so a token pasted across lines or escaped by a proxy verifies.
pub fn clean(token: &str) -> String {
    crate::url::decode_path(token)
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect()
}

/// What a token's header says about its signer, read without verifying anything.
#[derive(Debug, PartialEq)]
pub(super) struct Header {
    pub(super) alg: String,
    /// None when absent or not a string (Supabase then chooses as for a token without one).
    pub(super) kid: Option<String>,
}

/// The header of a cleaned token, as Supabase peeks it: three dot-separated parts, the
/// claims a JSON object, the header a JSON object naming its `alg`.
pub(super) fn header(token: &str) -> Result<Header, JwtError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(JwtError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(head), Some(claims), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed);
    };
    let object = |part: &str| -> Option<serde_json::Map<String, Value>> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part)
            .ok()?;
        match serde_json::from_slice(&bytes).ok()? {
            Value::Object(m) => Some(m),
            _ => None,
        }
    };
    let (Some(head), Some(_)) = (object(head), object(claims)) else {
        return Err(JwtError::Malformed);
    };
    let Some(alg) = head.get("alg").and_then(Value::as_str) else {
        return Err(JwtError::signer(None));
    };
    Ok(Header {
        alg: alg.to_owned(),
        kid: head.get("kid").and_then(Value::as_str).map(str::to_owned),
    })
}
