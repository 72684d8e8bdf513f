//! `realtime.expire_messages(max_rows)`: the rows the app inserted into `realtime.messages`
//! (`inserted.rs` delivers them) are removed after Supabase's retention, 72 hours after
//! `inserted_at`, in bounded chunks, by the sidecars' expiry round (with
//! `realtime.expire_persisted`). Supabase's server drops its daily partitions after that
//! long; here every row lands in one table or one DEFAULT partition, so rows go one by one.
//!
//! As the table's owner, in a security-restricted operation (`identity::as_role`), never with
//! the caller's rights (the sidecar's login) or the installer's: it sees what the owner sees.
//! In a database Supabase made the owner is `supabase_realtime_admin`, the role Supabase's own
//! janitor drops partitions as. With `session_replication_role = replica`: the only triggers
//! that fire are those the owner made `ENABLE ALWAYS` (its own code); a trigger by a role
//! granted TRIGGER on the table (Supabase grants it to `postgres` and `dashboard_user`) does
//! not, or its code would run with the owner's rights. Every name and operator in the
//! statement is schema-qualified, so nothing on the search path is run.

use crate::identity::as_role;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;

/// How long an inserted row is kept: Supabase's retention of `realtime.messages`.
const RETENTION: &str = "72 hours";

#[pg_extern(volatile, parallel_unsafe)]
fn expire_messages(max_rows: default!(i32, 10000)) -> i32 {
    if max_rows <= 0 {
        crate::errors::invalid("max_rows must be positive", None);
    }
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"realtime".as_ptr(), true);
        let rel = pg_sys::get_relname_relid(c"messages".as_ptr(), nsp);
        if rel == pg_sys::InvalidOid || pg_sys::get_attnum(rel, c"inserted_at".as_ptr()) <= 0 {
            return 0;
        }
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(rel),
        );
        if tuple.is_null() {
            return 0;
        }
        let form = pg_sys::GETSTRUCT(tuple) as pg_sys::Form_pg_class;
        let owner = (*form).relowner;
        pg_sys::ReleaseSysCache(tuple);

        let sql = CString::new(format!(
            "DELETE FROM realtime.messages m \
             USING (SELECT tableoid AS t, ctid AS c FROM realtime.messages \
                    WHERE inserted_at OPERATOR(pg_catalog.<) \
                          (pg_catalog.now() OPERATOR(pg_catalog.-) '{RETENTION}'::pg_catalog.interval)::pg_catalog.timestamp \
                    LIMIT $1) x \
             WHERE m.tableoid OPERATOR(pg_catalog.=) x.t AND m.ctid OPERATOR(pg_catalog.=) x.c"
        ))
        .expect("no NUL");
        if pg_sys::SPI_connect() < 0 {
            pgrx::error!("could not connect to SPI");
        }
        let mut types = [pg_sys::INT4OID];
        let args = [pg_sys::Datum::from(max_rows)];
        // Triggers fire only if the owner made them ALWAYS: in replica mode, as Supabase's
        // janitor fires none (it drops partitions). A role granted TRIGGER on the table must
        // not have its code run with the owner's rights. Restored when the level ends, and
        // by the transaction's abort on an error.
        let level = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"session_replication_role".as_ptr(),
            c"replica".as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        let gone = as_role(owner, || {
            let rc = pg_sys::SPI_execute_with_args(
                sql.as_ptr(),
                1,
                types.as_mut_ptr(),
                args.as_ptr() as *mut pg_sys::Datum,
                std::ptr::null(),
                false,
                0,
            );
            if rc < 0 {
                pgrx::error!("deleting expired rows of realtime.messages failed (SPI error {rc})");
            }
            pg_sys::SPI_processed
        });
        pg_sys::AtEOXact_GUC(true, level);
        pg_sys::SPI_finish();
        gone as i32
    }
}
