//! Postgres Changes checks run beside the drain (`postgres_changes::pool`): a table whose
//! check is slow holds only the channels waiting for its changes (`out`, its slots), each in
//! its queue order, and nothing else.
//!
//! Each test's table has a SELECT policy that sleeps, and CHANGES_CHECK_TIMEOUT_MS is high,
//! so the check is still running (seen in pg_stat_activity, by the sidecar's
//! application_name) while the test looks at what already arrived.

mod common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// A table `name` with RLS whose SELECT policy sleeps `sleep` seconds per row checked,
/// readable by `authenticated`, in the publication.
async fn slow_table(db: &tokio_postgres::Client, name: &str, sleep: &str) {
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS {name};
         CREATE TABLE {name} (id bigint PRIMARY KEY, v text);
         ALTER TABLE {name} ENABLE ROW LEVEL SECURITY;
         CREATE OR REPLACE FUNCTION {name}_ok() RETURNS boolean LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep({sleep}); RETURN true; END $$;
         CREATE POLICY slow ON {name} FOR SELECT TO authenticated USING ({name}_ok());
         GRANT SELECT ON {name} TO authenticated;
         ALTER PUBLICATION supabase_realtime ADD TABLE {name};"
    ))
    .await
    .unwrap();
}

async fn drop_table(db: &tokio_postgres::Client, name: &str) {
    db.batch_execute(&format!(
        "DROP TABLE {name}; DROP FUNCTION IF EXISTS {name}_ok()"
    ))
    .await
    .unwrap();
}

/// A sidecar whose connections are named `name` (so its checks are found in
/// pg_stat_activity), with a 30 s check budget and `env`.
async fn sidecar(name: &str, env: &[(&str, &str)]) -> Sidecar {
    let dsn = format!("{} application_name={name}", sidecar_dsn());
    let mut all = vec![
        ("CHANGES_CHECK_TIMEOUT_MS", "30000"),
        ("POLL_MAX_CHANGES", "100000"),
        ("DATABASE_URL", dsn.as_str()),
    ];
    all.extend_from_slice(env);
    Sidecar::start(name, &all).await
}

/// Whether a check (`realtime.visible`) of sidecar `name` is running now.
async fn checking(db: &tokio_postgres::Client, name: &str) -> bool {
    running_checks(db, name).await > 0
}

/// How many of sidecar `name`'s connections are running a check (`realtime.visible`) now.
async fn running_checks(db: &tokio_postgres::Client, name: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND query LIKE '%realtime.visible%' AND state = 'active'",
        &[&name],
    )
    .await
    .unwrap()
    .get(0)
}

