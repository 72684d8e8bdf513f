//! Postgres Changes end to end, where they meet the drain: a captured change is never a
//! broadcast, and a change right after a join reaches it.

mod common;

use common::*;
use serde_json::json;

/// A captured row change is drained like a message but is never a broadcast: it must not
/// reach a channel named after its table (Postgres Changes subscribers get it instead).
#[tokio::test]
async fn a_captured_change_is_never_delivered_as_a_broadcast() {
    let sidecar = Sidecar::start("t_change_not_broadcast", &[]).await;
    let db = db().await;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS change_leak (id int PRIMARY KEY, secret text);
         ALTER PUBLICATION supabase_realtime ADD TABLE change_leak;",
    )
    .await
    .unwrap();
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:change_leak").await;
    db.execute("INSERT INTO change_leak VALUES (1, 'row data')", &[])
        .await
        .unwrap();
    send(&db, json!({"after": true}), "marker", "change_leak").await;
    // Messages arrive in queue order: the marker is the first thing the channel gets.
    let m = c.next_json(5).await.expect("the marker");
    assert_eq!(m["payload"]["event"], "marker", "{m}");
    db.batch_execute("DROP TABLE change_leak").await.unwrap();
}

/// The drain decodes only the tables some channel listens to; a drain already waiting when a
/// channel joins was asked for none. The change committed right after the join's reply comes
/// back undecoded from that drain: it is drained again, decoded, and delivered.
#[tokio::test]
async fn a_change_right_after_subscribed_reaches_a_table_the_drain_in_flight_did_not_decode() {
    let sidecar = Sidecar::start("t_redrain", &[]).await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS redrain;
         CREATE TABLE redrain (id int PRIMARY KEY, note text);
         GRANT SELECT ON redrain TO anon;
         ALTER PUBLICATION supabase_realtime ADD TABLE redrain;",
    )
    .await
    .unwrap();
    let mut c = Client::connect(sidecar.port, "2.0.0").await;
    let binding = json!({"event": "INSERT", "schema": "public", "table": "redrain"});
    let config = json!({"private": false, "postgres_changes": [binding]});
    let reply = c.join("realtime:redrain", config).await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let id = reply["response"]["postgres_changes"][0]["id"].clone();
    let subscribed = c.next_json(5).await.expect("system");
    assert_eq!(
        subscribed["payload"]["message"], "Subscribed to PostgreSQL",
        "{subscribed}"
    );
    db.execute("INSERT INTO redrain VALUES (1, 'first')", &[])
        .await
        .unwrap();
    let m = c.next_json(5).await.expect("the change");
    assert_eq!(m["event"], "postgres_changes", "{m}");
    assert_eq!(m["payload"]["ids"], json!([id]));
    assert_eq!(
        m["payload"]["data"]["record"],
        json!({"id": 1, "note": "first"})
    );
    db.batch_execute("DROP TABLE redrain").await.unwrap();
}

