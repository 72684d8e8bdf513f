//! A row as JSON text, byte for byte as Postgres's `row_to_json` prints it, with each
//! column's JSON category and output function looked up once per table instead of per row.
//!
//! `row_to_json` looks up every column's type category and output function for every row
//! (`json_categorize_type`, then `OidOutputFunctionCall`, which builds a function call
//! from the catalog each time): most of its cost for the short rows a trigger sends. A
//! `RowJson` does those lookups once, for a table's column layout, and keeps them in the
//! backend for as long as the layout stays the same (`matches`: column names, types and
//! drops, and no cast to json created since). The categories and their output are
//! `json.c`'s (PostgreSQL 15): booleans bare, numbers bare when they are valid JSON numbers
//! (`NaN` is quoted), dates and timestamps in ISO 8601 (`JsonEncodeDateTime`), `json` and
//! `jsonb` as they print, everything else as an escaped string. Arrays, composites and
//! types with a cast to json are left to `row_to_json` itself (`write` says so), as they
//! nest. `regress/sql/row_json.sql` compares the two on every category.

use crate::json_str::push_json_bytes;
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::Rc;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Number,
    /// Date, timestamp or timestamptz: the base type's oid, as `JsonEncodeDateTime` takes it.
    DateTime(pg_sys::Oid),
    Json,
    Text,
    /// Array, composite or a type with a cast to json: `row_to_json` prints the row.
    Nested,
}

struct Column {
    /// 1-based, as `heap_getattr` takes it.
    attnum: i32,
    name: Vec<u8>,
    typid: pg_sys::Oid,
    dropped: bool,
    kind: Kind,
    /// The output function, looked up once; its memory lives in TopMemoryContext.
    out: Option<Box<pg_sys::FmgrInfo>>,
}

/// How to print the rows of one column layout.
pub struct RowJson {
    columns: Vec<Column>,
    /// The casts' generation it was built under (a new cast to json may change a category).
    casts: u64,
    nested: bool,
}

