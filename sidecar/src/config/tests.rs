//! Settings parsed as the binary parses them, and refused where they are out of range.

use super::*;

fn parse(args: &[&str]) -> Config {
    let mut all = vec![
        "realtime-sidecar",
        "--jwt-secret",
        "a-secret-of-at-least-thirty-two-bytes",
    ];
    all.extend_from_slice(args);
    Config::try_parse_from(all).unwrap()
}

/// MAX_RECORD_BYTES is applied where changes are decoded: every session of the sidecar
/// carries it as realtime.max_record_bytes, beside options the connection string gives.
#[test]
fn max_record_bytes_is_every_session_s_realtime_max_record_bytes() {
    let c = parse(&["--max-record-bytes", "2000"]).pg_config().unwrap();
    assert_eq!(c.get_options(), Some("-c realtime.max_record_bytes=2000"));
    let url = "postgres://u@h/d?options=-c%20work_mem%3D64MB";
    let c = parse(&["--database-url", url]).pg_config().unwrap();
    assert_eq!(
        c.get_options(),
        Some("-c work_mem=64MB -c realtime.max_record_bytes=1048576")
    );
}

#[test]
fn bad_configuration_is_refused_at_startup() {
    assert_eq!(parse(&[]).validate(), Ok(()));
    let short = Config::try_parse_from(["realtime-sidecar", "--jwt-secret", "short"]).unwrap();
    assert!(short
        .validate()
        .unwrap_err()
        .0
        .starts_with("API_JWT_SECRET must be at least 32 bytes"));
    let empty = Config::try_parse_from(["realtime-sidecar", "--jwt-secret", ""]).unwrap();
    assert!(empty.validate().is_err());
    // A JWKS alone will do; nothing at all will not.
    let none = Config::try_parse_from(["realtime-sidecar"]).unwrap();
    assert!(none
        .validate()
        .unwrap_err()
        .0
        .contains("API_JWT_SECRET or API_JWT_JWKS"));
    let ec = r#"{"keys": [{"kty": "EC", "kid": "k", "crv": "P-256",
        "x": "zvCd1zNpAiuxmC3S2ORy9Ueqx8l1QQrm8-5wzA976NM",
        "y": "nsYYs2yMa4-qLnYwbHdXb2i184e5PSsK8bwec8CpTdY"}]}"#;
    let jwks = Config::try_parse_from(["realtime-sidecar", "--jwt-jwks", ec]).unwrap();
    assert_eq!(jwks.validate(), Ok(()));
    let short_oct = r#"{"keys": [{"kty": "oct", "kid": "k", "k": "c2hvcnQ"}]}"#;
    let short = Config::try_parse_from(["realtime-sidecar", "--jwt-jwks", short_oct]).unwrap();
    assert!(short
        .validate()
        .unwrap_err()
        .0
        .contains("an oct key must be at least 32"));
    let validators = parse(&["--jwt-claim-validators", "[]"]);
    assert!(validators
        .validate()
        .unwrap_err()
        .0
        .starts_with("JWT_CLAIM_VALIDATORS"));
    for (flag, value, name) in [
        ("--drain-batch", "0", "DRAIN_BATCH"),
        ("--drain-linger-ms", "20000", "DRAIN_LINGER_MS"),
        ("--drain-linger-max-ms", "20000", "DRAIN_LINGER_MAX_MS"),
        (
            "--drain-calls-per-second",
            "2000000",
            "DRAIN_CALLS_PER_SECOND",
        ),
        ("--idle-timeout-secs", "0", "IDLE_TIMEOUT_SECS"),
        ("--authorization-ttl-secs", "0", "AUTHORIZATION_TTL_SECS"),
        ("--max-outbound-frames", "0", "MAX_OUTBOUND_FRAMES"),
        ("--max-outbound-bytes", "1000", "MAX_OUTBOUND_BYTES"),
        ("--max-bindings-per-join", "0", "MAX_BINDINGS_PER_JOIN"),
        ("--max-tables-per-join", "0", "MAX_TABLES_PER_JOIN"),
        ("--max-patterns-per-join", "0", "MAX_PATTERNS_PER_JOIN"),
        (
            "--filter-patterns-per-call",
            "0",
            "FILTER_PATTERNS_PER_CALL",
        ),
        ("--max-presence-key-bytes", "0", "MAX_PRESENCE_KEY_BYTES"),
        ("--db-statement-timeout-ms", "1", "DB_STATEMENT_TIMEOUT_MS"),
        (
            "--max-rest-messages-per-request",
            "5001",
            "MAX_REST_MESSAGES_PER_REQUEST",
        ),
        (
            "--max-connections-per-address",
            "0",
            "MAX_CONNECTIONS_PER_ADDRESS",
        ),
        (
            "--max-bindings-per-address",
            "0",
            "MAX_BINDINGS_PER_ADDRESS",
        ),
    ] {
        let err = parse(&[flag, value]).validate().unwrap_err().0;
        assert!(err.starts_with(name), "{flag} {value}: {err}");
    }
    let mut all = vec![
        "realtime-sidecar",
        "--jwt-secret",
        "a-secret-of-at-least-thirty-two-bytes",
    ];
    all.extend(["--cors-allowed-origins", "https://app.example.com/path"]);
    let err = Config::try_parse_from(all).unwrap_err().to_string();
    assert!(err.contains("--cors-allowed-origins"), "{err}");
    assert_eq!(
        parse(&[]).cors_allowed_origins,
        crate::cors::AllowedOrigins::Any
    );
    let mut all = vec![
        "realtime-sidecar",
        "--jwt-secret",
        "a-secret-of-at-least-thirty-two-bytes",
    ];
    all.extend(["--trusted-proxies", "127.0.0.1, proxy.internal"]);
    let err = Config::try_parse_from(all).unwrap_err().to_string();
    assert!(err.contains("proxy.internal"), "{err}");
    // The resume bounds are refused by the parser, naming the flag.
    for (flag, value) in [
        ("--max-resumes-per-address", "0"),
        ("--max-resumes-waiting-per-address", "1000001"),
    ] {
        let mut all = vec![
            "realtime-sidecar",
            "--jwt-secret",
            "a-secret-of-at-least-thirty-two-bytes",
        ];
        all.extend([flag, value]);
        let err = Config::try_parse_from(all).unwrap_err().to_string();
        assert!(err.contains(flag), "{err}");
    }
    let d = parse(&[]);
    assert_eq!(
        (
            d.max_bindings_per_address,
            d.max_resumes_per_address,
            d.max_resumes_waiting_per_address
        ),
        (10_000, 100, 1000)
    );
    let bad_dsn = parse(&["--database-url", "host=x port=notaport"]);
    assert!(bad_dsn
        .validate()
        .unwrap_err()
        .0
        .contains("not a valid connection string"));
}
