//! Presence on the wire, where realtime-js would hide a mistake: the order of a join's
//! frames (reply, then `presence_state`, then diffs), the channel's join_ref on them,
//! Phoenix's update diff (`phx_ref_prev`), and a poisoned track among many.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// The next frames up to and including the first of `event` (text frames, in order).
async fn until(c: &mut Client, event: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let m = c
            .next_json(10)
            .await
            .unwrap_or_else(|| panic!("{event} within 10 s; saw {seen:?}"));
        let done = m["event"] == event;
        seen.push(m);
        if done {
            return seen;
        }
    }
}

fn track(meta: Value) -> Value {
    json!({"type": "presence", "event": "track", "payload": meta})
}

#[tokio::test]
async fn a_join_gets_reply_then_state_then_diffs_and_an_update_carries_phx_ref_prev() {
    let sidecar = Sidecar::start("t_presence_wire", &[]).await;
    for vsn in ["1.0.0", "2.0.0"] {
        let topic = format!("realtime:wire-{vsn}");
        let mut c = Client::connect(sidecar.port, vsn).await;
        let config = json!({"config": {"presence": {"key": "ann", "enabled": true}}});
        let r = c.push(Some("7"), &topic, "phx_join", config).await;
        let first = c.next_json(10).await.expect("the reply");
        assert_eq!(
            (&first["event"], &first["ref"]),
            (&json!("phx_reply"), &json!(r))
        );
        let state = c.next_json(10).await.expect("the state");
        assert_eq!(state["event"], "presence_state", "{state}");
        assert_eq!(state["payload"], json!({}));
        assert_eq!(
            state["join_ref"], "7",
            "Phoenix drops frames of another join"
        );

        let r = c
            .push(Some("7"), &topic, "presence", track(json!({"n": 1})))
            .await;
        let mut frames = until(&mut c, "presence_diff").await;
        if !frames.iter().any(|f| f["ref"] == json!(r)) {
            frames.extend(until(&mut c, "phx_reply").await);
        }
        let reply = frames.iter().find(|f| f["ref"] == json!(r)).unwrap();
        assert_eq!(reply["payload"]["status"], "ok");
        let diff = frames
            .iter()
            .find(|f| f["event"] == "presence_diff")
            .unwrap();
        assert_eq!(diff["join_ref"], "7");
        let metas = &diff["payload"]["joins"]["ann"]["metas"];
        assert_eq!(metas[0]["n"], 1, "{diff}");
        let first_ref = metas[0]["phx_ref"].as_str().unwrap().to_owned();
        assert_eq!(diff["payload"]["leaves"], json!({}));

        c.push(Some("7"), &topic, "presence", track(json!({"n": 2})))
            .await;
        let diff = until(&mut c, "presence_diff").await.pop().unwrap();
        let joined = &diff["payload"]["joins"]["ann"]["metas"][0];
        assert_eq!(joined["n"], 2);
        assert_eq!(joined["phx_ref_prev"], json!(first_ref), "{diff}");
        assert_ne!(joined["phx_ref"], json!(first_ref));
        assert_eq!(
            diff["payload"]["leaves"],
            json!({"ann": {"metas": [{"n": 1, "phx_ref": first_ref}]}})
        );
    }
}