/// Waits (at most 5 s) until a check of sidecar `name` is seen running: true if it was.
async fn seen_checking(db: &tokio_postgres::Client, name: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if checking(db, name).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A client of user `sub` joined to `topic` with a binding on every change of `table`
/// (and broadcasts of the topic, public).
async fn subscriber(port: u16, sub: &str, topic: &str, table: &str) -> Client {
    let token = user_token(sub);
    let mut c = Client::connect_with(port, "1.0.0", &token).await;
    let binding = json!({"event": "*", "schema": "public", "table": table});
    let join = json!({
        "config": {"postgres_changes": [binding], "broadcast": {"self": false}, "private": false},
        "access_token": token,
    });
    let r = c.push(Some("1"), topic, "phx_join", join).await;
    assert_eq!(c.reply(&r).await["status"], "ok");
    let subscribed = c.next_json(10).await.expect("system");
    assert_eq!(
        subscribed["payload"]["message"], "Subscribed to PostgreSQL",
        "{subscribed}"
    );
    c
}

/// The bulk-writer attack of the soak: the check of a 3,000-row insert into a table whose
/// policy costs 2 ms a row takes about 6 s. It used to run in the drain's loop, so a
/// broadcast to another topic committed right after the insert waited for it. Now it
/// arrives while the check is still running, and the subscriber gets every change after.
#[tokio::test]
async fn a_broadcast_after_a_bulk_insert_arrives_while_the_insert_s_slow_check_is_pending() {
    let name = "t_offpath_bulk";
    let sidecar = sidecar(name, &[]).await;
    let db = db().await;
    slow_table(&db, "offpath_bulk", "0.002").await;
    let mut subscriber = subscriber(sidecar.port, "bulk", "realtime:bulk", "offpath_bulk").await;
    let mut bystander = Client::connect(sidecar.port, "1.0.0").await;
    bystander.join_public("realtime:beside_bulk").await;

    db.execute(
        "INSERT INTO offpath_bulk SELECT g, 'x' FROM generate_series(1, 3000) g",
        &[],
    )
    .await
    .unwrap();
    send(&db, json!({"n": 1}), "after", "beside_bulk").await;
    // Fail-safe only.
    let m = bystander.next_json(30).await.expect("the broadcast");
    assert_eq!(m["payload"]["event"], "after", "{m}");
    assert!(
        seen_checking(&db, name).await,
        "the broadcast arrived while the insert's check was still running"
    );

    let mut changes = 0;
    while changes < 3000 {
        let m = subscriber
            .next_json(60)
            .await
            .expect("every change, in time");
        assert_eq!(m["event"], "postgres_changes", "{m}");
        changes += 1;
    }
    assert_eq!(
        sidecar.metric("realtime_change_check_failures_total").await,
        0.0
    );
    drop_table(&db, "offpath_bulk").await;
}

/// A channel with a binding of a slow table and broadcasts of its topic: a change whose
/// check is pending is not overtaken by a broadcast committed after it (a channel's
/// position means everything up to it was sent); a channel of the same topic without the
/// binding gets the broadcast at once.
#[tokio::test]
async fn a_channel_gets_its_pending_change_before_a_broadcast_committed_after_it() {
    let name = "t_offpath_order";
    let sidecar = sidecar(name, &[]).await;
    let db = db().await;
    slow_table(&db, "offpath_order", "3").await;
    let mut both = subscriber(sidecar.port, "order", "realtime:mixed", "offpath_order").await;
    let mut plain = Client::connect(sidecar.port, "1.0.0").await;
    plain.join_public("realtime:mixed").await;

    db.execute("INSERT INTO offpath_order VALUES (1, 'first')", &[])
        .await
        .unwrap();
    send(&db, json!({"n": 2}), "second", "mixed").await;
    let m = plain.next_json(30).await.expect("the broadcast");
    assert_eq!(m["payload"]["event"], "second", "{m}");
    assert!(seen_checking(&db, name).await, "the change's check runs");

    let first = both.next_json(30).await.expect("the change");
    assert_eq!(first["event"], "postgres_changes", "{first}");
    assert_eq!(first["payload"]["data"]["record"]["v"], "first");
    let second = both.next_json(30).await.expect("the broadcast");
    assert_eq!(second["payload"]["event"], "second", "{second}");
    drop_table(&db, "offpath_order").await;
}

/// One table's slow check holds one check connection; another table's changes, checked on
/// another, reach their channel meanwhile.
#[tokio::test]
async fn another_table_s_changes_are_not_held_by_one_table_s_slow_check() {
    let name = "t_offpath_tables";
    let sidecar = sidecar(name, &[("CHANGES_CHECK_CONNECTIONS", "2")]).await;
    let db = db().await;
    slow_table(&db, "offpath_slow", "0.002").await;
    slow_table(&db, "offpath_quick", "0").await;
    let mut slow = subscriber(sidecar.port, "slow", "realtime:slow", "offpath_slow").await;
    let mut quick = subscriber(sidecar.port, "quick", "realtime:quick", "offpath_quick").await;

    db.execute(
        "INSERT INTO offpath_slow SELECT g, 'x' FROM generate_series(1, 3000) g",
        &[],
    )
    .await
    .unwrap();
    db.execute("INSERT INTO offpath_quick VALUES (1, 'quick')", &[])
        .await
        .unwrap();
    let m = quick.next_json(30).await.expect("the quick table's change");
    assert_eq!(m["event"], "postgres_changes", "{m}");
    assert_eq!(m["payload"]["data"]["record"]["v"], "quick");
    assert!(
        seen_checking(&db, name).await,
        "the slow table's check was still running"
    );
    let mut changes = 0;
    while changes < 3000 {
        let m = slow
            .next_json(60)
            .await
            .expect("every slow change, in time");
        assert_eq!(m["event"], "postgres_changes", "{m}");
        changes += 1;
    }
    drop_table(&db, "offpath_slow").await;
    drop_table(&db, "offpath_quick").await;
}

/// Frames held behind a pending check count against the connection's MAX_OUTBOUND_FRAMES:
/// a channel whose check takes long while its topic is busy is cut off as a slow client
/// is, and another channel of the topic, reading each message before the next is sent, is
/// not.
#[tokio::test]
async fn a_channel_holding_more_than_its_connection_may_queue_behind_a_slow_check_is_cut_off() {
    let name = "t_offpath_bound";
    let sidecar = sidecar(name, &[("MAX_OUTBOUND_FRAMES", "20")]).await;
    let db = db().await;
    slow_table(&db, "offpath_bound", "20").await;
    let mut held = subscriber(sidecar.port, "bound", "realtime:busy", "offpath_bound").await;
    let mut reader = Client::connect(sidecar.port, "1.0.0").await;
    reader.join_public("realtime:busy").await;

    db.execute("INSERT INTO offpath_bound VALUES (1, 'slow')", &[])
        .await
        .unwrap();
    assert!(seen_checking(&db, name).await, "the change's check runs");
    // One at a time: without the hold the channel's own queue would never hold more
    // than one or two of them.
    for n in 0..25 {
        send(&db, json!({"n": n}), "busy", "busy").await;
        let m = reader.next_json(30).await.expect("the broadcast");
        assert_eq!(m["payload"]["payload"]["n"], n, "{m}");
    }
    let closed = match held.next(30).await {
        Some(tokio_tungstenite::tungstenite::Message::Close(f)) => f,
        Some(other) => panic!("nothing passes the pending check: {other:?}"),
        None => panic!("expected a close frame"),
    };
    assert_eq!(
        closed.expect("close frame").reason.as_str(),
        "too slow: the client did not keep up with its messages"
    );
    assert_eq!(sidecar.metric("realtime_slow_disconnects_total").await, 1.0);
    drop(sidecar);
    // The check of the closed channel's change is still sleeping: end it.
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        &[&name],
    )
    .await
    .unwrap();
    drop_table(&db, "offpath_bound").await;
}

