//! Building message payloads: ids, JSON text, and the payload shape of Supabase's
//! `realtime.broadcast_changes`.

use crate::json_str::push_json_str;
use pgrx::pg_sys;

/// Random bytes drawn per call of the strong random source: 64 ids. One OpenSSL call costs
/// about 2 µs whatever its size (measured: `new_id` was a tenth of the native trigger's
/// cost per row), so a backend draws for many ids at once and hands them out in turn.
const ID_POOL: usize = 64 * 16;

struct IdPool {
    bytes: [u8; ID_POOL],
    /// Bytes of `bytes` already handed out; `ID_POOL` when empty.
    used: usize,
}

thread_local! {
    // Filled only in the backend that uses it (never in the postmaster, whose memory every
    // backend inherits), so no two processes hand out the same bytes.
    static IDS: std::cell::RefCell<IdPool> =
        const { std::cell::RefCell::new(IdPool { bytes: [0; ID_POOL], used: ID_POOL }) };
}

/// A random (version 4) uuid from Postgres's strong random source, as `gen_random_uuid` makes.
pub fn new_id() -> [u8; 16] {
    let mut b = IDS.with_borrow_mut(|pool| {
        if pool.used == ID_POOL {
            let ok = unsafe { pg_sys::pg_strong_random(pool.bytes.as_mut_ptr().cast(), ID_POOL) };
            if !ok {
                pgrx::error!("could not generate random values");
            }
            pool.used = 0;
        }
        let mut b = [0u8; 16];
        b.copy_from_slice(&pool.bytes[pool.used..pool.used + 16]);
        // Handed out once: wipe it, so the pool never holds an id already given.
        pool.bytes[pool.used..pool.used + 16].fill(0);
        pool.used += 16;
        b
    });
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

pub fn push_uuid(out: &mut String, id: &[u8; 16]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in id.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(HEX[(byte >> 4) as usize] as char);
        out.push(HEX[(byte & 0xf) as usize] as char);
    }
}

fn push_opt_str(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => push_json_str(out, s),
        None => out.push_str("null"),
    }
}

/// The payload Supabase's `broadcast_changes` delivers:
/// `{id, table, record, schema, operation, old_record}`. Keys are in the order jsonb prints
/// them, so the top level is byte-identical to Supabase's; `record` and `old_record` are
/// `row_to_json` text (same values, columns in table order, no spaces).
pub fn changes_payload(
    id: &[u8; 16],
    table: Option<&str>,
    schema: Option<&str>,
    operation: &str,
    record: Option<&[u8]>,
    old_record: Option<&[u8]>,
) -> String {
    let rows = record.map_or(4, |r| r.len()) + old_record.map_or(4, |r| r.len());
    let mut out = String::with_capacity(128 + rows);
    out.push_str("{\"id\": \"");
    push_uuid(&mut out, id);
    out.push_str("\", \"table\": ");
    push_opt_str(&mut out, table);
    out.push_str(", \"record\": ");
    push_row(&mut out, record);
    out.push_str(", \"schema\": ");
    push_opt_str(&mut out, schema);
    out.push_str(", \"operation\": ");
    push_json_str(&mut out, operation);
    out.push_str(", \"old_record\": ");
    push_row(&mut out, old_record);
    out.push('}');
    out
}

fn push_row(out: &mut String, row: Option<&[u8]>) {
    match row {
        // row_to_json output is valid UTF-8 JSON in a UTF8 database.
        Some(r) => out.push_str(&String::from_utf8_lossy(r)),
        None => out.push_str("null"),
    }
}

/// Adds `"id": "<uuid>"` as the first key of a JSON object text (`{...}`), as `realtime.send`
/// does when the payload has no `id`.
pub fn inject_id(object: &str, id: &[u8; 16]) -> String {
    let rest = object
        .trim_start()
        .strip_prefix('{')
        .unwrap_or(object)
        .trim_start();
    let mut out = String::with_capacity(object.len() + 48);
    out.push_str("{\"id\": \"");
    push_uuid(&mut out, id);
    out.push('"');
    if !rest.starts_with('}') {
        out.push_str(", ");
    }
    out.push_str(rest);
    out
}

