//! Tokens verified with the secret and with a JWKS (P-256, Ed25519 and `oct` keys made for
//! these tests; the end-to-end tests mint theirs with other libraries: npm `jose`, PyJWT).

use super::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

const SECRET: &str = "a-legacy-jwt-secret-of-32-bytes-or-more";
/// The `oct` key of the set: base64url of OCT.
const OCT: &str = "an-oct-key-of-the-jwks-32-bytes-long!!";

const EC_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgBnH0w6y3a64Eo7+s
ytnAb1ok2Y6r1IHdnuiExmHS5l2hRANCAATO8J3XM2kCK7GYLdLY5HL1R6rHyXVB
Cubz7nDMD3vo057GGLNsjGuPqi52MGx3V29otfOHuT0rCvG8HnPAqU3W
-----END PRIVATE KEY-----";
const ED_PEM: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIA5dnzDhaho1abz9N6h/yQHeKN0zceZfjDXWp1ZzvE0a
-----END PRIVATE KEY-----";

fn jwks() -> String {
    use base64::Engine;
    let oct = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(OCT);
    json!({"keys": [
        {"kty": "EC", "kid": "ec-1", "use": "sig", "alg": "ES256", "crv": "P-256",
         "x": "zvCd1zNpAiuxmC3S2ORy9Ueqx8l1QQrm8-5wzA976NM",
         "y": "nsYYs2yMa4-qLnYwbHdXb2i184e5PSsK8bwec8CpTdY"},
        {"kty": "OKP", "kid": "ed-1", "crv": "Ed25519",
         "x": "6fb-GJGThKfcL8VXZwWtHfXYe6PrEj0s8xgNmdZjky4"},
        {"kty": "oct", "kid": "oct-1", "k": oct},
        // The same EC key for encryption only: never chosen to verify.
        {"kty": "EC", "kid": "ec-enc", "use": "enc", "crv": "P-256",
         "x": "zvCd1zNpAiuxmC3S2ORy9Ueqx8l1QQrm8-5wzA976NM",
         "y": "nsYYs2yMa4-qLnYwbHdXb2i184e5PSsK8bwec8CpTdY"}
    ]})
    .to_string()
}

fn verifier(secret: Option<&str>, validators: Option<&str>) -> Verifier {
    let keys = Keys::new(secret, Some(&jwks()), |_| {}).unwrap();
    Verifier::new(
        keys,
        Validators::parse(validators).unwrap(),
        ApiKeys::default(),
    )
}

fn good() -> serde_json::Value {
    json!({"role": "authenticated", "exp": now() + 600, "sub": "u1"})
}

fn minted(
    alg: Algorithm,
    kid: Option<&str>,
    key: &EncodingKey,
    claims: &serde_json::Value,
) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    encode(&header, claims, key).unwrap()
}

fn ec(kid: Option<&str>) -> String {
    let key = EncodingKey::from_ec_pem(EC_PEM.as_bytes()).unwrap();
    minted(Algorithm::ES256, kid, &key, &good())
}

fn hs(kid: Option<&str>, secret: &str, claims: serde_json::Value) -> String {
    minted(
        Algorithm::HS256,
        kid,
        &EncodingKey::from_secret(secret.as_bytes()),
        &claims,
    )
}

fn signer_kid(kid: &str) -> Result<Claims, JwtError> {
    Err(JwtError::Signer {
        kid: Some(kid.into()),
    })
}

#[test]
fn asymmetric_tokens_are_verified_by_the_key_their_alg_and_kid_choose() {
    let v = verifier(Some(SECRET), None);
    assert_eq!(
        v.verify(&ec(Some("ec-1"))).unwrap().sub.as_deref(),
        Some("u1")
    );
    let ed = EncodingKey::from_ed_pem(ED_PEM.as_bytes()).unwrap();
    assert!(v
        .verify(&minted(Algorithm::EdDSA, Some("ed-1"), &ed, &good()))
        .is_ok());
    // A kid the set does not hold, and one of another key type.
    assert_eq!(v.verify(&ec(Some("nope"))), signer_kid("nope"));
    assert_eq!(v.verify(&ec(Some("ed-1"))), signer_kid("ed-1"));
    // No kid: nothing in the set is chosen, and an ES256 token has no secret to fall to.
    assert_eq!(v.verify(&ec(None)), Err(JwtError::Signer { kid: None }));
    // A key whose `use` is not `sig`.
    assert_eq!(v.verify(&ec(Some("ec-enc"))), signer_kid("ec-enc"));
    // A token signed by another EC key under the right kid.
    let other = ec(Some("ec-1"));
    let mut parts: Vec<&str> = other.split('.').collect();
    let ed_signed = minted(Algorithm::EdDSA, Some("ed-1"), &ed, &good());
    parts[2] = ed_signed.split('.').nth(2).unwrap();
    assert!(matches!(
        v.verify(&parts.join(".")),
        Err(JwtError::Signature | JwtError::Malformed)
    ));
}