/// A meta Postgres refuses (jsonb has no \u0000) among many tracks written together fails
/// only its own push, with the database's reason; every other track is committed, and the
/// bad one is found by halving the batch, not by writing each member alone.
#[tokio::test]
async fn a_poisoned_track_fails_alone_and_the_others_of_its_batch_are_written() {
    let sidecar = Sidecar::start("t_presence_poison", &[]).await;
    let db = db().await;
    let topic = format!("poison-{}", now());
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    let mut channels = Vec::new();
    for i in 0..21 {
        let t = format!("realtime:{topic}-{i}");
        let config = json!({"presence": {"key": format!("k{i}")}});
        assert_eq!(c.join(&t, config).await["status"], "ok");
        channels.push(t);
    }
    // Sent back to back, so the worker finds many waiting at once.
    let mut refs = Vec::new();
    for (i, t) in channels.iter().enumerate() {
        let meta = match i {
            10 => json!({"bad": "\u{0}"}),
            _ => json!({"i": i}),
        };
        refs.push(c.push(Some("1"), t, "presence", track(meta)).await);
    }
    // Replies come as each write settles, in any order.
    let mut by_ref = std::collections::HashMap::new();
    while by_ref.len() < refs.len() {
        let m = c.next_json(10).await.expect("every track answered");
        if m["event"] == "phx_reply" {
            by_ref.insert(m["ref"].as_str().unwrap().to_owned(), m["payload"].clone());
        }
    }
    let outcomes: Vec<&Value> = refs.iter().map(|r| &by_ref[r]).collect();
    for (i, o) in outcomes.iter().enumerate() {
        if i == 10 {
            assert_eq!(o["status"], "error");
            let reason = o["response"]["reason"].as_str().unwrap();
            assert!(
                reason.starts_with("UnableToTrackPresence: unsupported Unicode escape sequence"),
                "{reason}"
            );
        } else {
            assert_eq!(o["status"], "ok", "track {i}: {o}");
        }
    }
    let like = format!("{topic}-%");
    let live: i64 = db
        .query_one(
            "SELECT count(*) FROM realtime.presences WHERE topic LIKE $1 AND left_at IS NULL",
            &[&like],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, 20);
    assert_eq!(
        sidecar
            .metric("realtime_presence_write_failures_total")
            .await,
        1.0
    );
    // Found by halving: at most two statements per level of the poisoned batch beyond one
    // per batch (2 × ⌈log2 21⌉ = 10), where one statement per member of that batch was run
    // before (up to 21).
    let batches = sidecar
        .metric("realtime_presence_write_batches_total")
        .await;
    let statements = sidecar
        .metric("realtime_presence_write_statements_total")
        .await;
    assert!(
        statements - batches <= 10.0,
        "{statements} statements for {batches} batches"
    );
}

/// Fixed bug: the presence lease task could miss the shutdown signal, so a sidecar stopped
/// with SIGTERM hung for its whole grace period (5 s) and then exited without ending its
/// presence session. A stop is prompt (about 0.1 s here), its members leave, and the
/// session is ended in the database.
#[tokio::test]
async fn sigterm_stops_promptly_and_ends_the_presence_session() {
    let mut sidecar = Sidecar::start("t_presence_sigterm", &[]).await;
    let db = db().await;
    let topic = format!("sigterm-{}", now());
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    let channel = format!("realtime:{topic}");
    let config = json!({"presence": {"key": "ann"}});
    assert_eq!(c.join(&channel, config).await["status"], "ok");
    let r = c
        .push(Some("1"), &channel, "presence", track(json!({})))
        .await;
    assert_eq!(c.reply(&r).await["status"], "ok");
    let session: String = db
        .query_one(
            "SELECT session FROM realtime.presences WHERE topic = $1 AND left_at IS NULL",
            &[&topic],
        )
        .await
        .unwrap()
        .get(0);
    let stopping = std::time::Instant::now();
    assert!(sidecar.stop().success());
    let took = stopping.elapsed();
    assert!(
        took < std::time::Duration::from_secs(4),
        "the stop waited out the 5 s grace: {took:?}"
    );
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM realtime.presences WHERE topic = $1 AND left_at IS NULL),
                    (SELECT count(*) FROM realtime.presence_sessions WHERE session = $2)",
            &[&topic, &session],
        )
        .await
        .unwrap();
    let (live, sessions): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        (live, sessions),
        (0, 0),
        "members left and the session ended"
    );
}

