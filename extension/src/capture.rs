//! Postgres Changes capture: the row changes of the tables in publication
//! `supabase_realtime` go into the queue at commit, as any message does, so they are only
//! committed ones, in commit order, kept while a sidecar is away, and lost only as an
//! explicit gap (`queue.rs`).
//!
//! The extension keeps an `AFTER INSERT OR UPDATE OR DELETE ... FOR EACH ROW` trigger,
//! `realtime_capture`, on exactly the published tables (`realtime.sync_capture()`, run by
//! an event trigger whenever a publication or a table changes; `sql/capture.sql`). The app
//! writes no trigger and no code.
//!
//! The writer pays as little as possible: the trigger copies the row as Postgres holds it
//! (a composite datum, with toasted values pulled inline so that they outlive the row)
//! and appends it to the transaction's buffer. Nothing is converted to text here: the
//! change is turned into Supabase's JSON when a sidecar drains it (`change.rs`), once per
//! sidecar rather than once per write. The record remembers the table's column layout, so
//! a change whose table was altered in between is reported, never misread.
//!
//! Payload of a change record (little-endian): relation oid u32, layout u32, the table's
//! REPLICA IDENTITY when the change was made (a byte: `d`, `f`, `i` or `n`), then the new
//! row and the old row, each a u32 length (0: none) and that many bytes.

use crate::message::FLAG_CHANGE;
use crate::row_trigger::{row_event, RowEvent};
use crate::xact;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;

/// The table a change record was captured from (the payload's first field).
pub fn relid_of(payload: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(payload.get(0..4)?.try_into().ok()?))
}

#[pg_extern(sql = r#"
CREATE FUNCTION realtime."capture"() RETURNS trigger
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn capture(fcinfo: pg_sys::FunctionCallInfo) {
    unsafe {
        let RowEvent { td, op, new, old } = row_event(
            fcinfo,
            "realtime.capture()",
            "realtime.sync_capture() creates the triggers; do not create them by hand.",
        );
        let rel = td.tg_relation;
        let desc = (*rel).rd_att;
        let relid = (*rel).rd_id;
        let mut payload = Vec::with_capacity(64);
        payload.extend_from_slice(&relid.to_u32().to_le_bytes());
        payload.extend_from_slice(&layout(desc).to_le_bytes());
        payload.push((*(*rel).rd_rel).relreplident as u8);
        for row in [new, old] {
            if row.is_null() {
                payload.extend_from_slice(&0u32.to_le_bytes());
                continue;
            }
            // A composite datum: self-contained, toasted values inline.
            let datum = pg_sys::heap_copy_tuple_as_datum(row, desc);
            let bytes = crate::args::varlena_bytes_with_header(datum);
            payload.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            payload.extend_from_slice(bytes);
        }
        let table = CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr());
        let table = table.to_str().unwrap_or("table");
        // No message id: Supabase's change events carry none, and drawing one costs.
        xact::append(
            crate::dropped::By::App,
            table,
            op,
            &payload,
            FLAG_CHANGE,
            [0; 16],
            0,
        );
    }
}

/// A fingerprint of a table's column layout: what a stored row's bytes mean. It changes
/// when a column is added, dropped or changes type, not when one is renamed.
pub unsafe fn layout(desc: pg_sys::TupleDesc) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut mix = |v: u32| {
        for b in v.to_le_bytes() {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
    };
    unsafe {
        let natts = (*desc).natts as usize;
        mix(natts as u32);
        for a in (*desc).attrs.as_slice(natts) {
            mix(a.atttypid.to_u32());
            mix(a.attlen as u32);
            mix(a.attalign as u8 as u32);
            mix(a.attisdropped as u32);
        }
    }
    h
}
