//! Supabase's opaque API keys (`sb_publishable_...`, `sb_secret_...`) without its gateway.
//!
//! Supabase's Realtime never takes an opaque key as a credential: its gateway (Kong) swaps
//! the key for a pre-signed JWT of the project's anon or service_role key before Realtime
//! sees it. A deployment of this sidecar without that gateway gives it the keys instead
//! (SUPABASE_PUBLISHABLE_KEY, SUPABASE_SECRET_KEY: the names of Supabase's self-hosted
//! `.env`, each one key or a comma-separated list), and a key maps to the claims of those
//! JWTs: `{"role": "anon" | "service_role", "iss": "supabase"}`, valid as long as the key
//! is configured.
//!
//! Keys are compared in constant time (their SHA-256 digests, so not even a key's length
//! shows in the time taken) and never logged or echoed. A secret key presented by a
//! browser (a request with an `Origin` header) is refused, as Supabase refuses one: it
//! would be readable by anyone who opens the page.

use super::claims::Claims;
use super::errors::JwtError;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub const PUBLISHABLE_PREFIX: &str = "sb_publishable_";
pub const SECRET_PREFIX: &str = "sb_secret_";

/// The shortest key accepted after its prefix: Supabase's are over 30 characters; a short
/// one could be guessed.
const MIN_KEY_CHARS: usize = 16;

/// How long an opaque key's claims say they are valid: keys do not expire, so for as long as
/// any connection lasts.
const VALID_FOR: i64 = 10 * 365 * 24 * 3600;

#[derive(Default)]
pub struct ApiKeys {
    /// (the key's SHA-256, its role)
    keys: Vec<([u8; 32], Role)>,
}

#[derive(Clone, Copy, Debug)]
enum Role {
    Anon,
    ServiceRole,
}

impl ApiKeys {
    /// The keys of SUPABASE_PUBLISHABLE_KEY and SUPABASE_SECRET_KEY; an error names the
    /// setting and what is wrong (never the key).
    pub fn new(publishable: Option<&str>, secret: Option<&str>) -> Result<ApiKeys, String> {
        let mut keys: Vec<([u8; 32], Role)> = Vec::new();
        for (setting, list, prefix, role) in [
            (
                "SUPABASE_PUBLISHABLE_KEY",
                publishable,
                PUBLISHABLE_PREFIX,
                Role::Anon,
            ),
            (
                "SUPABASE_SECRET_KEY",
                secret,
                SECRET_PREFIX,
                Role::ServiceRole,
            ),
        ] {
            for (i, key) in list.unwrap_or("").split(',').map(str::trim).enumerate() {
                if key.is_empty() {
                    continue;
                }
                let Some(rest) = key.strip_prefix(prefix) else {
                    return Err(format!(
                        "{setting}: key {} does not start with {prefix}",
                        i + 1
                    ));
                };
                if rest.chars().count() < MIN_KEY_CHARS {
                    return Err(format!(
                        "{setting}: key {} has fewer than {MIN_KEY_CHARS} characters after {prefix}",
                        i + 1
                    ));
                }
                // Each list takes only its own prefix, so a key in both lists refuses the
                // start here: a key is publishable or secret, never both.
                keys.push((Sha256::digest(key.as_bytes()).into(), role));
            }
        }
        Ok(ApiKeys { keys })
    }

    /// The claims `key` stands for. `from_browser`: the request carries an `Origin` header.
    pub(super) fn claims(
        &self,
        key: &str,
        from_browser: bool,
        now: i64,
    ) -> Result<Claims, JwtError> {
        if self.keys.is_empty() {
            // As Supabase's Realtime answers an opaque key without its gateway.
            return Err(JwtError::Malformed);
        }
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        // Every key is compared, whichever matches.
        let mut found = None;
        for (d, role) in &self.keys {
            if bool::from(d.ct_eq(&digest)) {
                found = Some(*role);
            }
        }
        let role = match found {
            None => return Err(JwtError::UnknownApiKey),
            Some(Role::ServiceRole) if from_browser => return Err(JwtError::SecretKeyInBrowser),
            Some(Role::Anon) => "anon",
            Some(Role::ServiceRole) => "service_role",
        };
        let exp = now + VALID_FOR;
        Ok(Claims {
            role: role.into(),
            exp,
            sub: None,
            all: json!({"role": role, "iss": "supabase", "exp": exp}),
        })
    }
}
