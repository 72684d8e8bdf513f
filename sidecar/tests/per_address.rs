//! Per-address limits and the REST bounds end to end, each client a loopback address of its
//! own (127.0.0.x): one address flooding REST or holding connections is refused with
//! Supabase's texts while another address is served; `X-Forwarded-For` counts only from a
//! trusted proxy; a user is one budget across addresses; a `service_role` backend is not
//! bound per address, over REST or WebSocket.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const RATE_EXCEEDED: &str = r#"{"message":"You have exceeded your rate limit"}"#;
const BATCH_TOO_LARGE: &str =
    r#"{"message":"Too many messages to broadcast, please reduce the batch size"}"#;

fn batch(topic: &str, n: usize) -> String {
    let messages: Vec<Value> = (0..n)
        .map(|i| json!({"topic": topic, "event": "e", "payload": {"i": i}}))
        .collect();
    json!({ "messages": messages }).to_string()
}

/// Posts `n` messages to `topic` from address `from` with the token and extra headers.
async fn post(
    port: u16,
    from: &str,
    token: &str,
    extra: &[(&str, &str)],
    topic: &str,
    n: usize,
) -> (u16, String) {
    let auth = format!("Bearer {token}");
    let mut headers = vec![
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    http_from(
        from,
        port,
        "POST",
        "/api/broadcast",
        &headers,
        &batch(topic, n),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn one_address_flooding_rest_is_refused_and_another_address_is_served() {
    let sidecar = Sidecar::start(
        "t_rest_flood",
        &[
            ("MAX_REST_EVENTS_PER_SECOND_PER_ADDRESS", "20"),
            ("MAX_REST_MESSAGES_PER_REQUEST", "25"),
        ],
    )
    .await;
    let mut watcher = Client::connect_from("127.0.0.4", sidecar.port, "1.0.0")
        .await
        .unwrap();
    watcher.join_public("realtime:flood-other").await;
    let anon = anon_key();
    let p = sidecar.port;
    // The address's second spent, then one more.
    assert_eq!(post(p, "127.0.0.2", &anon, &[], "flood", 20).await.0, 202);
    assert_eq!(
        post(p, "127.0.0.2", &anon, &[], "flood", 1).await,
        (429, RATE_EXCEEDED.into())
    );
    // A request over the per-request bound is refused, and spends its address's second
    // too (it was read and parsed): the next is refused before its body is read.
    assert_eq!(
        post(p, "127.0.0.5", &anon, &[], "flood", 26).await,
        (429, BATCH_TOO_LARGE.into())
    );
    assert_eq!(
        post(p, "127.0.0.5", &anon, &[], "flood", 1).await,
        (429, RATE_EXCEEDED.into())
    );
    // Another visitor with the same anon key is served, and its message arrives.
    assert_eq!(
        post(p, "127.0.0.3", &anon, &[], "flood-other", 1).await.0,
        202
    );
    let m = watcher
        .next_json(10)
        .await
        .expect("the other address's message");
    assert_eq!(m["payload"]["payload"], json!({"i": 0}));
}

#[tokio::test]
async fn forwarded_for_counts_only_behind_a_trusted_proxy() {
    let sidecar = Sidecar::start(
        "t_rest_forwarded",
        &[
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("MAX_REST_EVENTS_PER_SECOND_PER_ADDRESS", "5"),
        ],
    )
    .await;
    let anon = anon_key();
    let p = sidecar.port;
    let via = |client: &'static str| [("X-Forwarded-For", client)];
    // Behind the trusted proxy each forwarded client has its own budget.
    let proxy = "127.0.0.1";
    assert_eq!(
        post(p, proxy, &anon, &via("203.0.113.1"), "t", 5).await.0,
        202
    );
    assert_eq!(
        post(p, proxy, &anon, &via("203.0.113.1"), "t", 1).await,
        (429, RATE_EXCEEDED.into())
    );
    // The client's own claim left of the proxy's entry is not believed.
    assert_eq!(
        post(p, proxy, &anon, &via("203.0.113.2, 203.0.113.1"), "t", 1)
            .await
            .0,
        429
    );
    assert_eq!(
        post(p, proxy, &anon, &via("203.0.113.2"), "t", 5).await.0,
        202
    );
    // From a peer that is no trusted proxy the header is ignored: a new "client" each time
    // is still the one address.
    assert_eq!(
        post(p, "127.0.0.2", &anon, &via("203.0.113.8"), "t", 5)
            .await
            .0,
        202
    );
    assert_eq!(
        post(p, "127.0.0.2", &anon, &via("203.0.113.9"), "t", 1).await,
        (429, RATE_EXCEEDED.into())
    );
}

#[tokio::test]
async fn a_user_is_one_budget_across_addresses_and_a_backend_is_not_bound_per_address() {
    let sidecar = Sidecar::start(
        "t_rest_users",
        &[
            ("MAX_REST_EVENTS_PER_SECOND_PER_USER", "3"),
            ("MAX_REST_EVENTS_PER_SECOND_PER_ADDRESS", "4"),
            ("MAX_REST_EVENTS_PER_SECOND", "100"),
        ],
    )
    .await;
    let p = sidecar.port;
    let alice = user_token("a11ce000-0000-4000-8000-000000000001");
    assert_eq!(post(p, "127.0.0.2", &alice, &[], "u", 3).await.0, 202);
    assert_eq!(
        post(p, "127.0.0.3", &alice, &[], "u", 1).await,
        (429, RATE_EXCEEDED.into())
    );
    // A backend's service_role token from one address: past the per-address rate, served.
    let service = token(json!({"role": "service_role", "exp": now() + 3600}));
    for _ in 0..3 {
        assert_eq!(post(p, "127.0.0.5", &service, &[], "u", 4).await.0, 202);
    }
    // ...and still counted in the total.
    assert_eq!(
        post(p, "127.0.0.5", &service, &[], "u", 100).await,
        (429, BATCH_TOO_LARGE.into())
    );
}

#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let sidecar = Sidecar::start(
        "t_conn_per_address",
        &[("MAX_CONNECTIONS_PER_ADDRESS", "3")],
    )
    .await;
    let p = sidecar.port;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(Client::connect_from("127.0.0.2", p, "1.0.0").await.unwrap());
    }
    let Err((status, body)) = Client::connect_from("127.0.0.2", p, "1.0.0").await else {
        panic!("a fourth connection from one address was accepted");
    };
    assert_eq!(status, 429);
    assert!(
        body.contains("ConnectionRateLimitReached: Too many connections from this address"),
        "{body}"
    );
    // Another address connects and joins.
    let mut other = Client::connect_from("127.0.0.3", p, "2.0.0").await.unwrap();
    other.join_public("realtime:per-address").await;
    // A closed connection gives its place back.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if Client::connect_from("127.0.0.2", p, "1.0.0").await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the freed place never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn rest_requests_in_flight_are_bounded_per_address() {
    let sidecar = Sidecar::start(
        "t_rest_in_flight",
        &[("MAX_REST_REQUESTS_IN_FLIGHT_PER_ADDRESS", "2")],
    )
    .await;
    let p = sidecar.port;
    let anon = anon_key();
    // Two requests whose bodies never finish arriving hold the address's two places.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut s = tcp_from("127.0.0.2", p).await.unwrap();
        let head = format!(
            "POST /api/broadcast HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {anon}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"messages\""
        );
        s.write_all(head.as_bytes()).await.unwrap();
        slow.push(s);
    }
    // Their places are taken once the server has read their headers; a request sent before
    // then could take one of the two places itself and leave a slow one refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sidecar.metric("realtime_rest_requests_in_flight").await < 2.0 {
        assert!(
            Instant::now() < deadline,
            "the slow requests were never admitted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The third waits for nothing: refused at once (well before the body timeout).
    assert_eq!(
        post(p, "127.0.0.2", &anon, &[], "f", 1).await,
        (429, r#"{"message":"Too many requests"}"#.into())
    );
    assert_eq!(post(p, "127.0.0.3", &anon, &[], "f", 1).await.0, 202);
    // Their clients gone, the places are given back.
    drop(slow);
    let deadline = Instant::now() + Duration::from_secs(10);
    while post(p, "127.0.0.2", &anon, &[], "f", 1).await.0 != 202 {
        assert!(Instant::now() < deadline, "the places never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn refusal(reply: &Value) -> &str {
    assert_eq!(reply["status"], "error", "{reply}");
    reply["response"]["reason"].as_str().unwrap()
}

/// Waits (the fail-safe: `secs`) until metric `name` is `value`.
async fn metric_reaches(sidecar: &Sidecar, name: &str, value: f64, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let now = sidecar.metric(name).await;
        if now == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} stayed {now}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Joins `topic` with `n` bindings that never match (schema-wide, the review's attack).
async fn join_never(c: &mut Client, topic: &str, n: usize) -> Value {
    let never = json!({"event": "*", "schema": "*", "filter": "zz=eq.1"});
    c.join(topic, json!({"postgres_changes": vec![never; n]}))
        .await
}

/// Joins `topic` with one binding of `n` `like` conditions on `per_address_notes.body`.
async fn join_patterns(c: &mut Client, topic: &str, n: usize) -> Value {
    let filter: Vec<String> = (0..n).map(|i| format!("body=like.p{i}%")).collect();
    let b = json!({"event": "*", "schema": "public", "table": "per_address_notes", "filter": filter.join(",")});
    c.join(topic, json!({"postgres_changes": [b]})).await
}

/// Pattern conditions (`like`, `ilike`, `match`, `imatch`) are each asked, in the database,
/// about every changed value of their table: 16,000 from one anonymous socket took a
/// backend to gigabytes and every other subscriber's check (issue 39, H1). They are
/// bounded per join, per connection and per client address, each with its setting's name;
/// a refusal by the address's bound leaves its bindings' count as it was, a leave gives
/// its patterns back, and another address has a budget of its own.
#[tokio::test]
async fn patterns_had_no_count_limit_per_join_connection_or_address() {
    let sidecar = Sidecar::start(
        "t_patterns_per_address",
        &[
            ("MAX_PATTERNS_PER_JOIN", "3"),
            ("MAX_PATTERNS_PER_CONNECTION", "4"),
            ("MAX_PATTERNS_PER_ADDRESS", "6"),
            ("MAX_BINDINGS_PER_ADDRESS", "3"),
        ],
    )
    .await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS per_address_notes;
         CREATE TABLE per_address_notes (id int PRIMARY KEY, body text);
         GRANT SELECT ON per_address_notes TO anon;
         ALTER PUBLICATION supabase_realtime ADD TABLE per_address_notes;",
    )
    .await
    .unwrap();
    let p = sidecar.port;
    let mut a1 = Client::connect_from("127.0.0.4", p, "1.0.0").await.unwrap();
    let mut a2 = Client::connect_from("127.0.0.4", p, "2.0.0").await.unwrap();
    assert_eq!(
        refusal(&join_patterns(&mut a1, "realtime:pp:0", 4).await),
        "InvalidPostgresChanges: the join's bindings have pattern conditions (like, ilike, match, imatch): 4; the limit is 3 (MAX_PATTERNS_PER_JOIN)"
    );
    assert_eq!(
        join_patterns(&mut a1, "realtime:pp:1", 3).await["status"],
        "ok"
    );
    assert_eq!(
        refusal(&join_patterns(&mut a1, "realtime:pp:2", 2).await),
        "InvalidPostgresChanges: the connection's channels would have pattern conditions: 5; the limit is 4 (MAX_PATTERNS_PER_CONNECTION)"
    );
    assert_eq!(
        join_patterns(&mut a2, "realtime:pp:3", 3).await["status"],
        "ok"
    );
    // Within its connection's bound, past its address's: refused, and the binding it
    // brought is not left counted (the address holds 2 of its 3 bindings, so one more
    // binding still joins once patterns are given back).
    assert_eq!(
        refusal(&join_patterns(&mut a2, "realtime:pp:4", 1).await),
        "InvalidPostgresChanges: the channels of this client address would have pattern conditions: 7; the limit is 6 (MAX_PATTERNS_PER_ADDRESS)"
    );
    // Another address: a budget of its own.
    let mut other = Client::connect_from("127.0.0.5", p, "1.0.0").await.unwrap();
    assert_eq!(
        join_patterns(&mut other, "realtime:pp:o", 3).await["status"],
        "ok"
    );
    // A leave gives its patterns back.
    let r = a2
        .push(Some("1"), "realtime:pp:3", "phx_leave", json!({}))
        .await;
    assert_eq!(a2.reply(&r).await["status"], "ok");
    assert_eq!(
        join_patterns(&mut a2, "realtime:pp:4", 1).await["status"],
        "ok"
    );
    assert_eq!(
        join_patterns(&mut a2, "realtime:pp:5", 1).await["status"],
        "ok"
    );
    assert!(refusal(&join_patterns(&mut a2, "realtime:pp:6", 1).await)
        .ends_with("bindings: 4; the limit is 3 (MAX_BINDINGS_PER_ADDRESS)"));
    db.batch_execute("DROP TABLE per_address_notes")
        .await
        .unwrap();
}

/// MAX_BINDINGS_PER_ADDRESS: the anon key is public, so one address could hold
/// MAX_CONNECTIONS_PER_ADDRESS sockets of MAX_BINDINGS_PER_CONNECTION bindings each (a
/// million by default, each run against every drained change). Its connections' bindings
/// are counted together: past the bound a join is refused with the setting's name, a rejoin
/// is judged by its difference, a leave and a close give bindings back, and another
/// address holds a budget of its own and is served meanwhile.
#[tokio::test]
async fn one_address_s_connections_together_hold_at_most_its_bindings() {
    let sidecar = Sidecar::start(
        "t_bindings_per_address",
        &[
            ("MAX_BINDINGS_PER_CONNECTION", "6"),
            ("MAX_BINDINGS_PER_ADDRESS", "10"),
        ],
    )
    .await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS per_address_items;
         CREATE TABLE per_address_items (id int PRIMARY KEY);
         GRANT SELECT ON per_address_items TO anon;
         ALTER PUBLICATION supabase_realtime ADD TABLE per_address_items;",
    )
    .await
    .unwrap();
    let p = sidecar.port;
    let mut a1 = Client::connect_from("127.0.0.2", p, "1.0.0").await.unwrap();
    let mut a2 = Client::connect_from("127.0.0.2", p, "2.0.0").await.unwrap();
    assert_eq!(
        join_never(&mut a1, "realtime:pa:1", 6).await["status"],
        "ok"
    );
    assert_eq!(
        join_never(&mut a2, "realtime:pa:2", 4).await["status"],
        "ok"
    );
    // Within its connection's bound, past its address's.
    assert_eq!(
        refusal(&join_never(&mut a2, "realtime:pa:3", 1).await),
        "InvalidPostgresChanges: the channels of this client address would have bindings: 11; the limit is 10 (MAX_BINDINGS_PER_ADDRESS)"
    );
    // A rejoin replacing its channel's bindings counts only the difference.
    assert_eq!(
        join_never(&mut a1, "realtime:pa:1", 6).await["status"],
        "ok"
    );
    assert_eq!(
        join_never(&mut a1, "realtime:pa:1", 5).await["status"],
        "ok"
    );
    assert_eq!(
        join_never(&mut a2, "realtime:pa:3", 1).await["status"],
        "ok"
    );
    assert!(refusal(&join_never(&mut a1, "realtime:pa:1", 6).await)
        .ends_with("bindings: 11; the limit is 10 (MAX_BINDINGS_PER_ADDRESS)"));
    // Another address, its own budget: joined, and its change arrives.
    let mut other = Client::connect_from("127.0.0.3", p, "1.0.0").await.unwrap();
    let real = json!({"event": "INSERT", "schema": "public", "table": "per_address_items"});
    let never = json!({"event": "*", "schema": "*", "filter": "zz=eq.1"});
    let mut bindings = vec![real];
    bindings.extend(vec![never; 5]);
    let reply = other
        .join("realtime:pa:other", json!({"postgres_changes": bindings}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    db.execute("INSERT INTO per_address_items VALUES (1)", &[])
        .await
        .unwrap();
    loop {
        let m = other
            .next_json(10)
            .await
            .expect("the other address's change");
        if m["event"] == "postgres_changes" {
            assert_eq!(m["payload"]["data"]["record"], json!({"id": 1}), "{m}");
            break;
        }
    }
    // A channel that leaves gives its bindings back (the leave's reply comes after).
    let r = a2
        .push(Some("1"), "realtime:pa:3", "phx_leave", json!({}))
        .await;
    assert_eq!(a2.reply(&r).await["status"], "ok");
    // So does a binding the database's check refuses (counted while its join waited; the
    // channel joins without it): with it still counted the next join would make 11.
    let nowhere = json!({"event": "*", "schema": "public", "table": "per_address_nowhere"});
    let told = a2
        .join_unserved(
            "realtime:pa:nowhere",
            json!({"postgres_changes": [nowhere]}),
            1,
        )
        .await;
    assert!(
        told[0].contains("InvalidPostgresChanges: binding 1:"),
        "{told:?}"
    );
    assert_eq!(
        join_never(&mut a1, "realtime:pa:4", 1).await["status"],
        "ok"
    );
    // So does a connection that closes: once the sidecar has let it go (its count of
    // connections drops after the connection's channels are left), the same address joins
    // with what it held.
    drop(a2);
    metric_reaches(&sidecar, "realtime_connections", 2.0, 10).await;
    let mut a3 = Client::connect_from("127.0.0.2", p, "1.0.0").await.unwrap();
    assert_eq!(
        join_never(&mut a3, "realtime:pa:5", 4).await["status"],
        "ok"
    );
    assert!(refusal(&join_never(&mut a3, "realtime:pa:6", 1).await)
        .ends_with("bindings: 11; the limit is 10 (MAX_BINDINGS_PER_ADDRESS)"));
    db.batch_execute("DROP TABLE per_address_items")
        .await
        .unwrap();
}

/// Reads `c` until a frame on `topic` satisfies `done`; returns it (fail-safe: `secs`).
async fn until_on(c: &mut Client, topic: &str, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "nothing on {topic} in {secs} s");
        let Some(m) = c.next_json(left.as_secs().max(1)).await else {
            continue;
        };
        if m["topic"] == topic && done(&m) {
            return m;
        }
    }
}

fn is_system(m: &Value) -> bool {
    m["event"] == "system" && m["payload"]["extension"] == "broadcast"
}

fn resume_config(epoch: i64, seq: i64) -> Value {
    json!({"broadcast": {"resume": {"epoch": epoch.to_string(), "seq": seq}}})
}

/// MAX_RESUMES_PER_ADDRESS: each join that asks for history may make the sidecar hold up to
/// MAX_RESUME_MESSAGES while its client takes them, and one address could open as many as it
/// has channels. Here two clients of one address resume 10 MB and never read: their
/// histories hold the address's two places. The address's next two resumes are answered
/// and wait (not refused: many users behind one NAT may rejoin at once); the one after them
/// finds the line full and goes live at once, told why. Meanwhile another address resumes
/// and gets its history and a live message; once the stalled clients go, the waiting two
/// are resumed in full.
#[tokio::test]
async fn one_address_s_resumes_wait_their_turn_and_past_its_line_go_live_told_why() {
    let sidecar = Sidecar::start(
        "t_resumes_per_address",
        &[
            ("MAX_RESUMES_PER_ADDRESS", "2"),
            ("MAX_RESUMES_WAITING_PER_ADDRESS", "2"),
            // A history waits for its client once half of this is queued (`history::worker`).
            ("MAX_OUTBOUND_BYTES", "1048576"),
        ],
    )
    .await;
    let db = db().await;
    let p = sidecar.port;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let big = format!("pa-resume-big:{nanos}");
    let small = |i: i64| format!("pa-resume-small-{i}:{nanos}");
    let (epoch, seq) = queue_position(&db).await;
    // 40 messages of 250 KB: more than a stalled socket's kernel buffers and half its
    // outbound queue take, so its history is still being sent when the others join.
    db.execute(
        "SELECT realtime.send(jsonb_build_object('n', g, 'x', repeat('a', 250000)), 'n', $1, false) \
         FROM generate_series(1, 40) g",
        &[&big],
    )
    .await
    .unwrap();
    for i in 1..=3 {
        send(&db, json!({"n": i}), "n", &small(i)).await;
    }
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut s = Client::connect_from_small_buffer("127.0.0.2", p, "1.0.0").await;
        let join = json!({"config": resume_config(epoch, seq)});
        s.push(Some("1"), &format!("realtime:{big}"), "phx_join", join)
            .await;
        stalled.push(s);
    }
    metric_reaches(&sidecar, "realtime_resumes_running", 2.0, 20).await;
    // The same address's next two: answered, then waiting.
    let mut c = Client::connect_from("127.0.0.2", p, "1.0.0").await.unwrap();
    for i in 1..=2 {
        let reply = c
            .join(&format!("realtime:{}", small(i)), resume_config(epoch, seq))
            .await;
        assert_eq!(reply["status"], "ok", "{reply}");
    }
    metric_reaches(&sidecar, "realtime_resumes_waiting", 2.0, 10).await;
    // The line full: live at once, without the history, with the reason.
    let third = format!("realtime:{}", small(3));
    let reply = c.join(&third, resume_config(epoch, seq)).await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let sys = until_on(&mut c, &third, 10, is_system).await;
    let sys = &sys["payload"];
    assert_eq!(
        (&sys["recovered"], &sys["status"], &sys["resent"]),
        (&json!(false), &json!("error"), &json!(0)),
        "{sys}"
    );
    assert_eq!(
        sys["message"],
        "Too many joins of this client address are resuming: MAX_RESUMES_PER_ADDRESS (2) are being sent and MAX_RESUMES_WAITING_PER_ADDRESS (2) are waiting; this channel was not resumed and is live from now on"
    );
    assert_eq!(sidecar.metric("realtime_resumes_refused_total").await, 1.0);
    // Another address is not behind that line: its resume is answered, its history sent,
    // and a live message follows.
    let mut other = Client::connect_from("127.0.0.3", p, "1.0.0").await.unwrap();
    let first = format!("realtime:{}", small(1));
    let reply = other.join(&first, resume_config(epoch, seq)).await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let m = until_on(&mut other, &first, 10, |m| m["event"] == "broadcast").await;
    assert_eq!(m["payload"]["payload"]["n"], 1, "{m}");
    let sys = until_on(&mut other, &first, 10, is_system).await;
    assert_eq!(sys["payload"]["recovered"], true, "{sys}");
    send(&db, json!({"n": 4}), "n", &small(1)).await;
    let m = until_on(&mut other, &first, 10, |m| m["event"] == "broadcast").await;
    assert_eq!(m["payload"]["payload"]["n"], 4, "{m}");
    // The stalled readers gone, the waiting two are resumed in full, in their turn.
    drop(stalled);
    for i in 1..=2 {
        let topic = format!("realtime:{}", small(i));
        let m = until_on(&mut c, &topic, 30, |m| m["event"] == "broadcast").await;
        assert_eq!(m["payload"]["payload"]["n"], i, "{m}");
        let sys = until_on(&mut c, &topic, 30, is_system).await;
        assert_eq!(sys["payload"]["recovered"], true, "{sys}");
    }
    metric_reaches(&sidecar, "realtime_resumes_running", 0.0, 10).await;
    assert_eq!(sidecar.metric("realtime_resumes_waiting").await, 0.0);
}

async fn tracked(c: &mut Client, topic: &str) -> Value {
    let track = json!({"type": "presence", "event": "track", "payload": {}});
    let r = c.push(Some("1"), topic, "presence", track).await;
    c.reply(&r).await
}

/// A `service_role` apikey is a backend's, as over REST: one server may hold many
/// connections from one address for many users, so its connections count in no per-address
/// limit (connections, bindings, presence tracks; resumes, in `history::line`'s unit test)
/// and do not spend the address's budget, while its per-connection limits still apply. The
/// same address's anon connections are bound as before.
#[tokio::test]
async fn a_service_role_connection_is_bound_per_connection_not_per_address() {
    let sidecar = Sidecar::start(
        "t_backend_per_address",
        &[
            ("MAX_CONNECTIONS_PER_ADDRESS", "2"),
            ("MAX_BINDINGS_PER_CONNECTION", "6"),
            ("MAX_BINDINGS_PER_ADDRESS", "2"),
            ("MAX_PRESENCE_EVENTS_PER_SECOND_PER_ADDRESS", "1"),
        ],
    )
    .await;
    let p = sidecar.port;
    let from = "127.0.0.5";
    let mut anon = Vec::new();
    for _ in 0..2 {
        anon.push(Client::connect_from(from, p, "1.0.0").await.unwrap());
    }
    let Err((status, _)) = Client::connect_from(from, p, "1.0.0").await else {
        panic!("a third anon connection from one address was accepted");
    };
    assert_eq!(status, 429);
    // The backend's connections from the same, full address: accepted, and three of them.
    let service = token(json!({"role": "service_role", "exp": now() + 3600}));
    let mut backend = Vec::new();
    for _ in 0..3 {
        let c = Client::connect_from_with(from, p, "2.0.0", &service).await;
        backend.push(c.expect("a backend's connection is not counted per address"));
    }
    // Bindings: past the address's 2, within the connection's 6; past the connection's, refused.
    assert_eq!(
        join_never(&mut backend[0], "realtime:be:1", 5).await["status"],
        "ok"
    );
    assert_eq!(
        join_never(&mut backend[1], "realtime:be:2", 5).await["status"],
        "ok"
    );
    assert!(
        refusal(&join_never(&mut backend[2], "realtime:be:3", 7).await)
            .ends_with("the limit is 6 (MAX_BINDINGS_PER_CONNECTION)"),
        "a backend keeps its per-connection limits"
    );
    // The address's own budget was not spent by them: an anon join of 2 fits, of 3 does not.
    assert_eq!(
        join_never(&mut anon[0], "realtime:an:1", 2).await["status"],
        "ok"
    );
    assert!(refusal(&join_never(&mut anon[1], "realtime:an:2", 1).await)
        .ends_with("bindings: 3; the limit is 2 (MAX_BINDINGS_PER_ADDRESS)"));
    // Presence: one track a second for the address; the backend tracks three.
    let config = json!({"presence": {"key": "", "enabled": true}});
    for (i, c) in anon.iter_mut().enumerate() {
        let reply = c.join(&format!("realtime:an:p{i}"), config.clone()).await;
        assert_eq!(reply["status"], "ok", "{reply}");
    }
    for i in 0..3 {
        let reply = backend[0]
            .join(&format!("realtime:be:p{i}"), config.clone())
            .await;
        assert_eq!(reply["status"], "ok", "{reply}");
    }
    let first = tracked(&mut anon[0], "realtime:an:p0").await;
    assert_eq!(first["status"], "ok", "{first}");
    let second = tracked(&mut anon[1], "realtime:an:p1").await;
    assert_eq!(
        second["response"]["reason"], "Too many presence messages from this address per second",
        "{second}"
    );
    for i in 0..3 {
        let r = tracked(&mut backend[0], &format!("realtime:be:p{i}")).await;
        assert_eq!(r["status"], "ok", "the backend's track {i}: {r}");
    }
}

/// Issue 39, M2: connections were counted by IPv6 /64 only, so about 17 /64s of one /56 (a
/// residential line's block) took every connection of the sidecar, and the process's
/// total counted backends too, so the app's own `service_role` server was refused with
/// everyone. Now an address's /56 and /48 (an IPv4 address's /24) each have a limit of
/// their own, and BACKEND_RESERVE_PERCENT of MAX_CONNECTIONS is left to backends.
#[tokio::test]
async fn seventeen_64s_of_one_56_took_every_connection_and_locked_the_backend_out() {
    let sidecar = Sidecar::start(
        "t_blocks",
        &[
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("MAX_CONNECTIONS_PER_ADDRESS", "2"),
            ("MAX_CONNECTIONS_PER_IPV6_56", "3"),
            ("MAX_CONNECTIONS_PER_IPV6_48", "4"),
            ("MAX_CONNECTIONS_PER_IPV4_24", "3"),
            ("MAX_CONNECTIONS", "10"),
            ("BACKEND_RESERVE_PERCENT", "30"),
        ],
    )
    .await;
    let p = sidecar.port;
    let anon = anon_key();
    let via = |ip: &'static str| {
        let anon = anon.clone();
        async move { Client::connect_forwarded("127.0.0.1", ip, p, "1.0.0", &anon).await }
    };
    let refused = |r: Result<Client, (u16, String)>| match r {
        Ok(_) => panic!("admitted"),
        Err((status, body)) => {
            assert_eq!(status, 429, "{body}");
            body
        }
    };
    let mut held = Vec::new();
    // Two /64s of one /56: three connections, then the /56's bound.
    held.push(via("2001:db8:0:100::1").await.unwrap());
    held.push(via("2001:db8:0:100::2").await.unwrap());
    assert!(
        refused(via("2001:db8:0:100::3").await).contains("Too many connections from this address")
    );
    held.push(via("2001:db8:0:1ff::1").await.unwrap());
    assert!(refused(via("2001:db8:0:1fe::1").await).contains(
        "ConnectionRateLimitReached: Too many connections from this network (2001:db8:0:100::/56)"
    ),);
    // Another /56 of the same /48: one more, then the /48's bound.
    held.push(via("2001:db8:0:200::1").await.unwrap());
    assert!(refused(via("2001:db8:0:300::1").await)
        .contains("Too many connections from this network (2001:db8::/48)"));
    // IPv4: a /24's addresses together.
    held.push(via("198.51.100.1").await.unwrap());
    held.push(via("198.51.100.2").await.unwrap());
    held.push(via("198.51.100.3").await.unwrap());
    assert!(refused(via("198.51.100.4").await)
        .contains("Too many connections from this network (198.51.100.0/24)"));
    // Seven clients hold 70% of MAX_CONNECTIONS (10 less 30%): an eighth, from a fresh
    // network, is refused as Supabase refuses; backends still connect, up to the total.
    assert_eq!(held.len(), 7);
    assert!(refused(via("203.0.113.1").await)
        .contains("ConnectionRateLimitReached: Too many connected users"));
    let service = token(json!({"role": "service_role", "exp": now() + 3600}));
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(
            Client::connect_from_with("127.0.0.9", p, "1.0.0", &service)
                .await
                .expect("a backend within its reserve"),
        );
    }
    assert!(
        refused(Client::connect_from_with("127.0.0.9", p, "1.0.0", &service).await)
            .contains("ConnectionRateLimitReached: Too many connected users")
    );
}