/// JSON text of a composite datum (a row), byte for byte as `row_to_json` prints it, through
/// the printer kept for its row type (`row_json::for_type`). `broadcast_changes` receives
/// its rows from plpgsql as composite datums, and `row_to_json` looked up every column's
/// JSON category and output function again for every row: the largest part of what the
/// plpgsql path cost per row beyond the native trigger, which already printed this way.
pub unsafe fn record_json(row: pg_sys::Datum) -> Vec<u8> {
    unsafe {
        if let Some(out) = expanded_record_json(row) {
            return out;
        }
        let td = pg_sys::pg_detoast_datum(row.cast_mut_ptr()) as pg_sys::HeapTupleHeader;
        let fields = (*td).t_choice.t_datum;
        let (typid, typmod) = (fields.datum_typeid, fields.datum_typmod);
        let desc = pg_sys::lookup_rowtype_tupdesc(typid, typmod);
        let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
        tuple.t_len = pgrx::varlena::varsize(td as *const pg_sys::varlena) as u32;
        tuple.t_data = td;
        let printer = crate::row_json::for_type(typid, typmod, desc);
        let mut out = Vec::with_capacity(256);
        let printed = printer.write(&mut out, &mut tuple, desc, None);
        // ReleaseTupleDesc: only a reference-counted descriptor was counted for us.
        if (*desc).tdrefcount >= 0 {
            pg_sys::DecrTupleDescRefCount(desc);
        }
        if !printed {
            // A column nests (arrays, composites, casts to json): Postgres prints the row.
            out.extend_from_slice(row_json(row));
        }
        out
    }
}

/// `record_json` of a row plpgsql passes as an expanded record (its NEW and OLD) whose flat
/// tuple is still valid, printed from that tuple and the record's descriptor: no flattened
/// copy, no type cache lookup. None for any other datum.
unsafe fn expanded_record_json(row: pg_sys::Datum) -> Option<Vec<u8>> {
    unsafe {
        // VARATT_IS_EXTERNAL_EXPANDED: a 1-byte external header (0x01 on little-endian
        // machines) whose tag says expanded, read-only or read-write.
        let p = row.cast_mut_ptr::<u8>();
        let tag = *p.add(1) as u32;
        if cfg!(target_endian = "big")
            || *p != 0x01
            || (tag != pg_sys::vartag_external::VARTAG_EXPANDED_RO
                && tag != pg_sys::vartag_external::VARTAG_EXPANDED_RW)
        {
            return None;
        }
        let erh = pg_sys::DatumGetEOHP(row).cast::<pg_sys::ExpandedRecordHeader>();
        if (*erh).er_magic != pg_sys::ER_MAGIC as i32
            || (*erh).flags & pg_sys::ER_FLAG_FVALUE_VALID as i32 == 0
            || (*erh).fvalue.is_null()
        {
            return None;
        }
        let desc = pg_sys::expanded_record_fetch_tupdesc(erh);
        let printer = crate::row_json::for_type((*erh).er_typeid, (*erh).er_typmod, desc);
        let mut out = Vec::with_capacity(256);
        printer
            .write(&mut out, (*erh).fvalue, desc, None)
            .then_some(out)
    }
}

/// JSON text of a composite datum (a row), via Postgres's own `row_to_json`.
pub unsafe fn row_json<'a>(row: pg_sys::Datum) -> &'a [u8] {
    unsafe {
        let json = pgrx::fcinfo::direct_function_call_as_datum(pg_sys::row_to_json, &[Some(row)])
            .expect("row_to_json returned NULL");
        crate::args::varlena_bytes(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_formats_like_postgres() {
        let mut s = String::new();
        push_uuid(&mut s, &[0xab; 16]);
        assert_eq!(s, "abababab-abab-abab-abab-abababababab");
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut s = String::new();
        push_json_str(&mut s, "a\"b\\c\n\u{1}é");
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\u0001é\"");
    }

    #[test]
    fn id_is_injected_first() {
        let id = [0u8; 16];
        assert_eq!(
            inject_id("{\"a\": 1}", &id),
            "{\"id\": \"00000000-0000-0000-0000-000000000000\", \"a\": 1}"
        );
        assert_eq!(
            inject_id("{}", &id),
            "{\"id\": \"00000000-0000-0000-0000-000000000000\"}"
        );
    }

    #[test]
    fn changes_payload_has_supabase_keys_in_jsonb_order() {
        let p = changes_payload(
            &[0; 16],
            Some("t"),
            Some("public"),
            "DELETE",
            None,
            Some(b"{\"x\":1}"),
        );
        assert_eq!(
            p,
            "{\"id\": \"00000000-0000-0000-0000-000000000000\", \"table\": \"t\", \"record\": null, \"schema\": \"public\", \"operation\": \"DELETE\", \"old_record\": {\"x\":1}}"
        );
    }
}
