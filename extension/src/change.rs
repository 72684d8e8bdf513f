//! A captured row change (`capture.rs`) turned into the `data` of Supabase's Postgres
//! Changes event, when a consumer drains it:
//!
//! ```json
//! {"schema": "public", "table": "todos", "commit_timestamp": "2026-01-02T03:04:05.678Z",
//!  "type": "UPDATE", "columns": [{"name": "id", "type": "int8"}, ...],
//!  "record": {...}, "old_record": {...}, "errors": null}
//! ```
//!
//! Values are rendered by Postgres's own `row_to_json`, as Supabase renders them through
//! `to_jsonb`; `columns[].type` is the type's name (`int8`, `timestamptz`, `_text`), which
//! realtime-js converts by. `record` is absent for DELETE and `old_record` for INSERT.
//! `old_record` holds what the table's REPLICA IDENTITY names, as Supabase's does: the
//! primary key by default, the whole row with FULL, nothing with NOTHING, the index's
//! columns with USING INDEX. A table without a primary key (and no other identity) gets
//! Supabase's "Error 400: Bad Request, no primary key" in `errors`.
//!
//! A change whose table was dropped, or altered in a way that changes what its stored row
//! means, before it was drained is reported in `errors` without its rows: never misread.

use crate::capture;
use crate::json_str::push_json_str;
use crate::payload::row_json;
use crate::row_json::{self as rows, RowJson};
use pgrx::pg_sys;
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::Rc;

/// What a drain call learned about one table, looked up once per call.
struct Table {
    schema: String,
    name: String,
    layout: u32,
    /// `[{"name": ..., "type": ...}, ...]`
    columns: String,
    identity: Identity,
    /// The table's descriptor (a copy, valid for the call), which its stored rows have
    /// when `layout` matches theirs.
    desc: pg_sys::TupleDesc,
    /// How its rows print, kept across calls (`row_json.rs`).
    rows: Rc<RowJson>,
}

enum Identity {
    Full,
    Nothing,
    /// These columns (1-based), with the blessed descriptor of a row made of them.
    Columns(Vec<usize>, pg_sys::TupleDesc),
    /// Replica identity DEFAULT on a table without a primary key.
    NoPrimaryKey,
}

/// Decodes the changes of one drain call (so table lookups are shared within it).
#[derive(Default)]
pub struct Decoder {
    tables: HashMap<u32, Option<Table>>,
}

impl Decoder {
    /// The JSON `data` of a change record as drained: decoded, or, for a change dropped when
    /// it was sent (`dropped.rs`), an error saying why, so that the channels of its table are
    /// told it was lost.
    pub fn record(&mut self, m: &crate::message::MessageView) -> String {
        if !m.is_dropped() {
            return self.decode(m.payload, m.topic, m.event, m.header.committed_at);
        }
        let (reason, size) = crate::dropped::read(m.payload, true);
        let why = match reason.as_str() {
            "too_large" => format!("Error 413: Payload Too Large: the change ({size} bytes) exceeded realtime.max_message_size and was dropped"),
            _ => format!("Error 507: the change was dropped when it was sent ({reason}: its transaction's messages did not fit realtime.queue_size)"),
        };
        failed(m.topic, m.event, m.header.committed_at, &why)
    }

