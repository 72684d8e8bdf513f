//! `realtime.depend_on(catalog, object)`: records that the extension depends on one of the
//! app's objects it uses but does not own (`realtime.messages`, its DEFAULT partition,
//! `realtime.topic()`; see `sql/schema.sql` and `sql/app_objects.sql`). pg_dump orders an
//! object before everything that depends on it, so a restore creates these before
//! `CREATE EXTENSION pg_realtime`, which then adopts them instead of creating its own (and
//! the dump's own CREATE failing). SQL cannot add a dependency; this is the catalog call.

use crate::errors;
use pgrx::prelude::*;

#[pg_extern(volatile, parallel_unsafe)]
fn depend_on(catalog: pg_sys::Oid, object: pg_sys::Oid) {
    // A dependency blocks DROP of the object: only a superuser (the extension's scripts)
    // may add one, whatever grants a database's default privileges hand out.
    if unsafe { !pg_sys::superuser() } {
        errors::fail(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "only a superuser may record pg_realtime's dependencies",
            None,
        );
    }
    let extension = unsafe { pg_sys::get_extension_oid(c"pg_realtime".as_ptr(), false) };
    let depender = pg_sys::ObjectAddress {
        classId: pg_sys::ExtensionRelationId,
        objectId: extension,
        objectSubId: 0,
    };
    let referenced = pg_sys::ObjectAddress {
        classId: catalog,
        objectId: object,
        objectSubId: 0,
    };
    unsafe {
        pg_sys::recordDependencyOn(
            &depender,
            &referenced,
            pg_sys::DependencyType::DEPENDENCY_NORMAL,
        )
    };
}
