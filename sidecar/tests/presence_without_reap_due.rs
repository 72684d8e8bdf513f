//! Fixed bug (issue 42, b267868, never released): the presence worker prepares its reap once a
//! connection, and a database that refused the statement (an extension without
//! `realtime.presence_reap_due`, older than 0.4.0) made the worker give up its connection
//! and its session, again and again: a joining channel never got its `presence_state`. Now
//! it serves presence without a reaper, as a failing reap did before the statement was
//! prepared.
//!
//! The database is one of this test's own, where the function is taken out of the
//! extension and dropped after the sidecar's login got its grants.

mod common;

use common::*;
use serde_json::json;

const DATABASE: &str = "t_presence_without_reap_due";

fn in_database(dsn: &str) -> String {
    dsn.replace("dbname=postgres", &format!("dbname={DATABASE}"))
}

#[tokio::test]
async fn presence_is_served_when_the_reaper_cannot_be_prepared() {
    assert!(
        sidecar_dsn().contains("dbname=postgres"),
        "{}",
        sidecar_dsn()
    );
    let admin = db().await;
    // Each alone: a batch of statements is one transaction, where neither may run.
    for sql in [
        format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"),
        format!("CREATE DATABASE {DATABASE}"),
    ] {
        admin.batch_execute(&sql).await.unwrap();
    }
    let own = db_at(&in_database(&dsn())).await;
    own.batch_execute("CREATE EXTENSION pg_realtime; CREATE PUBLICATION supabase_realtime")
        .await
        .unwrap();
    own.batch_execute(include_str!("../../scripts/sidecar_login.sql"))
        .await
        .unwrap();
    own.batch_execute(
        "ALTER EXTENSION pg_realtime DROP FUNCTION realtime.presence_reap_due(integer); \
         DROP FUNCTION realtime.presence_reap_due(integer)",
    )
    .await
    .unwrap();

    let url = in_database(&sidecar_dsn());
    let sidecar = Sidecar::start("t_presence_no_reap_due", &[("DATABASE_URL", &url)]).await;
    let mut c = Client::connect(sidecar.port, "1.0.0").await;
    let topic = "realtime:no-reap-due";
    let config = json!({"config": {"presence": {"key": "ann", "enabled": true}}});
    c.push(Some("1"), topic, "phx_join", config).await;
    let reply = c.next_json(10).await.expect("the join's reply");
    assert_eq!(reply["payload"]["status"], "ok", "{reply}");
    let state = c.next_json(10).await;
    assert!(
        state
            .as_ref()
            .is_some_and(|s| s["event"] == "presence_state"),
        "presence_state within 10 s; got {state:?}; the sidecar's log: {}",
        sidecar.log()
    );
    c.push(
        Some("1"),
        topic,
        "presence",
        json!({"type": "presence", "event": "track", "payload": {"n": 1}}),
    )
    .await;
    let mut joined = false;
    for _ in 0..10 {
        match c.next_json(10).await {
            Some(m) if m["event"] == "presence_diff" => {
                joined = m["payload"]["joins"]["ann"]["metas"][0]["n"] == 1;
                break;
            }
            Some(_) => {}
            None => break,
        }
    }
    assert!(
        joined,
        "the track's join; the sidecar's log: {}",
        sidecar.log()
    );
    assert!(
        sidecar
            .log()
            .contains("the presence reaper cannot run on this database"),
        "{}",
        sidecar.log()
    );
    drop(c);
    drop(sidecar);
    drop(own);
    admin
        .batch_execute(&format!("DROP DATABASE {DATABASE} WITH (FORCE)"))
        .await
        .unwrap();
}
