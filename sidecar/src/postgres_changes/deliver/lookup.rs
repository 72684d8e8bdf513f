//! What a check asks the database, behind one seam (`Lookup`): the table's facts, the
//! rows each identity may see, the patterns' verdicts. `Db` asks them of a connection; the
//! tests answer them from memory.

use std::collections::HashMap;
use std::time::Duration;

/// What the stage learns of a table once per batch.
#[derive(Clone, Debug, Default)]
pub struct TableInfo {
    pub oid: u32,
    pub rls: bool,
    pub primary_key: Vec<String>,
    /// Per role: the columns it may SELECT, or why it may not read the table.
    pub roles: HashMap<String, Result<Vec<String>, String>>,
}

/// One visible (identity, record) pair, or an identity's error, 1-based as
/// `realtime.visible` returns them.
pub type VisibleRow = (i32, Option<i32>, Option<String>);

/// One row of `realtime.match_patterns`: (pattern, subject, verdict) or (pattern, error),
/// 1-based.
pub type PatternRow = (i32, Option<i32>, Option<bool>, Option<String>);

/// Why a lookup failed.
#[derive(Debug)]
pub enum DbError {
    /// The connection is gone or stuck: the check's worker connects again for its next.
    Lost(String),
    /// The database refused the call (a policy's error is not this: it comes back per
    /// identity). The table's changes in this batch are withheld.
    Failed(String),
    /// The server cancelled the call at its statement_timeout (the table's budget).
    TimedOut,
}

/// The database side of the stage: a trait so the stage is tested without Postgres.
/// `budget`: how long the call may run on the server (its statement_timeout).
pub(crate) trait Lookup {
    /// None when the table no longer exists.
    async fn table(
        &self,
        schema: &str,
        table: &str,
        roles: &[String],
        budget: Duration,
    ) -> Result<Option<TableInfo>, DbError>;

    async fn visible(
        &self,
        oid: u32,
        call: &VisibleCall,
        budget: Duration,
    ) -> Result<Vec<VisibleRow>, DbError>;

    /// Which subjects each pattern matches by its op (`like`, `ilike`, `match`, `imatch`),
    /// asked only the (pattern, subject) pairs of `asked`.
    async fn patterns(
        &self,
        patterns: &[String],
        ops: &[&'static str],
        subjects: &[Option<String>],
        asked: &[i32],
        budget: Duration,
    ) -> Result<Vec<PatternRow>, DbError>;
}

/// One `realtime.visible` call: identities (role, claims), records (their keys as JSON)
/// and the (identity, record) pairs asked, 1-based, flat.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VisibleCall {
    pub roles: Vec<String>,
    pub claims: Vec<String>,
    pub records: Vec<String>,
    pub asked: Vec<i32>,
    /// The records are whole rows, each seen only while the row still holds it
    /// (`realtime.visible_current`, a resume's check), not keys (`realtime.visible`).
    pub current: bool,
}

pub(super) const TABLE_SQL: &str =
    "SELECT oid, rls, primary_key, role, columns, error FROM realtime.table_access($1, $2, $3)";

pub(super) const VISIBLE_SQL: &str = "SELECT identity, record, error \
     FROM realtime.visible($1::oid::regclass, $2::text[], $3::text[], $4::text[], $5::int4[])";

pub(super) const VISIBLE_CURRENT_SQL: &str = "SELECT identity, record, error \
     FROM realtime.visible_current($1::oid::regclass, $2::text[], $3::text[], $4::text[], $5::int4[])";

pub(super) const PATTERNS_SQL: &str = "SELECT pattern, subject, matched, error \
     FROM realtime.match_patterns($1::text[], $2::text[], $3::text[], $4::int4[], $5::int4)";

/// The lookups on a check connection (`pool`; statements prepared on first use). Each
/// call runs under the server's statement_timeout of its budget, so the server ends a check
/// that runs long; the client gives up `grace` later, for a server that does not answer at
/// all.
pub struct Db<'a> {
    pub client: &'a tokio_postgres::Client,
    pub grace: Duration,
    /// Each match pattern's time budget within its call (`FILTER_PATTERN_TIMEOUT_MS`).
    pub pattern_budget_ms: i32,
    pub statements: &'a Statements,
}

