//! pg_realtime: transactional broadcast from Postgres into a shared-memory queue that
//! WebSocket sidecars drain. See `queue.rs` for how messages are ordered and delivered;
//! `capture.rs` for how the row changes of published tables join them (Postgres Changes),
//! `authorize.rs` and `visible.rs` for the batched RLS checks sidecars ask for.
//!
//! Who runs what. A superuser installs the extension, and none of its functions hands that
//! superuser's rights to code another role controls (a trigger, a cast, a domain's CHECK, a
//! type's input function, an overload, SQL kept in a table). Every function runs as its
//! caller (the sidecar's login, or the app's role for `send`), and a step that meets code
//! another role controls first switches to the role whose rights it needs, in a
//! security-restricted operation (`identity::as_role`):
//! * `authorize`: the read probe's row is inserted as `realtime_prober` (NOLOGIN, BYPASSRLS,
//!   USAGE on schema realtime and INSERT on `realtime.messages`, nothing else), so a trigger
//!   on the table or a partition gets those rights inside a probe that is rolled back; the
//!   probes' SELECT and the write probe's INSERT run as the client's role.
//! * `visible`: the records' keys are read into the table's row type, and the lookup is
//!   planned and run, as the subscriber's role.
//! * `subscribable` (SQL) renders a filter's values through `filter_values.rs`, as the
//!   binding's role; it and `selectable` read only catalogs, as the caller, and call the
//!   extension's functions by their exact signatures.
//! * `sync_capture` and `sync_app_objects` (SQL; the event trigger, and the sidecar's login at
//!   each connection) are the SECURITY DEFINER functions, owned by the installing superuser:
//!   recording a dependency and creating a trigger on another role's table need it, and they
//!   run catalog reads, `CREATE`/`DROP TRIGGER realtime_capture`, `depend_on` and the catalog
//!   call that makes the internal delivery trigger of `realtime.messages` (`inserted.rs`),
//!   nothing else.
//! * `deliver_inserted` (that trigger) runs as the role that inserted the row, and reads it.
//! * `expire_messages` deletes `realtime.messages` rows past Supabase's 72 hours as the
//!   table's owner (`messages_expiry.rs`).
//! * `restore_replaced_functions` (SQL, the way back to Supabase's server) renames
//!   Supabase's functions back; it executes no stored text.
//!
//! `realtime.check_privileges()` (`sql/check_privileges.sql`) lists the rights through which
//! a role could still place code where these steps run it, and whose rights it would get.

mod app_objects;
mod args;
mod authorize;
mod capture;
mod change;
mod consumer;
mod dropped;
mod errors;
mod filter_values;
mod gucs;
mod history;
mod identity;
mod inserted;
mod interest;
mod interest_table;
mod json_str;
mod message;
mod messages_expiry;
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
mod send_policy;
mod shared;
mod stats;
mod sync_hold;
mod trigger;
mod visible;
mod wake;
mod xact;

use pgrx::prelude::*;

pgrx::pg_module_magic!();

extension_sql_file!("../../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!(
    "../../sql/app_objects.sql",
    name = "app_objects",
    requires = [
        app_objects::depend_on,
        inserted::deliver_inserted,
        inserted::add_delivery_trigger,
        messages_expiry::expire_messages
    ]
);
extension_sql_file!(
    "../../sql/capture.sql",
    name = "capture",
    requires = [capture, "app_objects"]
);
extension_sql_file!(
    "../../sql/subscribable.sql",
    name = "subscribable",
    requires = [visible::selectable, filter_values::render_filter_values]
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
extension_sql_file!("../../sql/check_privileges.sql", name = "check_privileges");
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