/// Issue 39, M1 and M2: joins were counted per connection and per /64 only, so the /64s of one
/// /56, or clients on many addresses, could ask the one authorizer for more verdicts than it
/// answers. Now an address's /56 and /48 (an IPv4 address's /24) each have a join rate of
/// their own, and the sidecar has one for everyone (MAX_SIDECAR_JOINS_PER_SECOND), of which
/// clients leave BACKEND_RESERVE_PERCENT to backends. Each refusal keeps the socket.
#[tokio::test]
async fn joins_had_no_rate_per_network_or_per_sidecar() {
    let sidecar = Sidecar::start(
        "t_join_blocks",
        &[
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("MAX_JOINS_PER_SECOND_PER_ADDRESS", "2"),
            ("MAX_JOINS_PER_SECOND_PER_IPV6_56", "3"),
            ("MAX_SIDECAR_JOINS_PER_SECOND", "10"),
            ("BACKEND_RESERVE_PERCENT", "50"),
        ],
    )
    .await;
    let p = sidecar.port;
    let anon = anon_key();
    let via = |ip: &'static str| {
        let anon = anon.clone();
        async move {
            Client::connect_forwarded("127.0.0.1", ip, p, "1.0.0", &anon)
                .await
                .expect("admitted")
        }
    };
    let mut clients = [
        via("2001:db8:0:100::1").await,
        via("2001:db8:0:1ff::1").await,
        via("198.51.100.1").await,
        via("203.0.113.1").await,
    ];
    let service = token(json!({"role": "service_role", "exp": now() + 3600}));
    let mut backend = Client::connect_from_with("127.0.0.9", p, "1.0.0", &service)
        .await
        .expect("a backend");
    // Every join below within one second (each rate's window starts at its first join):
    // clients 0 and 1 share a /56.
    let mut reasons = Vec::new();
    for (i, topic) in [
        (0, "a1"),
        (0, "a2"),
        (1, "b1"),
        (1, "b2"),
        (2, "c1"),
        (2, "c2"),
        (3, "d1"),
    ] {
        let r = clients[i]
            .join(&format!("realtime:{topic}"), json!({}))
            .await;
        reasons.push(r["response"]["reason"].as_str().unwrap_or("ok").to_owned());
    }
    let backend_joins: Vec<String> = {
        let mut got = Vec::new();
        for i in 0..3 {
            let r = backend.join(&format!("realtime:be{i}"), json!({})).await;
            got.push(r["status"].as_str().unwrap_or_default().to_owned());
        }
        got
    };
    assert_eq!(
        reasons,
        [
            "ok",
            "ok",
            "ok",
            "ClientJoinRateLimitReached: Too many joins per second from this network (2001:db8:0:100::/56)",
            "ok",
            "ok",
            // Clients have used their 5 of the sidecar's 10.
            "ClientJoinRateLimitReached: Too many joins per second on this server",
        ]
    );
    assert_eq!(
        backend_joins,
        ["ok", "ok", "ok"],
        "backends keep their part"
    );
    // The refused kept their sockets.
    let d = &mut clients[3];
    let r = d.push(Some("9"), "phoenix", "heartbeat", json!({})).await;
    assert_eq!(d.reply(&r).await["status"], "ok");
}

