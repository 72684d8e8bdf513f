//! Fuzzing of everything that parses network input: text frames of both serializers, binary
//! frames, join payloads, REST bodies, JWTs, topics and query strings.
//!
//! No nightly toolchain can be installed here, so this is not cargo-fuzz: a seeded PRNG
//! (`rand`) makes bytes, half of them mutations of valid inputs, and `arbitrary` turns bytes
//! into structured inputs (JSON values, claims). Every target must return (a panic fails the
//! run), reject with a reason a client can be given, and allocate within a bound linear in
//! the input's size (a counting allocator, per thread). `FUZZ_INPUTS` inputs per target
//! (default 20,000: the seconds-long smoke the test suite runs); README gives the command
//! for 10 million. `FUZZ_SEED` reproduces a run; a failure prints the input.

use crate::command::{self, Command};
use crate::frame::Vsn;
use crate::postgres_changes::bounds::Bounds;
use crate::{join_config, jwt, rest};
use arbitrary::{Arbitrary, Unstructured};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts the bytes live on each thread, and their peak, so a target's allocation can be
/// bounded without other tests' threads counting.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let _ = LIVE.try_with(|live| {
                let n = live.get() + layout.size();
                live.set(n);
                let _ = PEAK.try_with(|peak| peak.set(peak.get().max(n)));
            });
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(layout.size())));
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes one input may make its target allocate beyond what was live before.
fn allocation_bound(input_len: usize) -> usize {
    256 * input_len + (1 << 20)
}

/// A JSON value built by `arbitrary` from bytes (objects and arrays nest as the bytes last).
#[derive(Arbitrary, Debug)]
enum J {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn value(&self) -> Value {
        match self {
            J::Null => Value::Null,
            J::Bool(b) => json!(b),
            J::Int(i) => json!(i),
            J::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            J::Str(s) => json!(s),
            J::Arr(a) => Value::Array(a.iter().map(J::value).collect()),
            J::Obj(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), v.value())).collect()),
        }
    }
}

fn inputs_per_target() -> u64 {
    std::env::var("FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Bytes for one input: random, or a valid seed mutated a few times.
fn next_input(rng: &mut SmallRng, seeds: &[Vec<u8>], buf: &mut Vec<u8>) {
    buf.clear();
    if seeds.is_empty() || rng.gen_bool(0.5) {
        buf.resize(rng.gen_range(0..512), 0);
        rng.fill_bytes(buf);
        return;
    }
    buf.extend_from_slice(&seeds[rng.gen_range(0..seeds.len())]);
    for _ in 0..rng.gen_range(1..8) {
        let len = buf.len();
        match rng.gen_range(0..5) {
            0 if len > 0 => buf[rng.gen_range(0..len)] = rng.gen(),
            1 => buf.insert(rng.gen_range(0..=len), rng.gen()),
            2 if len > 0 => {
                buf.remove(rng.gen_range(0..len));
            }
            3 if len > 0 => {
                let (a, b) = (rng.gen_range(0..len), rng.gen_range(0..len));
                let piece = buf[a.min(b)..a.max(b)].to_vec();
                let at = rng.gen_range(0..=buf.len());
                buf.splice(at..at, piece);
            }
            _ if len > 0 => buf.truncate(rng.gen_range(0..len)),
            _ => {}
        }
    }
}

/// Runs `target` on `FUZZ_INPUTS` inputs; it returns Err with a reason for anything it finds
/// wrong. Panics (with the seed and the input) on a failure, a panic or too much allocation.
fn fuzz(name: &str, seeds: &[Vec<u8>], target: impl Fn(&[u8]) -> Result<(), String>) -> u64 {
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = SmallRng::seed_from_u64(seed ^ name.len() as u64);
    let mut buf = Vec::with_capacity(1024);
    let n = inputs_per_target();
    for i in 0..n {
        next_input(&mut rng, seeds, &mut buf);
        let before = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(before));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&buf)));
        let used = PEAK.with(Cell::get) - before;
        let shown = String::from_utf8_lossy(&buf[..buf.len().min(300)]).into_owned();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(why)) => panic!("{name}: input {i} (FUZZ_SEED={seed}): {why}: {shown:?}"),
            Err(_) => panic!("{name}: input {i} (FUZZ_SEED={seed}) panicked: {shown:?}"),
        }
        assert!(
            used <= allocation_bound(buf.len()),
            "{name}: input {i} (FUZZ_SEED={seed}) allocated {used} bytes for {} input bytes: {shown:?}",
            buf.len()
        );
    }
    println!("fuzz {name}: {n} inputs, no failure");
    n
}

