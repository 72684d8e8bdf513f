//! The pattern filters of Postgres Changes, `like`, `ilike`, `match` and `imatch`, evaluated
//! by Postgres's own `LIKE`, `ILIKE`, `~` and `~*` (Supabase evaluates them so:
//! `realtime.check_equality_op`), never by a second engine whose dialect differs (case
//! folding, escapes, regular expression flavour).
//!
//! `realtime.match_patterns(patterns, ops, subjects, asked, budget_ms)` is the per-table,
//! per-batch call the sidecar makes for the channels whose bindings carry such a filter:
//! which of the changed rows' values (`subjects`) each distinct (pattern, op) matches,
//! asked only about the (pattern, subject) pairs in `asked` (flat, 1-based; NULL: every
//! pair). A pattern is a client's input evaluated for every change, so each one runs in its
//! own subtransaction with a time budget of its own: a pattern that errs, or costs more than
//! `budget_ms` over its subjects, fails alone (one row with its error, none with verdicts),
//! and the others of the call are answered. The sidecar withholds the changes of the
//! channels whose binding holds a failed pattern and tells them; nobody else waits.
//!
//! The budget is a timer of this backend (a user timeout): when it fires it raises the same
//! cancel a statement_timeout does, which Postgres's regex engine polls while compiling and
//! matching; the cancel is caught here and becomes that pattern's error. A statement_timeout
//! or a cancel of the whole call is never caught: it ends the call, as in
//! `realtime.visible`. (A client's cancel arriving in the same instant as a budget is taken
//! for the budget: the call goes on, bounded by its statement_timeout.)

use crate::errors;
use crate::identity::{prepare, report, without_leftover_subxacts, SubXact};
use crate::returned_rows::ReturnedRows;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::IntoDatum;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// `TimeoutId` of `utils/timeout.h`, which pgrx does not bind: STATEMENT_TIMEOUT is the
/// fourth reason in every version; USER_TIMEOUT (the first a module may register) moved when
/// PostgreSQL 17 added TRANSACTION_TIMEOUT.
const STATEMENT_TIMEOUT: i32 = 3;
#[cfg(not(feature = "pg17"))]
const USER_TIMEOUT: i32 = 12;
#[cfg(feature = "pg17")]
const USER_TIMEOUT: i32 = 13;

// Each can raise (elog(FATAL) when the timeout slots run out, or when setitimer fails):
// every call goes through pgrx's error boundary (`guarded`), since a longjmp through Rust
// frames would be undefined.
extern "C-unwind" {
    fn RegisterTimeout(id: i32, handler: Option<unsafe extern "C" fn()>) -> i32;
    fn enable_timeout_after(id: i32, delay_ms: i32);
    fn disable_timeout(id: i32, keep_indicator: bool);
}

/// `f`, a call of one of the functions above, behind pgrx's error boundary: an error it
/// raises becomes a Rust panic that pgrx turns back into the same Postgres error.
unsafe fn guarded<T>(f: impl FnOnce() -> T) -> T {
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(f) }
}

// Unguarded: SetLatch is called from the timer's signal handler, where pgrx's boundary has
// no business, and neither raises an error.
extern "C" {
    fn get_timeout_active(id: i32) -> bool;
    fn SetLatch(latch: *mut pg_sys::Latch);
}

/// This backend's budget timer, registered on first use (-1: not yet).
static TIMER: AtomicI32 = AtomicI32::new(-1);
/// Set by the timer: the cancel being processed is a pattern's budget, not the statement's.
static SPENT: AtomicBool = AtomicBool::new(false);

/// The timer's handler: what StatementTimeoutHandler's SIGINT amounts to (a pending query
/// cancel, and the latch set so that a wait wakes up), and the mark that it was ours.
unsafe extern "C" fn budget_spent() {
    SPENT.store(true, Ordering::SeqCst);
    unsafe {
        pg_sys::QueryCancelPending = 1;
        pg_sys::InterruptPending = 1;
        if !pg_sys::MyLatch.is_null() {
            SetLatch(pg_sys::MyLatch);
        }
    }
}

fn timer() -> i32 {
    let t = TIMER.load(Ordering::Relaxed);
    if t >= 0 {
        return t;
    }
    let t = unsafe { guarded(|| RegisterTimeout(USER_TIMEOUT, Some(budget_spent))) };
    TIMER.store(t, Ordering::Relaxed);
    t
}

