//! The keys tokens are verified with, and which one a token gets.
//!
//! Supabase (`RealtimeWeb.JwtVerification`) chooses a token's signer by its header: the
//! key type its `alg` requires and its `kid`, in the static JWKS of `API_JWT_JWKS`:
//!
//! | `alg`                  | key                                               |
//! |------------------------|---------------------------------------------------|
//! | RS256/384/512 + kid    | `kty: RSA` with that kid                          |
//! | ES256/384/512 + kid    | `kty: EC` with that kid                           |
//! | EdDSA, Ed25519, Ed448 + kid | `kty: OKP` with that kid, `crv` Ed25519 or Ed448 |
//! | HS256/384/512 + kid    | `kty: oct` with that kid, else API_JWT_SECRET     |
//! | HS256/384/512          | API_JWT_SECRET                                    |
//! | anything else          | none: JwtSignerError                              |
//!
//! A key is never chosen by its `kid` alone, so a kid that names the EC key in an HS256
//! token is not an HMAC secret made of a public key. Stricter than Supabase: a JWK whose
//! `use` is present and not `sig`, or whose `alg` is present and not the token's, is not
//! used, nor an EC key of another curve than its `alg`'s; with a JWKS and no
//! API_JWT_SECRET, an HS* token is verified only by an `oct` key its kid names, never by
//! an empty or default key. What the verifying crate cannot check (ES512, Ed448, a token
//! whose `alg` is the curve's name `Ed25519` rather than `EdDSA`) is refused with
//! Supabase's signer text (the sidecar's reference lists these).

use super::errors::JwtError;
use base64::Engine;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

/// The shortest HMAC key accepted (API_JWT_SECRET, an `oct` key): HS256 wants 256 bits.
pub const MIN_SECRET_BYTES: usize = 32;

/// Every key a sidecar verifies tokens with.
pub struct Keys {
    secret: Option<DecodingKey>,
    /// None without API_JWT_JWKS.
    jwks: Option<Vec<Key>>,
}

/// One JWK of the set, with what chooses it.
struct Key {
    kty: String,
    kid: Option<String>,
    /// `use` absent or `sig`.
    signs: bool,
    alg: Option<String>,
    crv: Option<String>,
    /// None for a key the verifying crate cannot read (an Ed448 key, say): kept so that a
    /// token naming it is refused as Supabase refuses an unusable signer.
    decoding: Option<DecodingKey>,
}

/// The key type an `alg` requires, if it is one Supabase verifies.
fn kty_of(alg: &str) -> Option<&'static str> {
    match alg {
        "RS256" | "RS384" | "RS512" => Some("RSA"),
        "ES256" | "ES384" | "ES512" => Some("EC"),
        "EdDSA" | "Ed25519" | "Ed448" => Some("OKP"),
        "HS256" | "HS384" | "HS512" => Some("oct"),
        _ => None,
    }
}

/// The algorithm as the verifying crate knows it, for a key of curve `crv`; None where it
/// has none (ES512, Ed448, `alg: Ed25519`).
fn verifiable(alg: &str, crv: Option<&str>) -> Option<Algorithm> {
    Some(match (alg, crv) {
        ("HS256", _) => Algorithm::HS256,
        ("HS384", _) => Algorithm::HS384,
        ("HS512", _) => Algorithm::HS512,
        ("RS256", _) => Algorithm::RS256,
        ("RS384", _) => Algorithm::RS384,
        ("RS512", _) => Algorithm::RS512,
        ("ES256", Some("P-256")) => Algorithm::ES256,
        ("ES384", Some("P-384")) => Algorithm::ES384,
        ("EdDSA", Some("Ed25519")) => Algorithm::EdDSA,
        _ => return None,
    })
}

impl Keys {
    /// The keys of API_JWT_SECRET and API_JWT_JWKS (Supabase's `{"keys": [...]}`); an
    /// error names what is wrong with them. `unusable` is told each key of the set that no
    /// token will be verified with, and why (the sidecar logs it at start).
    pub fn new(
        secret: Option<&str>,
        jwks: Option<&str>,
        mut unusable: impl FnMut(String),
    ) -> Result<Keys, String> {
        if let Some(s) = secret {
            if s.len() < MIN_SECRET_BYTES {
                return Err(format!(
                    "API_JWT_SECRET must be at least {MIN_SECRET_BYTES} bytes long (it has {})",
                    s.len()
                ));
            }
        }
        let jwks = match jwks {
            None => None,
            Some(text) => Some(parse_jwks(text, &mut unusable)?),
        };
        if secret.is_none() && jwks.is_none() {
            return Err("API_JWT_SECRET or API_JWT_JWKS must be set".into());
        }
        Ok(Keys {
            secret: secret.map(|s| DecodingKey::from_secret(s.as_bytes())),
            jwks,
        })
    }

