//! Batched RLS authorization: `realtime.authorize(...)` gives the verdicts of Supabase's
//! per-join probe for many (JWT, topic, extension, action) requests in one call.
//!
//! Supabase authorizes a join by inserting a probe row into `realtime.messages` as an admin,
//! switching to the JWT's role with `request.jwt.claims`, `request.jwt.claim.sub`,
//! `request.jwt.claim.role`, `request.headers` and `realtime.topic` set, and selecting the row
//! back under RLS (read), or by inserting a row as that role (write: an RLS or privilege
//! refusal, 42501, denies); then it rolls everything back. This does the same, with the same
//! settings, inside subtransactions of the caller's transaction:
//!
//! * one outer subtransaction holds the probe rows for every (topic, extension) that is to be
//!   read, inserted as `realtime_prober` (BYPASSRLS, INSERT on `realtime.messages` and
//!   nothing else: a trigger on the table runs with those rights);
//! * the read requests of one role run together in one subtransaction, on one executor
//!   start: each identity sets its settings, each request `realtime.topic`, and the probe
//!   runs again (`read_together`); if one raises an error, all of that role's reads are
//!   rolled back and run again as the writes always are:
//! * one subtransaction per distinct (role, claims, headers) sets those settings once, and
//!   in it one subtransaction per request switches to the role, sets `realtime.topic` and
//!   runs the probe, so that an error there (a policy that raises, a missing privilege)
//!   denies that request only, with the error's text.
//!
//! Every subtransaction is rolled back, so no row, role or setting survives the call, even
//! when a policy errors.

use crate::errors;
use crate::identity::{
    as_role, interrupts_call, item_error, prepare_generic, prober, report, role_guard, run,
    set_identity, set_local, text_datum, without_leftover_subxacts, SubXact,
};
use crate::rerun::Rerun;
use crate::returned_rows::ReturnedRows;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::HashMap;

struct Request {
    role: String,
    claims: String,
    headers: String,
    topic: String,
    extension: String,
    write: bool,
}

type Verdict = (bool, Option<String>);

fn parse(
    roles: Vec<Option<String>>,
    claims: Vec<Option<String>>,
    headers: Vec<Option<String>>,
    topics: Vec<Option<String>>,
    extensions: Vec<Option<String>>,
    actions: Vec<Option<String>>,
) -> Vec<Request> {
    let n = roles.len();
    if [
        claims.len(),
        headers.len(),
        topics.len(),
        extensions.len(),
        actions.len(),
    ]
    .iter()
    .any(|&l| l != n)
    {
        errors::invalid("realtime.authorize needs arrays of the same length", None);
    }
    let mut out = Vec::with_capacity(n);
    let parts = roles
        .into_iter()
        .zip(claims)
        .zip(headers)
        .zip(topics)
        .zip(extensions)
        .zip(actions);
    for (i, (((((role, claims), headers), topic), extension), action)) in parts.enumerate() {
        let at = i + 1;
        let Some(role) = role else {
            errors::invalid(format!("roles[{at}] must not be NULL"), None)
        };
        let Some(topic) = topic else {
            errors::invalid(format!("topics[{at}] must not be NULL"), None)
        };
        let extension = match extension.as_deref() {
            Some(e @ ("broadcast" | "presence")) => e.to_owned(),
            _ => errors::invalid(
                format!("extensions[{at}] must be 'broadcast' or 'presence'"),
                None,
            ),
        };
        let write = match action.as_deref() {
            Some("read") => false,
            Some("write") => true,
            _ => errors::invalid(format!("actions[{at}] must be 'read' or 'write'"), None),
        };
        out.push(Request {
            role,
            claims: claims.unwrap_or_else(|| "{}".into()),
            headers: headers.unwrap_or_else(|| "{}".into()),
            topic,
            extension,
            write,
        });
    }
    out
}