#[test]
fn an_hs_token_takes_the_oct_key_its_kid_names_else_the_secret() {
    let v = verifier(Some(SECRET), None);
    assert!(v.verify(&hs(Some("oct-1"), OCT, good())).is_ok());
    assert_eq!(
        v.verify(&hs(Some("oct-1"), SECRET, good())),
        Err(JwtError::Signature)
    );
    // Supabase Auth's own tokens: a kid the set has no `oct` key for (here the EC key's),
    // verified with the secret; never with the EC key's public bytes as an HMAC key.
    assert!(v.verify(&hs(Some("ec-1"), SECRET, good())).is_ok());
    assert!(v.verify(&hs(None, SECRET, good())).is_ok());
}

#[test]
fn a_jwks_only_sidecar_verifies_hs_tokens_only_with_an_oct_key_its_kid_names() {
    let v = verifier(None, None);
    assert!(v.verify(&hs(Some("oct-1"), OCT, good())).is_ok());
    assert_eq!(
        v.verify(&hs(None, "", good())),
        Err(JwtError::Signer { kid: None })
    );
    assert_eq!(v.verify(&hs(Some("ec-1"), "", good())), signer_kid("ec-1"));
    assert!(v.verify(&ec(Some("ec-1"))).is_ok());
}

#[test]
fn an_asymmetric_alg_never_takes_an_hmac_key() {
    // RS256 naming the `oct` key, and an alg Supabase refuses (PS256, none).
    let v = verifier(Some(SECRET), None);
    let header = |h: serde_json::Value| {
        use base64::Engine;
        let b = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        format!("{}.{}.c2ln", b(&h), b(&good()))
    };
    assert_eq!(
        v.verify(&header(json!({"alg": "RS256", "kid": "oct-1"}))),
        signer_kid("oct-1")
    );
    assert_eq!(
        v.verify(&header(json!({"alg": "PS256", "kid": "ec-1"}))),
        Err(JwtError::Signer { kid: None })
    );
    assert_eq!(
        v.verify(&header(json!({"alg": "none"}))),
        Err(JwtError::Signer { kid: None })
    );
    // What the verifying crate cannot check is refused as Supabase refuses a signer.
    assert_eq!(
        v.verify(&header(json!({"alg": "Ed25519", "kid": "ed-1"}))),
        signer_kid("ed-1")
    );
    assert_eq!(
        v.verify(&header(json!({"alg": "ES512", "kid": "ec-1"}))),
        signer_kid("ec-1")
    );
}

#[test]
fn a_kid_is_bounded_and_sanitized_before_it_is_echoed() {
    let v = verifier(Some(SECRET), None);
    let kid = format!("k\"\n\u{1b}[31m{}", "x".repeat(100));
    let reason = v.verify(&ec(Some(&kid))).unwrap_err().reason();
    assert!(reason.starts_with(
        "JwtSignerError: Failed to generate JWT signer for key ID (kid) \"k????31mxxx"
    ));
    assert!(
        reason.ends_with("xxx...\", check your JWT secret or JWKS configuration"),
        "{reason}"
    );
    assert!(reason.len() < 200);
}

#[test]
fn decimal_exp_and_iat_are_accepted_and_rounded() {
    let v = Verifier::with_secret(SECRET);
    let exp = now() as f64 + 600.4;
    let c = v
        .verify(&hs(
            None,
            SECRET,
            json!({"role": "anon", "exp": exp, "iat": 1.7e9}),
        ))
        .unwrap();
    assert_eq!(c.exp, exp.round() as i64);
    assert_eq!(
        (c.all["exp"].clone(), c.all["iat"].clone()),
        (json!(c.exp), json!(1_700_000_000))
    );
    let bad_iat = json!({"role": "anon", "exp": now() + 60, "iat": "yesterday"});
    assert_eq!(
        v.verify(&hs(None, SECRET, bad_iat)),
        Err(JwtError::InvalidClaim("iat".into()))
    );
}