    /// The key and algorithm a token with this header is verified with.
    pub(super) fn choose(
        &self,
        alg: &str,
        kid: Option<&str>,
    ) -> Result<(Algorithm, &DecodingKey), JwtError> {
        let Some(kty) = kty_of(alg) else {
            return Err(JwtError::signer(None));
        };
        let from_set = match (kid, &self.jwks) {
            (Some(kid), Some(keys)) => keys.iter().find(|k| {
                k.kty == kty
                    && k.kid.as_deref() == Some(kid)
                    && k.signs
                    && k.alg.as_deref().is_none_or(|a| a == alg)
            }),
            _ => None,
        };
        if let Some(key) = from_set {
            let alg = verifiable(alg, key.crv.as_deref());
            return match (alg, &key.decoding) {
                (Some(alg), Some(decoding)) => Ok((alg, decoding)),
                _ => Err(JwtError::signer(kid)),
            };
        }
        match (kty, &self.secret) {
            // Supabase: "Most Supabase Auth JWTs fall in this case": an HS* token whose kid
            // names no `oct` key is verified with the secret.
            ("oct", Some(secret)) => Ok((verifiable(alg, None).expect("an HS alg"), secret)),
            // A kid the set does not hold for this key type (Supabase names it only when it
            // has a set to look in).
            _ if kid.is_some() && self.jwks.is_some() => Err(JwtError::signer(kid)),
            _ => Err(JwtError::signer(None)),
        }
    }
}

fn parse_jwks(text: &str, unusable: &mut impl FnMut(String)) -> Result<Vec<Key>, String> {
    let bad = |why: &str| format!("API_JWT_JWKS is not a JWKS ({why}): want {{\"keys\": [...]}}");
    let set: Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    let Some(list) = set.get("keys").and_then(Value::as_array) else {
        return Err(bad("no \"keys\" array"));
    };
    let mut keys = Vec::with_capacity(list.len());
    for (i, jwk) in list.iter().enumerate() {
        let Some(fields) = jwk.as_object() else {
            return Err(bad(&format!("key {i} is not an object")));
        };
        let text = |name: &str| fields.get(name).and_then(Value::as_str).map(str::to_owned);
        let Some(kty) = text("kty") else {
            return Err(bad(&format!("key {i} has no \"kty\"")));
        };
        let kid = text("kid");
        let named = format!("key {i} (kid {:?})", kid.as_deref().unwrap_or(""));
        let decoding = if kty == "oct" {
            // Supabase's own set holds the legacy secret as an `oct` key: it must be as
            // long as API_JWT_SECRET has to be.
            let Some(k) = text("k") else {
                return Err(bad(&format!("{} is an oct key with no \"k\"", named)));
            };
            let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(k.trim_end_matches('='))
                .map_err(|_| bad(&format!("{}: \"k\" is not base64url", named)))?;
            if secret.len() < MIN_SECRET_BYTES {
                return Err(format!(
                    "API_JWT_JWKS: {} is {} bytes long; an oct key must be at least {MIN_SECRET_BYTES}",
                    named,
                    secret.len()
                ));
            }
            Some(DecodingKey::from_secret(&secret))
        } else {
            match serde_json::from_value::<Jwk>(jwk.clone())
                .map_err(|e| e.to_string())
                .and_then(|j| DecodingKey::from_jwk(&j).map_err(|e| e.to_string()))
            {
                Ok(d) => Some(d),
                Err(e) => {
                    unusable(format!(
                        "{}: this server cannot verify with it ({e})",
                        named
                    ));
                    None
                }
            }
        };
        let key = Key {
            signs: text("use").is_none_or(|u| u == "sig"),
            alg: text("alg"),
            crv: text("crv"),
            kty,
            kid,
            decoding,
        };
        if !key.signs {
            unusable(format!("{}: its \"use\" is not \"sig\"", named));
        }
        keys.push(key);
    }
    Ok(keys)
}
