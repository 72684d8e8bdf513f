//! Who may read `/metrics`: Supabase's `METRICS_JWT_SECRET`. When it is set, a request needs
//! `Authorization: Bearer <JWT>` signed with it (HS256, HS384 or HS512; an `exp`, when the
//! token has one, in the future) and is refused with 403 otherwise, as Supabase refuses it.
//! When it is unset, `/metrics` is served to anyone who reaches the port, as before: the
//! port binds to 127.0.0.1 by default, and README's proxy forwards only `/realtime/v1/`.

use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};

pub struct MetricsAuth {
    key: Option<DecodingKey>,
}

impl MetricsAuth {
    pub fn new(secret: Option<&str>) -> MetricsAuth {
        MetricsAuth {
            key: secret.map(|s| DecodingKey::from_secret(s.as_bytes())),
        }
    }

    /// Whether a request with this `Authorization` header may read the metrics.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        let Some(key) = &self.key else {
            return true;
        };
        let Some(token) = authorization.and_then(|h| h.strip_prefix("Bearer ")) else {
            return false;
        };
        let Ok(header) = decode_header(token.trim()) else {
            return false;
        };
        if !matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return false;
        }
        let mut validation = Validation::new(header.alg);
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        decode::<serde_json::Value>(token.trim(), key, &validation).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &str = "metrics-secret-with-at-least-32-characters";

    fn bearer(alg: Algorithm, secret: &str, claims: serde_json::Value) -> String {
        let t = encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap();
        format!("Bearer {t}")
    }

    #[test]
    fn unset_secret_serves_everyone() {
        assert!(MetricsAuth::new(None).allows(None));
    }

    #[test]
    fn set_secret_wants_a_token_signed_with_it_and_unexpired() {
        let auth = MetricsAuth::new(Some(SECRET));
        let now = crate::jwt::now();
        assert!(!auth.allows(None));
        assert!(!auth.allows(Some("Basic abc")));
        assert!(!auth.allows(Some("Bearer not.a.jwt")));
        for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            assert!(auth.allows(Some(&bearer(alg, SECRET, json!({"exp": now + 60})))));
        }
        assert!(auth.allows(Some(&bearer(Algorithm::HS256, SECRET, json!({})))));
        assert!(!auth.allows(Some(&bearer(
            Algorithm::HS256,
            "another-secret-with-at-least-32-characters",
            json!({"exp": now + 60})
        ))));
        assert!(!auth.allows(Some(&bearer(
            Algorithm::HS256,
            SECRET,
            json!({"exp": now - 120})
        ))));
    }
}
