//! What the extension's row triggers share (`realtime.broadcast_trigger`, `realtime.capture`):
//! checking that they were fired AFTER ... FOR EACH ROW, and which rows the event carries.

use crate::errors;
use pgrx::pg_sys;
use pgrx::prelude::*;

const TRIGGER_EVENT_OPMASK: u32 = 0x3;
const TRIGGER_EVENT_ROW: u32 = 0x4;
const TRIGGER_EVENT_TIMINGMASK: u32 = 0x18;

/// One row event: INSERT carries the new row, DELETE the old one, UPDATE both.
pub struct RowEvent<'a> {
    pub td: &'a pg_sys::TriggerData,
    pub op: &'static str,
    pub new: pg_sys::HeapTuple,
    pub old: pg_sys::HeapTuple,
}

/// The event that fired trigger function `name`; refused with an error (and `hint`) unless
/// it was fired AFTER ... FOR EACH ROW.
pub unsafe fn row_event<'a>(
    fcinfo: pg_sys::FunctionCallInfo,
    name: &str,
    hint: &str,
) -> RowEvent<'a> {
    unsafe {
        let ctx = (*fcinfo).context;
        if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_TriggerData {
            errors::fail(
                PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                format!("{name} must be called as a trigger"),
                None,
            );
        }
        let td = &*(ctx as *const pg_sys::TriggerData);
        let ev = td.tg_event;
        if ev & TRIGGER_EVENT_ROW == 0 || ev & TRIGGER_EVENT_TIMINGMASK != 0 {
            errors::fail(
                PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                format!("{name} must be fired AFTER ... FOR EACH ROW"),
                Some(hint),
            );
        }
        let none = std::ptr::null_mut();
        let (op, new, old) = match ev & TRIGGER_EVENT_OPMASK {
            0 => ("INSERT", td.tg_trigtuple, none),
            1 => ("DELETE", none, td.tg_trigtuple),
            2 => ("UPDATE", td.tg_newtuple, td.tg_trigtuple),
            _ => unreachable!("TRUNCATE triggers are statement-level"),
        };
        RowEvent { td, op, new, old }
    }
}
