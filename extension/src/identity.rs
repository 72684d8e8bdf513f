//! Acting as a client's identity inside the database: the subtransactions that undo every
//! setting, the role guard (which roles a sidecar may act as), the switch to a role for one
//! step (`as_role`), the probe role (`prober`), and running prepared probes. Shared by the
//! batched channel authorization (`authorize.rs`), the batched visibility of Postgres
//! Changes (`visible.rs`) and the rendering of filter values (`filter_values.rs`).
//!
//! None of the functions that use these is `SECURITY DEFINER`: each runs as its caller (the
//! sidecar's login), and every step that runs code another role controls (a policy, a
//! trigger, a domain CHECK, a type's input function, a cast to json) runs after `as_role`
//! has switched to the role whose rights that step needs, and no more: the client's role,
//! or `realtime_prober` for the read probe's row. `lib.rs` tells the whole story.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;

/// A subtransaction that keeps the caller's memory context and resource owner, as PL/pgSQL's
/// exception blocks do.
pub(crate) struct SubXact {
    pub(crate) ctx: pg_sys::MemoryContext,
    pub(crate) owner: pg_sys::ResourceOwner,
}

impl SubXact {
    pub(crate) unsafe fn begin() -> SubXact {
        unsafe {
            let s = SubXact {
                ctx: pg_sys::CurrentMemoryContext,
                owner: pg_sys::CurrentResourceOwner,
            };
            pg_sys::BeginInternalSubTransaction(std::ptr::null());
            pg_sys::MemoryContextSwitchTo(s.ctx);
            s
        }
    }

    /// Commits the subtransaction into its parent: what it made (SPI results included) stays.
    pub(crate) unsafe fn release(self) {
        unsafe {
            pg_sys::ReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(self.ctx);
            pg_sys::CurrentResourceOwner = self.owner;
        }
    }

    pub(crate) unsafe fn rollback(self) {
        unsafe {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(self.ctx);
            pg_sys::CurrentResourceOwner = self.owner;
        }
    }
}

pub(crate) unsafe fn set_local(name: &str, value: &str) {
    let name = CString::new(name).expect("setting name");
    let value = CString::new(value.replace('\0', "")).expect("no NUL");
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            0,
            false,
        );
    }
}

/// The settings policies read as `auth.jwt()`, `auth.uid()`, `auth.role()` and
/// `request.headers`, as Supabase sets them for its probes (local to the subtransaction).
pub(crate) unsafe fn set_identity(role: &str, claims: &str, headers: &str) {
    let sub = serde_json::from_str::<serde_json::Value>(claims)
        .ok()
        .and_then(|c| c.get("sub").and_then(|s| s.as_str()).map(str::to_owned))
        .unwrap_or_default();
    unsafe {
        set_local("request.jwt.claims", claims);
        set_local("request.jwt.claim.sub", &sub);
        set_local("request.jwt.claim.role", role);
        set_local("request.headers", headers);
    }
}

pub(crate) unsafe fn prepare(sql: &str, types: &[pg_sys::Oid]) -> pg_sys::SPIPlanPtr {
    unsafe { prepare_with(sql, types, 0) }
}

/// A statement run once per identity of a batch: always its generic plan. Left to choose,
/// the plan cache keeps planning it afresh (a custom plan) for every execution whose
/// arguments look cheaper than the generic estimate, as one identity's few records do:
/// 1,000 identities then cost 1,000 plannings, three times the lookups themselves.
pub(crate) unsafe fn prepare_generic(sql: &str, types: &[pg_sys::Oid]) -> pg_sys::SPIPlanPtr {
    unsafe { prepare_with(sql, types, pg_sys::CURSOR_OPT_GENERIC_PLAN as i32) }
}

unsafe fn prepare_with(sql: &str, types: &[pg_sys::Oid], options: i32) -> pg_sys::SPIPlanPtr {
    let sql = CString::new(sql).unwrap();
    unsafe {
        let plan = pg_sys::SPI_prepare_cursor(
            sql.as_ptr(),
            types.len() as i32,
            types.as_ptr() as *mut pg_sys::Oid,
            options,
        );
        if plan.is_null() {
            pgrx::error!("could not prepare a probe");
        }
        plan
    }
}

pub(crate) fn text_datum(s: &str) -> pg_sys::Datum {
    pg_sys::Datum::from(pgrx::varlena::rust_str_to_text_p(s).into_pg())
}

/// Runs one prepared probe; returns the number of rows it returned or inserted.
pub(crate) unsafe fn run(plan: pg_sys::SPIPlanPtr, args: &[pg_sys::Datum]) -> u64 {
    unsafe {
        let rc = pg_sys::SPI_execute_plan(
            plan,
            args.as_ptr() as *mut pg_sys::Datum,
            std::ptr::null(),
            false,
            1,
        );
        if rc < 0 {
            pgrx::error!("a probe failed (SPI error {rc})");
        }
        pg_sys::SPI_processed
    }
}

