//! What the sidecar's login may do, logged once when the sidecar first reaches the database:
//! a warning when the login is a superuser (it needs none of that: `scripts/sidecar_login.sql`
//! makes the least-privilege login, and Supabase's docker-compose gives its `realtime`
//! service `supabase_admin`), and what `realtime.check_privileges()` finds: the rights through which a role could place code where pg_realtime runs it, and
//! whose rights such code would get (README, "Who runs what"). `CREATE EXTENSION` prints the
//! same list once; logged at every start, a right granted later is seen too. Nothing here
//! refuses to serve: none of these rights reaches a superuser's, and on a database Supabase
//! made the list is never empty.

/// At most this many rights are logged one per line; the rest are counted.
const MAX_LOGGED: usize = 100;

const CHECK_SQL: &str = "SELECT role::text AS role, privilege, object, runs_as \
     FROM realtime.check_privileges() ORDER BY 1, 3, 2";

const SUPERUSER_SQL: &str = "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user";

/// Logs the check's rows (or why it could not be asked: an extension older than 0.4.0, a
/// login without EXECUTE on it, or no answer within `deadline`), after a warning when the
/// login is a superuser.
pub async fn log(client: &tokio_postgres::Client, deadline: std::time::Duration) {
    if let Ok(Ok(row)) = tokio::time::timeout(deadline, client.query_one(SUPERUSER_SQL, &[])).await
    {
        if row.get::<_, bool>(0) {
            tracing::warn!("the sidecar's login is a superuser: it needs none of a superuser's rights, and a hole in it would hand them on; log in as the role scripts/sidecar_login.sql makes");
        }
    }
    let rows = match tokio::time::timeout(deadline, client.query(CHECK_SQL, &[])).await {
        Ok(Ok(rows)) => rows,
        Err(_) => {
            tracing::warn!("realtime.check_privileges() did not answer in time; not logged");
            return;
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "realtime.check_privileges() could not be asked: grant it to this login (scripts/sidecar_login.sql) to have the rights that reach pg_realtime's code logged");
            return;
        }
    };
    if rows.is_empty() {
        tracing::info!("no role but a superuser can place code where pg_realtime runs it");
        return;
    }
    for row in rows.iter().take(MAX_LOGGED) {
        let (role, privilege, object, runs_as): (&str, &str, &str, &str) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        tracing::warn!(
            role,
            privilege,
            object,
            runs_as,
            "a role can place code where pg_realtime runs it (realtime.check_privileges())"
        );
    }
    if rows.len() > MAX_LOGGED {
        tracing::warn!(
            more = rows.len() - MAX_LOGGED,
            "more such rights: SELECT * FROM realtime.check_privileges() lists them"
        );
    }
}