/// The operators, as the filters name them, in the order of `OPS`.
const OPS: [&str; 4] = ["like", "ilike", "match", "imatch"];

const SQL: &str = "SELECT u.n, CASE $4 WHEN 1 THEN u.s LIKE $1 WHEN 2 THEN u.s ILIKE $1 \
     WHEN 3 THEN u.s ~ $1 ELSE u.s ~* $1 END \
     FROM unnest($2::text[], $3::int4[]) AS u(s, n)";

type Row = (i32, Option<i32>, Option<bool>, Option<String>);

/// One pattern (`op`: 1-based in `OPS`) over its subjects: each subject's verdict (None for a NULL subject), or why
/// the pattern could not be evaluated.
/// What every pattern of one call is evaluated with.
struct PerCall {
    plan: pg_sys::SPIPlanPtr,
    /// Where a pattern's arguments are made; reset after each pattern.
    scratch: pg_sys::MemoryContext,
    budget_ms: i32,
    statement_timeout_armed: bool,
}

unsafe fn evaluate_one(
    call: &PerCall,
    pattern: &str,
    op: i32,
    subjects: Vec<Option<String>>,
    numbers: Vec<i32>,
) -> Result<Vec<(i32, Option<bool>)>, String> {
    let PerCall {
        plan,
        scratch,
        budget_ms,
        statement_timeout_armed,
    } = *call;
    unsafe {
        let id = timer();
        let sub = SubXact::begin();
        let (ctx, owner) = (sub.ctx, sub.owner);
        // The pattern's arguments (its subjects' copy above all) are made in `scratch`,
        // which the caller resets after each pattern: made in the call's memory, every
        // pattern's copy stayed until the call ended (issue 39, H1: 1,000 patterns over 400
        // values of 1 kB took a backend 1.2 GB past its start; `pgbench/pattern_memory.py`).
        pg_sys::MemoryContextSwitchTo(scratch);
        let args = [
            crate::identity::text_datum(pattern),
            subjects.into_datum().expect("an array of subjects"),
            numbers.into_datum().expect("an array of numbers"),
            op.into_datum().expect("an operator"),
        ];
        pg_sys::MemoryContextSwitchTo(ctx);
        SPENT.store(false, Ordering::SeqCst);
        guarded(|| enable_timeout_after(id, budget_ms));
        let got = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
            let rc =
                pg_sys::SPI_execute_plan(plan, args.as_ptr().cast_mut(), std::ptr::null(), true, 0);
            // A budget spent between two rows is raised here, inside the subtransaction,
            // rather than at the caller's next interrupt check.
            guarded(|| disable_timeout(id, false));
            pgrx::check_for_interrupts!();
            if rc < 0 {
                pgrx::error!("pattern evaluation failed (SPI error {rc})");
            }
            let table = pg_sys::SPI_tuptable;
            let mut out = Vec::with_capacity(pg_sys::SPI_processed as usize);
            for k in 0..pg_sys::SPI_processed as usize {
                let tuple = *(*table).vals.add(k);
                let (mut n_null, mut v_null) = (false, false);
                let n = pg_sys::SPI_getbinval(tuple, (*table).tupdesc, 1, &mut n_null);
                let v = pg_sys::SPI_getbinval(tuple, (*table).tupdesc, 2, &mut v_null);
                out.push((n.value() as i32, (!v_null).then(|| v.value() != 0)));
            }
            Ok(out)
        }))
        .catch_others(|e| {
            guarded(|| disable_timeout(id, false));
            let r = report(&e);
            let code = r.sql_error_code();
            if code == PgSqlErrorCode::ERRCODE_QUERY_CANCELED {
                // Ours only when our timer fired and the statement's did not.
                let statement_fired =
                    statement_timeout_armed && !get_timeout_active(STATEMENT_TIMEOUT);
                if SPENT.load(Ordering::SeqCst) && !statement_fired {
                    return Err(format!(
                        "the pattern took longer than its {budget_ms} ms to evaluate"
                    ));
                }
                e.rethrow();
            }
            if crate::identity::interrupts_call(code) {
                e.rethrow();
            }
            Err(r.message().to_owned())
        })
        .execute();
        SubXact { ctx, owner }.rollback();
        got
    }
}

