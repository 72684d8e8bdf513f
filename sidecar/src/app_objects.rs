//! What the extension keeps on the app's objects (`sql/app_objects.sql`): its recorded
//! dependencies on `realtime.messages`, `realtime.topic()` and the DEFAULT partition (what
//! lets a dump create them before `CREATE EXTENSION`), and the internal triggers that deliver
//! rows inserted into `realtime.messages` (`extension/src/inserted.rs`). The dump `pg_upgrade`
//! makes carries neither. Each time the drain connects, the sidecar asks
//! `realtime.sync_app_objects()` to make what is missing (a catalog read when nothing is):
//! after a `pg_upgrade`, the first sidecar that reaches the database makes them. Not granted
//! (a login made before 0.4.0), or an extension older than 0.4.0: logged, and the sidecar
//! serves on.

use std::time::Duration;

const SYNC_SQL: &str = "SELECT realtime.sync_app_objects()";

pub async fn sync(client: &tokio_postgres::Client, deadline: Duration) {
    match tokio::time::timeout(deadline, client.execute(SYNC_SQL, &[])).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(
            error = %crate::db_worker::describe(&e),
            "realtime.sync_app_objects() could not be asked: after a pg_upgrade, rows inserted into realtime.messages are not delivered and a dump does not restore until it runs; grant it to this login (scripts/sidecar_login.sql)"
        ),
        Err(_) => tracing::warn!("realtime.sync_app_objects() did not answer in time"),
    }
}
