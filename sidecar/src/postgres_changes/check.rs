//! The join-time check of `postgres_changes` bindings: the tables exist and are published,
//! the role may read them (the role guard, Supabase's 400 and 401), filter and select
//! columns exist and are readable by the role, and filter values are valid for their
//! column's type (`realtime.subscribable`, `sql/subscribable.sql`). The joins waiting are
//! checked in one call on this task's own connection, as the authorizer batches its
//! verdicts. A join is answered only once its bindings passed, so a client that sees
//! SUBSCRIBED is already registered: a change committed after that reaches it.

use super::binding::{Binding, BindingError};
use crate::authorizer::DbFailure;
use crate::config::Config;
use crate::db_worker;
use crate::metrics::Metrics;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

/// Most joins checked in one call.
const BATCH: usize = 1000;

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
    /// Servable; filters carry their typed values.
    Ok(Vec<Binding>),
    Refused(BindingError),
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
    mut rx: mpsc::Receiver<CheckRequest>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let fail = |r: CheckRequest| {
        let _ = r.reply.send(Checked::Failed(DbFailure::Unreachable));
    };
    loop {
        let Some(client) =
            db_worker::connect(&cfg, "subscription check", &mut rx, &mut shutdown, fail).await
        else {
            return;
        };
        while let Some(batch) = db_worker::next_batch(&mut rx, BATCH, &mut shutdown).await {
            metrics
                .postgres_changes_checks_total
                .increment(batch.len() as u64);
            let db = Db {
                client: &client,
                deadline: cfg.db_call_deadline(),
            };
            if !check_batch(&db, batch).await {
                break;
            }
        }
        if *shutdown.borrow() || rx.is_closed() {
            return;
        }
    }
}

/// What one `realtime.subscribable` call says of each binding sent: its error or, per
/// filter condition, its values as the column's type renders them (None for a condition
/// whose value is no value of the column).
type Rows = Vec<(Option<String>, Option<Vec<Option<Vec<Value>>>>)>;

enum CallError {
    Lost(DbFailure),
    /// The database refused the call (an input it cannot take, such as a NUL in a name).
    Refused(String),
}

trait Call {
    async fn subscribable(&self, items: &[Value]) -> Result<Rows, CallError>;
}

struct Db<'a> {
    client: &'a tokio_postgres::Client,
    deadline: std::time::Duration,
}

impl Call for Db<'_> {
    async fn subscribable(&self, items: &[Value]) -> Result<Rows, CallError> {
        let text = Value::Array(items.to_vec()).to_string();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&text];
        let call = self.client.query(SQL, &params);
        let rows = match tokio::time::timeout(self.deadline, call).await {
            Err(_) => return Err(CallError::Lost(DbFailure::QueryCanceled)),
            Ok(Err(_)) if self.client.is_closed() => {
                return Err(CallError::Lost(DbFailure::Unreachable))
            }
            Ok(Err(e)) => {
                if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) {
                    return Err(CallError::Lost(DbFailure::QueryCanceled));
                }
                let why = e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned());
                return Err(CallError::Refused(why));
            }
            Ok(Ok(rows)) => rows,
        };
        let mut out = vec![(None, None); items.len()];
        for row in rows {
            let item: i32 = row.get("item");
            let typed: Option<String> = row.get("typed");
            let typed =
                typed.and_then(|t| serde_json::from_str::<Vec<Option<Vec<Value>>>>(&t).ok());
            if let Some(slot) = out.get_mut(item as usize - 1) {
                *slot = (row.get("error"), typed);
            }
        }
        Ok(out)
    }
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

