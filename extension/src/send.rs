//! `realtime.send`, `realtime.send_binary` and `realtime.broadcast_changes`: the SQL API that
//! Supabase Realtime users already call, with the same names, arguments and defaults. They
//! write no table row and no WAL: each call only appends to the transaction's buffer. A
//! message that cannot be sent does not fail the caller's transaction (`dropped.rs`).

use crate::args;
use crate::dropped::{By, Reason, Refusal};
use crate::errors;
use crate::message::{FLAG_BINARY, FLAG_ID_SHOWN, FLAG_PERSIST, FLAG_PRIVATE};
use crate::payload;
use crate::send_policy::{self, Row};
use crate::xact;
use pgrx::pg_sys;
use pgrx::prelude::*;

fn flags(private: bool) -> u8 {
    if private {
        FLAG_PRIVATE
    } else {
        0
    }
}

/// As Supabase's `send`: a message that cannot be sent is dropped with a WARNING (or an
/// ERROR with `realtime.strict_send`), as `dropped.rs` says.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."send"(payload jsonb, event text, topic text, private boolean DEFAULT true)
RETURNS void VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn send(fcinfo: pg_sys::FunctionCallInfo) {
    unsafe {
        let event = args::datum(fcinfo, 1).map(|d| args::text(d, "event"));
        let topic = args::datum(fcinfo, 2).map(|d| args::text(d, "topic"));
        let private = args::bool_or(fcinfo, 3, true);
        let refuse = |size: usize, r: Refusal| {
            xact::refuse(By::App, (topic, event), flags(private), size, r)
        };
        let Some(d) = args::datum(fcinfo, 0) else {
            return refuse(0, Refusal::null(Reason::InvalidPayload, "payload"));
        };
        let (Some(topic), Some(event)) = (topic, event) else {
            let (reason, what) = match topic {
                None => (Reason::InvalidTopic, "topic"),
                Some(_) => (Reason::InvalidEvent, "event"),
            };
            return refuse(0, Refusal::null(reason, what));
        };
        let jb = pg_sys::pg_detoast_datum(d.cast_mut_ptr()) as *mut pg_sys::Jsonb;
        let size = pgrx::varlena::varsize(jb as *const pg_sys::varlena);
        if (*jb).root.header & pg_sys::JB_FOBJECT == 0 {
            return refuse(
                size,
                Refusal::invalid(
                    Reason::InvalidPayload,
                    "realtime.send payload must be a JSON object",
                    Some("Wrap the value in an object, for example jsonb_build_object('value', ...)."),
                ),
            );
        }
        let id = payload::new_id();
        let has_id = pgrx::fcinfo::direct_function_call_as_datum(
            pg_sys::jsonb_exists,
            &[Some(pg_sys::Datum::from(jb)), Some(id_key())],
        )
        .is_some_and(|b| b.value() != 0);
        let text = pg_sys::JsonbToCString(std::ptr::null_mut(), &raw mut (*jb).root, size as i32);
        let text = std::ffi::CStr::from_ptr(text).to_string_lossy();
        let text = if has_id {
            text
        } else {
            payload::inject_id(&text, &id).into()
        };
        let row = Row {
            topic,
            event,
            payload: Some(&text),
            private,
        };
        if let Some(r) = send_policy::refusal(&row) {
            return refuse(text.len(), r);
        }
        xact::append(
            By::App,
            topic,
            event,
            text.as_bytes(),
            flags(private),
            id,
            0,
        );
    }
}

/// The text datum `'id'`, built once per backend.
fn id_key() -> pg_sys::Datum {
    thread_local! {
        static KEY: pg_sys::Datum = unsafe {
            let mut ctx = pgrx::PgMemoryContexts::TopMemoryContext;
            ctx.switch_to(|_| pg_sys::Datum::from(pgrx::varlena::rust_str_to_text_p("id").into_pg()))
        };
    }
    KEY.with(|k| *k)
}

/// Binary payloads reach only clients on the 2.0.0 serializer, as in Supabase.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."send_binary"(payload bytea, event text, topic text, private boolean DEFAULT true)
RETURNS void VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn send_binary(fcinfo: pg_sys::FunctionCallInfo) {
    unsafe {
        let event = args::datum(fcinfo, 1).map(|d| args::text(d, "event"));
        let topic = args::datum(fcinfo, 2).map(|d| args::text(d, "topic"));
        let private = args::bool_or(fcinfo, 3, true);
        let refuse = |r: Refusal| xact::refuse(By::App, (topic, event), flags(private), 0, r);
        let Some(d) = args::datum(fcinfo, 0) else {
            return refuse(Refusal::null(Reason::InvalidPayload, "payload"));
        };
        let (Some(topic), Some(event)) = (topic, event) else {
            return refuse(match topic {
                None => Refusal::null(Reason::InvalidTopic, "topic"),
                Some(_) => Refusal::null(Reason::InvalidEvent, "event"),
            });
        };
        let bytes = args::varlena_bytes(d);
        let row = Row {
            topic,
            event,
            payload: None,
            private,
        };
        if let Some(r) = send_policy::refusal(&row) {
            return refuse(r);
        }
        xact::append(
            By::App,
            topic,
            event,
            bytes,
            flags(private) | FLAG_BINARY,
            payload::new_id(),
            0,
        );
    }
}

