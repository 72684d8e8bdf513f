//! Why a token was refused, each reason named once with the text clients see: Supabase's
//! error code before the colon, its message after.

/// The longest key id echoed in a refusal; a longer one is cut, marked `...`.
const MAX_SHOWN_KID: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwtError {
    Malformed,
    Signature,
    /// No key verifies a token of this algorithm and key id (`keys`); the kid as shown.
    Signer {
        kid: Option<String>,
    },
    Expired {
        seconds_ago: i64,
    },
    /// `nbf` lies in the future by more than the leeway (`claims::NBF_LEEWAY`).
    NotYetValid {
        seconds_ahead: i64,
    },
    MissingClaims,
    /// A claim that is present but not what it must be: `exp` or `iat` not a number, or a
    /// claim other than JWT_CLAIM_VALIDATORS requires.
    InvalidClaim(String),
    /// An `sb_` key that is none of SUPABASE_PUBLISHABLE_KEY and SUPABASE_SECRET_KEY.
    UnknownApiKey,
    /// An `sb_secret_` key sent by a browser (the request has an `Origin` header).
    SecretKeyInBrowser,
}

impl JwtError {
    /// A signer error naming the token's key id, bounded and limited to characters that
    /// cannot change how a log line or a client's error text reads.
    pub(super) fn signer(kid: Option<&str>) -> JwtError {
        JwtError::Signer {
            kid: kid.map(shown_kid),
        }
    }

    pub fn reason(&self) -> String {
        match self {
            JwtError::Malformed => "MalformedJWT: The token provided is not a valid JWT".into(),
            JwtError::Signature => "JwtSignatureError: Failed to validate JWT signature".into(),
            JwtError::Signer { kid: Some(kid) } => format!(
                "JwtSignerError: Failed to generate JWT signer for key ID (kid) \"{kid}\", check your JWT secret or JWKS configuration"
            ),
            JwtError::Signer { kid: None } => {
                "JwtSignerError: Failed to generate JWT signer, check your JWT secret or JWKS configuration"
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
            JwtError::InvalidClaim(claim) => {
                format!("InvalidJWTToken: Claim `{claim}` is not valid")
            }
            JwtError::UnknownApiKey => {
                "InvalidAPIKey: The API key provided is not a key of this project".into()
            }
            JwtError::SecretKeyInBrowser => "InvalidAPIKey: A secret API key (sb_secret_) cannot be used from a browser (the request has an Origin header); use the publishable key".into(),
        }
    }
}

/// A key id as a refusal shows it: at most MAX_SHOWN_KID characters, each one of the
/// characters key ids are made of (letters, digits, `-_.:+/=~@`), any other shown as `?`.
fn shown_kid(kid: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_.:+/=~@".contains(c);
    let mut shown: String = kid
        .chars()
        .take(MAX_SHOWN_KID)
        .map(|c| if safe(c) { c } else { '?' })
        .collect();
    if kid.chars().count() > MAX_SHOWN_KID {
        shown.push_str("...");
    }
    shown
}
