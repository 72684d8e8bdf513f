//! pg_realtime: transactional broadcast from Postgres into a shared-memory queue that
//! WebSocket sidecars drain. See `queue.rs` for how messages are ordered and delivered;
//! `capture.rs` for how the row changes of published tables join them (Postgres Changes),
//! `authorize.rs` and `visible.rs` for the batched RLS checks sidecars ask for.

mod app_objects;
mod args;
mod authorize;
mod capture;
mod change;
mod consumer;
mod errors;
mod gucs;
mod history;
mod identity;
mod interest;
mod message;
mod packed;
mod pattern;
mod payload;
mod presence;
mod queue;
mod rerun;
mod returned_rows;
mod ring_pages;
mod row_json;
mod row_trigger;
mod send;
mod shared;
mod stats;
mod trigger;
mod visible;
mod xact;

use pgrx::prelude::*;

pgrx::pg_module_magic!();

extension_sql_file!("../../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!(
    "../../sql/capture.sql",
    name = "capture",
    requires = [capture]
);
extension_sql_file!(
    "../../sql/subscribable.sql",
    name = "subscribable",
    requires = [visible::selectable]
);
extension_sql_file!("../../sql/persisted.sql", name = "persisted");
extension_sql_file!(
    "../../sql/tables.sql",
    name = "tables",
    requires = [visible::selectable]
);
extension_sql_file!(
    "../../sql/presence.sql",
    name = "presence",
    requires = [presence::queue_presence]
);
extension_sql_file!(
    "../../sql/app_objects.sql",
    name = "app_objects",
    requires = [app_objects::depend_on]
);
extension_sql_file!("../../sql/privileges.sql", name = "privileges", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // The queue lives in shared memory sized at postmaster start; a library loaded later
    // (by CREATE EXTENSION or LOAD) could not have it, so refuse to load at all.
    if unsafe { !pg_sys::process_shared_preload_libraries_in_progress } {
        errors::fail(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pg_realtime must be loaded via shared_preload_libraries",
            Some("Add pg_realtime to shared_preload_libraries in postgresql.conf (shared_preload_libraries = 'pg_realtime') and restart the server."),
        );
    }
    gucs::init();
    shared::install_hooks();
    xact::register_callbacks();
}