    /// The JSON `data` of a change record: `table` and `op` are the record's topic and
    /// event, `committed_at` its commit time (Postgres µs since 2000-01-01).
    pub fn decode(&mut self, payload: &[u8], table: &str, op: &str, committed_at: i64) -> String {
        let Some(c) = Captured::parse(payload) else {
            return failed(
                table,
                op,
                committed_at,
                "Error 500: the change record is damaged",
            );
        };
        let t = self
            .tables
            .entry(c.relid)
            .or_insert_with(|| unsafe { Table::load(c.relid) });
        let Some(t) = t else {
            return failed(
                table,
                op,
                committed_at,
                "Error 410: the table was dropped before this change was delivered",
            );
        };
        if t.layout != c.layout {
            return failed(
                &t.name,
                op,
                committed_at,
                "Error 409: the table's columns changed before this change was delivered",
            );
        }
        let record = c.new.map(|new| unsafe { t.row_text(new, None, c.relid) });
        let old_record = c.old.map(|old| {
            // The identity the change was made under; its key columns as the table has them.
            let identity = match c.identity {
                b'f' => &Identity::Full,
                b'n' => &Identity::Nothing,
                _ => &t.identity,
            };
            match identity {
                Identity::Full => unsafe { t.row_text(old, None, c.relid) },
                Identity::Nothing | Identity::NoPrimaryKey => "{}".to_owned(),
                Identity::Columns(cols, _) => unsafe { t.row_text(old, Some(cols), c.relid) },
            }
        });
        let rows_len =
            record.as_ref().map_or(0, String::len) + old_record.as_ref().map_or(0, String::len);
        let mut out = String::with_capacity(256 + t.columns.len() + rows_len);
        out.push_str("{\"schema\":");
        push_json_str(&mut out, &t.schema);
        out.push_str(",\"table\":");
        push_json_str(&mut out, &t.name);
        out.push_str(",\"commit_timestamp\":\"");
        push_iso_millis(&mut out, committed_at);
        out.push_str("\",\"type\":");
        push_json_str(&mut out, op);
        out.push_str(",\"columns\":");
        out.push_str(&t.columns);
        // Supabase's max_record_bytes, at decode: past it only the small values stay, and
        // the change says 413 (issue 39, H4: applied only in the sidecar, a row that decoded
        // to megabytes was held whole by every drain and history call on its way there).
        let too_large = out.len() + rows_len + 64 > crate::gucs::max_record_bytes();
        let mut push_row = |name: &str, row: Option<String>| {
            if let Some(row) = row {
                out.push_str(name);
                if too_large {
                    out.push_str(&keep_small_values(&row));
                } else {
                    out.push_str(&row);
                }
            }
        };
        push_row(",\"record\":", record);
        push_row(",\"old_record\":", old_record);
        out.push_str(",\"errors\":");
        let no_key = matches!(t.identity, Identity::NoPrimaryKey);
        out.push_str(match (no_key, too_large) {
            (false, false) => "null",
            (true, false) => "[\"Error 400: Bad Request, no primary key\"]",
            (false, true) => "[\"Error 413: Payload Too Large\"]",
            (true, true) => {
                "[\"Error 400: Bad Request, no primary key\",\"Error 413: Payload Too Large\"]"
            }
        });
        out.push('}');
        out
    }
}

/// Values of a change that is too large are kept only up to this size as JSON text, as
/// Supabase keeps them (and the sidecar's `shape`).
const SMALL_VALUE_BYTES: usize = 64;

/// A JSON object's text with only the members whose value text is at most
/// SMALL_VALUE_BYTES, in their order. Scanned, not parsed: a parse would round a numeric
/// beyond f64 and cost a copy of every value. Text that is not an object of the shape
/// `row_to_json` writes gives `{}`.
fn keep_small_values(obj: &str) -> String {
    let b = obj.as_bytes();
    let mut out = String::from("{");
    let ws = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut i = ws(0);
    if b.get(i) != Some(&b'{') {
        return "{}".into();
    }
    i = ws(i + 1);
    if b.get(i) == Some(&b'}') {
        return "{}".into();
    }
    loop {
        let Some(key_end) = end_of_value(b, i).filter(|_| b[i] == b'"') else {
            return "{}".into();
        };
        let key = i..key_end;
        i = ws(key_end);
        if b.get(i) != Some(&b':') {
            return "{}".into();
        }
        let start = ws(i + 1);
        let Some(end) = end_of_value(b, start) else {
            return "{}".into();
        };
        if end - start <= SMALL_VALUE_BYTES {
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(&obj[key.clone()]);
            out.push(':');
            out.push_str(&obj[start..end]);
        }
        i = ws(end);
        match b.get(i) {
            Some(b',') => i = ws(i + 1),
            Some(b'}') => break,
            _ => return "{}".into(),
        }
    }
    out.push('}');
    out
}