/// Fixed bug: the lease task ran the reaper right after each renewal, so a reaper waiting
/// for locks on the members table held up the next renewal; a sidecar busy behind a slow
/// or blocked statement lost its lease, and its members were reaped and tracked again
/// (every observer saw them leave and join). Renewals now never wait behind the reaper.
#[tokio::test]
async fn a_members_table_locked_longer_than_the_lease_loses_no_session() {
    let sidecar = Sidecar::start("t_presence_locked", &[("PRESENCE_LEASE_SECS", "2")]).await;
    let mut db = db().await;
    let topic = format!("locked-{}", now());
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    let (a, b) = (format!("realtime:{topic}-a"), format!("realtime:{topic}-b"));
    for t in [&a, &b] {
        assert_eq!(
            c.join(t, json!({"presence": {"key": t}})).await["status"],
            "ok"
        );
    }
    let r = c.push(Some("1"), &a, "presence", track(json!({}))).await;
    assert_eq!(c.reply(&r).await["status"], "ok");
    let before = live_ref(&db, &format!("{topic}-a")).await;
    // Writes to the members table wait (SHARE blocks INSERT and UPDATE), and so does the
    // reaper, until a renewal has landed more than a lease (2 s) after the lock was taken:
    // renewals go on while writes and the reaper wait.
    let tx = db.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE realtime.presences IN SHARE MODE")
        .await
        .unwrap();
    let locked_at: std::time::SystemTime = tx
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    let r = c.push(Some("1"), &b, "presence", track(json!({}))).await;
    let renewed_a_lease_later = "SELECT count(*) FROM realtime.presence_sessions \
         WHERE session LIKE 't_presence_locked/%' \
           AND expires_at - interval '2 seconds' > $1::timestamptz + interval '2 seconds'";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let n: i64 = tx
            .query_one(renewed_a_lease_later, &[&locked_at])
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no renewal while the members table was locked"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tx.commit().await.unwrap();
    assert_eq!(
        c.reply(&r).await["status"],
        "ok",
        "the blocked track went through"
    );
    assert_eq!(
        sidecar
            .metric("realtime_presence_sessions_lost_total")
            .await,
        0.0,
        "the lease held while the writer waited"
    );
    assert_eq!(
        live_ref(&db, &format!("{topic}-a")).await,
        before,
        "the member was not reaped and tracked again"
    );
}

/// The ref of the live member of `topic`; it must be exactly one.
async fn live_ref(db: &tokio_postgres::Client, topic: &str) -> String {
    let rows = db
        .query(
            "SELECT ref FROM realtime.presences WHERE topic = $1 AND left_at IS NULL",
            &[&topic],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "live members of {topic}");
    rows[0].get(0)
}

