//! A resume's Postgres Changes: which tables it reads, and its changes checked as the
//! subscriber may read them at the rejoin (`deliver::prepare`).

use super::read::FoundChange;
use super::request::{Changes, Request};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::postgres_changes::deliver;
use crate::postgres_changes::subscribers::{Subscriber, Subscribers};
use crate::postgres_changes::Binding;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;
use tokio_tungstenite::tungstenite::Message;

/// The tables that bindings name by (schema or `*`, table or NULL for every table of the
/// schema), looked up by the extension (`sql/tables.sql`).
pub(super) const TABLES_SQL: &str = "SELECT realtime.table_oids($1, $2) AS oids";

/// Whether some binding wants the change (its place, event and filters; a change that could
/// not be decoded goes on, for the stage to tell the channel it was lost). Matched before
/// counting against MAX_RESUME_MESSAGES, so another room's changes do not count.
pub(super) fn wanted(bindings: &[Binding], f: &FoundChange) -> bool {
    if !places(bindings, &f.schema, &f.table) {
        return false;
    }
    match crate::postgres_changes::Change::from_data(&f.value) {
        Some(change) => bindings.iter().any(|b| b.matches(&change)),
        None => true,
    }
}

/// Whether some binding listens at (schema, table).
pub(super) fn places(bindings: &[Binding], schema: &str, table: &str) -> bool {
    bindings.iter().any(|b| {
        (b.schema == "*" || b.schema == schema) && b.table.as_deref().is_none_or(|t| t == table)
    })
}

/// The tables whose changes the resuming channels' bindings cover, if any asked.
pub(super) async fn change_tables(
    client: &Client,
    cfg: &Config,
    requests: &[Request],
) -> Result<Option<Vec<u32>>, String> {
    let mut schemas: Vec<String> = Vec::new();
    let mut names: Vec<Option<String>> = Vec::new();
    for c in requests.iter().filter_map(|r| r.changes.as_ref()) {
        for b in &c.bindings {
            if !schemas
                .iter()
                .zip(&names)
                .any(|(s, t)| *s == b.schema && *t == b.table)
            {
                schemas.push(b.schema.clone());
                names.push(b.table.clone());
            }
        }
    }
    if schemas.is_empty() {
        return Ok(None);
    }
    let params: [&(dyn ToSql + Sync); 2] = [&schemas, &names];
    let row = tokio::time::timeout(
        cfg.db_call_deadline(),
        client.query_one(TABLES_SQL, &params),
    )
    .await
    .map_err(|_| "looking up the resumed tables did not answer in time".to_owned())?
    .map_err(|e| e.to_string())?;
    Ok(Some(row.get("oids")))
}

/// What checking one channel's resent changes came to.
pub(super) enum Checked {
    Done {
        /// (position, frame, whether it is a change) in queue order: the changes it may
        /// read, and the `system` notices of those that could not be checked.
        frames: Vec<(i64, Message, bool)>,
        withheld: usize,
        /// Some check ran (the connection's statement_timeout is set).
        asked: bool,
    },
    Lost(String),
}

/// Matches and checks one resuming channel's changes as the drain's stage checks live ones
/// (`deliver::prepare`, for a set holding only this channel, with its identity at the
/// rejoin), in chunks of POLL_MAX_CHANGES, each under its own CHANGES_CHECK_TIMEOUT_MS and
/// all together under RESUME_CHECK_TIMEOUT_MS: what is left unchecked then is withheld, the
/// channel told, and the worker goes on to the next join.
pub(super) async fn check_changes(
    db: &deliver::Db<'_>,
    r: &Request,
    c: &Changes,
    changes: &[&FoundChange],
    (limits, resume_check_timeout): (&deliver::Limits, Duration),
    metrics: &Metrics,
) -> Checked {
    // The channel as the stage sees it: its frames are made for this channel's topic,
    // join_ref and serializer. The stage returns everything it has for the channel, notices
    // included, and sends nothing itself (`deliver`'s test
    // `prepare_sends_nothing_itself_every_notice_is_returned`), so the queue behind this
    // `Reach` never receives a frame.
    let (tx, _unused) = crate::out::channel(1);
    let link = crate::out::Link::new(r.reach.conn, r.reach.vsn, 0, tx);
    let only = Subscribers::default();
    only.add(Subscriber {
        reach: link.reach(&r.reach.topic, r.reach.join_ref()),
        bindings: c.bindings.clone(),
        role: c.role.clone(),
        claims: c.claims.clone(),
        positions: false,
    });
    let mut out = Vec::new();
    let (mut withheld, mut asked) = (0, false);
    // Checked long after their commit: a version is resent only while its row still holds
    // it (`deliver::Limits::resume`).
    let limits = &deliver::Limits {
        resume: true,
        until: Some(Instant::now() + resume_check_timeout),
        ..*limits
    };
    for chunk in changes.chunks(limits.max_changes.max(1)) {
        let datas: Vec<&str> = chunk.iter().map(|c| c.data.as_str()).collect();
        let p = deliver::prepare(db, &only, &datas, limits, metrics).await;
        asked |= p.asked;
        if let Some(why) = p.lost {
            return Checked::Lost(why);
        }
        for (change, frames) in chunk.iter().zip(p.frames) {
            for f in frames {
                // A notice that the table's changes were withheld comes among the frames,
                // at the first change withheld (`deliver`).
                withheld += usize::from(!f.change);
                out.push((change.seq, f.frame, f.change));
            }
        }
    }
    Checked::Done {
        frames: out,
        withheld,
        asked,
    }
}
