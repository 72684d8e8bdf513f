//! Batched visibility for Postgres Changes: `realtime.visible(entity, roles, claims,
//! records)` says which changed rows each subscriber identity may see under the table's
//! row-level security, as Supabase's `apply_rls` decides it, in one call per batch.
//!
//! Supabase runs one primary-key lookup per subscriber per change, as the subscriber's role
//! with its claims (`SELECT EXISTS (SELECT 1 FROM entity WHERE pk = <value>)`). Here the
//! records' keys are read once per role, as that role (a domain's CHECK on the key is the
//! domain owner's code: it never runs with more rights than the subscriber's), and each
//! distinct identity is set once (a subtransaction, the role guard of `identity.rs`, the
//! same `request.jwt.*` settings as `realtime.authorize`) and asks once for all the
//! records: the rows of `entity` whose primary key equals that of a record, under RLS. So
//! 1,000 identities and 100 changed rows are 1,000 queries, not 100,000. A policy that
//! raises, or a role that may not read the table, fails that identity only (its error is
//! returned); every setting is rolled back.
//!
//! Returns (identity, record) for each visible pair, 1-based positions in the arrays, and
//! (identity, NULL, error) for an identity that could not be asked. With `asked`, a flat list
//! of (identity, record) pairs, each identity is asked only about its records: the sidecar
//! passes the pairs its subscribers' filters let through, so a subscriber of one room is not
//! asked about every room's rows.
//!
//! `realtime.selectable(entity, roles)` gives the other half of what a subscriber may see:
//! the columns its role may SELECT (the rest are left out of the record it receives).

use crate::errors;
use crate::identity::{
    as_role, item_error, prepare, prepare_generic, role_guard, set_identity,
    without_leftover_subxacts, SubXact,
};
use crate::returned_rows::ReturnedRows;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::IntoDatum;
use std::ffi::CStr;

/// The first column of each row `sql` returns for the oid arguments `args`, as text. Runs in
/// this call's SPI connection, as the caller (catalog reads only).
unsafe fn texts(sql: &str, args: &[pg_sys::Oid]) -> Vec<String> {
    unsafe {
        let plan = prepare(sql, &vec![pg_sys::OIDOID; args.len()]);
        // Every row: a composite primary key read as its first column alone would make the
        // lookup match rows by part of their key.
        let values: Vec<pg_sys::Datum> = args.iter().map(|&a| pg_sys::Datum::from(a)).collect();
        let rc =
            pg_sys::SPI_execute_plan(plan, values.as_ptr().cast_mut(), std::ptr::null(), true, 0);
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

const PRIMARY_KEY_SQL: &str = "SELECT a.attname::text FROM pg_index i \
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
     WHERE i.indrelid = $1 AND i.indisprimary ORDER BY a.attnum";

/// The primary key's columns, each as "<array type oid> <name>".
const KEY_TYPES_SQL: &str = "SELECT t.typarray::text || ' ' || a.attname FROM pg_index i \
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
     JOIN pg_type t ON t.oid = a.atttypid \
     WHERE i.indrelid = $1 AND i.indisprimary ORDER BY a.attnum";

/// What the catalogs say of `entity`, read once per call as the caller: its name as SQL
/// names it, and its primary key's columns, each as (array type, quoted name).
struct Table {
    oid: pg_sys::Oid,
    name: String,
    key: Vec<(pg_sys::Oid, String)>,
}

unsafe fn table(entity: pg_sys::Oid) -> Result<Table, String> {
    unsafe {
        let name = texts("SELECT $1::regclass::text", &[entity]);
        let Some(name) = name.first() else {
            return Err(format!(
                "relation with OID {} does not exist",
                entity.to_u32()
            ));
        };
        let key: Vec<(pg_sys::Oid, String)> = texts(KEY_TYPES_SQL, &[entity])
            .iter()
            .filter_map(|t| {
                let (oid, name) = t.split_once(' ')?;
                Some((
                    pg_sys::Oid::from(oid.parse::<u32>().ok()?),
                    quote_ident(name),
                ))
            })
            .collect();
        if key.is_empty() {
            return Err("Error 400: Bad Request, no primary key".into());
        }
        if key.iter().any(|(array, _)| *array == pg_sys::InvalidOid) {
            return Err("the primary key has a type without an array type".into());
        }
        Ok(Table {
            oid: entity,
            name: name.clone(),
            key,
        })
    }
}

/// What a record is asked about.
#[derive(Clone, Copy, PartialEq)]
enum Asked {
    /// Whether the row with its primary key is visible now (`realtime.visible`).
    Key,
    /// Whether the row with its primary key is visible now and still holds, in every
    /// column the role may read, the values the record holds (`realtime.visible_current`).
    Version,
}

/// How one role looks `entity`'s rows up: a statement taking the record numbers to ask
/// about (int[]) and, per key column, the records' key values as an array of that column's
/// type, read from the JSON records once per role rather than once per identity.
struct Lookup {
    plan: pg_sys::SPIPlanPtr,
    keys: Vec<pg_sys::Datum>,
}

/// Reading the records into the table's row type runs code the table's column types
/// carry (a domain's CHECK, an input function), and the statement is planned with the
/// role's policies: so both are done as the role, in a subtransaction of their own. An
/// error there (a CHECK that raises, a schema the role may not use) fails that role's
/// identities only; on success the subtransaction is kept, and with it the keys' tuple.
unsafe fn lookup_as(
    role: pg_sys::Oid,
    table: &Table,
    records: pg_sys::Datum,
    mode: Asked,
) -> Result<Lookup, String> {
    unsafe {
        let sub = SubXact::begin();
        let (ctx, owner) = (sub.ctx, sub.owner);
        let made = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
            Ok(as_role(role, || match mode {
                Asked::Key => lookup(table, records),
                Asked::Version => lookup_version(role, table, records),
            }))
        }))
        .catch_others(item_error)
        .execute();
        if made.is_ok() {
            SubXact { ctx, owner }.release();
        } else {
            SubXact { ctx, owner }.rollback();
        }
        made
    }
}

