//! Rows inserted into realtime.messages are delivered by internal triggers, which the dump
//! pg_upgrade makes does not carry: the sidecar makes them again when its drain connects
//! (src/delivery_triggers.rs).

mod common;

use common::*;
use std::time::{Duration, Instant};

const COUNT_SQL: &str = "SELECT count(*) FROM pg_trigger \
     WHERE tgrelid = 'realtime.messages'::regclass AND tgisinternal \
       AND tgfoid = 'realtime.deliver_inserted()'::regprocedure";

#[tokio::test]
async fn a_sidecar_makes_the_delivery_triggers_a_pg_upgrade_left_out() {
    let db = db().await;
    let name: String = db
        .query_one(
            "SELECT tgname::text FROM pg_trigger \
             WHERE tgrelid = 'realtime.messages'::regclass \
               AND tgfoid = 'realtime.deliver_inserted()'::regprocedure",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // What a pg_upgrade leaves: the table without its delivery trigger.
    db.batch_execute(&format!("DROP TRIGGER {name} ON realtime.messages"))
        .await
        .unwrap();
    let gone: i64 = db.query_one(COUNT_SQL, &[]).await.unwrap().get(0);
    assert_eq!(gone, 0);
    let sidecar = Sidecar::start("t_messages_inserted_sync", &[]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = db.query_one(COUNT_SQL, &[]).await.unwrap().get(0);
        if n == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sidecar did not make the trigger again: {}",
            sidecar.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!sidecar.log().contains("sync_delivery"));
}
