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

/// The tuplestore a materialize-mode call returns its rows in.
pub(crate) struct ReturnedRows {
    store: *mut pg_sys::Tuplestorestate,
    desc: pg_sys::TupleDesc,
    /// Where one row's values are made (a text's copy, say): reset after each row, since
    /// the tuplestore keeps its own copy, so a call returning megabytes of rows does not
    /// hold them twice. A child of the call's memory, freed with it: never deleted here, so
    /// an error raised while it is current (a tuplestore that cannot spill, say) does not
    /// leave the server in a deleted context while the error unwinds.
    scratch: pg_sys::MemoryContext,
}

impl ReturnedRows {
    /// Switches the call to materialize mode: the tuplestore lives in the query's memory,
    /// spills past `work_mem`, and its row type is the function's declared result.
    ///
    /// # Safety
    /// `fcinfo` is the call's own, from a function declared `RETURNS TABLE` or `SETOF`.
    pub(crate) unsafe fn begin(fcinfo: pg_sys::FunctionCallInfo) -> ReturnedRows {
        unsafe {
            let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
            if rsinfo.is_null()
                || (*rsinfo).type_ != pg_sys::NodeTag::T_ReturnSetInfo
                || ((*rsinfo).allowedModes & pg_sys::SetFunctionReturnMode::SFRM_Materialize as i32)
                    == 0
            {
                pgrx::error!("set-valued function called in context that cannot accept a set");
            }
            let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
            if pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc)
                != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE
            {
                pgrx::error!("return type must be a row type");
            }
            let query_memory = (*(*rsinfo).econtext).ecxt_per_query_memory;
            let old = pg_sys::MemoryContextSwitchTo(query_memory);
            let desc = pg_sys::CreateTupleDescCopy(desc);
            let random_access = ((*rsinfo).allowedModes
                & pg_sys::SetFunctionReturnMode::SFRM_Materialize_Random as i32)
                != 0;
            let store = pg_sys::tuplestore_begin_heap(random_access, false, pg_sys::work_mem);
            pg_sys::MemoryContextSwitchTo(old);
            (*rsinfo).returnMode = pg_sys::SetFunctionReturnMode::SFRM_Materialize;
            (*rsinfo).setResult = store;
            (*rsinfo).setDesc = desc;
            let scratch = pg_sys::AllocSetContextCreateExtended(
                pg_sys::CurrentMemoryContext,
                c"returned rows".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            );
            ReturnedRows {
                store,
                desc,
                scratch,
            }
        }
    }

    /// Adds one row: `make` gives its columns in declared order, None for NULL (as
    /// `IntoDatum::into_datum` does).
    pub(crate) fn push<const N: usize>(
        &mut self,
        make: impl FnOnce() -> [Option<pg_sys::Datum>; N],
    ) {
        unsafe {
            if (*self.desc).natts as usize != N {
                pgrx::error!(
                    "a returned row has {N} columns where the function declares {}",
                    (*self.desc).natts
                );
            }
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