unsafe fn lookup(table: &Table, records: pg_sys::Datum) -> Lookup {
    unsafe {
        let (name, key) = (&table.name, &table.key);
        // The key values, typed by the table's own row type (as a change's record holds
        // them), one array per key column in record order.
        let aggs = key
            .iter()
            .map(|(_, c)| format!("array_agg(r.{c} ORDER BY k.i)"))
            .collect::<Vec<_>>()
            .join(", ");
        let keys_sql = format!(
            "SELECT {aggs} FROM unnest($1::text[]) WITH ORDINALITY AS k(rec, i), \
             LATERAL jsonb_populate_record(NULL::{name}, k.rec::jsonb) AS r"
        );
        let keys_plan = prepare(&keys_sql, &[pg_sys::TEXTARRAYOID]);
        let rc = pg_sys::SPI_execute_plan(
            keys_plan,
            [records].as_ptr().cast_mut(),
            std::ptr::null(),
            true,
            1,
        );
        if rc < 0 {
            pgrx::error!("reading the records' keys failed (SPI error {rc})");
        }
        // The tuple stays in this call's SPI memory until SPI_finish.
        let (tuptable, mut keys) = (pg_sys::SPI_tuptable, Vec::with_capacity(key.len()));
        let mut nulls = Vec::with_capacity(key.len());
        for n in 1..=key.len() {
            let mut isnull = false;
            let d = pg_sys::SPI_getbinval(
                *(*tuptable).vals,
                (*tuptable).tupdesc,
                n as i32,
                &mut isnull,
            );
            keys.push(d);
            nulls.push(isnull);
        }
        if nulls.iter().any(|&n| n) {
            // No records: nothing to look up (every answer is "not visible").
            keys.clear();
        }
        let same = key
            .iter()
            .enumerate()
            .map(|(n, (_, c))| format!("t.{c} = ${}[a.i]", n + 2))
            .collect::<Vec<_>>()
            .join(" AND ");
        let sql = format!(
            "SELECT a.i FROM unnest($1::int[]) AS a(i) \
             WHERE EXISTS (SELECT 1 FROM {name} t WHERE {same})"
        );
        let mut types = vec![pg_sys::INT4ARRAYOID];
        types.extend(key.iter().map(|(array, _)| *array));
        Lookup {
            plan: prepare_generic(&sql, &types),
            keys,
        }
    }
}

/// An identifier quoted as SQL needs it (Postgres's own `quote_identifier`).
fn quote_ident(name: &str) -> String {
    let c = std::ffi::CString::new(name).unwrap_or_default();
    unsafe {
        CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr()))
            .to_string_lossy()
            .into_owned()
    }
}

