//! One read-only probe run many times on a single executor start.
//!
//! A batched authorization runs the same `SELECT` once per request of an identity, with a
//! different parameter and `realtime.topic` each time. Through SPI every run plans nothing
//! (the plan is cached) but starts and ends the executor: opening the relations and
//! indexes, building every node, qualifier and subplan of the policies. That start was
//! 40% of a verdict's time (`pgbench/profile.py authorize --callgraph`). Here the executor
//! starts once per identity and each further run rescans it, as a cursor rewinds: the
//! choice took batched verdicts from 64,710 to 128,374 a second.
//!
//! A rewind alone would be wrong for a probe: a policy's `(SELECT realtime.topic())` is
//! an initplan, computed once and then kept across rescans because none of its inputs is
//! a parameter that changed; an uncorrelated hashed subplan keeps its hash table and a
//! CTE its stored rows likewise. The setting did change, so each run after the first
//! tells every one of them, in the way the executor notices it, to compute afresh at its
//! next use (`rescan`). Correlated subplans are rescanned at every use anyway, and index
//! keys from parameters are evaluated again at each rescan.
//! `regress/sql/authorize_property.sql` checks the verdicts against Supabase's probe,
//! with policies of each of those forms.
//!
//! Lifetime: start, run, finish in one subtransaction, under the role the plan was made
//! for. If a run raises an error the subtransaction's abort releases what the executor
//! held; the `Rerun` is then dropped without `finish`.

use pgrx::pg_sys;

pub(crate) struct Rerun {
    qd: *mut pg_sys::QueryDesc,
    params: pg_sys::ParamListInfo,
    cplan: *mut pg_sys::CachedPlan,
    /// The statement's subplans that a rerun must tell to compute afresh, found once at
    /// start (the executor's tree does not change between runs).
    subplans: Subplans,
    ran: bool,
}

#[derive(Default)]
struct Subplans {
    initplans: Vec<*mut pg_sys::SubPlanState>,
    hashed: Vec<*mut pg_sys::SubPlanState>,
}

impl Rerun {
    /// Prepares `plan` (one `SELECT` taking one parameter of type `ptype`) for runs under
    /// the current user and a new snapshot.
    pub(crate) unsafe fn start(plan: pg_sys::SPIPlanPtr, ptype: pg_sys::Oid) -> Rerun {
        unsafe {
            let cplan = pg_sys::SPI_plan_get_cached_plan(plan);
            if cplan.is_null() || (*(*cplan).stmt_list).length != 1 {
                pgrx::error!("a probe must be one statement");
            }
            let stmt = (*(*(*cplan).stmt_list).elements).ptr_value as *mut pg_sys::PlannedStmt;
            // As SPI runs a statement that is not read-only: see what came before.
            pg_sys::CommandCounterIncrement();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
            let params = pg_sys::makeParamList(1);
            let p = (*params).params.as_mut_ptr();
            (*p).isnull = false;
            (*p).pflags = pg_sys::PARAM_FLAG_CONST as u16;
            (*p).ptype = ptype;
            let qd = pg_sys::CreateQueryDesc(
                stmt,
                c"realtime.authorize probe".as_ptr(),
                pg_sys::GetActiveSnapshot(),
                std::ptr::null_mut(),
                pg_sys::None_Receiver,
                params,
                std::ptr::null_mut(),
                0,
            );
            pg_sys::ExecutorStart(qd, 0);
            Rerun {
                qd,
                params,
                cplan,
                subplans: subplans((*qd).estate, (*qd).planstate),
                ran: false,
            }
        }
    }

    /// Runs the probe with parameter `arg`; the number of rows it returned (at most 1).
    pub(crate) unsafe fn run(&mut self, arg: pg_sys::Datum) -> u64 {
        unsafe {
            (*(*self.params).params.as_mut_ptr()).value = arg;
            let estate = (*self.qd).estate;
            if self.ran {
                rescan(estate, (*self.qd).planstate, &self.subplans);
            }
            self.ran = true;
            (*estate).es_processed = 0;
            pg_sys::ExecutorRun(
                self.qd,
                pg_sys::ScanDirection::ForwardScanDirection,
                1,
                false,
            );
            (*estate).es_processed
        }
    }

    pub(crate) unsafe fn finish(self) {
        unsafe {
            pg_sys::ExecutorFinish(self.qd);
            pg_sys::ExecutorEnd(self.qd);
            pg_sys::FreeQueryDesc(self.qd);
            pg_sys::PopActiveSnapshot();
            pg_sys::ReleaseCachedPlan(self.cplan, std::ptr::null_mut());
        }
    }
}

