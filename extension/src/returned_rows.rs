//! A set-returning function's rows handed to the executor in one call (PostgreSQL's
//! "materialize" mode), for the batched functions defined with `SET search_path`.
//!
//! pgrx's `TableIterator` returns one row per call of the function ("value per call"). For
//! a function with a `SET` clause every call goes through `fmgr_security_definer`, which
//! applies the setting (`ProcessGUCArray`, parsing the search path) and undoes it
//! (`AtEOXact_GUC`, a walk of every GUC variable) around each row: a `realtime.visible`
//! call returning 10,000 (identity, record) pairs spent 17% of its backend's time there.
//! Here the function fills a tuplestore once, as PL/pgSQL's `RETURN NEXT` does, and the
//! setting is applied once per call.

use pgrx::pg_sys;
// PostgreSQL's own set-up of a materialize-mode call: it checks that the caller accepts a
// set, makes the tuplestore in the query's memory (spilling past `work_mem`) with the
// function's declared row type, and hands both to the executor. PostgreSQL 15 calls it
// `SetSingleFuncCall` (every 15.x has that name); 16 renamed it.
#[cfg(feature = "pg17")]
use pg_sys::InitMaterializedSRF as init_materialized_srf;
#[cfg(not(feature = "pg17"))]
use pg_sys::SetSingleFuncCall as init_materialized_srf;

/// The tuplestore a materialize-mode call returns its rows of `N` columns in.
pub(crate) struct ReturnedRows<const N: usize> {
    store: *mut pg_sys::Tuplestorestate,
    desc: pg_sys::TupleDesc,
    /// Where one row's values are made (a text's copy, say): reset after each row, since
    /// the tuplestore keeps its own copy, so a call returning megabytes of rows does not
    /// hold them twice. A child of the call's memory, freed with it: never deleted here, so
    /// an error raised while it is current (a tuplestore that cannot spill, say) does not
    /// leave the server in a deleted context while the error unwinds.
    scratch: pg_sys::MemoryContext,
}

impl<const N: usize> ReturnedRows<N> {
    /// Switches the call to materialize mode.
    ///
    /// # Safety
    /// `fcinfo` is the call's own, from a function declared `RETURNS TABLE` or `SETOF`.
    pub(crate) unsafe fn begin(fcinfo: pg_sys::FunctionCallInfo) -> Self {
        unsafe {
            init_materialized_srf(fcinfo, 0);
            let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
            let desc = (*rsinfo).setDesc;
            if (*desc).natts as usize != N {
                pgrx::error!(
                    "returned rows have {N} columns where the function declares {}",
                    (*desc).natts
                );
            }
            let scratch = pg_sys::AllocSetContextCreateExtended(
                pg_sys::CurrentMemoryContext,
                c"returned rows".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            );
            ReturnedRows {
                store: (*rsinfo).setResult,
                desc,
                scratch,
            }
        }
    }

    /// Adds one row: `make` gives its columns in declared order, None for NULL (as
    /// `IntoDatum::into_datum` does).
    pub(crate) fn push(&mut self, make: impl FnOnce() -> [Option<pg_sys::Datum>; N]) {
        unsafe {
            let old = pg_sys::MemoryContextSwitchTo(self.scratch);
            let row = make();
            let mut values = [pg_sys::Datum::from(0); N];
            let mut nulls = [false; N];
            for (i, v) in row.into_iter().enumerate() {
                match v {
                    Some(d) => values[i] = d,
                    None => nulls[i] = true,
                }
            }
            pg_sys::tuplestore_putvalues(
                self.store,
                self.desc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::MemoryContextReset(self.scratch);
        }
    }
}
