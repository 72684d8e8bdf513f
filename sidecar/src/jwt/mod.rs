//! Verifying the JWTs clients present (the socket's `apikey`, each channel's
//! `access_token`, REST's `apikey` and `Bearer`), with Supabase's rules and reason texts.
//!
//! A token's way: cleaned as Supabase cleans it (`token::clean`), its header peeked for
//! `alg` and `kid` (`token::header`), its key chosen by the key type that `alg` requires
//! and its `kid` (`keys`: API_JWT_SECRET and API_JWT_JWKS), its signature verified by
//! jsonwebtoken with that one algorithm, and its claims judged (`claims`: `exp`, `iat`,
//! JWT_CLAIM_VALIDATORS, `role`, `nbf`). Every refusal is a `JwtError` (`errors`).

mod api_keys;
mod claims;
mod errors;
mod keys;
mod token;
mod verified;

pub use api_keys::{ApiKeys, PUBLISHABLE_PREFIX, SECRET_PREFIX};
pub use claims::{Claims, Validators, NBF_LEEWAY};
pub use errors::JwtError;
pub use keys::{Keys, MIN_SECRET_BYTES};
pub use token::{clean, MAX_TOKEN_BYTES};
pub use verified::{VERIFIED_TOKENS_MAX, VERIFIED_TOKENS_MAX_BYTES};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{decode, Validation};
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Verifies tokens with the project's keys and judges their claims; maps its opaque API
/// keys to their claims.
pub struct Verifier {
    keys: Keys,
    validators: Validators,
    api_keys: ApiKeys,
    /// Tokens that verified, until their `exp` (`verified`).
    verified: verified::Verified,
}

impl Verifier {
    pub fn new(keys: Keys, validators: Validators, api_keys: ApiKeys) -> Self {
        Verifier {
            keys,
            validators,
            api_keys,
            verified: verified::Verified::default(),
        }
    }

    /// A verifier of HS* tokens signed with `secret` alone (tests, fuzzing).
    pub fn with_secret(secret: &str) -> Self {
        let keys = Keys::new(Some(secret), None, |_| {}).expect("a secret of 32 bytes or more");
        Verifier::new(keys, Validators::default(), ApiKeys::default())
    }

    /// A project's key, as a socket's `apikey` or REST's `apikey` or `Bearer` carry it: an
    /// opaque `sb_` key (`api_keys`) or a JWT. `from_browser`: the request has an `Origin`
    /// header (a secret key is refused there).
    pub fn verify_key(&self, key: &str, from_browser: bool) -> Result<Claims, JwtError> {
        let key = key.trim();
        if key.starts_with("sb_") {
            return self.api_keys.claims(key, from_browser, now());
        }
        self.verify(key)
    }

    pub fn verify(&self, token: &str) -> Result<Claims, JwtError> {
        let token = clean(token);
        let now = now();
        if let Some(claims) = self.verified.get(&token, now) {
            return Ok(claims);
        }
        let claims = self.verify_anew(&token, now)?;
        self.verified.put(&token, &claims);
        Ok(claims)
    }

    fn verify_anew(&self, token: &str, now: i64) -> Result<Claims, JwtError> {
        let header = token::header(token)?;
        let (alg, key) = self.keys.choose(&header.alg, header.kid.as_deref())?;
        let mut validation = Validation::new(alg);
        // Claims are judged below, to give Supabase's reasons.
        validation.validate_exp = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let data = decode::<Value>(token, key, &validation).map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => JwtError::Signature,
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                JwtError::signer(header.kid.as_deref())
            }
            _ => JwtError::Malformed,
        })?;
        claims::judge(data.claims, &self.validators, now)
    }
}

#[cfg(test)]
mod tests;