fn evaluate(
    patterns: &[(String, i32)],
    subjects: &[Option<String>],
    asked: &[Vec<i32>],
    budget_ms: i32,
    out: &mut Vec<Row>,
) {
    unsafe {
        if pg_sys::SPI_connect() < 0 {
            pgrx::error!("could not connect to SPI");
        }
        let plan = prepare(
            SQL,
            &[
                pg_sys::TEXTOID,
                pg_sys::TEXTARRAYOID,
                pg_sys::INT4ARRAYOID,
                pg_sys::INT4OID,
            ],
        );
        let statement_timeout_armed = get_timeout_active(STATEMENT_TIMEOUT);
        // A child of the call's memory, freed with it: reset, never deleted, so an error
        // while it holds arguments leaves nothing dangling.
        let scratch = pg_sys::AllocSetContextCreateExtended(
            pg_sys::CurrentMemoryContext,
            c"pattern arguments".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        let call = PerCall {
            plan,
            scratch,
            budget_ms,
            statement_timeout_armed,
        };
        for (p, ((pattern, op), numbers)) in patterns.iter().zip(asked).enumerate() {
            if numbers.is_empty() {
                continue;
            }
            let values: Vec<Option<String>> = numbers
                .iter()
                .map(|&s| subjects[s as usize - 1].clone())
                .collect();
            let at = p as i32 + 1;
            let verdict = evaluate_one(&call, pattern, *op, values, numbers.clone());
            pg_sys::MemoryContextReset(call.scratch);
            match verdict {
                Ok(verdicts) => {
                    out.extend(verdicts.into_iter().map(|(s, v)| (at, Some(s), v, None)))
                }
                Err(why) => out.push((at, None, None, Some(why))),
            }
        }
        pg_sys::SPI_finish();
    }
}

#[pg_extern(sql = r#"
CREATE FUNCTION realtime."match_patterns"(patterns text[], ops text[], subjects text[], asked integer[] DEFAULT NULL, budget_ms integer DEFAULT 100)
RETURNS TABLE(pattern integer, subject integer, matched boolean, error text)
VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn match_patterns(
    patterns: Vec<Option<String>>,
    ops: Vec<Option<String>>,
    subjects: Vec<Option<String>>,
    asked: Option<Vec<Option<i32>>>,
    budget_ms: i32,
    fcinfo: pg_sys::FunctionCallInfo,
) {
    if patterns.len() != ops.len() {
        errors::invalid(
            "realtime.match_patterns needs as many ops as patterns",
            None,
        );
    }
    if budget_ms <= 0 {
        errors::invalid("budget_ms must be positive", None);
    }
    let patterns: Vec<(String, i32)> = patterns
        .into_iter()
        .zip(ops)
        .enumerate()
        .map(|(i, (p, op))| {
            let op = op.as_deref().and_then(|o| OPS.iter().position(|&k| k == o));
            match (p, op) {
                (Some(p), Some(op)) => (p, op as i32 + 1),
                _ => errors::invalid(
                    format!(
                        "patterns[{}] must not be NULL and ops[{}] must be like, ilike, match or imatch",
                        i + 1,
                        i + 1
                    ),
                    None,
                ),
            }
        })
        .collect();
    let asked = match asked {
        None => vec![(1..=subjects.len() as i32).collect(); patterns.len()],
        Some(flat) => pairs(&flat, patterns.len(), subjects.len()),
    };
    let mut out = Vec::new();
    without_leftover_subxacts(|| evaluate(&patterns, &subjects, &asked, budget_ms, &mut out));
    let mut rows = unsafe { ReturnedRows::begin(fcinfo) };
    for (pattern, subject, matched, error) in out {
        rows.push(|| {
            [
                pattern.into_datum(),
                subject.into_datum(),
                matched.into_datum(),
                error.into_datum(),
            ]
        });
    }
}

/// `asked` as the subjects each pattern is asked about: a flat list of (pattern, subject)
/// pairs, 1-based.
fn pairs(flat: &[Option<i32>], patterns: usize, subjects: usize) -> Vec<Vec<i32>> {
    if !flat.len().is_multiple_of(2) {
        errors::invalid("asked must hold (pattern, subject) pairs", None);
    }
    let mut per = vec![Vec::new(); patterns];
    for (k, pair) in flat.chunks(2).enumerate() {
        match (pair[0], pair[1]) {
            (Some(p), Some(s))
                if (1..=patterns as i32).contains(&p) && (1..=subjects as i32).contains(&s) =>
            {
                per[p as usize - 1].push(s)
            }
            _ => errors::invalid(
                format!(
                    "asked pair {} is not a (pattern, subject) of this call",
                    k + 1
                ),
                None,
            ),
        }
    }
    per
}
