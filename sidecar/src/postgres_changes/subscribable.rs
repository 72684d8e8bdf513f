//! The join-time check of `postgres_changes` bindings: the tables exist and are published,
//! the role may read them (the role guard, Supabase's 400 and 401), filter and select
//! columns exist and are readable by the role, and filter values are valid for their
//! column's type (`realtime.subscribable`, `sql/subscribable.sql`). The joins waiting are
//! checked in one call on this task's own connection, as the authorizer batches its
//! verdicts. A join is answered only once its bindings passed, so a client that sees
//! SUBSCRIBED is already registered: a change committed after that reaches it.

use super::binding::{Binding, BindingError};
use super::unserved::Unserved;
use crate::config::Config;
use crate::db_worker::{self, Batched, CallError, Db, DbFailure};
use crate::metrics::Metrics;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

const SQL: &str =
    "SELECT item, error, \"values\"::text AS typed FROM realtime.subscribable($1::text::jsonb)";

/// A join's bindings, to be checked for its role.
pub struct CheckRequest {
    pub role: String,
    pub bindings: Vec<Binding>,
    pub reply: oneshot::Sender<Checked>,
}

/// How a join's bindings fared.
#[derive(Debug)]
pub enum Checked {
    /// The servable, their filters carrying their typed values; and those the database
    /// refused (`unserved`), the channel told why.
    Ok(Vec<Binding>, Vec<Unserved>),
    /// The database could not answer: not a refusal.
    Failed(DbFailure),
}

/// Checks one join's bindings (batched with whatever else is waiting).
pub async fn check(tx: &mpsc::Sender<CheckRequest>, role: &str, bindings: Vec<Binding>) -> Checked {
    let (reply, rx) = oneshot::channel();
    let req = CheckRequest {
        role: role.to_owned(),
        bindings,
        reply,
    };
    if tx.send(req).await.is_err() {
        return Checked::Failed(DbFailure::Unreachable);
    }
    rx.await.unwrap_or(Checked::Failed(DbFailure::Unreachable))
}

/// Runs until shutdown, checking what joins queue on `rx`.
pub async fn run(
    cfg: Arc<Config>,
    rx: mpsc::Receiver<CheckRequest>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    db_worker::serve(&cfg, Checker { metrics }, rx, shutdown).await
}

/// What one `realtime.subscribable` call says of each binding sent: its error or, per
/// filter condition, its values as the column's type renders them (None for a condition
/// whose value is no value of the column).
type Rows = Vec<(Option<String>, Option<Vec<Option<Vec<Value>>>>)>;

/// `realtime.subscribable` over the bindings of a batch of joins: each join's rows.
struct Checker {
    metrics: Arc<Metrics>,
}

impl Batched for Checker {
    type Req = CheckRequest;
    type Out = Rows;
    const WHAT: &'static str = "subscription check";
    const MAX: usize = 1000;

    async fn call(&self, db: &Db, batch: &[CheckRequest]) -> Result<Vec<Rows>, CallError> {
        let text = Value::Array(items(batch)).to_string();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&text];
        let rows = match db.query(SQL, &params).await {
            // A check that ran out of time is the database's failure, not a join's: split,
            // each half would wait as long again.
            Err(CallError::Failed { canceled: true, .. }) => {
                return Err(CallError::Lost(DbFailure::QueryCanceled))
            }
            other => other?,
        };
        let mut out: Rows = vec![(None, None); count(batch)];
        for row in rows {
            let item: i32 = row.get("item");
            let typed: Option<String> = row.get("typed");
            let typed =
                typed.and_then(|t| serde_json::from_str::<Vec<Option<Vec<Value>>>>(&t).ok());
            if let Some(slot) = out.get_mut(item as usize - 1) {
                *slot = (row.get("error"), typed);
            }
        }
        Ok(per_join(batch, out))
    }

    fn answer(&self, r: CheckRequest, rows: Rows) {
        let _ = r.reply.send(verdict(r.bindings, rows));
    }

    fn fail(&self, r: CheckRequest, why: DbFailure) {
        let _ = r.reply.send(Checked::Failed(why));
    }

    fn refuse(&self, r: CheckRequest, why: String) {
        let unserved = r
            .bindings
            .iter()
            .map(|b| {
                let why = why.clone();
                Unserved::of(b, BindingError::Rejected { at: b.at, why })
            })
            .collect();
        let _ = r.reply.send(Checked::Ok(Vec::new(), unserved));
    }

    fn taken(&self, batch: &[CheckRequest]) {
        self.metrics
            .postgres_changes_checks_total
            .increment(batch.len() as u64);
    }
}

/// What the database is told of a batch's bindings, join after join.
fn items(batch: &[CheckRequest]) -> Vec<Value> {
    batch
        .iter()
        .flat_map(|r| r.bindings.iter().map(|b| item(&r.role, b)))
        .collect()
}

fn count(batch: &[CheckRequest]) -> usize {
    batch.iter().map(|r| r.bindings.len()).sum()
}

/// The rows of a batch's bindings cut into each join's.
fn per_join(batch: &[CheckRequest], rows: Rows) -> Vec<Rows> {
    let mut rows = rows.into_iter();
    batch
        .iter()
        .map(|r| rows.by_ref().take(r.bindings.len()).collect())
        .collect()
}