/// The statement of `Asked::Version`: the records themselves are its second argument
/// (text[]), each read into the table's row type as the identity asks about it, and a
/// record is seen when the row with its key is visible and equal to it, column by column
/// as text, in each column `role` may read. A column the role may not read is not
/// compared: what it held is none of the subscriber's business, and the record it gets
/// leaves it out.
unsafe fn lookup_version(role: pg_sys::Oid, table: &Table, records: pg_sys::Datum) -> Lookup {
    unsafe {
        let name = &table.name;
        let readable = texts(
            "SELECT quote_ident(a.attname) FROM pg_attribute a \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
             AND has_column_privilege($2, a.attrelid, a.attnum, 'SELECT') ORDER BY a.attnum",
            &[table.oid, role],
        );
        let same = table
            .key
            .iter()
            .map(|(_, c)| format!("t.{c} = r.{c}"))
            .chain(
                readable
                    .iter()
                    .map(|c| format!("t.{c}::text IS NOT DISTINCT FROM r.{c}::text")),
            )
            .collect::<Vec<_>>()
            .join(" AND ");
        let sql = format!(
            "SELECT a.i FROM unnest($1::int[]) AS a(i), \
             LATERAL jsonb_populate_record(NULL::{name}, ($2::text[])[a.i]::jsonb) AS r \
             WHERE EXISTS (SELECT 1 FROM {name} t WHERE {same})"
        );
        Lookup {
            plan: prepare_generic(&sql, &[pg_sys::INT4ARRAYOID, pg_sys::TEXTARRAYOID]),
            keys: vec![records],
        }
    }
}

type Row = (i32, Option<i32>, Option<String>);

/// The records each identity is asked about (1-based), or None: every record.
type PerIdentity = Option<Vec<Vec<i32>>>;