/// The role a request may run its probe as, or why not. As PostgREST's authenticator, the
/// sidecar may act only as roles its login role (`session_user`, not this function's owner)
/// has been granted, and never as a superuser: otherwise a JWT signed with the project's
/// secret but naming `postgres` would open every private topic. Superuser logins get no
/// shortcut here; they too need the grants.
pub(crate) fn role_guard(name: &str) -> Result<pg_sys::Oid, String> {
    let Ok(c_name) = CString::new(name) else {
        return Err(format!("role \"{}\" does not exist", name.escape_default()));
    };
    unsafe {
        let role = pg_sys::get_role_oid(c_name.as_ptr(), true);
        if role == pg_sys::InvalidOid {
            return Err(format!("role \"{name}\" does not exist"));
        }
        if pg_sys::superuser_arg(role) {
            return Err(format!(
                "role \"{name}\" is a superuser: realtime clients may not act as one"
            ));
        }
        let login = pg_sys::GetSessionUserId();
        if !pg_sys::is_member_of_role_nosuper(login, role) {
            let login_name = std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(login, false))
                .to_string_lossy()
                .into_owned();
            return Err(format!(
                "role \"{name}\" is not granted to the sidecar's login role \"{login_name}\" (GRANT \"{name}\" TO \"{login_name}\" lets its clients act as it)"
            ));
        }
        Ok(role)
    }
}

/// Runs `f` as `role`, as PostgreSQL runs a SECURITY DEFINER function or a maintenance
/// command's index expressions: `SET ROLE`, `SET SESSION AUTHORIZATION` and the other session
/// changes a security-restricted operation refuses are refused to whatever `f` runs, so code
/// of another role's cannot step back into the caller's rights. The user is restored when
/// `f` returns; if `f` raises, the rollback of the enclosing (sub)transaction restores it.
pub(crate) unsafe fn as_role<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    unsafe {
        let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(
            role,
            saved_context
                | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
        );
        let out = f();
        pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
        out
    }
}

/// The role the read probe's row is inserted as (`authorize.rs`): `CREATE EXTENSION` makes
/// it with nothing but BYPASSRLS and INSERT on `realtime.messages`, so a trigger on that
/// table or a partition runs with those rights and no more. Refused if it is missing or has
/// been made a superuser, which would hand such a trigger a superuser's rights again.
pub(crate) fn prober() -> pg_sys::Oid {
    unsafe {
        let role = pg_sys::get_role_oid(c"realtime_prober".as_ptr(), true);
        if role == pg_sys::InvalidOid {
            crate::errors::fail(
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                "role \"realtime_prober\" does not exist: pg_realtime inserts its read probes as it",
                Some("ALTER EXTENSION pg_realtime UPDATE creates it, as CREATE EXTENSION does."),
            );
        }
        if pg_sys::superuser_arg(role) {
            crate::errors::fail(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                "role \"realtime_prober\" is a superuser: triggers on realtime.messages would run with a superuser's rights in every read probe",
                Some("ALTER ROLE realtime_prober NOSUPERUSER;"),
            );
        }
        role
    }
}

/// Errors that end the whole call: the statement was cancelled or timed out, or the server
/// is shutting down (SQLSTATE class 57).
pub(crate) fn interrupts_call(code: PgSqlErrorCode) -> bool {
    matches!(
        code,
        PgSqlErrorCode::ERRCODE_QUERY_CANCELED
            | PgSqlErrorCode::ERRCODE_ADMIN_SHUTDOWN
            | PgSqlErrorCode::ERRCODE_CRASH_SHUTDOWN
            | PgSqlErrorCode::ERRCODE_OPERATOR_INTERVENTION
            | PgSqlErrorCode::ERRCODE_CANNOT_CONNECT_NOW
            | PgSqlErrorCode::ERRCODE_DATABASE_DROPPED
    )
}

/// Runs `f`, which opens subtransactions of its own; whatever error escapes it (a cancel, a
/// statement_timeout, an internal failure) first rolls back every subtransaction it left
/// open, so the caller's transaction fails as any statement fails instead of being left in
/// an aborted block.
pub(crate) fn without_leftover_subxacts<R>(f: impl FnOnce() -> R) -> R {
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    let (ctx, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    PgTryBuilder::new(std::panic::AssertUnwindSafe(f))
        .catch_others(|e| unsafe {
            while pg_sys::GetCurrentTransactionNestLevel() > level {
                pg_sys::RollbackAndReleaseCurrentSubTransaction();
            }
            pg_sys::MemoryContextSwitchTo(ctx);
            pg_sys::CurrentResourceOwner = owner;
            e.rethrow()
        })
        .execute()
}

/// A caught error as one item's answer (one identity's, one value's, one role's reads):
/// its message. A cancel, a statement_timeout or a shutdown is about the whole call, not
/// the item: it is raised again and ends the call.
pub(crate) fn item_error<T>(e: pg_sys::panic::CaughtError) -> Result<T, String> {
    if interrupts_call(report(&e).sql_error_code()) {
        e.rethrow();
    }
    Err(report(&e).message().to_owned())
}

/// The error report of a caught error, whatever raised it.
pub(crate) fn report(e: &pg_sys::panic::CaughtError) -> &pg_sys::panic::ErrorReportWithLevel {
    match e {
        pg_sys::panic::CaughtError::PostgresError(r)
        | pg_sys::panic::CaughtError::ErrorReport(r) => r,
        pg_sys::panic::CaughtError::RustPanic { ereport, .. } => ereport,
    }
}