thread_local! {
    static CASTS: Cell<u64> = const { Cell::new(0) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static BY_TABLE: RefCell<HashMap<u32, Rc<RowJson>>> = RefCell::new(HashMap::new());
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn casts_changed(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    CASTS.set(CASTS.get() + 1);
}

fn watch_casts() {
    if !WATCHING.replace(true) {
        unsafe {
            pg_sys::CacheRegisterSyscacheCallback(
                pg_sys::SysCacheIdentifier::CASTSOURCETARGET as i32,
                Some(casts_changed),
                pg_sys::Datum::from(0usize),
            )
        };
    }
}

/// The cached `RowJson` of table `relid` with layout `desc`, built anew if the table's
/// layout changed since.
pub unsafe fn for_table(relid: pg_sys::Oid, desc: pg_sys::TupleDesc) -> Rc<RowJson> {
    unsafe {
        let key = relid.to_u32();
        let cached = BY_TABLE.with_borrow(|m| m.get(&key).cloned());
        if let Some(r) = cached.filter(|r| r.matches(desc)) {
            return r;
        }
        // Built without holding the map: building reads the catalogs, which may run
        // invalidation callbacks.
        let r = Rc::new(RowJson::new(desc));
        BY_TABLE.with_borrow_mut(|m| m.insert(key, r.clone()));
        r
    }
}

thread_local! {
    static BY_TYPE: RefCell<HashMap<(u32, i32), Rc<RowJson>>> = RefCell::new(HashMap::new());
}

/// The cached `RowJson` of row type `typid` (with `typmod`, which numbers an anonymous
/// record type) with layout `desc`, built anew if the layout changed since: for rows that
/// come as composite datums rather than a table's tuples.
pub unsafe fn for_type(typid: pg_sys::Oid, typmod: i32, desc: pg_sys::TupleDesc) -> Rc<RowJson> {
    unsafe {
        let key = (typid.to_u32(), typmod);
        let cached = BY_TYPE.with_borrow(|m| m.get(&key).cloned());
        if let Some(r) = cached.filter(|r| r.matches(desc)) {
            return r;
        }
        let r = Rc::new(RowJson::new(desc));
        BY_TYPE.with_borrow_mut(|m| m.insert(key, r.clone()));
        r
    }
}

impl RowJson {
    pub unsafe fn new(desc: pg_sys::TupleDesc) -> RowJson {
        unsafe {
            watch_casts();
            let casts = CASTS.get();
            let natts = (*desc).natts as usize;
            let mut columns = Vec::with_capacity(natts);
            for (i, a) in (*desc).attrs.as_slice(natts).iter().enumerate() {
                let name = CStr::from_ptr(a.attname.data.as_ptr()).to_bytes().to_vec();
                let (kind, out) = if a.attisdropped {
                    (Kind::Text, None)
                } else {
                    categorize(a.atttypid)
                };
                columns.push(Column {
                    attnum: i as i32 + 1,
                    name,
                    typid: a.atttypid,
                    dropped: a.attisdropped,
                    kind,
                    out,
                });
            }
            let nested = columns.iter().any(|c| !c.dropped && c.kind == Kind::Nested);
            RowJson {
                columns,
                casts,
                nested,
            }
        }
    }

    /// Whether rows of `desc` print as this was built for.
    pub unsafe fn matches(&self, desc: pg_sys::TupleDesc) -> bool {
        unsafe {
            let natts = (*desc).natts as usize;
            self.casts == CASTS.get()
                && natts == self.columns.len()
                && (*desc)
                    .attrs
                    .as_slice(natts)
                    .iter()
                    .zip(&self.columns)
                    .all(|(a, c)| {
                        a.atttypid == c.typid
                            && a.attisdropped == c.dropped
                            && CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == c.name
                    })
        }
    }

    /// Appends `tuple` (of the layout this was built for) as `row_to_json` prints it, only
    /// the columns `only` (1-based, in that order) if given, as `row_to_json` prints a row
    /// of just those columns. Returns false, appending nothing, when a column nests
    /// (arrays, composites, casts to json): the caller asks `row_to_json` then.
    pub unsafe fn write(
        &self,
        out: &mut Vec<u8>,
        tuple: pg_sys::HeapTuple,
        desc: pg_sys::TupleDesc,
        only: Option<&[usize]>,
    ) -> bool {
        unsafe {
            let nested = match only {
                None => self.nested,
                Some(cols) => cols
                    .iter()
                    .any(|&c| self.columns[c - 1].kind == Kind::Nested),
            };
            if nested {
                return false;
            }
            out.push(b'{');
            let mut first = true;
            let mut one = |c: &Column| {
                if c.dropped {
                    return;
                }
                if !first {
                    out.push(b',');
                }
                first = false;
                push_json_bytes(out, &c.name);
                out.push(b':');
                let mut isnull = false;
                let v = pg_sys::heap_getattr(tuple, c.attnum, desc, &mut isnull);
                if isnull {
                    out.extend_from_slice(b"null");
                    return;
                }
                match c.kind {
                    Kind::Bool => {
                        out.extend_from_slice(if v.value() != 0 { b"true" } else { b"false" })
                    }
                    Kind::DateTime(typid) => {
                        let mut buf = [0 as std::ffi::c_char; pg_sys::MAXDATELEN as usize + 1];
                        pg_sys::JsonEncodeDateTime(buf.as_mut_ptr(), v, typid, std::ptr::null());
                        out.push(b'"');
                        out.extend_from_slice(CStr::from_ptr(buf.as_ptr()).to_bytes());
                        out.push(b'"');
                    }
                    Kind::Number | Kind::Json | Kind::Text => {
                        let f: &pg_sys::FmgrInfo = c.out.as_deref().expect("an output function");
                        // OutputFunctionCall takes *mut but only reads the lookup's fields.
                        let f = f as *const pg_sys::FmgrInfo as *mut pg_sys::FmgrInfo;
                        let s = pg_sys::OutputFunctionCall(f, v);
                        let text = CStr::from_ptr(s).to_bytes();
                        match c.kind {
                            Kind::Number if is_json_number(text) => out.extend_from_slice(text),
                            Kind::Json => out.extend_from_slice(text),
                            _ => push_json_bytes(out, text),
                        }
                        pg_sys::pfree(s.cast());
                    }
                    Kind::Nested => unreachable!("checked above"),
                }
            };
            match only {
                None => self.columns.iter().for_each(&mut one),
                Some(cols) => cols.iter().for_each(|&c| one(&self.columns[c - 1])),
            }
            out.push(b'}');
            true
        }
    }
}

/// `json.c`'s `json_categorize_type`, and the output function where one is used.
unsafe fn categorize(typid: pg_sys::Oid) -> (Kind, Option<Box<pg_sys::FmgrInfo>>) {
    unsafe {
        let base = pg_sys::getBaseType(typid);
        let kind = match base {
            pg_sys::BOOLOID => return (Kind::Bool, None),
            pg_sys::DATEOID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID => {
                return (Kind::DateTime(base), None)
            }
            pg_sys::INT2OID
            | pg_sys::INT4OID
            | pg_sys::INT8OID
            | pg_sys::FLOAT4OID
            | pg_sys::FLOAT8OID
            | pg_sys::NUMERICOID => Kind::Number,
            pg_sys::JSONOID | pg_sys::JSONBOID => Kind::Json,
            _ if pg_sys::get_element_type(base) != pg_sys::InvalidOid
                || base == pg_sys::ANYARRAYOID
                || base == pg_sys::ANYCOMPATIBLEARRAYOID
                || base == pg_sys::RECORDARRAYOID
                || pg_sys::type_is_rowtype(base) =>
            {
                return (Kind::Nested, None)
            }
            _ if base.to_u32() >= pg_sys::FirstNormalObjectId => {
                let mut cast = pg_sys::InvalidOid;
                let path = pg_sys::find_coercion_pathway(
                    pg_sys::JSONOID,
                    base,
                    pg_sys::CoercionContext::COERCION_EXPLICIT,
                    &mut cast,
                );
                if path == pg_sys::CoercionPathType::COERCION_PATH_FUNC
                    && cast != pg_sys::InvalidOid
                {
                    return (Kind::Nested, None);
                }
                Kind::Text
            }
            _ => Kind::Text,
        };
        (kind, Some(output_function(base)))
    }
}

/// The output function of type `typid`, looked up once for the backend's life (its memory
/// in TopMemoryContext).
pub unsafe fn output_function(typid: pg_sys::Oid) -> Box<pg_sys::FmgrInfo> {
    unsafe {
        let mut func = pg_sys::InvalidOid;
        let mut varlena = false;
        pg_sys::getTypeOutputInfo(typid, &mut func, &mut varlena);
        let mut info = Box::new(std::mem::zeroed::<pg_sys::FmgrInfo>());
        pg_sys::fmgr_info_cxt(func, &mut *info, pg_sys::TopMemoryContext);
        info
    }
}

/// Whether `s` is a JSON number as Postgres's `IsValidJsonNumber` judges it (RFC 8259).
fn is_json_number(s: &[u8]) -> bool {
    let digits = |i: &mut usize| {
        let start = *i;
        while s.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > start
    };
    let mut i = usize::from(s.first() == Some(&b'-'));
    match s.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if s.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return false;
        }
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(&mut i) {
            return false;
        }
    }
    i == s.len()
}

#[cfg(test)]
mod tests {
    use super::is_json_number;

    #[test]
    fn json_numbers_are_judged_as_postgres_does() {
        for ok in ["0", "-0", "12", "1.5", "-1.25e+10", "1E5", "0.001", "1e-7"] {
            assert!(is_json_number(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "-",
            "NaN",
            "Infinity",
            "-Infinity",
            "01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "1 ",
        ] {
            assert!(!is_json_number(bad.as_bytes()), "{bad}");
        }
    }
}