/// Checks a batch and answers each join. False when the connection is no longer usable.
async fn check_batch(db: &impl Call, batch: Vec<CheckRequest>) -> bool {
    let items: Vec<Value> = batch
        .iter()
        .flat_map(|r| r.bindings.iter().map(|b| item(&r.role, b)))
        .collect();
    match db.subscribable(&items).await {
        Ok(rows) => {
            let mut rows = rows.into_iter();
            for r in batch {
                let mine: Rows = rows.by_ref().take(r.bindings.len()).collect();
                let verdict = verdict(r.bindings, mine);
                let _ = r.reply.send(verdict);
            }
            true
        }
        Err(CallError::Lost(f)) => {
            for r in batch {
                let _ = r.reply.send(Checked::Failed(f.clone()));
            }
            false
        }
        Err(CallError::Refused(why)) if batch.len() == 1 => {
            let r = batch.into_iter().next().expect("one");
            let _ = r
                .reply
                .send(Checked::Refused(BindingError::Rejected { at: 1, why }));
            true
        }
        Err(CallError::Refused(_)) => {
            // One join's input sank the call: check each alone, so only it is refused.
            let mut alive = true;
            for r in batch {
                if alive {
                    alive = Box::pin(check_batch(db, vec![r])).await;
                } else {
                    let _ = r.reply.send(Checked::Failed(DbFailure::Unreachable));
                }
            }
            alive
        }
    }
}

/// A join's bindings with what the database said of each.
fn verdict(mut bindings: Vec<Binding>, rows: Rows) -> Checked {
    for (i, (b, (error, typed))) in bindings.iter_mut().zip(rows).enumerate() {
        if let Some(why) = error {
            return Checked::Refused(BindingError::Rejected { at: i + 1, why });
        }
        let typed = typed.unwrap_or_default();
        for (n, f) in b.filters.iter_mut().enumerate() {
            f.typed = typed.get(n).cloned().flatten();
            if !f.orderable() {
                return Checked::Refused(BindingError::Rejected {
                    at: i + 1,
                    why: format!(
                        "column {}'s values can only be compared with eq, neq, in or isdistinct",
                        f.column
                    ),
                });
            }
        }
    }
    Checked::Ok(bindings)
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

    impl Call for Fake {
        async fn subscribable(&self, items: &[Value]) -> Result<Rows, CallError> {
            self.calls.lock().unwrap().push(items.len());
            if items.iter().any(|i| i["table"] == "poison") {
                return Err(CallError::Refused(
                    "unsupported Unicode escape sequence".into(),
                ));
            }
            Ok(items
                .iter()
                .map(|i| match i["table"].as_str() {
                    Some("missing") => (Some("table public.missing does not exist".into()), None),
                    _ => (None, i.get("filters").map(|_| vec![Some(vec![json!(5)])])),
                })
                .collect())
        }
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
        let Checked::Ok(bindings) = a_rx.await.unwrap() else {
            panic!("a should pass")
        };
        assert_eq!(bindings[0].filters[0].typed, Some(vec![json!(5)]));
        match b_rx.await.unwrap() {
            Checked::Refused(e) => assert_eq!(
                e.text(),
                "InvalidPostgresChanges: binding 2: table public.missing does not exist"
            ),
            other => panic!("{other:?}"),
        }

        let db = Fake::default();
        let (a, a_rx) = request(&["todos"]);
        let (p, p_rx) = request(&["poison"]);
        assert!(check_batch(&db, vec![a, p]).await);
        assert_eq!(*db.calls.lock().unwrap(), vec![2, 1, 1]);
        assert!(matches!(a_rx.await.unwrap(), Checked::Ok(_)));
        match p_rx.await.unwrap() {
            Checked::Refused(e) => {
                assert!(e.text().contains("unsupported Unicode"), "{}", e.text())
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ordering_a_column_of_arrays_is_refused() {
        let (mut r, _) = request(&["todos"]);
        r.bindings[0].filters[0].op = crate::postgres_changes::binding::Op::Gt;
        let rows = vec![(None, Some(vec![Some(vec![json!(["a", "b"])])]))];
        match verdict(r.bindings, rows) {
            Checked::Refused(e) => assert!(e.text().contains("only be compared with eq")),
            other => panic!("{other:?}"),
        }
    }
}
