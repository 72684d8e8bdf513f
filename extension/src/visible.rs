//! Batched visibility for Postgres Changes: `realtime.visible(entity, roles, claims,
//! records)` says which changed rows each subscriber identity may see under the table's
//! row-level security, as Supabase's `apply_rls` decides it, in one call per batch.
//!
//! Supabase runs one primary-key lookup per subscriber per change, as the subscriber's role
//! with its claims (`SELECT EXISTS (SELECT 1 FROM entity WHERE pk = <value>)`). Here each
//! distinct identity is set once (a subtransaction, the role guard of `identity.rs`, the
//! same `request.jwt.*` settings as `realtime.authorize`) and asks once for all the
//! records: the rows of `entity` whose primary key equals that of a record, under RLS. So
//! 1,000 identities and 100 changed rows are 1,000 queries, not 100,000. A policy that
//! raises, or a role that may not read the table, fails that identity only (its error is
//! returned); every setting is rolled back.
//!
//! Returns (identity, record) for each visible pair, 1-based positions in the arrays, and
//! (identity, NULL, error) for an identity that could not be asked.

use crate::errors;
use crate::identity::{interrupts_call, prepare, role_guard, set_identity, SubXact};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::IntoDatum;
use std::ffi::CStr;

/// The first column of each row `sql` returns for the argument `entity` (an oid), as text.
/// Runs in this call's SPI connection, as the function's owner.
unsafe fn texts(sql: &str, entity: pg_sys::Oid) -> Vec<String> {
    unsafe {
        let plan = prepare(sql, &[pg_sys::OIDOID]);
        // Every row: a composite primary key read as its first column alone would make the
        // lookup match rows by part of their key.
        let args = [pg_sys::Datum::from(entity)];
        let rc =
            pg_sys::SPI_execute_plan(plan, args.as_ptr().cast_mut(), std::ptr::null(), true, 0);
        if rc < 0 {
            pgrx::error!("catalog lookup failed (SPI error {rc})");
        }
        let table = pg_sys::SPI_tuptable;
        (0..pg_sys::SPI_processed as usize)
            .filter_map(|n| {
                let v = pg_sys::SPI_getvalue(*(*table).vals.add(n), (*table).tupdesc, 1);
                (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
            })
            .collect()
    }
}

/// The lookup of `entity`'s rows by the primary keys of a text[] of JSON records.
unsafe fn lookup_sql(entity: pg_sys::Oid) -> Result<String, String> {
    unsafe {
        let table = texts("SELECT $1::regclass::text", entity);
        let key = texts(
            "SELECT quote_ident(a.attname::text) FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
             WHERE i.indrelid = $1 AND i.indisprimary ORDER BY a.attnum",
            entity,
        );
        let Some(table) = table.first() else {
            return Err(format!(
                "relation with OID {} does not exist",
                entity.to_u32()
            ));
        };
        if key.is_empty() {
            return Err("Error 400: Bad Request, no primary key".into());
        }
        let same = key
            .iter()
            .map(|c| format!("t.{c} = r.{c}"))
            .collect::<Vec<_>>()
            .join(" AND ");
        Ok(format!(
            "SELECT k.i::int FROM unnest($1::text[]) WITH ORDINALITY AS k(rec, i), \
             LATERAL jsonb_populate_record(NULL::{table}, k.rec::jsonb) AS r \
             WHERE EXISTS (SELECT 1 FROM {table} t WHERE {same})"
        ))
    }
}

type Row = (i32, Option<i32>, Option<String>);

fn evaluate(
    entity: pg_sys::Oid,
    identities: &[(String, String)],
    records: &[Option<String>],
    out: &mut Vec<Row>,
) {
    unsafe {
        if pg_sys::SPI_connect() < 0 {
            pgrx::error!("could not connect to SPI");
        }
        let sql = match lookup_sql(entity) {
            Ok(sql) => sql,
            Err(why) => {
                for i in 0..identities.len() {
                    out.push((i as i32 + 1, None, Some(why.clone())));
                }
                pg_sys::SPI_finish();
                return;
            }
        };
        let plan = prepare(&sql, &[pg_sys::TEXTARRAYOID]);
        let arg = records.to_vec().into_datum().expect("an array of records");
        let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        for (i, (role_name, claims)) in identities.iter().enumerate() {
            let at = i as i32 + 1;
            let role = match role_guard(role_name) {
                Ok(role) => role,
                Err(why) => {
                    out.push((at, None, Some(why)));
                    continue;
                }
            };
            let sub = SubXact::begin();
            let (ctx, owner) = (sub.ctx, sub.owner);
            let seen = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
                set_identity(role_name, claims, "{}");
                pg_sys::SetUserIdAndSecContext(
                    role,
                    saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
                );
                let rc = pg_sys::SPI_execute_plan(
                    plan,
                    [arg].as_ptr().cast_mut(),
                    std::ptr::null(),
                    false,
                    0,
                );
                if rc < 0 {
                    pgrx::error!("visibility lookup failed (SPI error {rc})");
                }
                let table = pg_sys::SPI_tuptable;
                let mut seen = Vec::with_capacity(pg_sys::SPI_processed as usize);
                for n in 0..pg_sys::SPI_processed as usize {
                    let tuple = *(*table).vals.add(n);
                    let mut isnull = false;
                    let d = pg_sys::SPI_getbinval(tuple, (*table).tupdesc, 1, &mut isnull);
                    if !isnull {
                        seen.push(d.value() as i32);
                    }
                }
                Ok(seen)
            }))
            .catch_others(|e| {
                let report = match &e {
                    pg_sys::panic::CaughtError::PostgresError(r)
                    | pg_sys::panic::CaughtError::ErrorReport(r) => r,
                    pg_sys::panic::CaughtError::RustPanic { ereport, .. } => ereport,
                };
                if interrupts_call(report.sql_error_code()) {
                    e.rethrow();
                }
                Err(report.message().to_owned())
            })
            .execute();
            pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
            SubXact { ctx, owner }.rollback();
            match seen {
                Ok(rows) => out.extend(rows.into_iter().map(|r| (at, Some(r), None))),
                Err(why) => out.push((at, None, Some(why))),
            }
        }
        pg_sys::SPI_finish();
    }
}