/// Runs every request's probe, filling `verdicts`; `order` groups requests by identity.
fn evaluate(requests: &[Request], order: &[usize], verdicts: &mut [Verdict]) {
    unsafe {
        if pg_sys::SPI_connect() < 0 {
            pgrx::error!("could not connect to SPI");
        }
        let probe_insert = prepare_generic(
            "INSERT INTO realtime.messages (topic, extension, id) VALUES ($1, $2, $3)",
            &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::UUIDOID],
        );
        let probe_read = prepare_generic(
            "SELECT 1 FROM realtime.messages WHERE id = $1",
            &[pg_sys::UUIDOID],
        );
        let probe_write = prepare_generic(
            "INSERT INTO realtime.messages (topic, extension) VALUES ($1, $2)",
            &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        );

        let outer = SubXact::begin();
        let mut probes: Probes = HashMap::new();
        // As realtime_prober: a trigger on realtime.messages or the partition a row lands
        // in runs with its rights (BYPASSRLS, INSERT on realtime.messages), never the
        // caller's, and its effects are rolled back with `outer`.
        let prober = prober();
        as_role(prober, || {
            for r in requests.iter().filter(|r| !r.write) {
                if let std::collections::hash_map::Entry::Vacant(slot) =
                    probes.entry((r.topic.clone(), r.extension.clone()))
                {
                    let id = Box::new(crate::payload::new_id());
                    let args = [
                        text_datum(&r.topic),
                        text_datum(&r.extension),
                        pg_sys::Datum::from(id.as_ptr()),
                    ];
                    run(probe_insert, &args);
                    slot.insert(id);
                }
            }
        });

        // `order` sorts by role, then claims and headers: each role's requests, and within
        // them each identity's, are contiguous.
        for group in runs(order, |&i| &requests[i].role) {
            let first = &requests[group[0]];
            let role = match role_guard(&first.role) {
                Ok(role) => role,
                Err(why) => {
                    for &i in group {
                        verdicts[i] = (false, Some(why.clone()));
                    }
                    continue;
                }
            };
            let (reads, mut isolate): (Vec<usize>, Vec<usize>) =
                group.iter().partition(|&&i| !requests[i].write);
            if !reads.is_empty() {
                match read_together(requests, &reads, role, probe_read, &probes, verdicts) {
                    Ok(()) => {}
                    Err(why) => {
                        pgrx::debug1!(
                            "realtime.authorize: the reads of role {} run one by one after: {why}",
                            first.role
                        );
                        isolate.extend(reads);
                        isolate.sort_by(|&a, &b| {
                            identity_of(&requests[a]).cmp(&identity_of(&requests[b]))
                        });
                    }
                }
            }
            for identity in runs(&isolate, |&i| identity_of(&requests[i])) {
                let r0 = &requests[identity[0]];
                let subxact = SubXact::begin();
                set_identity(&r0.role, &r0.claims, &r0.headers);
                for &i in identity {
                    verdicts[i] = probe_alone(&requests[i], role, probe_read, probe_write, &probes);
                }
                subxact.rollback();
            }
        }
        outer.rollback();
        pg_sys::SPI_finish();
    }
}

type Probes = HashMap<(String, String), Box<[u8; 16]>>;

fn identity_of(r: &Request) -> (&str, &str, &str) {
    (&r.role, &r.claims, &r.headers)
}

/// The runs of consecutive items of `items` with the same key.
fn runs<'a, T, K: PartialEq>(
    items: &'a [T],
    key: impl Fn(&T) -> K + 'a,
) -> impl Iterator<Item = &'a [T]> + 'a {
    let mut rest = items;
    std::iter::from_fn(move || {
        let first = rest.first()?;
        let k = key(first);
        let n = rest.iter().position(|x| key(x) != k).unwrap_or(rest.len());
        let (run, tail) = rest.split_at(n);
        rest = tail;
        Some(run)
    })
}