fn evaluate(
    entity: pg_sys::Oid,
    identities: &[(String, String)],
    records: &[Option<String>],
    asked: &PerIdentity,
    mode: Asked,
    out: &mut Vec<Row>,
) {
    unsafe {
        if pg_sys::SPI_connect() < 0 {
            pgrx::error!("could not connect to SPI");
        }
        let table = match table(entity) {
            Ok(t) => t,
            Err(why) => {
                for i in 0..identities.len() {
                    out.push((i as i32 + 1, None, Some(why.clone())));
                }
                pg_sys::SPI_finish();
                return;
            }
        };
        let all = records.to_vec().into_datum().expect("an array of records");
        let every: Vec<i32> = (1..=records.len() as i32).collect();
        // The role guard's answer and the role's lookup, once per role of the call.
        let mut by_role: std::collections::HashMap<&str, Result<(pg_sys::Oid, Lookup), String>> =
            std::collections::HashMap::new();
        let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        for (i, (role_name, claims)) in identities.iter().enumerate() {
            let at = i as i32 + 1;
            if matches!(asked, Some(per) if per[i].is_empty()) {
                continue;
            }
            let made = by_role.entry(role_name.as_str()).or_insert_with(|| {
                let role = role_guard(role_name)?;
                Ok((role, lookup_as(role, &table, all, mode)?))
            });
            let (role, lookup) = match made {
                Ok((role, lookup)) => (*role, &*lookup),
                Err(why) => {
                    out.push((at, None, Some(why.clone())));
                    continue;
                }
            };
            if lookup.keys.is_empty() {
                // No records: no identity sees any.
                continue;
            }
            let mut args = vec![match asked {
                None => every.clone(),
                Some(per) => per[i].clone(),
            }
            .into_datum()
            .expect("an array of numbers")];
            args.extend_from_slice(&lookup.keys);
            let sub = SubXact::begin();
            let (ctx, owner) = (sub.ctx, sub.owner);
            let seen = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
                set_identity(role_name, claims, "{}");
                pg_sys::SetUserIdAndSecContext(
                    role,
                    saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
                );
                let rc = pg_sys::SPI_execute_plan(
                    lookup.plan,
                    args.as_ptr().cast_mut(),
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
            .catch_others(item_error)
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
CREATE FUNCTION realtime."visible"(entity regclass, roles text[], claims text[], records text[], asked integer[] DEFAULT NULL)
RETURNS TABLE(identity integer, record integer, error text)
VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn visible(
    entity: pg_sys::Oid,
    roles: Vec<Option<String>>,
    claims: Vec<Option<String>>,
    records: Vec<Option<String>>,
    asked: Option<Vec<Option<i32>>>,
    fcinfo: pg_sys::FunctionCallInfo,
) {
    answer(entity, roles, claims, records, asked, Asked::Key, fcinfo)
}

/// `realtime.visible` for a resume: each record is a whole row as a change recorded it,
/// and counts as seen only while the row with its key is visible to the identity and still
/// holds, in every column its role may read, what the record holds. A version written while
/// the row was hidden (a draft published since) is therefore never resent: the row's latest
/// change, which holds what the row holds now, is. The live stage asks `realtime.visible`:
/// a live change is checked within milliseconds of its commit, as Supabase checks it.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."visible_current"(entity regclass, roles text[], claims text[], records text[], asked integer[] DEFAULT NULL)
RETURNS TABLE(identity integer, record integer, error text)
VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn visible_current(
    entity: pg_sys::Oid,
    roles: Vec<Option<String>>,
    claims: Vec<Option<String>>,
    records: Vec<Option<String>>,
    asked: Option<Vec<Option<i32>>>,
    fcinfo: pg_sys::FunctionCallInfo,
) {
    answer(
        entity,
        roles,
        claims,
        records,
        asked,
        Asked::Version,
        fcinfo,
    )
}

fn answer(
    entity: pg_sys::Oid,
    roles: Vec<Option<String>>,
    claims: Vec<Option<String>>,
    records: Vec<Option<String>>,
    asked: Option<Vec<Option<i32>>>,
    mode: Asked,
    fcinfo: pg_sys::FunctionCallInfo,
) {
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
    let asked = asked.map(|flat| pairs(&flat, identities.len(), records.len()));
    let mut out = Vec::new();
    without_leftover_subxacts(|| evaluate(entity, &identities, &records, &asked, mode, &mut out));
    let mut rows = unsafe { ReturnedRows::begin(fcinfo) };
    for (identity, record, error) in out {
        rows.push(|| {
            [
                identity.into_datum(),
                record.into_datum(),
                error.into_datum(),
            ]
        });
    }
}

/// `asked` as the records each identity is asked about: a flat list of (identity, record)
/// pairs, 1-based, as the sidecar sends the pairs its filters let through.
fn pairs(flat: &[Option<i32>], identities: usize, records: usize) -> Vec<Vec<i32>> {
    if !flat.len().is_multiple_of(2) {
        errors::invalid("asked must hold (identity, record) pairs", None);
    }
    let mut per = vec![Vec::new(); identities];
    for (k, pair) in flat.chunks(2).enumerate() {
        match (pair[0], pair[1]) {
            (Some(i), Some(r))
                if (1..=identities as i32).contains(&i) && (1..=records as i32).contains(&r) =>
            {
                per[i as usize - 1].push(r)
            }
            _ => errors::invalid(
                format!(
                    "asked pair {} is not an (identity, record) of this call",
                    k + 1
                ),
                None,
            ),
        }
    }
    per
}

/// Which columns of `entity` each role may SELECT: Supabase leaves the others out of a
/// change's record, and refuses a subscriber whose role may not select the primary key
/// ("Error 401: Unauthorized"). One row per role, in order; a role the sidecar may not act
/// as (the role guard) gets its reason instead of columns.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."selectable"(entity regclass, roles text[])
RETURNS TABLE("role" text, "columns" text[], error text)
STRICT STABLE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
#[allow(clippy::type_complexity)]
fn selectable(
    entity: pg_sys::Oid,
    roles: Vec<Option<String>>,
) -> TableIterator<
    'static,
    (
        name!(role, String),
        name!(columns, Option<Vec<String>>),
        name!(error, Option<String>),
    ),
> {
    let mut out = Vec::with_capacity(roles.len());
    unsafe {
        if pg_sys::SPI_connect() < 0 {
            pgrx::error!("could not connect to SPI");
        }
        let key = texts(PRIMARY_KEY_SQL, &[entity]);
        for (i, role) in roles.into_iter().enumerate() {
            let Some(role) = role else {
                errors::invalid(format!("roles[{}] must not be NULL", i + 1), None)
            };
            let row = match role_guard(&role) {
                Err(why) => (role, None, Some(why)),
                Ok(oid) => {
                    let columns = texts(
                        "SELECT a.attname::text FROM pg_attribute a \
                         WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
                         AND has_column_privilege($2, a.attrelid, a.attnum, 'SELECT') \
                         ORDER BY a.attnum",
                        &[entity, oid],
                    );
                    if key.is_empty() {
                        (
                            role,
                            Some(columns),
                            Some("Error 400: Bad Request, no primary key".into()),
                        )
                    } else if key.iter().any(|k| !columns.contains(k)) {
                        (role, Some(columns), Some("Error 401: Unauthorized".into()))
                    } else {
                        (role, Some(columns), None)
                    }
                }
            };
            out.push(row);
        }
        pg_sys::SPI_finish();
    }
    TableIterator::new(out)
}
