//! Tokens already verified, so the same token is not verified again until it expires.
//!
//! Every socket of an app presents the same anon key, and every channel of a signed-in user
//! the same session token. On Supabase's asymmetric keys each is an ES256 signature, whose
//! check costs this machine about a third of a millisecond of CPU (`pgbench/joins.py`:
//! 15,000 sockets connecting with one ES256 anon key took 7.3 s against 1.4 s with HS256).
//! A token's verdict cannot change before its `exp`: the keys, the validators and the
//! clock's direction are fixed for the process's life; `nbf` is past once it passed.
//!
//! Only tokens that verified are kept, by the SHA-256 of their cleaned text, each until its
//! `exp`. A client cannot grow the set with tokens nobody signed; holders of many signed
//! tokens are bounded by VERIFIED_TOKENS_MAX tokens and VERIFIED_TOKENS_MAX_BYTES of their
//! claims: past either, the set is emptied (what it held is verified again when it comes
//! back), so its memory is bounded and nothing is ever refused for it.

use super::claims::Claims;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;

/// Tokens kept at most.
pub const VERIFIED_TOKENS_MAX: usize = 10_000;
/// Bytes of the kept tokens' claims (as JSON) at most.
pub const VERIFIED_TOKENS_MAX_BYTES: usize = 16 << 20;

#[derive(Default)]
pub struct Verified {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    claims: HashMap<[u8; 32], Claims>,
    bytes: usize,
}

fn weight(c: &Claims) -> usize {
    c.all.to_string().len() + 64
}

impl Verified {
    /// The claims of `token` if it verified before and has not expired at `now`.
    pub(super) fn get(&self, token: &str, now: i64) -> Option<Claims> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        match kept.claims.get(&digest) {
            Some(c) if c.exp > now => Some(c.clone()),
            Some(_) => {
                let gone = kept.claims.remove(&digest).map_or(0, |c| weight(&c));
                kept.bytes -= gone;
                None
            }
            None => None,
        }
    }

    /// Keeps the claims `token` verified to.
    pub(super) fn put(&self, token: &str, claims: &Claims) {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let w = weight(claims);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.claims.len() >= VERIFIED_TOKENS_MAX || kept.bytes + w > VERIFIED_TOKENS_MAX_BYTES {
            kept.claims.clear();
            kept.bytes = 0;
        }
        if let Some(old) = kept.claims.insert(digest, claims.clone()) {
            kept.bytes -= weight(&old);
        }
        kept.bytes += w;
    }

    #[cfg(test)]
    pub(super) fn held(&self) -> (usize, usize) {
        let kept = self.kept.lock().unwrap();
        (kept.claims.len(), kept.bytes)
    }
}