/// The read requests of one role (`reads`, grouped by identity), all in one subtransaction
/// and on one executor start (`rerun.rs`): a read probe changes nothing that a later one
/// could see but the settings, which each identity and request sets anew (every setting an
/// identity sets, each sets), so there is nothing to undo between them. The executor start
/// per probe was 40% of a verdict's time (`pgbench/profile.py authorize --callgraph`);
/// without it and the subtransactions per identity and request, a batch of 10,000 reads
/// of as many users went from 64,710 to 128,374 verdicts/s. If a probe fails (a policy
/// raised), everything here is rolled back and the error returned: the caller runs these
/// requests one subtransaction each, so that only the failing one is denied, with its error.
unsafe fn read_together(
    requests: &[Request],
    reads: &[usize],
    role: pg_sys::Oid,
    probe_read: pg_sys::SPIPlanPtr,
    probes: &Probes,
    verdicts: &mut [Verdict],
) -> Result<(), String> {
    unsafe {
        let subxact = SubXact::begin();
        let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        let together = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
            // As the role before the plan is fetched: its policies are in the plan.
            pg_sys::SetUserIdAndSecContext(
                role,
                saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
            );
            let mut rerun = Rerun::start(probe_read, pg_sys::UUIDOID);
            for identity in runs(reads, |&i| identity_of(&requests[i])) {
                let r0 = &requests[identity[0]];
                set_identity(&r0.role, &r0.claims, &r0.headers);
                for &i in identity {
                    let r = &requests[i];
                    set_local("realtime.topic", &r.topic);
                    let id = &probes[&(r.topic.clone(), r.extension.clone())];
                    verdicts[i] = (rerun.run(pg_sys::Datum::from(id.as_ptr())) == 1, None);
                }
            }
            rerun.finish();
            Ok(())
        }))
        .catch_others(item_error)
        .execute();
        if together.is_ok() {
            pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
        }
        subxact.rollback();
        together
    }
}

/// One request's probe in a subtransaction of its own, as `role` (the identity's settings
/// made by the caller): an error there denies this request only, with the error's text.
unsafe fn probe_alone(
    r: &Request,
    role: pg_sys::Oid,
    probe_read: pg_sys::SPIPlanPtr,
    probe_write: pg_sys::SPIPlanPtr,
    probes: &Probes,
) -> Verdict {
    unsafe {
        let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        let sub = SubXact::begin();
        let (ctx, owner) = (sub.ctx, sub.owner);
        let verdict = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
            pg_sys::SetUserIdAndSecContext(
                role,
                saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
            );
            set_local("realtime.topic", &r.topic);
            let allowed = if r.write {
                run(
                    probe_write,
                    &[text_datum(&r.topic), text_datum(&r.extension)],
                ) == 1
            } else {
                let id = &probes[&(r.topic.clone(), r.extension.clone())];
                run(probe_read, &[pg_sys::Datum::from(id.as_ptr())]) == 1
            };
            (allowed, None)
        }))
        .catch_others(|e| {
            let report = report(&e);
            // A cancel or statement_timeout (or a shutdown) is about the whole call, not
            // this request's policy: it must end the call, not become a "no".
            if interrupts_call(report.sql_error_code()) {
                e.rethrow();
            }
            // An RLS WITH CHECK violation on the write probe is a plain "no".
            let refused = report.sql_error_code() == PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE;
            (
                false,
                (!(r.write && refused)).then(|| report.message().to_owned()),
            )
        })
        .execute();
        // Also restores the user the subtransaction began with.
        SubXact { ctx, owner }.rollback();
        verdict
    }
}

#[pg_extern(sql = r#"
CREATE FUNCTION realtime."authorize"(roles text[], claims text[], headers text[], topics text[], extensions text[], actions text[])
RETURNS TABLE("ordinality" integer, allowed boolean, error text)
STRICT VOLATILE PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
fn authorize(
    roles: Vec<Option<String>>,
    claims: Vec<Option<String>>,
    headers: Vec<Option<String>>,
    topics: Vec<Option<String>>,
    extensions: Vec<Option<String>>,
    actions: Vec<Option<String>>,
    fcinfo: pg_sys::FunctionCallInfo,
) {
    let requests = parse(roles, claims, headers, topics, extensions, actions);
    let mut verdicts: Vec<Verdict> = vec![(false, None); requests.len()];
    // Requests grouped by who asks, so each identity's settings are made once.
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&requests[a], &requests[b]);
        (&x.role, &x.claims, &x.headers).cmp(&(&y.role, &y.claims, &y.headers))
    });
    without_leftover_subxacts(|| evaluate(&requests, &order, &mut verdicts));
    let mut rows = unsafe { ReturnedRows::begin(fcinfo) };
    for (i, (allowed, error)) in verdicts.into_iter().enumerate() {
        rows.push(|| {
            [
                (i as i32 + 1).into_datum(),
                allowed.into_datum(),
                error.into_datum(),
            ]
        });
    }
}