/// The bulk-insert attack: a table whose SELECT policy costs 2 ms per row, one
/// authenticated subscriber, one INSERT of 6,000 rows. Its RLS check needs 12 s, past the
/// client's 10 s call deadline that used to end the drain connection with the batch
/// unconfirmed and drain it again forever (nothing else was delivered). Under a 300 ms
/// CHANGES_CHECK_TIMEOUT_MS the check is cut on the server, the subscriber is told its
/// changes were withheld, the rows decided within the budget arrive, and a broadcast
/// committed right after the insert reaches another client; the connection never drops.
#[tokio::test]
async fn a_bulk_insert_whose_rls_check_outlasts_its_timeout_withholds_and_the_drain_goes_on() {
    let sidecar = Sidecar::start(
        "t_slow_check",
        &[
            ("CHANGES_CHECK_TIMEOUT_MS", "300"),
            ("POLL_MAX_CHANGES", "50"),
        ],
    )
    .await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS slow_items;
         CREATE TABLE slow_items (id bigint PRIMARY KEY, v text);
         ALTER TABLE slow_items ENABLE ROW LEVEL SECURITY;
         CREATE OR REPLACE FUNCTION slow_ok() RETURNS boolean LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(0.002); RETURN true; END $$;
         CREATE POLICY slow ON slow_items FOR SELECT TO authenticated USING (slow_ok());
         GRANT SELECT ON slow_items TO authenticated;
         ALTER PUBLICATION supabase_realtime ADD TABLE slow_items;",
    )
    .await
    .unwrap();
    let mut subscriber = Client::connect_with(sidecar.port, "1.0.0", &user_token("bulk")).await;
    let binding = json!({"event": "*", "schema": "public", "table": "slow_items"});
    let join =
        json!({"config": {"postgres_changes": [binding]}, "access_token": user_token("bulk")});
    let r = subscriber
        .push(Some("1"), "realtime:slow", "phx_join", join)
        .await;
    let reply = subscriber.reply(&r).await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let subscribed = subscriber.next_json(10).await.expect("system");
    assert_eq!(subscribed["payload"]["status"], "ok", "{subscribed}");
    let mut bystander = Client::connect(sidecar.port, "1.0.0").await;
    bystander.join_public("realtime:after_bulk").await;

    db.execute(
        "INSERT INTO slow_items SELECT g, 'x' FROM generate_series(1, 6000) g",
        &[],
    )
    .await
    .unwrap();
    send(&db, json!({"n": 1}), "after", "after_bulk").await;

    // Fail-safe only: the broadcast is due within a second or so.
    let m = bystander
        .next_json(30)
        .await
        .expect("the broadcast after the bulk insert");
    assert_eq!(m["payload"]["event"], "after", "{m}");

    let (mut changes, mut withheld) = (0, Vec::new());
    while let Some(m) = subscriber.next_json(3).await {
        match m["event"].as_str() {
            Some("postgres_changes") => changes += 1,
            Some("system") => withheld.push(m["payload"]["message"].as_str().unwrap().to_owned()),
            _ => panic!("{m}"),
        }
    }
    assert_eq!(
        withheld,
        vec![
            "Changes to public.slow_items could not be authorized and were not delivered: \
              the check took longer than CHANGES_CHECK_TIMEOUT_MS (300 ms)"
        ],
        "told once"
    );
    // What the budget decided (a call of 50 rows takes about 100 ms: 100 rows, 200 ms, with
    // the lookups before, left a slow box no call decided), never all of it.
    assert!(changes > 0 && changes < 6000, "{changes} changes delivered");
    assert_eq!(sidecar.metric("realtime_db_reconnects_total").await, 0.0);
    assert_eq!(
        sidecar.metric("realtime_change_check_failures_total").await,
        1.0
    );
    db.batch_execute("DROP TABLE slow_items; DROP FUNCTION slow_ok()")
        .await
        .unwrap();
}

/// A partition's changes are captured on the leaf, and used to be checked against the
/// leaf's row security and grants: a schema-wide anonymous binding received every row of a
/// partitioned table whose root hides them all (RLS, no policy), because the leaf has no RLS
/// of its own and Supabase's default grants let anon read it. They are checked through the
/// root now: withheld, while a table anon may read still arrives, after it in queue order.
#[tokio::test]
async fn a_partition_s_rows_are_checked_against_its_root_s_row_security() {
    let sidecar = Sidecar::start("t_partition_root", &[]).await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS part_msgs, part_marker;
         CREATE TABLE part_msgs (id bigint, room int, body text, PRIMARY KEY (id, room))
             PARTITION BY LIST (room);
         CREATE TABLE part_msgs_1 PARTITION OF part_msgs FOR VALUES IN (1);
         ALTER TABLE part_msgs ENABLE ROW LEVEL SECURITY;
         GRANT SELECT ON part_msgs, part_msgs_1 TO anon;
         CREATE TABLE part_marker (id int PRIMARY KEY);
         GRANT SELECT ON part_marker TO anon;
         ALTER PUBLICATION supabase_realtime ADD TABLE part_msgs, part_marker;",
    )
    .await
    .unwrap();
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let binding = json!({"event": "INSERT", "schema": "public"});
    let reply = c
        .join(
            "realtime:schema_wide",
            json!({"postgres_changes": [binding]}),
        )
        .await;
    assert_eq!(reply["status"], "ok", "{reply}");
    db.batch_execute(
        "INSERT INTO part_msgs VALUES (1, 1, 'hidden by the root''s policy');
         INSERT INTO part_marker VALUES (1);",
    )
    .await
    .unwrap();
    let mut tables = Vec::new();
    loop {
        let m = c.next_json(10).await.expect("the marker's change");
        if m["event"] != "postgres_changes" {
            continue;
        }
        let table = m["payload"]["data"]["table"].as_str().unwrap().to_owned();
        tables.push(table.clone());
        if table == "part_marker" {
            break;
        }
    }
    assert!(
        !tables.iter().any(|t| t.starts_with("part_msgs")),
        "{tables:?}"
    );
    db.batch_execute("DROP TABLE part_msgs, part_marker")
        .await
        .unwrap();
}

