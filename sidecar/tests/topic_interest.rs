//! End-to-end: a sidecar drains only the topics its channels joined (`interest`,
//! `realtime.listen`), answers a join only once its topic is listened to, and falls back to
//! everything whenever it cannot filter.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn send(db: &tokio_postgres::Client, topic: &str, n: i64) {
    db.execute(
        "SELECT realtime.send(jsonb_build_object('n', $1::int8), 'ev', $2, false)",
        &[&n, &topic],
    )
    .await
    .unwrap();
}

/// What the consumer's slot listens to: None while it receives everything.
async fn listening(db: &tokio_postgres::Client, consumer: &str) -> Option<i32> {
    db.query_one(
        "SELECT listening FROM realtime.consumers() WHERE name = $1",
        &[&consumer],
    )
    .await
    .unwrap()
    .get(0)
}

/// Polls (every 25 ms, at most 10 s) until the slot listens to `want`.
async fn wait_listening(db: &tokio_postgres::Client, consumer: &str, want: Option<i32>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = listening(db, consumer).await;
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{consumer} listens to {now:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The next broadcast's `n`, passing over anything else.
async fn next_n(c: &mut Client) -> Option<i64> {
    loop {
        let m = c.next_json(5).await?;
        if m["event"] == "broadcast" {
            return m["payload"]["payload"]["n"].as_i64();
        }
    }
}

#[tokio::test]
async fn a_sidecar_drains_only_the_topics_its_channels_joined() {
    let filtering = Sidecar::start("t_interest_on", &[]).await;
    let everything = Sidecar::start("t_interest_off", &[("FILTER_TOPICS", "false")]).await;
    let db = db().await;
    let mut a = Client::connect(filtering.port, "1.0.0").await;
    let mut b = Client::connect(everything.port, "1.0.0").await;
    a.join_public("realtime:interest:mine").await;
    b.join_public("realtime:interest:mine").await;
    assert_eq!(listening(&db, "t_interest_on").await, Some(1));
    assert_eq!(listening(&db, "t_interest_off").await, None);
    // Counted from here: before its first upload a sidecar receives everything.
    let metric = "realtime_drain_messages_total";
    let (on_before, off_before) = (
        filtering.metric(metric).await,
        everything.metric(metric).await,
    );
    for n in 0..100 {
        send(&db, "interest:others", n).await;
    }
    send(&db, "interest:mine", 7).await;
    assert_eq!(next_n(&mut a).await, Some(7));
    assert_eq!(next_n(&mut b).await, Some(7));
    // The filtering sidecar was handed its topic's message only; the other all 101.
    assert_eq!(filtering.metric(metric).await - on_before, 1.0);
    assert!(everything.metric(metric).await - off_before >= 101.0);
    // Its position still moved past the skipped messages.
    let (_, last) = queue_position(&db).await;
    let confirmed_or_read: i64 = db
        .query_one(
            "SELECT last_read_seq FROM realtime.consumers() WHERE name = 't_interest_on'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        confirmed_or_read >= last - 1,
        "{confirmed_or_read} < {last}"
    );
}

#[tokio::test]
async fn a_join_is_answered_only_once_its_topic_is_listened_to() {
    // Each join is of a topic this sidecar never had (60: the test cluster allows 64 per
    // consumer), and the message is sent the moment
    // the reply arrives: a reply sent before the upload would let the drain skip it.
    let sidecar = Sidecar::start("t_interest_seam", &[]).await;
    let db = db().await;
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    for i in 0..60 {
        let topic = format!("interest:fresh:{i}");
        c.join_public(&format!("realtime:{topic}")).await;
        // Read at once, not waited for: the reply came after the upload.
        assert_eq!(listening(&db, "t_interest_seam").await, Some(i as i32 + 1));
        send(&db, &topic, i).await;
        let got = loop {
            match c
                .next(5)
                .await
                .expect("the message sent right after the reply")
            {
                tokio_tungstenite::tungstenite::Message::Binary(b) => {
                    let (_, _, _, _, payload) = decode_kind4(&b);
                    break serde_json::from_slice::<Value>(&payload).unwrap()["n"].as_i64();
                }
                _ => continue,
            }
        };
        assert_eq!(got, Some(i));
    }
    assert_eq!(listening(&db, "t_interest_seam").await, Some(60));
}

#[tokio::test]
async fn a_topic_left_by_its_last_channel_is_no_longer_drained() {
    let sidecar = Sidecar::start("t_interest_leave", &[]).await;
    let db = db().await;
    let mut a = Client::connect(sidecar.port, "1.0.0").await;
    let mut b = Client::connect(sidecar.port, "1.0.0").await;
    a.join_public("realtime:interest:shared").await;
    b.join_public("realtime:interest:shared").await;
    a.join_public("realtime:interest:only-a").await;
    wait_listening(&db, "t_interest_leave", Some(2)).await;
    let r = a
        .push(
            Some("1"),
            "realtime:interest:shared",
            "phx_leave",
            json!({}),
        )
        .await;
    a.reply(&r).await;
    // b still holds the shared topic.
    send(&db, "interest:shared", 1).await;
    assert_eq!(next_n(&mut b).await, Some(1));
    assert_eq!(listening(&db, "t_interest_leave").await, Some(2));
    drop(a);
    wait_listening(&db, "t_interest_leave", Some(1)).await;
    drop(b);
    wait_listening(&db, "t_interest_leave", Some(0)).await;
}

#[tokio::test]
async fn a_restarted_sidecar_replaces_what_its_slot_listened_to() {
    let mut first = Sidecar::start("t_interest_restart", &[]).await;
    let db = db().await;
    let mut c = Client::connect(first.port, "1.0.0").await;
    c.join_public("realtime:interest:before").await;
    c.join_public("realtime:interest:before-2").await;
    assert_eq!(listening(&db, "t_interest_restart").await, Some(2));
    // Killed: nothing tells the database; the slot still listens to both.
    first.kill();
    drop(c);
    assert_eq!(listening(&db, "t_interest_restart").await, Some(2));
    let second = Sidecar::start_on(free_port(), "t_interest_restart", &[]).await;
    wait_listening(&db, "t_interest_restart", Some(0)).await;
    let mut c = Client::connect(second.port, "1.0.0").await;
    c.join_public("realtime:interest:after").await;
    send(&db, "interest:after", 3).await;
    assert_eq!(next_n(&mut c).await, Some(3));
    // A sidecar that does not filter clears what the slot's earlier process listened to.
    let mut second = second;
    second.kill();
    assert_eq!(listening(&db, "t_interest_restart").await, Some(1));
    let _third = Sidecar::start_on(
        free_port(),
        "t_interest_restart",
        &[("FILTER_TOPICS", "false")],
    )
    .await;
    assert_eq!(listening(&db, "t_interest_restart").await, None);
}

#[tokio::test]
async fn a_sidecar_over_the_topic_limit_receives_everything() {
    // The test cluster allows 64 topics per consumer (scripts/test.sh).
    let sidecar = Sidecar::start("t_interest_limit", &[]).await;
    let db = db().await;
    let limit: i32 = db
        .query_one(
            "SELECT current_setting('realtime.max_topics_per_consumer')::int",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let mut clients = Vec::new();
    for i in 0..=limit {
        if i % 50 == 0 {
            clients.push(Client::connect(sidecar.port, "1.0.0").await);
        }
        let c = clients.last_mut().unwrap();
        c.join_public(&format!("realtime:interest:many:{i}")).await;
    }
    assert_eq!(listening(&db, "t_interest_limit").await, None);
    assert!(sidecar.metric("realtime_listened_keys").await.is_nan());
    assert!(
        sidecar.log().contains("refuses this many topics"),
        "{}",
        sidecar.log()
    );
    send(&db, &format!("interest:many:{limit}"), 5).await;
    assert_eq!(next_n(clients.last_mut().unwrap()).await, Some(5));
}

#[tokio::test]
async fn filtering_switched_off_for_good_comes_back_once_the_set_fits_again() {
    // The test cluster allows 64 topics per consumer (scripts/test.sh).
    let sidecar = Sidecar::start("t_interest_back", &[]).await;
    let db = db().await;
    let limit: i32 = db
        .query_one(
            "SELECT current_setting('realtime.max_topics_per_consumer')::int",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let mut keeper = Client::connect(sidecar.port, "1.0.0").await;
    keeper.join_public("realtime:interest:back:kept").await;
    let mut many = Vec::new();
    for i in 0..limit {
        if i % 50 == 0 {
            many.push(Client::connect(sidecar.port, "1.0.0").await);
        }
        let c = many.last_mut().unwrap();
        c.join_public(&format!("realtime:interest:back:{i}")).await;
    }
    wait_listening(&db, "t_interest_back", None).await;
    // The many leave: one key is held, fewer than were refused.
    drop(many);
    wait_listening(&db, "t_interest_back", Some(1)).await;
    assert_eq!(sidecar.metric("realtime_listened_keys").await, 1.0);
    // Filtering again: a new topic's join waits for its upload, and its message arrives.
    keeper.join_public("realtime:interest:back:new").await;
    assert_eq!(listening(&db, "t_interest_back").await, Some(2));
    send(&db, "interest:back:new", 9).await;
    assert_eq!(next_n(&mut keeper).await, Some(9));
}
