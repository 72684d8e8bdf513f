//! Raising Postgres errors with a code, a message and a hint in one call.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// Raises an ERROR; the transaction (or subtransaction) aborts and nothing it sent survives.
pub fn fail(code: PgSqlErrorCode, message: impl Into<String>, hint: Option<&str>) -> ! {
    let mut report = ErrorReport::new(code, message.into(), "pg_realtime");
    if let Some(h) = hint {
        report = report.set_hint(h);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR returned")
}

pub fn invalid(message: impl Into<String>, hint: Option<&str>) -> ! {
    fail(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        message,
        hint,
    )
}

pub fn null_arg(what: &str) -> ! {
    fail(
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{what} must not be NULL"),
        None,
    )
}