/// Issue 39, M2: Postgres Changes bindings and pattern conditions were counted per /64
/// only, so a client with the /64s of a /56 held MAX_BINDINGS_PER_ADDRESS 256 times. Each
/// wider block has limits of its own now; a leave gives its share back.
#[tokio::test]
async fn the_64s_of_one_56_each_had_an_address_s_bindings() {
    let sidecar = Sidecar::start(
        "t_binding_blocks",
        &[
            ("TRUSTED_PROXIES", "127.0.0.1"),
            ("MAX_BINDINGS_PER_ADDRESS", "3"),
            ("MAX_BINDINGS_PER_IPV6_56", "4"),
        ],
    )
    .await;
    let p = sidecar.port;
    let anon = anon_key();
    let mut a = Client::connect_forwarded("127.0.0.1", "2001:db8:0:100::1", p, "1.0.0", &anon)
        .await
        .expect("admitted");
    let mut b = Client::connect_forwarded("127.0.0.1", "2001:db8:0:1ff::1", p, "1.0.0", &anon)
        .await
        .expect("admitted");
    let mut c = Client::connect_forwarded("127.0.0.1", "2001:db8:0:200::1", p, "1.0.0", &anon)
        .await
        .expect("admitted");
    assert_eq!(
        join_never(&mut a, "realtime:blk:a", 3).await["status"],
        "ok"
    );
    assert_eq!(
        refusal(&join_never(&mut b, "realtime:blk:b", 2).await),
        "InvalidPostgresChanges: the channels of this client network (2001:db8:0:100::/56) would have bindings: 5; the limit is 4 (MAX_BINDINGS_PER_IPV6_56)"
    );
    assert_eq!(
        join_never(&mut b, "realtime:blk:b", 1).await["status"],
        "ok"
    );
    // Another /56 of the same /48 has its own.
    assert_eq!(
        join_never(&mut c, "realtime:blk:c", 3).await["status"],
        "ok"
    );
    // A leave gives the /56 its share back.
    let r = a
        .push(Some("2"), "realtime:blk:a", "phx_leave", json!({}))
        .await;
    assert_eq!(a.reply(&r).await["status"], "ok");
    assert_eq!(
        join_never(&mut b, "realtime:blk:b2", 2).await["status"],
        "ok"
    );
}