/// Where the JSON value starting at `i` ends (one past it): a string, an array or object
/// (strings inside skipped), or a scalar up to the next delimiter. None: it does not end.
fn end_of_value(b: &[u8], i: usize) -> Option<usize> {
    let end_of_string = |mut j: usize| loop {
        match b.get(j)? {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    };
    match b.get(i)? {
        b'"' => end_of_string(i + 1),
        b'{' | b'[' => {
            let (mut depth, mut j) = (0usize, i);
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = end_of_string(j + 1)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while b
                .get(j)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace())
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// The parts of a change record's payload (layout in `capture.rs`).
struct Captured<'a> {
    relid: u32,
    layout: u32,
    /// REPLICA IDENTITY when the change was made.
    identity: u8,
    new: Option<&'a [u8]>,
    old: Option<&'a [u8]>,
}

impl<'a> Captured<'a> {
    fn parse(p: &'a [u8]) -> Option<Self> {
        let u32_at = |i: usize| Some(u32::from_le_bytes(p.get(i..i + 4)?.try_into().ok()?));
        let (relid, layout, identity) = (u32_at(0)?, u32_at(4)?, *p.get(8)?);
        let mut at = 9;
        let mut row = || {
            let len = u32_at(at)? as usize;
            at += 4;
            let bytes = p.get(at..at + len)?;
            at += len;
            Some((len > 0).then_some(bytes))
        };
        let (new, old) = (row()?, row()?);
        Some(Captured {
            relid,
            layout,
            identity,
            new,
            old,
        })
    }
}

fn failed(table: &str, op: &str, committed_at: i64, error: &str) -> String {
    let mut out = String::from("{\"schema\":null,\"table\":");
    push_json_str(&mut out, table);
    out.push_str(",\"commit_timestamp\":\"");
    push_iso_millis(&mut out, committed_at);
    out.push_str("\",\"type\":");
    push_json_str(&mut out, op);
    out.push_str(",\"columns\":[],\"errors\":[");
    push_json_str(&mut out, error);
    out.push_str("]}");
    out
}

impl Table {
    /// None when the table no longer exists.
    unsafe fn load(relid: u32) -> Option<Table> {
        unsafe {
            let rel = pg_sys::try_relation_open(
                pg_sys::Oid::from(relid),
                pg_sys::AccessShareLock as pg_sys::LOCKMODE,
            );
            if rel.is_null() {
                return None;
            }
            let desc = (*rel).rd_att;
            let form = &*(*rel).rd_rel;
            let name = CStr::from_ptr(form.relname.data.as_ptr())
                .to_string_lossy()
                .into_owned();
            let schema = CStr::from_ptr(pg_sys::get_namespace_name(form.relnamespace))
                .to_string_lossy()
                .into_owned();
            let natts = (*desc).natts as usize;
            let attrs = (*desc).attrs.as_slice(natts);
            let mut columns = String::from("[");
            for a in attrs.iter().filter(|a| !a.attisdropped) {
                if columns.len() > 1 {
                    columns.push(',');
                }
                columns.push_str("{\"name\":");
                push_json_str(
                    &mut columns,
                    &CStr::from_ptr(a.attname.data.as_ptr()).to_string_lossy(),
                );
                columns.push_str(",\"type\":");
                push_json_str(&mut columns, &type_name(a.atttypid));
                columns.push('}');
            }
            columns.push(']');
            let identity = match form.relreplident as u8 {
                b'f' => Identity::Full,
                b'n' => Identity::Nothing,
                _ => {
                    let kind = pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_IDENTITY_KEY;
                    let set = pg_sys::RelationGetIndexAttrBitmap(rel, kind);
                    let mut cols = Vec::new();
                    let mut m = -1;
                    loop {
                        m = pg_sys::bms_next_member(set, m);
                        if m < 0 {
                            break;
                        }
                        let attno = m + pg_sys::FirstLowInvalidHeapAttributeNumber;
                        if attno > 0 {
                            cols.push(attno as usize);
                        }
                    }
                    if cols.is_empty() {
                        Identity::NoPrimaryKey
                    } else {
                        let sub = pg_sys::CreateTemplateTupleDesc(cols.len() as i32);
                        for (j, &attno) in cols.iter().enumerate() {
                            pg_sys::TupleDescCopyEntry(sub, (j + 1) as i16, desc, attno as i16);
                        }
                        Identity::Columns(cols, pg_sys::BlessTupleDesc(sub))
                    }
                }
            };
            let table = Table {
                schema,
                name,
                layout: capture::layout(desc),
                columns,
                identity,
                desc: pg_sys::CreateTupleDescCopy(desc),
                rows: rows::for_table(pg_sys::Oid::from(relid), desc),
            };
            pg_sys::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            Some(table)
        }
    }
}

/// A type's name as realtime-js knows it (`int8`, `_text`).
unsafe fn type_name(oid: pg_sys::Oid) -> String {
    unsafe {
        let tup = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::TYPEOID as i32,
            pg_sys::Datum::from(oid),
        );
        if tup.is_null() {
            return "unknown".into();
        }
        let form = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_type>(tup);
        let name = CStr::from_ptr(form.typname.data.as_ptr())
            .to_string_lossy()
            .into_owned();
        pg_sys::ReleaseSysCache(tup);
        name
    }
}

/// A stored row (a composite datum's bytes) copied into aligned memory of this call.
unsafe fn datum_of(bytes: &[u8]) -> pg_sys::Datum {
    unsafe {
        let p = pg_sys::palloc(bytes.len()).cast::<u8>();
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        pg_sys::Datum::from(p)
    }
}

impl Table {
    /// A stored row of this table as JSON: every column, or only `cols` (1-based).
    unsafe fn row_text(&self, bytes: &[u8], cols: Option<&[usize]>, relid: u32) -> String {
        unsafe {
            let datum = datum_of(bytes);
            let mut tuple = pg_sys::HeapTupleData {
                t_len: bytes.len() as u32,
                t_self: pg_sys::ItemPointerData::default(),
                t_tableOid: pg_sys::Oid::from(relid),
                t_data: datum.cast_mut_ptr::<pg_sys::HeapTupleHeaderData>(),
            };
            let mut out = Vec::with_capacity(bytes.len() * 2);
            if self.rows.write(&mut out, &mut tuple, self.desc, cols) {
                return String::from_utf8(out)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            }
            // A column nests (arrays, composites): row_to_json prints it.
            match (cols, &self.identity) {
                (Some(cols), Identity::Columns(_, sub)) => projected_text(bytes, cols, *sub, relid),
                _ => String::from_utf8_lossy(row_json(datum)).into_owned(),
            }
        }
    }
}

/// The row as JSON, only the columns `cols` (a row of the blessed descriptor `sub`).
unsafe fn projected_text(
    bytes: &[u8],
    cols: &[usize],
    sub: pg_sys::TupleDesc,
    relid: u32,
) -> String {
    unsafe {
        let datum = datum_of(bytes);
        let header = datum.cast_mut_ptr::<pg_sys::HeapTupleHeaderData>();
        let typeid = (*header).t_choice.t_datum.datum_typeid;
        let desc = pg_sys::lookup_rowtype_tupdesc(typeid, -1);
        let mut tuple = pg_sys::HeapTupleData {
            t_len: bytes.len() as u32,
            t_self: pg_sys::ItemPointerData::default(),
            t_tableOid: pg_sys::Oid::from(relid),
            t_data: header,
        };
        let natts = (*desc).natts as usize;
        let mut values = vec![pg_sys::Datum::from(0usize); natts];
        let mut nulls = vec![false; natts];
        pg_sys::heap_deform_tuple(&mut tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        let mut pv: Vec<pg_sys::Datum> = cols.iter().map(|&c| values[c - 1]).collect();
        let mut pn: Vec<bool> = cols.iter().map(|&c| nulls[c - 1]).collect();
        let row = pg_sys::heap_form_tuple(sub, pv.as_mut_ptr(), pn.as_mut_ptr());
        let text = String::from_utf8_lossy(row_json(pg_sys::heap_copy_tuple_as_datum(row, sub)))
            .into_owned();
        pg_sys::DecrTupleDescRefCount(desc);
        text
    }
}

/// Appends a Postgres timestamp (µs since 2000-01-01 UTC) as Supabase writes
/// `commit_timestamp`: `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn push_iso_millis(out: &mut String, pg_micros: i64) {
    const PG_EPOCH_DAYS: i64 = 10_957; // 1970-01-01 .. 2000-01-01
    let millis = pg_micros.div_euclid(1000);
    let (days, ms_of_day) = (millis.div_euclid(86_400_000), millis.rem_euclid(86_400_000));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + PG_EPOCH_DAYS + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s, ms) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000,
    );
    use std::fmt::Write;
    let _ = write!(out, "{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_timestamps_are_written_as_supabase_writes_them() {
        let iso = |us: i64| {
            let mut s = String::new();
            push_iso_millis(&mut s, us);
            s
        };
        assert_eq!(iso(0), "2000-01-01T00:00:00.000Z");
        // 2026-01-02 03:04:05.678901 UTC, and a leap day, and before 2000.
        assert_eq!(iso(820_638_245_678_901), "2026-01-02T03:04:05.678Z");
        assert_eq!(iso(762_480_000_000_000), "2024-02-29T00:00:00.000Z");
        assert_eq!(iso(-1_000), "1999-12-31T23:59:59.999Z");
    }

    #[test]
    fn a_too_large_row_keeps_its_small_values_in_order_whatever_they_hold() {
        let big = "x".repeat(100);
        let row = format!(
            r#"{{"id":12345678901234567890123456789, "body":"{big}", "t":"a\"}},", "n":null, "j":{{"a":[1,"}}"]}}, "arr":[{big:?}]}}"#
        );
        assert_eq!(
            keep_small_values(&row),
            r#"{"id":12345678901234567890123456789,"t":"a\"},","n":null,"j":{"a":[1,"}"]}}"#
        );
        assert_eq!(keep_small_values("{}"), "{}");
        assert_eq!(keep_small_values(r#"{"a":"#), "{}", "cut short");
        assert_eq!(keep_small_values("[1]"), "{}", "not an object");
    }

    #[test]
    fn a_damaged_record_is_refused_not_misread() {
        assert!(Captured::parse(&[1, 0, 0]).is_none());
        let mut p = vec![7, 0, 0, 0, 9, 0, 0, 0, b'd'];
        p.extend_from_slice(&3u32.to_le_bytes());
        p.extend_from_slice(b"ab");
        assert!(
            Captured::parse(&p).is_none(),
            "a row shorter than its length"
        );
        p.push(b'c');
        p.extend_from_slice(&0u32.to_le_bytes());
        let c = Captured::parse(&p).unwrap();
        assert_eq!(
            (c.relid, c.layout, c.identity, c.new, c.old),
            (7, 9, b'd', Some(&b"abc"[..]), None)
        );
    }
}