/// The changes waiting for their check are bounded (CHANGES_CHECK_BACKLOG): while one
/// change's check sleeps, a batch of 20 more of the table does not fit a backlog of 10. It
/// is withheld at once, its channel told why, after the change before it (in the channel's
/// order), and nothing of it is sent unchecked.
#[tokio::test]
async fn changes_past_the_check_backlog_are_withheld_with_the_reason() {
    let name = "t_offpath_backlog";
    let sidecar = sidecar(name, &[("CHANGES_CHECK_BACKLOG", "10")]).await;
    let db = db().await;
    slow_table(&db, "offpath_backlog", "2").await;
    let mut c = subscriber(
        sidecar.port,
        "backlog",
        "realtime:backlog",
        "offpath_backlog",
    )
    .await;

    db.execute("INSERT INTO offpath_backlog VALUES (0, 'first')", &[])
        .await
        .unwrap();
    assert!(
        seen_checking(&db, name).await,
        "the first change's check runs"
    );
    db.execute(
        "INSERT INTO offpath_backlog SELECT g, 'more' FROM generate_series(1, 20) g",
        &[],
    )
    .await
    .unwrap();
    let first = c.next_json(30).await.expect("the first change");
    assert_eq!(first["event"], "postgres_changes", "{first}");
    assert_eq!(first["payload"]["data"]["record"]["v"], "first");
    let told = c.next_json(30).await.expect("the notice");
    assert_eq!(told["event"], "system", "{told}");
    assert_eq!(
        told["payload"]["message"],
        "Changes to public.offpath_backlog could not be authorized and were not delivered: \
         more than CHANGES_CHECK_BACKLOG (10) changes, or CHANGES_CHECK_BACKLOG_BYTES \
         (67108864), are waiting for their check"
    );
    assert!(c.next_json(3).await.is_none(), "nothing of it is sent");
    drop_table(&db, "offpath_backlog").await;
}

