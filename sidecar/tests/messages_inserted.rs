//! What the dump pg_upgrade makes does not carry: the internal triggers that deliver rows
//! inserted into realtime.messages, and the extension's recorded dependencies on the app's
//! objects. The sidecar makes them again when its drain connects (src/app_objects.rs).

mod common;

use common::*;
use std::time::{Duration, Instant};

const DROP_DEPENDENCY: &str = "DELETE FROM pg_depend \
     WHERE classid = 'pg_extension'::regclass AND refobjid = 'realtime.messages'::regclass;";

const DEPENDENCY_SQL: &str = "SELECT count(*) FROM pg_depend \
     WHERE classid = 'pg_extension'::regclass AND refobjid = 'realtime.messages'::regclass";

const COUNT_SQL: &str = "SELECT count(*) FROM pg_trigger \
     WHERE tgrelid = 'realtime.messages'::regclass AND tgisinternal \
       AND tgfoid = 'realtime.deliver_inserted()'::regprocedure";

#[tokio::test]
async fn a_sidecar_makes_what_a_pg_upgrade_left_out() {
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
    // What a pg_upgrade leaves: the table without its delivery trigger, the extension without
    // its dependency on the table.
    db.batch_execute(&format!(
        "DROP TRIGGER {name} ON realtime.messages; {DROP_DEPENDENCY}"
    ))
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
    let dependencies: i64 = db.query_one(DEPENDENCY_SQL, &[]).await.unwrap().get(0);
    assert_eq!(
        dependencies, 1,
        "the extension's dependency on realtime.messages"
    );
    assert!(!sidecar.log().contains("sync_app_objects"));
}
