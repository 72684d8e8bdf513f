//! A verified token's claims, judged as Supabase judges them: `exp` a number after now,
//! `iat` a number when present, each JWT_CLAIM_VALIDATORS claim equal to its value when
//! present; then `role` and `exp` required. Decimal `exp` and `iat` are accepted and
//! rounded, as Supabase rounds them, in the claims policies read too.
//!
//! `nbf` is kept where Supabase ignores it: a token that says it is not valid yet is
//! refused, allowing NBF_LEEWAY for clocks that differ (RFC 7519 asks for this; Supabase
//! Auth sets no `nbf`, so its tokens are not affected).

use super::errors::JwtError;
use serde_json::{Map, Value};

/// How far a token's `nbf` may lie ahead of this server's clock.
pub const NBF_LEEWAY: i64 = 60;

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

/// JWT_CLAIM_VALIDATORS: claims a token must hold these values of when it has them.
///
/// Supabase's meaning ("equal when present") is kept rather than a stricter "required and
/// equal": Supabase's anon and service keys carry no `aud`, so a project that validates
/// `aud` against its users' tokens would otherwise lock out every socket opened with the
/// anon key.
#[derive(Clone, Debug, Default)]
pub struct Validators(Vec<(String, Value)>);

impl Validators {
    /// Supabase's form: a JSON object of claim names and the values they must hold.
    pub fn parse(text: Option<&str>) -> Result<Validators, String> {
        let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
            return Ok(Validators::default());
        };
        match serde_json::from_str(text) {
            Ok(Value::Object(m)) => Ok(Validators(m.into_iter().collect())),
            _ => Err(format!(
                "JWT_CLAIM_VALIDATORS must be a JSON object of claims and values, as {{\"iss\": \"supabase\"}}; it is {text:?}"
            )),
        }
    }
}

/// The claims of a token whose signature verified, judged at `now`.
pub(super) fn judge(claims: Value, validators: &Validators, now: i64) -> Result<Claims, JwtError> {
    let Value::Object(mut all) = claims else {
        return Err(JwtError::Malformed);
    };
    let exp = rounded(&mut all, "exp")?;
    if let Some(exp) = exp {
        if exp <= now {
            return Err(JwtError::Expired {
                seconds_ago: now - exp,
            });
        }
    }
    rounded(&mut all, "iat")?;
    for (claim, value) in &validators.0 {
        if all.get(claim).is_some_and(|v| v != value) {
            return Err(JwtError::InvalidClaim(claim.clone()));
        }
    }
    let role = all.get("role").and_then(Value::as_str).map(str::to_owned);
    let (Some(role), Some(exp)) = (role, exp) else {
        return Err(JwtError::MissingClaims);
    };
    match all.get("nbf") {
        None => {}
        Some(nbf) => match nbf.as_f64() {
            Some(nbf) if nbf > (now + NBF_LEEWAY) as f64 => {
                return Err(JwtError::NotYetValid {
                    seconds_ahead: nbf.round() as i64 - now,
                })
            }
            Some(_) => {}
            None => return Err(JwtError::InvalidClaim("nbf".into())),
        },
    }
    Ok(Claims {
        role,
        exp,
        sub: all.get("sub").and_then(Value::as_str).map(str::to_owned),
        all: Value::Object(all),
    })
}

/// A numeric claim, rounded in place; an error when present and not a number.
fn rounded(all: &mut Map<String, Value>, claim: &str) -> Result<Option<i64>, JwtError> {
    let Some(v) = all.get(claim) else {
        return Ok(None);
    };
    let n = if let Some(i) = v.as_i64() {
        i
    } else {
        match v.as_f64() {
            // Beyond i64 a time means nothing: refused rather than saturated.
            Some(f) if f.is_finite() && f.abs() < 9.0e15 => f.round() as i64,
            _ => return Err(JwtError::InvalidClaim(claim.into())),
        }
    };
    all.insert(claim.into(), Value::from(n));
    Ok(Some(n))
}
