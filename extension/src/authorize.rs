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
//! * one outer subtransaction holds the probe rows (inserted as the function's owner, which
//!   bypasses RLS) for every (topic, extension) that is to be read;
//! * one subtransaction per distinct (role, claims, headers) sets those settings once;
//! * one subtransaction per request switches to the role, sets `realtime.topic` and runs the
//!   probe; an error there (a policy that raises, a missing privilege) denies that request
//!   only, with the error's text.
//!
//! Every subtransaction is rolled back, so no row, role or setting survives the call, even
//! when a policy errors.

use crate::errors;
use crate::identity::{
    interrupts_call, prepare_generic, report, role_guard, run, set_identity, set_local, text_datum,
    without_leftover_subxacts, SubXact,
};
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
        let mut probes: HashMap<(String, String), Box<[u8; 16]>> = HashMap::new();
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

        let mut start = 0;
        while start < order.len() {
            let first = &requests[order[start]];
            let end = order[start..]
                .iter()
                .position(|&i| {
                    let r = &requests[i];
                    (&r.role, &r.claims, &r.headers) != (&first.role, &first.claims, &first.headers)
                })
                .map_or(order.len(), |p| start + p);
            let group = &order[start..end];
            start = end;

            let role = match role_guard(&first.role) {
                Ok(role) => role,
                Err(why) => {
                    for &i in group {
                        verdicts[i] = (false, Some(why.clone()));
                    }
                    continue;
                }
            };
            let identity = SubXact::begin();
            set_identity(&first.role, &first.claims, &first.headers);
            let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);

            for &i in group {
                let r = &requests[i];
                let probe = SubXact::begin();
                let ctx = probe.ctx;
                let owner = probe.owner;
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
                    // A cancel or statement_timeout (or a shutdown) is about the whole call,
                    // not this request's policy: it must end the call, not become a "no".
                    if interrupts_call(report.sql_error_code()) {
                        e.rethrow();
                    }
                    // An RLS WITH CHECK violation on the write probe is a plain "no".
                    let refused =
                        report.sql_error_code() == PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE;
                    (
                        false,
                        (!(r.write && refused)).then(|| report.message().to_owned()),
                    )
                })
                .execute();
                SubXact { ctx, owner }.rollback();
                verdicts[i] = verdict;
            }
            identity.rollback();
        }
        outer.rollback();
        pg_sys::SPI_finish();
    }
}

#[pg_extern(sql = r#"
CREATE FUNCTION realtime."authorize"(roles text[], claims text[], headers text[], topics text[], extensions text[], actions text[])
RETURNS TABLE("ordinality" integer, allowed boolean, error text)
STRICT VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#)]
#[allow(clippy::type_complexity)]
fn authorize(
    roles: Vec<Option<String>>,
    claims: Vec<Option<String>>,
    headers: Vec<Option<String>>,
    topics: Vec<Option<String>>,
    extensions: Vec<Option<String>>,
    actions: Vec<Option<String>>,
) -> TableIterator<
    'static,
    (
        name!(ordinality, i32),
        name!(allowed, bool),
        name!(error, Option<String>),
    ),
> {
    let requests = parse(roles, claims, headers, topics, extensions, actions);
    let mut verdicts: Vec<Verdict> = vec![(false, None); requests.len()];
    // Requests grouped by who asks, so each identity's settings are made once.
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&requests[a], &requests[b]);
        (&x.role, &x.claims, &x.headers).cmp(&(&y.role, &y.claims, &y.headers))
    });
    without_leftover_subxacts(|| evaluate(&requests, &order, &mut verdicts));
    TableIterator::new(
        verdicts
            .into_iter()
            .enumerate()
            .map(|(i, (allowed, error))| (i as i32 + 1, allowed, error)),
    )
}