/// A partitioned table's rows are captured on the partition they are written to and named
/// after it, as Supabase names them under a publication's default
/// `publish_via_partition_root = false`: a binding on the partitioned table's own name would
/// never match one, and was refused as missing from the publication it is in. It is refused
/// with the reason now, and a binding on the partition gets its rows.
#[tokio::test]
async fn a_binding_on_a_partitioned_table_is_not_served_with_the_reason_and_its_partition_is() {
    let sidecar = Sidecar::start("t_partition_name", &[]).await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS pname;
         CREATE TABLE pname (id bigint, room int, PRIMARY KEY (id, room)) PARTITION BY LIST (room);
         CREATE TABLE pname_1 PARTITION OF pname FOR VALUES IN (1);
         GRANT SELECT ON pname, pname_1 TO anon;
         ALTER PUBLICATION supabase_realtime ADD TABLE pname;",
    )
    .await
    .unwrap();
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let on = |table: &str| json!({"postgres_changes": [{"event": "INSERT", "schema": "public", "table": table}]});
    // Not served: the channel joins, told why (`postgres_changes::unserved`).
    let told = c.join_unserved("realtime:root", on("pname"), 1).await;
    assert!(
        told[0].contains("table public.pname is partitioned")
            && told[0].contains("bind its partitions"),
        "{told:?}"
    );
    let reply = c.join("realtime:leaf", on("pname_1")).await;
    assert_eq!(reply["status"], "ok", "{reply}");
    db.batch_execute("INSERT INTO pname VALUES (7, 1)")
        .await
        .unwrap();
    let change = loop {
        let m = c.next_json(10).await.expect("the partition's change");
        if m["event"] == "postgres_changes" {
            break m;
        }
    };
    assert_eq!(change["topic"], "realtime:leaf");
    assert_eq!(change["payload"]["data"]["table"], "pname_1");
    assert_eq!(change["payload"]["data"]["record"]["id"], 7);
    db.batch_execute("DROP TABLE pname").await.unwrap();
}

/// On a table with RLS a DELETE is not checked and delivers its key alone, but its
/// filters used to run on the whole old row: a subscriber who may see no row learned,
/// binding by binding, what a deleted row held (`salary=lt.50000`, `salary=lt.100000`, ...).
/// Only filters on the key apply to such a DELETE now.
#[tokio::test]
async fn a_delete_on_an_rls_table_reveals_nothing_through_filters_on_other_columns() {
    let sidecar = Sidecar::start("t_delete_filters", &[]).await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS salaries;
         CREATE TABLE salaries (id bigint PRIMARY KEY, owner text, salary int);
         ALTER TABLE salaries ENABLE ROW LEVEL SECURITY;
         ALTER TABLE salaries REPLICA IDENTITY FULL;
         CREATE POLICY own ON salaries FOR SELECT TO authenticated
             USING (owner = current_setting('request.jwt.claims', true)::jsonb ->> 'sub');
         GRANT SELECT ON salaries TO authenticated;
         ALTER PUBLICATION supabase_realtime ADD TABLE salaries;
         INSERT INTO salaries VALUES (1, 'victim', 42000), (2, 'victim', 99000);",
    )
    .await
    .unwrap();
    let token = user_token("attacker");
    let mut c = Client::connect_with(sidecar.port, "1.0.0", &token).await;
    let bindings = json!([
        {"event": "DELETE", "schema": "public", "table": "salaries", "filter": "salary=lt.50000"},
        {"event": "DELETE", "schema": "public", "table": "salaries", "filter": "salary=lt.100000"},
        {"event": "DELETE", "schema": "public", "table": "salaries", "filter": "id=eq.2"}
    ]);
    let join = json!({"config": {"postgres_changes": bindings}, "access_token": token});
    let r = c
        .push(Some("1"), "realtime:salaries", "phx_join", join)
        .await;
    let reply = c.reply(&r).await;
    assert_eq!(reply["status"], "ok", "{reply}");
    let key_binding = reply["response"]["postgres_changes"][2]["id"].clone();
    db.batch_execute("DELETE FROM salaries WHERE id = 1; DELETE FROM salaries WHERE id = 2;")
        .await
        .unwrap();
    // Row 1 matches only salary filters: nothing. Row 2 matches the key filter: its key,
    // and the ids name that binding alone.
    let m = loop {
        let m = c.next_json(10).await.expect("the delete of row 2");
        if m["event"] == "postgres_changes" {
            break m;
        }
    };
    assert_eq!(m["payload"]["data"]["old_record"], json!({"id": 2}), "{m}");
    assert_eq!(m["payload"]["ids"], json!([key_binding]), "{m}");
    assert!(c.next_json(1).await.is_none());
    db.batch_execute("DROP TABLE salaries").await.unwrap();
}

