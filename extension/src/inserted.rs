//! Rows the app inserts into `realtime.messages` (integrations, cron jobs, older examples)
//! are delivered at commit, as Supabase's server delivers every such row it decodes from the
//! WAL: a row with an `event` and a `payload` (or `binary_payload`) becomes a broadcast to
//! `topic` (`private` as the row says), with the row's `id` as its id (`meta.id`), in call
//! order with the transaction's other messages, replayed from the ring like `send`'s. What
//! cannot be sent is dropped as `dropped.rs` says (the row stays; the WARNING tells why). The
//! INSERT itself was the policy check: RLS let the row in or refused it.
//!
//! The trigger. An `AFTER INSERT ... FOR EACH ROW WHEN (NEW.event IS NOT NULL)` on each leaf
//! of `realtime.messages` (the table itself when it is not partitioned), calling
//! `realtime.deliver_inserted()`. The read probes (`authorize.rs`) insert rows without an
//! event: the WHEN clause leaves them out before any function is called.
//!
//! The trigger is *internal* (`tgisinternal`, as a foreign key's are), which is what keeps
//! it out of every dump: `realtime.messages` is the app's table and pg_dump dumps its
//! triggers, so a trigger made by `CREATE EXTENSION` would be made again by the dump's
//! `CREATE TRIGGER` after the restore's `CREATE EXTENSION` had made it, and the restore
//! would stop there. An internal one is never dumped: the restore's `CREATE EXTENSION`
//! makes it, and the partitions a restore attaches later get theirs from
//! `realtime.sync_app_objects()` (`sql/app_objects.sql`), which `realtime.sync_capture()`
//! calls when the extension's event trigger runs it after `CREATE TABLE` and `ALTER TABLE`;
//! after a `pg_upgrade`, whose dump leaves them out too, the sidecar's first connection
//! does. It depends on the extension (`DROP EXTENSION`
//! drops it) and on its leaf (dropped with it).
//!
//! Who runs what: `deliver_inserted` runs as the inserting role (a trigger function is no
//! definer) and runs nothing another role wrote: it reads the row's columns and copies them.
//! `add_delivery_trigger` is called by `realtime.sync_app_objects()`, the installer's SECURITY
//! DEFINER, and creates the trigger by a catalog call (no event trigger, no user code: the
//! WHEN clause calls no function or operator).

use crate::dropped::{By, Reason, Refusal};
use crate::errors;
use crate::message::{FLAG_BINARY, FLAG_PRIVATE};
use crate::row_trigger::row_event;
use crate::xact;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::{CStr, CString};