/// Issue 39, M3: schema-wide bindings (no table) are matched against every drained change
/// on the drain's loop, and were bounded per address only, so a few addresses could slow
/// every delivery of the sidecar. The sidecar's channels together hold at most
/// MAX_SCHEMA_WIDE_BINDINGS, clients leaving BACKEND_RESERVE_PERCENT of it to backends; a
/// leave gives them back; bindings on a table are not counted.
#[tokio::test]
async fn schema_wide_bindings_had_no_bound_per_sidecar() {
    let sidecar = Sidecar::start(
        "t_schema_wide",
        &[
            ("MAX_SCHEMA_WIDE_BINDINGS", "10"),
            ("BACKEND_RESERVE_PERCENT", "20"),
        ],
    )
    .await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS per_address_wide;
         CREATE TABLE per_address_wide (id int PRIMARY KEY);
         GRANT SELECT ON per_address_wide TO anon;
         ALTER PUBLICATION supabase_realtime ADD TABLE per_address_wide;",
    )
    .await
    .unwrap();
    let p = sidecar.port;
    let mut a = Client::connect_from("127.0.0.11", p, "1.0.0")
        .await
        .unwrap();
    let mut b = Client::connect_from("127.0.0.12", p, "1.0.0")
        .await
        .unwrap();
    // Clients may hold 8 of the 10, from any addresses.
    assert_eq!(join_never(&mut a, "realtime:sw:1", 5).await["status"], "ok");
    assert_eq!(join_never(&mut b, "realtime:sw:2", 3).await["status"], "ok");
    assert_eq!(
        refusal(&join_never(&mut b, "realtime:sw:3", 1).await),
        "InvalidPostgresChanges: the channels of this server would have bindings without a table: 9; the limit is 8 (MAX_SCHEMA_WIDE_BINDINGS)"
    );
    // A binding on a table is not schema-wide.
    let table = json!({"event": "*", "schema": "public", "table": "per_address_wide"});
    let reply = b
        .join("realtime:sw:table", json!({"postgres_changes": [table]}))
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    // A backend may use the reserve.
    let service = token(json!({"role": "service_role", "exp": now() + 3600}));
    let mut backend = Client::connect_from_with("127.0.0.13", p, "1.0.0", &service)
        .await
        .unwrap();
    assert_eq!(
        join_never(&mut backend, "realtime:sw:b", 2).await["status"],
        "ok"
    );
    assert!(
        refusal(&join_never(&mut backend, "realtime:sw:b2", 1).await)
            .ends_with("without a table: 11; the limit is 10 (MAX_SCHEMA_WIDE_BINDINGS)")
    );
    // A leave gives them back.
    let r = a
        .push(Some("1"), "realtime:sw:1", "phx_leave", json!({}))
        .await;
    assert_eq!(a.reply(&r).await["status"], "ok");
    assert_eq!(join_never(&mut b, "realtime:sw:3", 1).await["status"], "ok");
    db.batch_execute("DROP TABLE per_address_wide")
        .await
        .unwrap();
}
