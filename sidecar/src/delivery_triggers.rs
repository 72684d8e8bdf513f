//! The delivery triggers of `realtime.messages` (`extension/src/inserted.rs`: rows the app
//! inserts there are delivered at commit) are internal, so that no dump carries them; but
//! neither does the dump `pg_upgrade` makes. Each time the drain connects, the sidecar asks
//! `realtime.sync_delivery()` to make any that are missing (a catalog read when none is):
//! after a `pg_upgrade`, the first sidecar that reaches the database makes them. Not
//! granted (a login made before 0.4.0), or an extension older than 0.4.0: logged, and the
//! sidecar serves on.

use std::time::Duration;

const SYNC_SQL: &str = "SELECT realtime.sync_delivery()";

pub async fn sync(client: &tokio_postgres::Client, deadline: Duration) {
    match tokio::time::timeout(deadline, client.execute(SYNC_SQL, &[])).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(
            error = %crate::db_worker::describe(&e),
            "realtime.sync_delivery() could not be asked: after a pg_upgrade, rows inserted into realtime.messages are not delivered until it runs; grant it to this login (scripts/sidecar_login.sql)"
        ),
        Err(_) => tracing::warn!("realtime.sync_delivery() did not answer in time"),
    }
}