/// Regression: a table's drained batches were checked one job at a time, each paying the
/// check's fixed cost per identity, so a table of 1,000 subscribers fell behind for good at
/// 100 inserts/s (`pgbench/change_positions.py`). While a check runs, the batches of its
/// table drained meanwhile now wait and are checked together: here five batches drained
/// while the first one's check sleeps are checked in one more check, not five.
#[tokio::test]
async fn batches_drained_while_their_table_is_checked_are_checked_together() {
    let name = "t_offpath_coalesce";
    let sidecar = sidecar(name, &[]).await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS offpath_coalesce;
         CREATE TABLE offpath_coalesce (id bigint PRIMARY KEY, v text);
         ALTER TABLE offpath_coalesce ENABLE ROW LEVEL SECURITY;
         CREATE OR REPLACE FUNCTION offpath_coalesce_ok(v text) RETURNS boolean LANGUAGE plpgsql AS
           $$ BEGIN IF v = 'slow' THEN PERFORM pg_sleep(3); END IF; RETURN true; END $$;
         CREATE POLICY slow ON offpath_coalesce FOR SELECT TO authenticated
             USING (offpath_coalesce_ok(v));
         GRANT SELECT ON offpath_coalesce TO authenticated;
         ALTER PUBLICATION supabase_realtime ADD TABLE offpath_coalesce;",
    )
    .await
    .unwrap();
    let mut c = subscriber(
        sidecar.port,
        "coalesce",
        "realtime:coalesce",
        "offpath_coalesce",
    )
    .await;
    let checks = "realtime_changes_checks_total";
    let before = sidecar.metric(checks).await;
    db.execute("INSERT INTO offpath_coalesce VALUES (1, 'slow')", &[])
        .await
        .unwrap();
    assert!(seen_checking(&db, name).await, "the first check began");
    // Five more rows, each drained as a batch of its own while the first check sleeps.
    for id in 2..=6_i64 {
        let batches = sidecar.metric("realtime_drain_batches_total").await;
        db.execute("INSERT INTO offpath_coalesce VALUES ($1, 'fast')", &[&id])
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while sidecar.metric("realtime_drain_batches_total").await <= batches {
            assert!(Instant::now() < deadline, "row {id} was never drained");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(
        checking(&db, name).await,
        "all five drained while the first check still ran"
    );
    let mut got = Vec::new();
    while got.len() < 6 {
        let m = c.next_json(30).await.expect("the six changes");
        if m["event"] == "postgres_changes" {
            got.push(m["payload"]["data"]["record"]["id"].as_i64().unwrap());
        }
    }
    assert_eq!(got, [1, 2, 3, 4, 5, 6], "in commit order");
    assert_eq!(
        sidecar.metric(checks).await - before,
        2.0,
        "the first batch's check, then one for the five that waited"
    );
    db.batch_execute("DROP TABLE offpath_coalesce; DROP FUNCTION offpath_coalesce_ok(text)")
        .await
        .unwrap();
}

/// Regression: one table's check ran on one connection, so `realtime.visible` set up every
/// identity in turn on one backend (p99 1.75 s at 1,000 inserts/s into a table of 1,000
/// subscribers, `pgbench/changes.py`). Split by identity over CHANGES_CHECK_PARTS (2)
/// connections, two backends check at once: sixteen users whose policy sleeps 0.3 s each
/// take about 2.4 s a part instead of 4.8 s on one.
#[tokio::test]
async fn a_check_of_many_identities_runs_in_parts_at_once() {
    let name = "t_offpath_parts";
    let sidecar = sidecar(name, &[("CHANGES_CHECK_PARTS", "2")]).await;
    let db = db().await;
    slow_table(&db, "offpath_parts", "0.3").await;
    let mut clients = Vec::new();
    for n in 0..16 {
        let topic = format!("realtime:parts{n}");
        clients
            .push(subscriber(sidecar.port, &format!("parts-{n}"), &topic, "offpath_parts").await);
    }
    db.execute("INSERT INTO offpath_parts VALUES (1, 'x')", &[])
        .await
        .unwrap();
    // Sixteen identities in two parts: that all land in one part has odds of 2^-15.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut most = 0;
    while Instant::now() < deadline && most < 2 {
        most = most.max(running_checks(&db, name).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(most, 2, "two connections checked at once");
    for c in &mut clients {
        let m = c.next_json(30).await.expect("the change");
        assert_eq!(m["event"], "postgres_changes", "{m}");
        assert_eq!(m["payload"]["data"]["record"]["id"], 1, "{m}");
    }
    drop_table(&db, "offpath_parts").await;
}