/// The elements of a Postgres list.
unsafe fn cells(l: *mut pg_sys::List) -> impl Iterator<Item = pg_sys::ListCell> {
    let n = if l.is_null() {
        0
    } else {
        unsafe { (*l).length as usize }
    };
    (0..n).map(move |i| unsafe { *(*l).elements.add(i) })
}

unsafe fn list<T>(l: *mut pg_sys::List) -> impl Iterator<Item = *mut T> {
    unsafe { cells(l) }.map(|c| unsafe { c.ptr_value } as *mut T)
}

/// The initplans and hashed subplans of the statement: on the nodes of the main tree and
/// of the subplans' trees.
unsafe fn subplans(estate: *mut pg_sys::EState, top: *mut pg_sys::PlanState) -> Subplans {
    unsafe {
        let mut found = Subplans::default();
        let mut stack = vec![top];
        stack.extend(list::<pg_sys::PlanState>((*estate).es_subplanstates));
        while let Some(ps) = stack.pop() {
            if ps.is_null() {
                continue;
            }
            found
                .initplans
                .extend(list::<pg_sys::SubPlanState>((*ps).initPlan));
            found.hashed.extend(
                list::<pg_sys::SubPlanState>((*ps).subPlan)
                    .filter(|&s| (*(*s).subplan).useHashTable),
            );
            stack.push((*ps).lefttree);
            stack.push((*ps).righttree);
            push_children(ps, &mut stack);
        }
        found
    }
}

/// Rescans the statement so that its next run computes every subplan afresh: each kind
/// is told in the way the executor notices it (`nodeSubplan.c`, `nodeCtescan.c`).
unsafe fn rescan(estate: *mut pg_sys::EState, top: *mut pg_sys::PlanState, found: &Subplans) {
    unsafe {
        let is_cte = |s: *mut pg_sys::SubPlanState| {
            (*(*s).subplan).subLinkType == pg_sys::SubLinkType::CTE_SUBLINK
        };
        // A CTE scan empties the CTE's stored rows at its rescan if the CTE's plan is
        // marked changed; it is read again then, at the next fetch.
        for &s in found.initplans.iter().filter(|&&s| is_cte(s)) {
            mark_changed((*s).planstate);
        }
        pg_sys::ExecReScan(top);
        for &s in found.initplans.iter().filter(|&&s| !is_cte(s)) {
            // An initplan runs when its output is next read with `execPlan` set, from
            // where its tree stands: rewound here. (Not marked changed: its parent's rescan
            // would then take it for a correlated initplan, which it refuses.)
            pg_sys::ExecReScan((*s).planstate);
            for c in cells((*(*s).subplan).setParam) {
                (*(*estate).es_param_exec_vals.add(c.int_value as usize)).execPlan = s.cast();
            }
        }
        // A hashed subplan builds its table at its next use when it has none. (Marking it
        // changed is what a rescan looks at before 15.x minors that added a flag for it;
        // having no table is what every version looks at.) The build resets the memory the
        // old table was in.
        for &s in &found.hashed {
            (*s).hashtable = std::ptr::null_mut();
            (*s).hashnulls = std::ptr::null_mut();
        }
    }
}

/// Any member works: a node whose set is not empty is rescanned at its next fetch, and
/// what a rescan passes down is cut to the parameters each child uses.
unsafe fn mark_changed(ps: *mut pg_sys::PlanState) {
    unsafe { (*ps).chgParam = pg_sys::bms_add_member((*ps).chgParam, 0) };
}

/// The children of the nodes that keep them outside lefttree and righttree.
unsafe fn push_children(ps: *mut pg_sys::PlanState, stack: &mut Vec<*mut pg_sys::PlanState>) {
    unsafe {
        let array =
            |p: *mut *mut pg_sys::PlanState, n: i32| (0..n.max(0) as usize).map(move |i| *p.add(i));
        use pg_sys::NodeTag::*;
        match (*ps).type_ {
            T_AppendState => {
                let a = ps as *mut pg_sys::AppendState;
                stack.extend(array((*a).appendplans, (*a).as_nplans));
            }
            T_MergeAppendState => {
                let a = ps as *mut pg_sys::MergeAppendState;
                stack.extend(array((*a).mergeplans, (*a).ms_nplans));
            }
            T_BitmapAndState => {
                let a = ps as *mut pg_sys::BitmapAndState;
                stack.extend(array((*a).bitmapplans, (*a).nplans));
            }
            T_BitmapOrState => {
                let a = ps as *mut pg_sys::BitmapOrState;
                stack.extend(array((*a).bitmapplans, (*a).nplans));
            }
            T_SubqueryScanState => {
                stack.push((*(ps as *mut pg_sys::SubqueryScanState)).subplan);
            }
            _ => {}
        }
    }
}