/// One address tracking as fast as it can spent the sidecar's presence budget; its tracks
/// were refused with the reason while a bystander's track on another address is served,
/// and nobody's channel is closed (the sidecar's limit once closed whoever tracked next).
#[tokio::test]
async fn a_presence_flood_from_one_address_is_refused_and_a_bystander_still_tracks() {
    let sidecar = Sidecar::start(
        "t_presence_budget",
        &[
            ("MAX_PRESENCE_EVENTS_PER_SECOND", "20"),
            ("MAX_CLIENT_PRESENCE_EVENTS_PER_SECOND", "1000"),
        ],
    )
    .await;
    let config = json!({"presence": {"key": "", "enabled": true}});
    let mut flood = Client::connect_from("127.0.0.2", sidecar.port, "1.0.0")
        .await
        .unwrap();
    let mut bystander = Client::connect_from("127.0.0.3", sidecar.port, "1.0.0")
        .await
        .unwrap();
    assert_eq!(
        flood.join("realtime:flood", config.clone()).await["status"],
        "ok"
    );
    assert_eq!(
        bystander.join("realtime:calm", config).await["status"],
        "ok"
    );
    let mut refs = Vec::new();
    for i in 0..40 {
        refs.push(
            flood
                .push(
                    Some("1"),
                    "realtime:flood",
                    "presence",
                    track(json!({"i": i})),
                )
                .await,
        );
    }
    // Every flood track is answered: the first ones ok, the rest refused with the reason.
    let mut answers = std::collections::HashMap::new();
    while answers.len() < refs.len() {
        let m = flood.next_json(10).await.expect("every track answered");
        assert_ne!(
            m["event"], "phx_close",
            "the flooder's channel is not closed"
        );
        if m["event"] == "phx_reply" && refs.contains(&m["ref"].as_str().unwrap().to_owned()) {
            answers.insert(m["ref"].as_str().unwrap().to_owned(), m["payload"].clone());
        }
    }
    let refused: Vec<_> = answers
        .values()
        .filter(|p| p["status"] == "error")
        .collect();
    assert!(!refused.is_empty(), "the flood spent the budget");
    for p in &refused {
        assert_eq!(
            p["response"]["reason"],
            "Too many presence messages per second"
        );
    }
    // The bystander, on its own address, tracks while the flooder is refused.
    let r = bystander
        .push(
            Some("1"),
            "realtime:calm",
            "presence",
            track(json!({"calm": true})),
        )
        .await;
    let frames = until(&mut bystander, "phx_reply").await;
    let reply = frames.iter().find(|f| f["ref"] == json!(r)).unwrap();
    assert_eq!(reply["payload"]["status"], "ok", "{reply}");
    assert!(frames.iter().all(|f| f["event"] != "phx_close"));
}

/// Issue 39, L4: a topic's presence was bounded only by connections: one address held a
/// thousand members of up to 16 KiB each, sent to every joiner and kept by every watching
/// sidecar. A channel's first track into a topic whose view holds
/// MAX_PRESENCE_MEMBERS_PER_TOPIC members is refused with the reason (its channel kept); a
/// member re-tracking is not refused; once one leaves, another gets in.
#[tokio::test]
async fn a_topic_s_presence_had_no_member_bound() {
    let sidecar = Sidecar::start(
        "t_presence_members",
        &[("MAX_PRESENCE_MEMBERS_PER_TOPIC", "2")],
    )
    .await;
    let topic = format!("realtime:crowd-{}", now());
    let config = json!({"presence": {"key": "", "enabled": true}});
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut c = Client::connect(sidecar.port, "1.0.0").await;
        assert_eq!(c.join(&topic, config.clone()).await["status"], "ok");
        clients.push(c);
    }
    // Tracks a meta; the reply's payload.
    async fn track_on(c: &mut Client, topic: &str, meta: Value) -> Value {
        let r = c.push(Some("1"), topic, "presence", track(meta)).await;
        c.reply(&r).await
    }
    for (i, c) in clients.iter_mut().take(2).enumerate() {
        assert_eq!(track_on(c, &topic, json!({"i": i})).await["status"], "ok");
    }
    // Once the third's view shows both (its state, then diffs), its track is refused.
    let mut keys = std::collections::HashSet::new();
    while keys.len() < 2 {
        let m = clients[2].next_json(10).await.expect("the others' joins");
        let joined = match m["event"].as_str() {
            Some("presence_state") => m["payload"].clone(),
            Some("presence_diff") => m["payload"]["joins"].clone(),
            _ => continue,
        };
        keys.extend(
            joined
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k.clone()),
        );
    }
    let refused = track_on(&mut clients[2], &topic, json!({"i": 2})).await;
    assert_eq!(
        refused["response"]["reason"],
        "Too many presence members in this topic: the limit is 2 (MAX_PRESENCE_MEMBERS_PER_TOPIC)"
    );
    // A member re-tracking is not a new member.
    assert_eq!(
        track_on(&mut clients[0], &topic, json!({"i": 10})).await["status"],
        "ok"
    );
    // One leaves (its socket closes): the third gets in.
    drop(clients.remove(0));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = track_on(&mut clients[1], &topic, json!({"i": 2})).await;
        if reply["status"] == "ok" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never admitted: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
