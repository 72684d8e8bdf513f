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