#[test]
fn claim_validators_hold_a_claim_to_its_value_when_present() {
    let v = verifier(Some(SECRET), Some(r#"{"iss": "supabase"}"#));
    let with = |iss: serde_json::Value| {
        let mut c = good();
        c["iss"] = iss;
        v.verify(&hs(None, SECRET, c))
    };
    assert!(with(json!("supabase")).is_ok());
    assert_eq!(
        with(json!("elsewhere")),
        Err(JwtError::InvalidClaim("iss".into()))
    );
    // Supabase's meaning: a token without the claim passes.
    assert!(v.verify(&hs(None, SECRET, good())).is_ok());
    assert!(Validators::parse(Some("[1]")).is_err());
}

#[test]
fn nbf_further_ahead_than_the_leeway_is_refused() {
    let v = Verifier::with_secret(SECRET);
    let at = |nbf: serde_json::Value| {
        v.verify(&hs(
            None,
            SECRET,
            json!({"role": "anon", "exp": now() + 600, "nbf": nbf}),
        ))
    };
    assert!(at(json!(now() - 5)).is_ok());
    assert!(
        at(json!(now() + NBF_LEEWAY - 5)).is_ok(),
        "within the clocks' leeway"
    );
    match at(json!(now() + 300)) {
        Err(e @ JwtError::NotYetValid { .. }) => {
            assert!(e
                .reason()
                .starts_with("InvalidJWTToken: Token is not valid for another"))
        }
        other => panic!("expected NotYetValid, got {other:?}"),
    }
    assert_eq!(at(json!("soon")), Err(JwtError::InvalidClaim("nbf".into())));
}

#[test]
fn a_token_is_cleaned_as_supabase_cleans_it() {
    let v = Verifier::with_secret(SECRET);
    let t = hs(None, SECRET, good());
    let (head, rest) = t.split_at(10);
    let pasted = format!("  {head}\n {}", rest.replacen('.', "%2E", 1));
    assert!(v.verify(&pasted).is_ok());
}

#[test]
fn refuses_bad_tokens_with_supabase_reasons() {
    let v = Verifier::with_secret(SECRET);
    let good = json!({"role": "anon", "exp": now() + 60});
    assert_eq!(
        v.verify(&hs(
            None,
            "another-secret-of-thirty-two-bytes!!",
            good.clone()
        )),
        Err(JwtError::Signature)
    );
    assert_eq!(v.verify("not.a.jwt"), Err(JwtError::Malformed));
    assert_eq!(v.verify(""), Err(JwtError::Malformed));
    assert_eq!(
        v.verify(&"a.".repeat(MAX_TOKEN_BYTES)),
        Err(JwtError::Malformed)
    );
    assert_eq!(
        v.verify(&hs(None, SECRET, json!({"exp": now() + 60}))),
        Err(JwtError::MissingClaims)
    );
    let expired = v.verify(&hs(
        None,
        SECRET,
        json!({"role": "anon", "exp": now() - 10}),
    ));
    assert!(
        matches!(expired, Err(JwtError::Expired { seconds_ago }) if (10..=12).contains(&seconds_ago))
    );
    // alg "none": header {"alg":"none","typ":"JWT"}, claims {"role":"anon","exp":9999999999}
    let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJyb2xlIjoiYW5vbiIsImV4cCI6OTk5OTk5OTk5OX0.";
    assert_eq!(v.verify(none), Err(JwtError::Signer { kid: None }));
    assert_eq!(
        JwtError::Signer { kid: None }.reason(),
        "JwtSignerError: Failed to generate JWT signer, check your JWT secret or JWKS configuration"
    );
    assert_eq!(
        JwtError::Expired { seconds_ago: 3 }.reason(),
        "InvalidJWTToken: Token has expired 3 seconds ago"
    );
}

#[test]
fn keys_that_cannot_serve_refuse_the_start_or_are_named() {
    use base64::Engine;
    let short = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("short");
    let set = |keys: serde_json::Value| json!({ "keys": keys }).to_string();
    let err = |secret: Option<&str>, jwks: Option<&str>| {
        Keys::new(secret, jwks, |_| {}).err().unwrap_or_default()
    };
    assert!(err(Some("short"), None).contains("API_JWT_SECRET must be at least 32 bytes"));
    assert!(err(None, None).contains("API_JWT_SECRET or API_JWT_JWKS must be set"));
    assert!(err(None, Some("{}")).contains("no \"keys\" array"));
    assert!(err(None, Some("not json")).contains("API_JWT_JWKS is not a JWKS"));
    let short_oct = set(json!([{"kty": "oct", "kid": "s", "k": short}]));
    assert!(err(None, Some(&short_oct)).contains("an oct key must be at least 32"));
    let mut named = Vec::new();
    let ed448 = set(json!([{"kty": "OKP", "kid": "x448", "crv": "Ed448", "x": "AAAA"}]));
    assert!(Keys::new(None, Some(&ed448), |why| named.push(why)).is_ok());
    assert_eq!(named.len(), 1, "{named:?}");
    assert!(named[0].contains("x448"));
}

#[test]
fn opaque_keys_stand_for_their_role_and_refuse_the_start_when_misconfigured() {
    let publishable = "sb_publishable_0123456789abcdefghij";
    let secret = "sb_secret_0123456789abcdefghijklmn";
    let keys = ApiKeys::new(Some(&format!(" {publishable} ,")), Some(secret)).unwrap();
    let v = Verifier::new(
        Keys::new(Some(SECRET), None, |_| {}).unwrap(),
        Validators::default(),
        keys,
    );
    let anon = v.verify_key(publishable, true).unwrap();
    assert_eq!(
        (anon.role.as_str(), &anon.all["iss"]),
        ("anon", &json!("supabase"))
    );
    assert!(anon.exp > now() + 3600);
    assert!(v.verify_key(secret, false).unwrap().is_backend());
    assert_eq!(
        v.verify_key(secret, true),
        Err(JwtError::SecretKeyInBrowser)
    );
    assert_eq!(
        v.verify_key("sb_publishable_0123456789abcdefghiX", false),
        Err(JwtError::UnknownApiKey)
    );
    // JWTs still go to the verifier.
    assert!(v.verify_key(&hs(None, SECRET, good()), true).is_ok());
    // Without keys, an sb_ key is what Supabase's Realtime calls it without its gateway.
    let bare = Verifier::with_secret(SECRET);
    assert_eq!(
        bare.verify_key(publishable, false),
        Err(JwtError::Malformed)
    );
    let err = |p: Option<&str>, s: Option<&str>| ApiKeys::new(p, s).err().unwrap_or_default();
    assert!(err(Some("sb_secret_0123456789abcdefghij"), None)
        .contains("does not start with sb_publishable_"));
    assert!(err(None, Some("sb_secret_short")).contains("fewer than 16 characters"));
    // A key in both lists: the publishable one in the secret list refuses the start.
    let both = format!("{secret},{publishable}");
    assert!(err(Some(publishable), Some(&both)).contains("does not start with sb_secret_"));
}

#[test]
fn a_verified_token_is_kept_until_its_exp_and_the_set_is_bounded() {
    let v = Verifier::with_secret(SECRET);
    let t = hs(None, SECRET, good());
    assert!(v.verify(&t).is_ok());
    assert_eq!(v.verified.held().0, 1);
    assert!(
        v.verify(&format!(" {t}\n")).is_ok(),
        "kept by its cleaned text"
    );
    assert_eq!(v.verified.held().0, 1);
    // Refusals are not kept.
    assert!(v
        .verify(&hs(None, "another-secret-of-thirty-two-bytes!!", good()))
        .is_err());
    assert_eq!(v.verified.held().0, 1);
    // Expired since it was kept: verified again, and refused.
    let claims = Claims {
        exp: now() - 1,
        ..v.verify(&t).unwrap()
    };
    v.verified.put("an expired one", &claims);
    assert_eq!(v.verified.get("an expired one", now()), None);
    // Past VERIFIED_TOKENS_MAX tokens the set is emptied, never grown.
    for i in 0..VERIFIED_TOKENS_MAX + 5 {
        let mut c = good();
        c["n"] = json!(i);
        v.verified.put(
            &format!("token {i}"),
            &v.verify(&hs(None, SECRET, c)).unwrap(),
        );
    }
    let (count, bytes) = v.verified.held();
    assert!(
        count <= VERIFIED_TOKENS_MAX && bytes <= VERIFIED_TOKENS_MAX_BYTES,
        "{count} {bytes}"
    );
    // And past VERIFIED_TOKENS_MAX_BYTES.
    let big = Claims {
        all: json!({"pad": "x".repeat(VERIFIED_TOKENS_MAX_BYTES / 4)}),
        ..claims
    };
    for i in 0..6 {
        v.verified.put(
            &format!("big {i}"),
            &Claims {
                exp: now() + 60,
                ..big.clone()
            },
        );
    }
    assert!(v.verified.held().1 <= VERIFIED_TOKENS_MAX_BYTES);
}