/// The prepared statements of one connection.
#[derive(Default)]
pub struct Statements {
    table: tokio::sync::OnceCell<tokio_postgres::Statement>,
    visible: tokio::sync::OnceCell<tokio_postgres::Statement>,
    visible_current: tokio::sync::OnceCell<tokio_postgres::Statement>,
    patterns: tokio::sync::OnceCell<tokio_postgres::Statement>,
}

impl Db<'_> {
    fn error(&self, e: tokio_postgres::Error) -> DbError {
        if self.client.is_closed() {
            return DbError::Lost(e.to_string());
        }
        match e.as_db_error() {
            Some(d) if *d.code() == tokio_postgres::error::SqlState::QUERY_CANCELED => {
                DbError::TimedOut
            }
            // The server is ending this connection (a FATAL the client has not yet seen
            // close): the session ends after the batch, as for a closed one.
            Some(d) if d.code().code().starts_with("57P") => DbError::Lost(d.message().to_owned()),
            Some(d) => DbError::Failed(d.message().to_owned()),
            None => DbError::Failed(e.to_string()),
        }
    }

    async fn query(
        &self,
        cell: &tokio::sync::OnceCell<tokio_postgres::Statement>,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        budget: Duration,
    ) -> Result<Vec<tokio_postgres::Row>, DbError> {
        if budget.is_zero() {
            return Err(DbError::TimedOut);
        }
        // At least 1 ms: 0 would switch the timeout off.
        let ms = budget.as_millis().clamp(1, i32::MAX as u128);
        let call = async {
            self.client
                .batch_execute(&format!("SET statement_timeout = {ms}"))
                .await?;
            let stmt = cell.get_or_try_init(|| self.client.prepare(sql)).await?;
            self.client.query(stmt, params).await
        };
        match tokio::time::timeout(budget + self.grace, call).await {
            Err(_) => Err(DbError::Lost(
                "a Postgres Changes check did not answer in time".into(),
            )),
            Ok(r) => r.map_err(|e| self.error(e)),
        }
    }
}

impl Lookup for Db<'_> {
    async fn table(
        &self,
        schema: &str,
        table: &str,
        roles: &[String],
        budget: Duration,
    ) -> Result<Option<TableInfo>, DbError> {
        let rows = self
            .query(
                &self.statements.table,
                TABLE_SQL,
                &[&schema, &table, &roles],
                budget,
            )
            .await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let mut info = TableInfo {
            oid: first.get("oid"),
            rls: first.get("rls"),
            primary_key: first.get("primary_key"),
            roles: HashMap::new(),
        };
        for row in &rows {
            let role: String = row.get("role");
            let verdict = match row.get::<_, Option<String>>("error") {
                Some(why) => Err(why),
                None => Ok(row
                    .get::<_, Option<Vec<String>>>("columns")
                    .unwrap_or_default()),
            };
            info.roles.insert(role, verdict);
        }
        Ok(Some(info))
    }

    async fn visible(
        &self,
        oid: u32,
        call: &VisibleCall,
        budget: Duration,
    ) -> Result<Vec<VisibleRow>, DbError> {
        let (cell, sql) = if call.current {
            (&self.statements.visible_current, VISIBLE_CURRENT_SQL)
        } else {
            (&self.statements.visible, VISIBLE_SQL)
        };
        let rows = self
            .query(
                cell,
                sql,
                &[&oid, &call.roles, &call.claims, &call.records, &call.asked],
                budget,
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("identity"), r.get("record"), r.get("error")))
            .collect())
    }

    async fn patterns(
        &self,
        patterns: &[String],
        ops: &[&'static str],
        subjects: &[Option<String>],
        asked: &[i32],
        budget: Duration,
    ) -> Result<Vec<PatternRow>, DbError> {
        let rows = self
            .query(
                &self.statements.patterns,
                PATTERNS_SQL,
                &[&patterns, &ops, &subjects, &asked, &self.pattern_budget_ms],
                budget,
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get("pattern"),
                    r.get("subject"),
                    r.get("matched"),
                    r.get("error"),
                )
            })
            .collect())
    }
}
