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
use crate::row_json;
use crate::row_trigger::{row_event, RowEvent};
use crate::xact;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::rc::Rc;

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
        let rel = td.tg_relation;
        let desc = (*rel).rd_att;
        let plan = plan_of(&*td.tg_trigger, desc);
        let row_for_topic = if new_tuple.is_null() {
            old_tuple
        } else {
            new_tuple
        };
        let topic = plan.topic(row_for_topic, desc);

        let rows = row_json::for_table((*rel).rd_id, desc);
        let as_json = |t: pg_sys::HeapTuple| {
            (!t.is_null()).then(|| {
                let mut out = Vec::with_capacity(256);
                if !rows.write(&mut out, t, desc, None) {
                    let datum = pg_sys::heap_copy_tuple_as_datum(t, desc);
                    out.extend_from_slice(payload::row_json(datum));
                }
                out
            })
        };
        let new = as_json(new_tuple);
        let old = as_json(old_tuple);
        let table = CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy();
        let schema_ptr = pg_sys::get_namespace_name((*(*rel).rd_rel).relnamespace);
        let schema = CStr::from_ptr(schema_ptr).to_string_lossy();

        let id = payload::new_id();
        let body = payload::changes_payload(
            &id,
            Some(&table),
            Some(&schema),
            op,
            new.as_deref(),
            old.as_deref(),
        );
        let event = plan.event.as_deref().unwrap_or(op);
        let flags = if plan.private { FLAG_PRIVATE } else { 0 };
        let row = crate::send_policy::Row {
            topic: &topic,
            event,
            payload: Some(&body),
            private: plan.private,
        };
        if let Some(r) = crate::send_policy::refusal(&row) {
            let size = topic.len() + event.len() + body.len();
            let to = (Some(topic.as_str()), Some(event));
            return xact::refuse(crate::dropped::By::App, to, flags, size, r);
        }
        xact::append(
            crate::dropped::By::App,
            &topic,
            event,
            body.as_bytes(),
            flags,
            id,
            0,
        );
    }
}

/// What a trigger's arguments say, worked out at its first row and kept for the backend's
/// life: the topic template split into text and columns (each column's number and output
/// function looked up once), the event and whether the message is private.
struct Plan {
    /// The trigger's arguments the plan was made from.
    args: Vec<Vec<u8>>,
    topic: Vec<Part>,
    event: Option<String>,
    private: bool,
}

enum Part {
    Text(String),
    Column {
        name: String,
        attnum: i32,
        typid: pg_sys::Oid,
        out: Box<pg_sys::FmgrInfo>,
    },
}

thread_local! {
    static PLANS: RefCell<HashMap<u32, Rc<Plan>>> = RefCell::new(HashMap::new());
}

/// The plan of `trig`, made anew if its arguments or a template column changed since (a
/// column renamed, dropped or retyped: the next row looks it up again).
unsafe fn plan_of(trig: &pg_sys::Trigger, desc: pg_sys::TupleDesc) -> Rc<Plan> {
    unsafe {
        let args: Vec<&[u8]> = (0..trig.tgnargs as usize)
            .map(|i| CStr::from_ptr(*trig.tgargs.add(i)).to_bytes())
            .collect();
        let key = trig.tgoid.to_u32();
        let cached = PLANS.with_borrow(|m| m.get(&key).cloned());
        if let Some(p) = cached.filter(|p| p.args == args && p.columns_match(desc)) {
            return p;
        }
        let p = Rc::new(Plan::new(&args, desc));
        PLANS.with_borrow_mut(|m| m.insert(key, p.clone()));
        p
    }
}

impl Plan {
    unsafe fn new(args: &[&[u8]], desc: pg_sys::TupleDesc) -> Plan {
        let text = |a: &[u8]| String::from_utf8_lossy(a).into_owned();
        let Some(template) = args.first().map(|a| text(a)) else {
            errors::invalid(
                "realtime.broadcast_trigger() needs a topic argument",
                Some("For example: EXECUTE FUNCTION realtime.broadcast_trigger('room:{room_id}')."),
            );
        };
        let event = args.get(1).map(|a| text(a)).filter(|e| !e.is_empty());
        let private = match args.get(2) {
            None => true,
            Some(p) => parse_bool(&text(p)),
        };
        Plan {
            args: args.iter().map(|a| a.to_vec()).collect(),
            topic: unsafe { parse_template(&template, desc) },
            event,
            private,
        }
    }

    unsafe fn columns_match(&self, desc: pg_sys::TupleDesc) -> bool {
        self.topic.iter().all(|part| match part {
            Part::Text(_) => true,
            Part::Column {
                name,
                attnum,
                typid,
                ..
            } => unsafe {
                *attnum <= (*desc).natts && {
                    let a = &(*desc).attrs.as_slice((*desc).natts as usize)[*attnum as usize - 1];
                    !a.attisdropped
                        && a.atttypid == *typid
                        && CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes()
                }
            },
        })
    }

    /// The topic of `tuple`: the template with each `{column}` replaced by its text value.
    unsafe fn topic(&self, tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> String {
        let mut out = String::with_capacity(64);
        for part in &self.topic {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Column {
                    name,
                    attnum,
                    out: f,
                    ..
                } => unsafe {
                    let mut isnull = false;
                    let v = pg_sys::heap_getattr(tuple, *attnum, desc, &mut isnull);
                    if isnull {
                        errors::fail(
                            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                            format!(
                                "column \"{name}\" named in topic template \"{}\" is NULL",
                                self.template()
                            ),
                            Some("A message needs a topic; make the column NOT NULL or use another column."),
                        );
                    }
                    let f = &**f as *const pg_sys::FmgrInfo as *mut pg_sys::FmgrInfo;
                    let s = pg_sys::OutputFunctionCall(f, v);
                    out.push_str(&CStr::from_ptr(s).to_string_lossy());
                    pg_sys::pfree(s.cast());
                },
            }
        }
        out
    }

    fn template(&self) -> String {
        String::from_utf8_lossy(&self.args[0]).into_owned()
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

/// Splits a topic template into text and `{column}` parts (`{{` and `}}` are literal
/// braces), each column looked up in `desc`.
unsafe fn parse_template(template: &str, desc: pg_sys::TupleDesc) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        text.push_str(&rest[..i]);
        let c = rest.as_bytes()[i];
        let after = &rest[i + 1..];
        if after.as_bytes().first() == Some(&c) {
            text.push(c as char);
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
        if !text.is_empty() {
            parts.push(Part::Text(std::mem::take(&mut text)));
        }
        parts.push(unsafe { column_part(&after[..end], desc, template) });
        rest = &after[end + 1..];
    }
    text.push_str(rest);
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    parts
}

unsafe fn column_part(column: &str, desc: pg_sys::TupleDesc, template: &str) -> Part {
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
        let typid = (*desc).attrs.as_slice((*desc).natts as usize)[attno as usize - 1].atttypid;
        Part::Column {
            name: column.to_string(),
            attnum: attno as i32,
            typid,
            out: row_json::output_function(typid),
        }
    }
}
