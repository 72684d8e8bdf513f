//! The app's producers held to the INSERT policies of `realtime.messages`, as Supabase's are.
//!
//! Supabase's `realtime.send` is an INSERT into `realtime.messages` as its caller, with
//! `realtime.topic` set to the topic: a role without BYPASSRLS sends only what an INSERT
//! policy allows it (and only with INSERT on the table), and anything refused is Supabase's
//! WARNING. `send`, `send_binary`, `broadcast_changes` and the broadcast triggers do the
//! same here, without keeping the row: for a caller that is neither a superuser nor holds
//! BYPASSRLS, each message's row (`id`, `payload`, `event`, `topic`, `private`, `extension =
//! 'broadcast'`, the columns Supabase's send writes) is inserted as the caller in a
//! subtransaction of its own, with `realtime.topic` set local to it, and rolled back at once.
//! A refusal (RLS, or no INSERT privilege: SQLSTATE 42501) or any error a policy or a trigger
//! of the table raises drops the message, as `dropped.rs` says (reason `unauthorized`), but
//! with no dropped record: a role that may not send to a topic must not be able to put
//! anything before its subscribers, not even a notice naming an event it chose. A cancel or
//! statement timeout still ends the statement.
//!
//! Nothing here runs with more rights than the caller's: these functions are not `SECURITY
//! DEFINER`, and the row is inserted as the user the call runs as (a definer trigger
//! function's owner, when the app's trigger is one). Checked at each call rather than at
//! commit: a policy reads the JWT settings of the moment, as Supabase's INSERT does, and one
//! call's cost is what Supabase's own send pays (a subtransaction and an INSERT), only for
//! roles held to policies; superusers and BYPASSRLS roles pay one catalog lookup.

use crate::dropped::{Reason, Refusal};
use crate::identity::{interrupts_call, prepare, report, set_local, text_datum, SubXact};
use pgrx::pg_sys;
use pgrx::prelude::*;

/// What a refused message's row held.
pub struct Row<'a> {
    pub topic: &'a str,
    pub event: &'a str,
    /// JSON text; None for a binary payload (Supabase's send_binary writes `binary_payload`,
    /// which policies do not read: it is left NULL here).
    pub payload: Option<&'a str>,
    pub private: bool,
}

/// Whether the current user is held to the policies: not a superuser, no BYPASSRLS.
fn held() -> bool {
    unsafe {
        let user = pg_sys::GetUserId();
        !pg_sys::superuser_arg(user) && !pg_sys::has_bypassrls_privilege(user)
    }
}

/// None when the caller may insert `row` into `realtime.messages` (or is not held to its
/// policies); else the refusal, with the error's text as Supabase's WARNING carries it.
pub fn refusal(row: &Row) -> Option<Refusal> {
    if !held() {
        return None;
    }
    unsafe {
        if pg_sys::SPI_connect() < 0 {
            pgrx::error!("could not connect to SPI");
        }
        let insert = insert_plan();
        let sub = SubXact::begin();
        let (ctx, owner) = (sub.ctx, sub.owner);
        let verdict = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
            set_local("realtime.topic", row.topic);
            let payload = row.payload.map_or(pg_sys::Datum::from(0), text_datum);
            let args = [
                payload,
                text_datum(row.event),
                text_datum(row.topic),
                pg_sys::Datum::from(row.private),
            ];
            let nulls = [if row.payload.is_none() { b'n' } else { b' ' }, b' ', b' ', b' '];
            // Not delivered: the row is a check, rolled back (`inserted.rs`).
            crate::inserted::while_checking(|| run_with_nulls(insert, &args, &nulls));
            None
        }))
        .catch_others(|e| {
            let report = report(&e);
            if interrupts_call(report.sql_error_code()) {
                e.rethrow();
            }
            Some(Refusal {
                reason: Reason::Unauthorized,
                code: report.sql_error_code(),
                message: report.message().to_owned(),
                hint: Some("Realtime sends as Supabase's do: an INSERT into realtime.messages as the caller, which needs an INSERT policy for the topic (realtime.topic()) or BYPASSRLS."),
            })
        })
        .execute();
        SubXact { ctx, owner }.rollback();
        pg_sys::SPI_finish();
        verdict
    }
}

/// The INSERT, prepared once per backend and kept: the plan cache revalidates it when the
/// table changes (a dropped one makes the call fail, which refuses the message). Prepared
/// per call it cost a parse and a plan each time, three times what Supabase's send pays
/// (its PL/pgSQL keeps its plan).
fn insert_plan() -> pg_sys::SPIPlanPtr {
    thread_local! {
        static PLAN: std::cell::Cell<pg_sys::SPIPlanPtr> = const { std::cell::Cell::new(std::ptr::null_mut()) };
    }
    PLAN.with(|p| {
        if p.get().is_null() {
            unsafe {
                let plan = prepare(
                    "INSERT INTO realtime.messages (payload, event, topic, private, extension) \
                     VALUES ($1::jsonb, $2, $3, $4, 'broadcast')",
                    &[
                        pg_sys::TEXTOID,
                        pg_sys::TEXTOID,
                        pg_sys::TEXTOID,
                        pg_sys::BOOLOID,
                    ],
                );
                if pg_sys::SPI_keepplan(plan) != 0 {
                    pgrx::error!("could not keep the plan of realtime.send's INSERT");
                }
                p.set(plan);
            }
        }
        p.get()
    })
}

/// `identity::run` with NULL arguments.
unsafe fn run_with_nulls(plan: pg_sys::SPIPlanPtr, args: &[pg_sys::Datum], nulls: &[u8]) {
    unsafe {
        let rc = pg_sys::SPI_execute_plan(
            plan,
            args.as_ptr() as *mut pg_sys::Datum,
            nulls.as_ptr() as *const std::ffi::c_char,
            false,
            1,
        );
        if rc < 0 {
            pgrx::error!("the INSERT of realtime.send's row failed (SPI error {rc})");
        }
    }
}
