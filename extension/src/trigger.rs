//! `realtime.broadcast_trigger(topic, [event], [private])`: a native row trigger that sends
//! the same payload as `broadcast_changes` without a plpgsql wrapper.
//!
//! ```sql
//! CREATE TRIGGER t AFTER INSERT OR UPDATE OR DELETE ON rooms_messages
//!   FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room_id}');
//! ```
//! `{column}` in the topic is replaced by that column of the new row (the old row for
//! DELETE); `{{` and `}}` stand for literal braces. The event defaults to TG_OP and
//! `private` to true, as `broadcast_changes` always sends privately.

use crate::errors;
use crate::message::FLAG_PRIVATE;
use crate::payload;
use crate::row_trigger::{row_event, RowEvent};
use crate::xact;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{CStr, CString};

#[pg_extern(sql = r#"
CREATE FUNCTION realtime."broadcast_trigger"() RETURNS trigger
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn broadcast_trigger(fcinfo: pg_sys::FunctionCallInfo) {
    unsafe {
        let RowEvent {
            td,
            op,
            new: new_tuple,
            old: old_tuple,
        } = row_event(
            fcinfo,
            "realtime.broadcast_trigger()",
            "Create the trigger as AFTER INSERT OR UPDATE OR DELETE ... FOR EACH ROW.",
        );
        let trig = &*td.tg_trigger;
        let targs: Vec<&str> = (0..trig.tgnargs as usize)
            .map(|i| CStr::from_ptr(*trig.tgargs.add(i)).to_str().unwrap_or(""))
            .collect();
        let Some(template) = targs.first() else {
            errors::invalid(
                "realtime.broadcast_trigger() needs a topic argument",
                Some("For example: EXECUTE FUNCTION realtime.broadcast_trigger('room:{room_id}')."),
            );
        };
        let event = targs
            .get(1)
            .copied()
            .filter(|e| !e.is_empty())
            .unwrap_or(op);
        let private = match targs.get(2).copied() {
            None => true,
            Some(p) => parse_bool(p),
        };

        let rel = td.tg_relation;
        let desc = (*rel).rd_att;
        let row_for_topic = if new_tuple.is_null() {
            old_tuple
        } else {
            new_tuple
        };
        let topic = expand_topic(template, row_for_topic, desc);

        let as_json = |t: pg_sys::HeapTuple| {
            (!t.is_null()).then(|| payload::row_json(pg_sys::heap_copy_tuple_as_datum(t, desc)))
        };
        let new = as_json(new_tuple);
        let old = as_json(old_tuple);
        let table = CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy();
        let schema_ptr = pg_sys::get_namespace_name((*(*rel).rd_rel).relnamespace);
        let schema = CStr::from_ptr(schema_ptr).to_string_lossy();

        let id = payload::new_id();
        let body = payload::changes_payload(&id, Some(&table), Some(&schema), op, new, old);
        let flags = if private { FLAG_PRIVATE } else { 0 };
        xact::append(&topic, event, body.as_bytes(), flags, id, 0);
    }
}

fn parse_bool(s: &str) -> bool {
    match s.to_ascii_lowercase().as_str() {
        "true" | "t" | "on" | "yes" | "1" | "private" => true,
        "false" | "f" | "off" | "no" | "0" | "public" => false,
        _ => errors::invalid(
            format!(
                "invalid value for the private argument of realtime.broadcast_trigger(): \"{s}\""
            ),
            Some("Use true or false."),
        ),
    }
}

/// Replaces each `{column}` of the template with that column's text value in `tuple`.
unsafe fn expand_topic(
    template: &str,
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let c = rest.as_bytes()[i];
        let after = &rest[i + 1..];
        if after.as_bytes().first() == Some(&c) {
            out.push(c as char);
            rest = &after[1..];
            continue;
        }
        if c == b'}' {
            errors::invalid(
                format!("unmatched }} in topic template \"{template}\""),
                Some("Write }} for a literal brace."),
            );
        }
        let Some(end) = after.find('}') else {
            errors::invalid(
                format!("unterminated {{ in topic template \"{template}\""),
                Some("Write {{ for a literal brace."),
            );
        };
        let column = &after[..end];
        out.push_str(&column_text(column, tuple, desc, template));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

unsafe fn column_text(
    column: &str,
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    template: &str,
) -> String {
    unsafe {
        let cname = CString::new(column).unwrap_or_default();
        let attno = pg_sys::SPI_fnumber(desc, cname.as_ptr());
        if attno <= 0 {
            errors::fail(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!(
                    "column \"{column}\" named in topic template \"{template}\" does not exist"
                ),
                None,
            );
        }
        let v = pg_sys::SPI_getvalue(tuple, desc, attno);
        if v.is_null() {
            errors::fail(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                format!("column \"{column}\" named in topic template \"{template}\" is NULL"),
                Some("A message needs a topic; make the column NOT NULL or use another column."),
            );
        }
        CStr::from_ptr(v).to_string_lossy().into_owned()
    }
}