thread_local! {
    /// Set while `send_policy.rs` inserts the row Supabase's send would write (rolled back at
    /// once): that row is a policy check, not a message.
    static CHECKING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (the policy check's INSERT) with delivery of inserted rows off.
pub fn while_checking<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            CHECKING.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(CHECKING.with(|c| c.replace(true)));
    f()
}

#[pg_extern(sql = r#"
CREATE FUNCTION realtime."deliver_inserted"() RETURNS trigger
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn deliver_inserted(fcinfo: pg_sys::FunctionCallInfo) {
    unsafe {
        let ev = row_event(
            fcinfo,
            "realtime.deliver_inserted()",
            "realtime.sync_app_objects() creates its triggers; do not create them by hand.",
        );
        if ev.op != "INSERT" {
            errors::fail(
                PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                "realtime.deliver_inserted() must be fired AFTER INSERT",
                None,
            );
        }
        if CHECKING.with(Cell::get) {
            return;
        }
        let desc = (*ev.td.tg_relation).rd_att;
        let row = Columns {
            tuple: ev.new,
            desc,
        };
        let topic = row.text(c"topic");
        let event = row.text(c"event");
        let private = row.bool(c"private");
        // Only a row whose `private` is true is private; a NULL one is refused below.
        let flags = if private == Some(true) {
            FLAG_PRIVATE
        } else {
            0
        };
        let refuse =
            |size: usize, r: Refusal| xact::refuse(By::App, (topic, event), flags, size, r);
        let (Some(topic), Some(event)) = (topic, event) else {
            let (reason, what) = match topic {
                None => (Reason::InvalidTopic, "topic"),
                Some(_) => (Reason::InvalidEvent, "event"),
            };
            return refuse(0, Refusal::null(reason, what));
        };
        // Supabase's server skips a row whose `private` is NULL: it is neither of the two
        // topics, so no subscriber of either is told (a dropped record on the public one
        // would name the event of what may be a private message).
        let Some(private) = private else {
            let r = Refusal::null(Reason::InvalidTopic, "private");
            return xact::refuse(By::App, (None, Some(event)), 0, 0, r);
        };
        debug_assert_eq!(flags != 0, private);
        let id = row.uuid(c"id").unwrap_or_else(crate::payload::new_id);
        if let Some(json) = row.json(c"payload") {
            let size = json.len();
            if !json.trim_start().starts_with('{') {
                return refuse(
                    size,
                    Refusal::invalid(
                        Reason::InvalidPayload,
                        "the payload of a row inserted into realtime.messages must be a JSON object",
                        Some("Insert an object, for example jsonb_build_object('value', ...)."),
                    ),
                );
            }
            xact::append(By::App, topic, event, json.as_bytes(), flags, id, 0);
        } else if let Some(bytes) = row.bytes(c"binary_payload") {
            xact::append(By::App, topic, event, bytes, flags | FLAG_BINARY, id, 0);
        }
    }
}

/// The inserted row's columns, read by name (Supabase's table and ours order them
/// differently, and a partition may have dropped columns). A name is found by a scan of the
/// leaf's few columns: cheaper than a cache of positions, which would have to follow every
/// `ALTER TABLE` of every leaf.
struct Columns {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl Columns {
    unsafe fn datum(&self, name: &CStr) -> Option<(pg_sys::Datum, pg_sys::Oid)> {
        unsafe {
            let n = pg_sys::SPI_fnumber(self.desc, name.as_ptr());
            if n <= 0 {
                return None;
            }
            let mut null = false;
            let d = pg_sys::SPI_getbinval(self.tuple, self.desc, n, &mut null);
            (!null).then(|| (d, pg_sys::SPI_gettypeid(self.desc, n)))
        }
    }

    unsafe fn text<'a>(&self, name: &CStr) -> Option<&'a str> {
        unsafe {
            let (d, ty) = self.datum(name)?;
            let what = name.to_str().expect("ASCII column name");
            (ty == pg_sys::TEXTOID || ty == pg_sys::VARCHAROID).then(|| crate::args::text(d, what))
        }
    }

    unsafe fn bool(&self, name: &CStr) -> Option<bool> {
        unsafe {
            let (d, ty) = self.datum(name)?;
            (ty == pg_sys::BOOLOID).then(|| d.value() != 0)
        }
    }

    unsafe fn uuid(&self, name: &CStr) -> Option<[u8; 16]> {
        unsafe {
            let (d, ty) = self.datum(name)?;
            if ty != pg_sys::UUIDOID {
                return None;
            }
            let mut id = [0u8; 16];
            id.copy_from_slice(std::slice::from_raw_parts(d.cast_mut_ptr::<u8>(), 16));
            Some(id)
        }
    }

    /// A `jsonb` or `json` column as JSON text.
    unsafe fn json(&self, name: &CStr) -> Option<String> {
        unsafe {
            let (d, ty) = self.datum(name)?;
            if ty == pg_sys::JSONBOID {
                let jb = pg_sys::pg_detoast_datum(d.cast_mut_ptr()) as *mut pg_sys::Jsonb;
                let size = pgrx::varlena::varsize(jb as *const pg_sys::varlena);
                let text =
                    pg_sys::JsonbToCString(std::ptr::null_mut(), &raw mut (*jb).root, size as i32);
                Some(
                    std::ffi::CStr::from_ptr(text)
                        .to_string_lossy()
                        .into_owned(),
                )
            } else if ty == pg_sys::JSONOID {
                Some(crate::args::text(d, name.to_str().expect("ASCII column name")).to_owned())
            } else {
                None
            }
        }
    }

    unsafe fn bytes<'a>(&self, name: &CStr) -> Option<&'a [u8]> {
        unsafe {
            let (d, ty) = self.datum(name)?;
            (ty == pg_sys::BYTEAOID).then(|| crate::args::varlena_bytes(d))
        }
    }
}

/// Creates the internal delivery trigger on `leaf` (a leaf of `realtime.messages`), unless
/// the leaf lacks an `event` column or both payload columns. Superusers only: it is
/// `realtime.sync_app_objects()`'s step, run as the installer.
#[pg_extern(volatile, parallel_unsafe)]
fn add_delivery_trigger(leaf: pg_sys::Oid) -> bool {
    unsafe {
        if !pg_sys::superuser() {
            errors::fail(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                "only a superuser may create pg_realtime's delivery triggers",
                Some("realtime.sync_app_objects() creates them."),
            );
        }
        let has = |c: &CStr| pg_sys::get_attnum(leaf, c.as_ptr()) > 0;
        if !has(c"event") || !(has(c"payload") || has(c"binary_payload")) {
            return false;
        }
        let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(leaf));
        let rel = pg_sys::get_rel_name(leaf);
        if nsp.is_null() || rel.is_null() {
            return false;
        }
        let name = pg_sys::quote_qualified_identifier(nsp, rel);
        let name = std::ffi::CStr::from_ptr(name).to_string_lossy();
        // The clause is compiled at every statement that inserts (each read probe's): one
        // test costs nothing measurable there, where testing the payload columns too cost 2
        // to 4 us a probe row (`pgbench/authorize.py --delivery-trigger`). A row with an
        // event and no payload calls the function, which leaves it.
        let sql = CString::new(format!(
            "CREATE TRIGGER realtime_deliver AFTER INSERT ON {name} FOR EACH ROW \
             WHEN (NEW.event IS NOT NULL) EXECUTE FUNCTION realtime.deliver_inserted()"
        ))
        .expect("no NUL");
        let parsed = pg_sys::raw_parser(sql.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
        if parsed.is_null() || (*parsed).length != 1 {
            pgrx::error!("the delivery trigger's statement did not parse as one statement");
        }
        let raw = (*(*parsed).elements).ptr_value as *mut pg_sys::RawStmt;
        let stmt = (*raw).stmt as *mut pg_sys::CreateTrigStmt;
        let invalid = pg_sys::InvalidOid;
        let trigger = pg_sys::CreateTrigger(
            stmt,
            sql.as_ptr(),
            leaf,
            invalid,
            invalid,
            invalid,
            invalid,
            invalid,
            std::ptr::null_mut(),
            true,
            false,
        );
        // DROP EXTENSION takes it along (an AUTO dependency), as it takes the functions.
        let extension = pg_sys::ObjectAddress {
            classId: pg_sys::ExtensionRelationId,
            objectId: pg_sys::get_extension_oid(c"pg_realtime".as_ptr(), false),
            objectSubId: 0,
        };
        pg_sys::recordDependencyOn(
            &trigger,
            &extension,
            pg_sys::DependencyType::DEPENDENCY_AUTO,
        );
        pg_sys::CommandCounterIncrement();
        true
    }
}
