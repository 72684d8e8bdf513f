//! Verifying the JWTs clients present (the `apikey` of the socket and each channel's
//! `access_token`), with Supabase's rules and reason texts.

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

/// The claims of a verified token.
#[derive(Clone, Debug, PartialEq)]
pub struct Claims {
    pub role: String,
    pub exp: i64,
    pub sub: Option<String>,
    /// Every claim, as the JSON object policies read through `request.jwt.claims`.
    pub all: Value,
}

impl Claims {
    /// A `service_role` token is a backend's: one server sending and listening for many
    /// users from one address. No per-address or per-user limit counts it (REST's
    /// `rest_limits`, and a WebSocket connection whose `apikey` it is); its per-connection
    /// limits and the process's totals do. Whoever holds it holds the project's secret key.
    pub fn is_backend(&self) -> bool {
        self.role == "service_role"
    }
}

/// Why a token was refused; `reason()` is the text clients see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwtError {
    Malformed,
    Signature,
    Signer,
    Expired {
        seconds_ago: i64,
    },
    /// `nbf` lies in the future.
    NotYetValid {
        seconds_ahead: i64,
    },
    MissingClaims,
}

impl JwtError {
    pub fn reason(&self) -> String {
        match self {
            JwtError::Malformed => "MalformedJWT: The token provided is not a valid JWT".into(),
            JwtError::Signature => "JwtSignatureError: Failed to validate JWT signature".into(),
            JwtError::Signer => {
                "JwtSignerError: The token was not signed with an algorithm this server accepts"
                    .into()
            }
            JwtError::Expired { seconds_ago } => {
                format!("InvalidJWTToken: Token has expired {seconds_ago} seconds ago")
            }
            JwtError::NotYetValid { seconds_ahead } => {
                format!(
                    "InvalidJWTToken: Token is not valid for another {seconds_ahead} seconds (nbf)"
                )
            }
            JwtError::MissingClaims => {
                "InvalidJWTToken: Fields `role` and `exp` are required in JWT".into()
            }
        }
    }
}

/// The `alg` of a token's header, read without trusting anything else in it.
fn header_alg(token: &str) -> Option<String> {
    use base64::Engine;
    let head = token.split('.').next()?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.get("alg")?.as_str().map(str::to_owned)
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Verifies HS256/384/512 tokens signed with the project's JWT secret.
pub struct Verifier {
    key: DecodingKey,
}

impl Verifier {
    pub fn new(secret: &str) -> Self {
        Verifier {
            key: DecodingKey::from_secret(secret.as_bytes()),
        }
    }

    pub fn verify(&self, token: &str) -> Result<Claims, JwtError> {
        let token = token.trim();
        let header = decode_header(token).map_err(|_| match header_alg(token).as_deref() {
            // A well-formed token with an algorithm we do not accept ("none", say).
            Some(_) => JwtError::Signer,
            None => JwtError::Malformed,
        })?;
        if !matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return Err(JwtError::Signer);
        }
        let mut validation = Validation::new(header.alg);
        // Expiry and required claims are checked below, to give Supabase's reasons.
        validation.validate_exp = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let data = decode::<Value>(token, &self.key, &validation).map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => JwtError::Signature,
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => JwtError::Signer,
            _ => JwtError::Malformed,
        })?;
        let all = data.claims;
        let role = all.get("role").and_then(Value::as_str);
        let exp = all.get("exp").and_then(Value::as_i64);
        let (Some(role), Some(exp)) = (role, exp) else {
            return Err(JwtError::MissingClaims);
        };
        let now = now();
        if exp <= now {
            return Err(JwtError::Expired {
                seconds_ago: now - exp,
            });
        }
        match all.get("nbf") {
            None => {}
            Some(nbf) => match nbf.as_i64() {
                Some(nbf) if nbf > now => {
                    return Err(JwtError::NotYetValid {
                        seconds_ahead: nbf - now,
                    })
                }
                Some(_) => {}
                None => return Err(JwtError::Malformed),
            },
        }
        Ok(Claims {
            role: role.to_owned(),
            exp,
            sub: all.get("sub").and_then(Value::as_str).map(str::to_owned),
            all,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    fn token(alg: Algorithm, secret: &str, claims: Value) -> String {
        encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    #[test]
    fn nbf_in_the_future_is_refused() {
        let v = Verifier::new("s3cret");
        let at = |nbf: Value| {
            v.verify(&token(
                Algorithm::HS256,
                "s3cret",
                json!({"role": "anon", "exp": now() + 600, "nbf": nbf}),
            ))
        };
        assert!(at(json!(now() - 5)).is_ok());
        match at(json!(now() + 300)) {
            Err(e @ JwtError::NotYetValid { .. }) => {
                assert!(e
                    .reason()
                    .starts_with("InvalidJWTToken: Token is not valid for another"))
            }
            other => panic!("expected NotYetValid, got {other:?}"),
        }
        assert_eq!(at(json!("soon")), Err(JwtError::Malformed));
    }

    #[test]
    fn accepts_hs_tokens_with_role_and_exp() {
        let v = Verifier::new("s3cret");
        for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            let c = v
                .verify(&token(
                    alg,
                    "s3cret",
                    json!({"role": "anon", "exp": now() + 60, "sub": "u1"}),
                ))
                .unwrap();
            assert_eq!((c.role.as_str(), c.sub.as_deref()), ("anon", Some("u1")));
        }
    }

    #[test]
    fn refuses_bad_tokens_with_supabase_reasons() {
        let v = Verifier::new("s3cret");
        let good = json!({"role": "anon", "exp": now() + 60});
        assert_eq!(
            v.verify(&token(Algorithm::HS256, "other", good.clone())),
            Err(JwtError::Signature)
        );
        assert_eq!(v.verify("not.a.jwt"), Err(JwtError::Malformed));
        assert_eq!(v.verify(""), Err(JwtError::Malformed));
        assert_eq!(
            v.verify(&token(
                Algorithm::HS256,
                "s3cret",
                json!({"exp": now() + 60})
            )),
            Err(JwtError::MissingClaims)
        );
        let expired = v.verify(&token(
            Algorithm::HS256,
            "s3cret",
            json!({"role": "anon", "exp": now() - 10}),
        ));
        assert!(
            matches!(expired, Err(JwtError::Expired { seconds_ago }) if (10..=12).contains(&seconds_ago))
        );
        // alg "none": header {"alg":"none","typ":"JWT"}, claims {"role":"anon","exp":9999999999}
        let none =
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJyb2xlIjoiYW5vbiIsImV4cCI6OTk5OTk5OTk5OX0.";
        assert_eq!(v.verify(none), Err(JwtError::Signer));
        assert_eq!(
            JwtError::Expired { seconds_ago: 3 }.reason(),
            "InvalidJWTToken: Token has expired 3 seconds ago"
        );
    }
}