/// A rejection must say why.
fn reason(r: &str) -> Result<(), String> {
    if r.trim().is_empty() {
        Err("rejected without a reason".into())
    } else {
        Ok(())
    }
}

const SECRET: &str = "fuzzing-secret-with-at-least-32-bytes";

fn valid_token(claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

fn join_payload() -> Value {
    json!({"config": {"broadcast": {"ack": true, "self": "TRUE", "replay": {"since": 1, "limit": 5}},
                      "presence": {"key": "", "enabled": true},
                      "postgres_changes": [{"event": "*", "schema": "public", "table": "t", "filter": "id=eq.5"}],
                      "private": true},
           "access_token": valid_token(&json!({"role": "authenticated", "exp": jwt::now() + 600})),
           "version": "realtime-js/2.119.1"})
}

#[test]
fn text_frames_of_both_serializers() {
    let join = join_payload();
    let seeds: Vec<Vec<u8>> = [
        json!({"topic": "realtime:room", "event": "phx_join", "payload": join, "ref": "1", "join_ref": "1"}),
        json!(["1", "1", "realtime:room", "phx_join", join]),
        json!([null, "2", "phoenix", "heartbeat", {}]),
        json!(["1", "3", "realtime:room", "broadcast", {"type": "broadcast", "event": "e", "payload": {"a": [1, 2]}}]),
        json!({"topic": "realtime:room", "event": "access_token", "payload": {"access_token": "x"}, "ref": 4}),
    ]
    .iter()
    .map(|v| (b"\x00".iter().chain(v.to_string().as_bytes())).copied().collect())
    .collect();
    fuzz("text frame", &seeds, |data| {
        let (vsn, text) = match data.split_first() {
            Some((b, rest)) if b % 2 == 1 => (Vsn::V2, rest),
            Some((_, rest)) => (Vsn::V1, rest),
            None => (Vsn::V1, data),
        };
        // The typed parser the connection dispatches on, and the topic check a join does.
        match command::from_text(vsn, &String::from_utf8_lossy(text), &Bounds::defaults()) {
            Ok(f) => {
                if let Some(sub) = f.head.topic.strip_prefix("realtime:") {
                    if let Err(e) = join_config::validate_sub_topic(sub) {
                        reason(&e.text())?;
                    }
                }
                match f.command {
                    Command::Broadcast(Ok(b)) if crate::client_text::event(&b.event).is_err() => {
                        Err("a broadcast with an invalid event name passed".into())
                    }
                    Command::Broadcast(Err(why)) => reason(&why),
                    _ => Ok(()),
                }
            }
            Err(e) => reason(&e.to_string()),
        }
    });
}

#[test]
fn binary_frames() {
    let mut push = vec![3u8, 1, 1, 13, 5, 0, 1];
    push.extend_from_slice(b"12realtime:roomevent{\"a\":1}");
    fuzz("binary frame", &[push], |data| {
        match command::from_binary(&bytes::Bytes::copy_from_slice(data)) {
            Ok(f) => match f.command {
                Command::Broadcast(Ok(b)) => match b.payload {
                    crate::hub::Payload::Binary(p) if p.len() > data.len() => {
                        Err("payload longer than the frame".into())
                    }
                    crate::hub::Payload::Json(j)
                        if crate::client_text::json_payload(j.as_bytes()).is_err() =>
                    {
                        Err("a JSON payload that does not parse passed".into())
                    }
                    _ => Ok(()),
                },
                Command::Broadcast(Err(why)) => reason(&why),
                other => Err(format!("a binary frame became {other:?}")),
            },
            Err(e) => reason(&e.to_string()),
        }
    });
}

#[test]
fn join_payloads() {
    let seeds = vec![join_payload().to_string().into_bytes()];
    fuzz("join payload", &seeds, |data| {
        // Both the bytes as JSON text and a structured value `arbitrary` builds from them.
        if let Ok(v) = serde_json::from_slice::<Value>(data) {
            nul_free(&join_config::parse_join(&v, &Bounds::defaults()))?;
        }
        if let Ok(j) = J::arbitrary(&mut Unstructured::new(data)) {
            let config =
                join_config::parse_join(&json!({"config": j.value()}), &Bounds::defaults());
            nul_free(&config)?;
            nul_free(&join_config::parse_join(&j.value(), &Bounds::defaults()))?;
            if config.access_token.is_some() {
                return Err("a token appeared from nowhere".into());
            }
        }
        Ok(())
    });
}

/// No binding a join accepts carries a NUL into the database's check or the interest
/// upload (`client_text`).
fn nul_free(config: &join_config::JoinConfig) -> Result<(), String> {
    for b in &config.postgres_changes {
        let names = std::iter::once(&b.schema)
            .chain(&b.table)
            .chain(b.select.iter().flatten())
            .chain(b.filters.iter().map(|f| &f.column))
            .chain(b.filters.iter().flat_map(|f| &f.values));
        if let Some(n) = names.into_iter().find(|n| n.contains('\0')) {
            return Err(format!("a binding passed with a NUL in {n:?}"));
        }
    }
    Ok(())
}

#[test]
fn rest_bodies() {
    let seeds = vec![
        br#"{"messages":[{"topic":"room","event":"e","payload":{"a":1},"private":true},{"topic":"r2","event":"x","payload":{}}]}"#.to_vec(),
    ];
    // A small bound, so that fuzzed lists pass it too.
    fuzz("REST body", &seeds, |data| match rest::parse(data, 4) {
        Ok(rest::Parsed::Messages(messages)) => messages
            .iter()
            .try_for_each(|m| join_config::validate_sub_topic(&m.topic).map_err(|e| e.text())),
        Ok(rest::Parsed::TooMany(n)) if n > 4 => Ok(()),
        Ok(rest::Parsed::TooMany(n)) => Err(format!("{n} messages said to be too many")),
        Err((status, body)) if status.is_client_error() => {
            reason(&body.map(|b| b.to_string()).unwrap_or_default())
        }
        Err((status, _)) => Err(format!("answered {status}, not a client error")),
    });
}

#[test]
fn jwts() {
    let verifier = jwt::Verifier::with_secret(SECRET);
    let seeds = vec![
        valid_token(&json!({"role": "anon", "exp": jwt::now() + 600, "sub": "u"})).into_bytes(),
    ];
    fuzz("JWT", &seeds, |data| {
        let check = |token: &str| match verifier.verify(token) {
            Ok(c) if c.exp <= jwt::now() => Err("accepted an expired token".to_string()),
            Ok(c)
                if c.all
                    .get("nbf")
                    .and_then(Value::as_i64)
                    .is_some_and(|nbf| nbf > jwt::now() + jwt::NBF_LEEWAY) =>
            {
                Err("accepted a token before its nbf".to_string())
            }
            Ok(_) => Ok(()),
            Err(e) => reason(&e.reason()),
        };
        check(&String::from_utf8_lossy(data))?;
        // Correctly signed tokens with arbitrary claims, so claim checking runs too.
        if let Ok(j) = J::arbitrary(&mut Unstructured::new(data)) {
            let mut claims = j.value();
            if let Value::Object(m) = &mut claims {
                if data.first().is_some_and(|b| b % 2 == 0) {
                    m.insert("exp".into(), json!(jwt::now() + 600));
                }
            }
            check(&valid_token(&claims))?;
        }
        Ok(())
    });
}

#[test]
fn topics_and_query_strings() {
    fuzz("topic and query", &[b"room:1%2Fa+b%zz".to_vec()], |data| {
        let text = String::from_utf8_lossy(data);
        if let Err(e) = join_config::validate_sub_topic(&text) {
            reason(&e.text())?;
        }
        let decoded = crate::url::decode_query(&text);
        if decoded.len() > 3 * text.len() + 3 {
            return Err("percent-decoding grew the input".into());
        }
        Ok(())
    });
}

/// The harness itself fails on a panicking target (so a clean run means something).
#[test]
#[should_panic(expected = "panicked")]
fn the_harness_reports_a_panicking_target() {
    fuzz("self-check", &[], |data| {
        assert!(data.len() < 400, "long input");
        Ok(())
    });
}

/// ... and on a target that allocates beyond the bound.
#[test]
#[should_panic(expected = "allocated")]
fn the_harness_reports_unbounded_allocation() {
    fuzz("self-check", &[], |data| {
        let big = vec![0u8; allocation_bound(data.len()) + 1];
        std::hint::black_box(big);
        Ok(())
    });
}