/// What the database is told of one binding.
fn item(role: &str, b: &Binding) -> Value {
    let mut o = json!({"role": role, "schema": b.schema});
    if let Some(t) = &b.table {
        o["table"] = json!(t);
    }
    if !b.filters.is_empty() {
        let filters: Vec<Value> = b
            .filters
            .iter()
            .map(|f| json!({"column": f.column, "op": f.op.name(), "values": f.values}))
            .collect();
        o["filters"] = Value::Array(filters);
    }
    if let Some(s) = &b.select {
        o["select"] = json!(s);
    }
    o
}

/// A join's bindings with what the database said of each: served, or not and why.
fn verdict(bindings: Vec<Binding>, rows: Rows) -> Checked {
    let (mut served, mut unserved) = (Vec::new(), Vec::new());
    for (mut b, (error, typed)) in bindings.into_iter().zip(rows) {
        let at = b.at;
        if let Some(why) = error {
            unserved.push(Unserved::of(&b, BindingError::Rejected { at, why }));
            continue;
        }
        let typed = typed.unwrap_or_default();
        for (n, f) in b.filters.iter_mut().enumerate() {
            f.typed = typed.get(n).cloned().flatten();
        }
        match b.filters.iter().find(|f| !f.orderable()) {
            Some(f) => {
                let why = format!(
                    "column {}'s values can only be compared with eq, neq, in or isdistinct",
                    f.column
                );
                unserved.push(Unserved::of(&b, BindingError::Rejected { at, why }));
            }
            None => served.push(b),
        }
    }
    Checked::Ok(served, unserved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres_changes::parse_bindings;
    use std::sync::Mutex;

    /// Plays `realtime.subscribable`: refuses any call holding a table named "poison" as a
    /// whole, and says "no such table" of tables named "missing".
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<usize>>,
    }

    impl db_worker::Call<CheckRequest, Rows> for Fake {
        async fn call(&self, batch: &[CheckRequest]) -> Result<Vec<Rows>, CallError> {
            let items = items(batch);
            self.calls.lock().unwrap().push(items.len());
            if items.iter().any(|i| i["table"] == "poison") {
                return Err(CallError::Failed {
                    canceled: false,
                    message: "unsupported Unicode escape sequence".into(),
                });
            }
            let rows = items
                .iter()
                .map(|i| match i["table"].as_str() {
                    Some("missing") => (Some("table public.missing does not exist".into()), None),
                    _ => (None, i.get("filters").map(|_| vec![Some(vec![json!(5)])])),
                })
                .collect();
            Ok(per_join(batch, rows))
        }
    }

    /// Checks a batch as the checker does, with `db` in place of its connection.
    async fn check_batch(db: &Fake, batch: Vec<CheckRequest>) -> bool {
        let worker = Checker {
            metrics: Arc::new(Metrics::default()),
        };
        db_worker::settle(&worker, db, batch).await
    }

    fn request(tables: &[&str]) -> (CheckRequest, oneshot::Receiver<Checked>) {
        let list: Vec<Value> = tables
            .iter()
            .map(|t| json!({"event": "*", "schema": "public", "table": t, "filter": "id=eq.5"}))
            .collect();
        let (reply, rx) = oneshot::channel();
        let req = CheckRequest {
            role: "authenticated".into(),
            bindings: parse_bindings(Some(&Value::Array(list))).unwrap(),
            reply,
        };
        (req, rx)
    }

    #[tokio::test]
    async fn joins_are_checked_in_one_call_and_a_poisoned_one_is_refused_alone() {
        let db = Fake::default();
        let (a, a_rx) = request(&["todos", "notes"]);
        let (b, b_rx) = request(&["todos", "missing"]);
        assert!(check_batch(&db, vec![a, b]).await);
        assert_eq!(*db.calls.lock().unwrap(), vec![4]);
        let Checked::Ok(bindings, unserved) = a_rx.await.unwrap() else {
            panic!("a should pass")
        };
        assert!(unserved.is_empty());
        assert_eq!(bindings[0].filters[0].typed, Some(vec![json!(5)]));
        // The other binding of b is served; the missing table alone is not.
        match b_rx.await.unwrap() {
            Checked::Ok(served, unserved) => {
                assert_eq!(served.len(), 1);
                assert_eq!(
                    unserved[0].error.text(),
                    "InvalidPostgresChanges: binding 2: table public.missing does not exist"
                );
            }
            other => panic!("{other:?}"),
        }

        let db = Fake::default();
        let (a, a_rx) = request(&["todos"]);
        let (p, p_rx) = request(&["poison"]);
        assert!(check_batch(&db, vec![a, p]).await);
        assert_eq!(*db.calls.lock().unwrap(), vec![2, 1, 1]);
        assert!(matches!(a_rx.await.unwrap(), Checked::Ok(_, u) if u.is_empty()));
        match p_rx.await.unwrap() {
            Checked::Ok(served, unserved) if served.is_empty() => {
                let text = unserved[0].error.text();
                assert!(text.contains("unsupported Unicode"), "{text}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ordering_a_column_of_arrays_is_refused() {
        let (mut r, _) = request(&["todos"]);
        r.bindings[0].filters[0].op = crate::postgres_changes::filter::Op::Gt;
        let rows = vec![(None, Some(vec![Some(vec![json!(["a", "b"])])]))];
        match verdict(r.bindings, rows) {
            Checked::Ok(served, unserved) if served.is_empty() => {
                assert!(unserved[0]
                    .error
                    .text()
                    .contains("only be compared with eq"))
            }
            other => panic!("{other:?}"),
        }
    }
}