/// A check that loses its connection (here the drain's backend is terminated in the middle
/// of a long RLS check) used to end the session with the batch unconfirmed, and the next
/// session drained it and ran the same check again, forever if it always failed. Now the
/// channels are told, the rest of the batch goes out, and the next session starts after it:
/// the check runs once.
#[tokio::test]
async fn a_check_that_loses_its_connection_withholds_and_its_batch_is_not_drained_again() {
    // Its own application_name: the backend ended is this sidecar's, not another test's.
    let dsn = format!("{} application_name=t_check_lost", sidecar_dsn());
    let sidecar = Sidecar::start(
        "t_check_lost",
        &[
            ("CHANGES_CHECK_TIMEOUT_MS", "60000"),
            ("POLL_MAX_CHANGES", "100000"),
            ("DATABASE_URL", &dsn),
        ],
    )
    .await;
    let db = db().await;
    db.batch_execute(
        "DROP TABLE IF EXISTS lost_items;
         CREATE TABLE lost_items (id bigint PRIMARY KEY, v text);
         ALTER TABLE lost_items ENABLE ROW LEVEL SECURITY;
         CREATE OR REPLACE FUNCTION lost_slow() RETURNS boolean LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(0.002); RETURN true; END $$;
         CREATE POLICY slow ON lost_items FOR SELECT TO authenticated USING (lost_slow());
         GRANT SELECT ON lost_items TO authenticated;
         ALTER PUBLICATION supabase_realtime ADD TABLE lost_items;",
    )
    .await
    .unwrap();
    let token = user_token("lost");
    let mut subscriber = Client::connect_with(sidecar.port, "1.0.0", &token).await;
    let binding = json!({"event": "*", "schema": "public", "table": "lost_items"});
    let join = json!({"config": {"postgres_changes": [binding]}, "access_token": token});
    let r = subscriber
        .push(Some("1"), "realtime:lost", "phx_join", join)
        .await;
    assert_eq!(subscriber.reply(&r).await["status"], "ok");
    let mut bystander = Client::connect(sidecar.port, "1.0.0").await;
    bystander.join_public("realtime:after_lost").await;
    db.batch_execute(
        "INSERT INTO lost_items SELECT g, 'x' FROM generate_series(1, 3000) g;
         SELECT realtime.send('{\"n\": 1}', 'after', 'after_lost', false);",
    )
    .await
    .unwrap();
    // The check (about 6 s) is running on the drain's backend: end that backend.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let killed: i64 = db
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = 't_check_lost' AND query LIKE '%realtime.visible%' \
                 AND state = 'active'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if killed > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no check ran");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let m = bystander
        .next_json(30)
        .await
        .expect("the broadcast of the same batch");
    let m = if m["event"] == "system" {
        // The drain connection's loss and return are told to every channel.
        let mut m = m;
        while m["event"] == "system" {
            m = bystander.next_json(30).await.expect("the broadcast");
        }
        m
    } else {
        m
    };
    assert_eq!(m["payload"]["event"], "after", "{m}");
    let mut withheld = 0;
    while let Some(m) = subscriber.next_json(3).await {
        let text = m["payload"]["message"].as_str().unwrap_or_default();
        if text.starts_with("Changes to public.lost_items could not be authorized") {
            withheld += 1;
        }
        assert_ne!(
            m["event"], "postgres_changes",
            "the batch was drained again: {m}"
        );
    }
    assert_eq!(withheld, 1, "the check ran once");
    let running: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 't_check_lost' \
             AND query LIKE '%realtime.visible%' AND state = 'active'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(running, 0, "no check of the same batch again");
    assert_eq!(
        sidecar.metric("realtime_change_check_failures_total").await,
        1.0
    );
    db.batch_execute("DROP TABLE lost_items; DROP FUNCTION lost_slow()")
        .await
        .unwrap();
}
