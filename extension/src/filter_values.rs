//! A Postgres Changes filter's values rendered as the column's type renders them in JSON,
//! for `realtime.subscribable` (`sql/subscribable.sql`): the sidecar compares a changed
//! record's JSON with these, so `eq.2026-01-01` on a date column matches the record's
//! "2026-01-01".
//!
//! Rendering a value runs code the column's type carries: its input function, and
//! `to_jsonb`'s cast to json when the type's owner made one (a user's enum may have one).
//! That code is the type owner's, and it is fed the client's text: so it runs as the
//! client's role (`as_role`, a security-restricted operation), one value per
//! subtransaction that is rolled back, never as the caller and never as the extension's
//! installer. The type is named by its oid, not by a name: the client's role need not use
//! the schema a column's type lives in to have it rendered, as it need not to read the
//! column.

use crate::identity::{
    as_role, item_error, prepare, role_guard, without_leftover_subxacts, SubXact,
};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{CStr, CString};

/// `{"values": [...]}`, each value's JSON as `to_jsonb` prints it (numbers keep every
/// digit: the text is never parsed here), or `{"value": v, "error": ...}` for the first
/// value the type refuses, or `{"error": ...}` when the role may not be acted as.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."render_filter_values"("role" text, type_oid oid, typmod integer, "values" text[])
RETURNS text
STRICT VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn render_filter_values(
    role: String,
    type_oid: pg_sys::Oid,
    typmod: i32,
    values: Vec<Option<String>>,
) -> String {
    let role = match role_guard(&role) {
        Ok(role) => role,
        Err(why) => return serde_json::json!({ "error": why }).to_string(),
    };
    without_leftover_subxacts(|| unsafe { render(role, type_oid, typmod, &values) })
}

unsafe fn render(
    role: pg_sys::Oid,
    typ: pg_sys::Oid,
    typmod: i32,
    values: &[Option<String>],
) -> String {
    unsafe {
        if pg_sys::SPI_connect() < 0 {
            pgrx::error!("could not connect to SPI");
        }
        let (mut input, mut ioparam) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
        pg_sys::getTypeInputInfo(typ, &mut input, &mut ioparam);
        let plan = prepare("SELECT pg_catalog.to_jsonb($1)::text", &[typ]);
        let mut rendered = Vec::with_capacity(values.len());
        for v in values {
            let refused = |why: &str| serde_json::json!({ "value": v, "error": why }).to_string();
            let Some(text) = v.as_deref().and_then(|t| CString::new(t).ok()) else {
                pg_sys::SPI_finish();
                return refused("a filter value must be a string without NUL");
            };
            let sub = SubXact::begin();
            let (ctx, owner) = (sub.ctx, sub.owner);
            let one = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
                Ok(as_role(role, || {
                    let datum = pg_sys::OidInputFunctionCall(
                        input,
                        text.as_ptr().cast_mut(),
                        ioparam,
                        typmod,
                    );
                    let rc = pg_sys::SPI_execute_plan(
                        plan,
                        [datum].as_ptr().cast_mut(),
                        std::ptr::null(),
                        true,
                        1,
                    );
                    if rc < 0 || pg_sys::SPI_processed != 1 {
                        pgrx::error!("rendering a filter value failed (SPI error {rc})");
                    }
                    let table = pg_sys::SPI_tuptable;
                    let s = pg_sys::SPI_getvalue(*(*table).vals, (*table).tupdesc, 1);
                    if s.is_null() {
                        "null".to_owned()
                    } else {
                        CStr::from_ptr(s).to_string_lossy().into_owned()
                    }
                }))
            }))
            .catch_others(item_error)
            .execute();
            // Nothing the type's code did stays; the rendered text is already copied out.
            SubXact { ctx, owner }.rollback();
            match one {
                Ok(json) => rendered.push(json),
                Err(why) => {
                    pg_sys::SPI_finish();
                    return refused(&why);
                }
            }
        }
        pg_sys::SPI_finish();
        format!("{{\"values\": [{}]}}", rendered.join(", "))
    }
}