#[pg_extern(sql = r#"
CREATE FUNCTION realtime."visible"(entity regclass, roles text[], claims text[], records text[])
RETURNS TABLE(identity integer, record integer, error text)
STRICT VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
#[allow(clippy::type_complexity)]
fn visible(
    entity: pg_sys::Oid,
    roles: Vec<Option<String>>,
    claims: Vec<Option<String>>,
    records: Vec<Option<String>>,
) -> TableIterator<
    'static,
    (
        name!(identity, i32),
        name!(record, Option<i32>),
        name!(error, Option<String>),
    ),
> {
    if roles.len() != claims.len() {
        errors::invalid("realtime.visible needs as many claims as roles", None);
    }
    let identities: Vec<(String, String)> = roles
        .into_iter()
        .zip(claims)
        .enumerate()
        .map(|(i, (role, claims))| {
            let Some(role) = role else {
                errors::invalid(format!("roles[{}] must not be NULL", i + 1), None)
            };
            (role, claims.unwrap_or_else(|| "{}".into()))
        })
        .collect();
    let mut out = Vec::new();
    // As in realtime.authorize: an error that ends the call leaves no subtransaction open.
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    let (ctx, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        evaluate(entity, &identities, &records, &mut out)
    }))
    .catch_others(|e| unsafe {
        while pg_sys::GetCurrentTransactionNestLevel() > level {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(ctx);
        pg_sys::CurrentResourceOwner = owner;
        e.rethrow()
    })
    .execute();
    TableIterator::new(out)
}
