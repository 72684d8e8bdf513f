//! What a request's URL carries: its query parameters and its path segments,
//! percent-decoded (`+` is a space in a query string only).

use hyper::body::Incoming;
use hyper::Request;
use std::collections::HashMap;

/// The query string's parameters, decoded.
pub fn query_params(req: &Request<Incoming>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode_query(k), decode_query(v));
    }
    out
}

/// A query string's key or value: `%XX` escapes, and `+` for a space.
pub fn decode_query(s: &str) -> String {
    decode(s, true)
}

/// A path segment: `%XX` escapes; a `+` stays a `+`.
pub fn decode_path(s: &str) -> String {
    decode(s, false)
}

fn decode(s: &str, plus_is_space: bool) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' => {
                match (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) {
                    (Some(h), Some(l)) => {
                        out.push(h * 16 + l);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_values_and_path_segments() {
        assert_eq!(decode_query("a%2Eb%2ec+d"), "a.b.c d");
        assert_eq!(decode_query("100%"), "100%");
        assert_eq!(decode_query("%zz"), "%zz");
        assert_eq!(decode_path("room%3A1+a%2Bb"), "room:1+a+b");
    }
}