/// A client's broadcast, relayed by a sidecar so that every sidecar sees it in the one order
/// the queue gives. `origin` names the sending connection (nonzero); the payload is passed
/// through as the client sent it: JSON text, or bytes from a 2.0.0 binary push. `id` is the
/// message's id when the sidecar chose it (a persisted message's row has the same one) or its
/// sender named it; `persist` marks a message its sender asked to keep, which Supabase's
/// replay includes; `show_id`, a message whose id its sender named (REST's `id`): delivered
/// as `meta.id`, as Supabase delivers it (`message.rs`, `FLAG_ID_SHOWN`).
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."relay"(origin bigint, topic text, event text, private boolean, payload json, binary_payload bytea, id uuid DEFAULT NULL, persist boolean DEFAULT false, show_id boolean DEFAULT false)
RETURNS void VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn relay(fcinfo: pg_sys::FunctionCallInfo) {
    unsafe {
        let origin = match args::datum(fcinfo, 0) {
            Some(d) if d.value() as i64 != 0 => d.value() as i64 as u64,
            _ => errors::invalid("origin must be a nonzero sidecar connection id", None),
        };
        let topic = args::required_text(fcinfo, 1, "topic");
        let event = args::required_text(fcinfo, 2, "event");
        let private = args::bool_or(fcinfo, 3, false);
        let id = match args::datum(fcinfo, 6) {
            // A uuid datum points to its 16 bytes.
            Some(d) => {
                let mut id = [0u8; 16];
                id.copy_from_slice(std::slice::from_raw_parts(d.cast_mut_ptr::<u8>(), 16));
                id
            }
            None => payload::new_id(),
        };
        let mut marks = 0;
        if args::bool_or(fcinfo, 7, false) {
            marks |= FLAG_PERSIST;
        }
        if args::bool_or(fcinfo, 8, false) {
            marks |= FLAG_ID_SHOWN;
        }
        match (args::datum(fcinfo, 4), args::datum(fcinfo, 5)) {
            (Some(json), None) => xact::append(
                By::Sidecar,
                topic,
                event,
                args::varlena_bytes(json),
                flags(private) | marks,
                id,
                origin,
            ),
            (None, Some(bin)) => xact::append(
                By::Sidecar,
                topic,
                event,
                args::varlena_bytes(bin),
                flags(private) | FLAG_BINARY | marks,
                id,
                origin,
            ),
            _ => errors::invalid(
                "exactly one of payload and binary_payload must be given",
                None,
            ),
        }
    }
}

const CHANGE_OPERATIONS: [&str; 3] = ["INSERT", "UPDATE", "DELETE"];

/// Supabase's signature and error texts; always sends to the private topic, as Supabase does.
#[pg_extern(sql = r#"
CREATE FUNCTION realtime."broadcast_changes"(topic_name text, event_name text, operation text, table_name text, table_schema text, new record, old record, level text DEFAULT 'ROW')
RETURNS void VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn broadcast_changes(fcinfo: pg_sys::FunctionCallInfo) {
    unsafe {
        if let Some(level) = args::datum(fcinfo, 7) {
            if args::text(level, "level") == "STATEMENT" {
                errors::fail(
                    PgSqlErrorCode::ERRCODE_RAISE_EXCEPTION,
                    "Failed to process the row: function can only be triggered for each row, not for each statement",
                    Some("Create the trigger FOR EACH ROW."),
                );
            }
        }
        let op = args::datum(fcinfo, 2).map(|d| args::text(d, "operation"));
        let op = match op {
            Some(op) if CHANGE_OPERATIONS.contains(&op) => op,
            other => errors::fail(
                PgSqlErrorCode::ERRCODE_RAISE_EXCEPTION,
                format!(
                    "Failed to process the row: Unexpected operation type: {}",
                    other.unwrap_or("<NULL>")
                ),
                Some("operation must be INSERT, UPDATE or DELETE (TG_OP)."),
            ),
        };
        let topic = args::datum(fcinfo, 0).map(|d| args::text(d, "topic_name"));
        let event = args::datum(fcinfo, 1).map(|d| args::text(d, "event_name"));
        let (Some(topic), Some(event)) = (topic, event) else {
            let r = match topic {
                None => Refusal::null(Reason::InvalidTopic, "topic_name"),
                Some(_) => Refusal::null(Reason::InvalidEvent, "event_name"),
            };
            return xact::refuse(By::App, (topic, event), FLAG_PRIVATE, 0, r);
        };
        let table = args::datum(fcinfo, 3).map(|d| args::text(d, "table_name"));
        let schema = args::datum(fcinfo, 4).map(|d| args::text(d, "table_schema"));
        let new = args::datum(fcinfo, 5).map(|d| payload::record_json(d));
        let old = args::datum(fcinfo, 6).map(|d| payload::record_json(d));
        let id = payload::new_id();
        let body = payload::changes_payload(&id, table, schema, op, new.as_deref(), old.as_deref());
        let row = Row {
            topic,
            event,
            payload: Some(&body),
            private: true,
        };
        if let Some(r) = send_policy::refusal(&row) {
            let size = topic.len() + event.len() + body.len();
            return xact::refuse(By::App, (Some(topic), Some(event)), FLAG_PRIVATE, size, r);
        }
        xact::append(By::App, topic, event, body.as_bytes(), FLAG_PRIVATE, id, 0);
    }
}
