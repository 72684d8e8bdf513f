//! The tokens clients present: HS256 with the server's secret, or ES256 with a P-256 key and
//! its `kid` (`--jwt-ec-pem`, `--jwt-kid`), as a project on Supabase's JWT signing keys
//! issues them. Every token is signed before the clients are told to go, so a run times the
//! server's verification, not this generator's signing.

use crate::args::Args;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::Value;

pub fn sign(args: &Args, claims: &Value) -> String {
    match &args.jwt_ec_pem {
        None => encode(
            &Header::default(),
            claims,
            &EncodingKey::from_secret(args.jwt_secret.as_bytes()),
        ),
        Some(path) => {
            let pem = std::fs::read(path).expect("the --jwt-ec-pem file");
            let mut header = Header::new(Algorithm::ES256);
            header.kid = args.jwt_kid.clone();
            encode(
                &header,
                claims,
                &EncodingKey::from_ec_pem(&pem).expect("a P-256 private key in PEM"),
            )
        }
    }
    .unwrap()
}
