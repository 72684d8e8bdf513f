//! The database as publisher: every 10 ms, one statement sends the messages due by then,
//! so the rate is exact over the run and batching is what a busy application would do.
//! Message m goes to topic m mod T and is number m / T + 1 of that topic's stream.

use crate::args::{Args, Publisher};
use crate::report::Totals;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;

/// The send time is taken in the database (clock_timestamp(), per message) so latency is
/// commit-to-receive as a subscriber sees it, including the statement itself.
const STAMP: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::int8";

fn statement(publisher: Publisher) -> String {
    match publisher {
        Publisher::Send => format!(
            "SELECT count(realtime.send(jsonb_build_object('t', {STAMP}, 'k', k, 'n', n, 'pad', $3::text), \
             'ev', $4 || k, false)) FROM unnest($1::int8[], $2::int8[]) AS u(k, n)"
        ),
        // pgbench/scenarios_setup.sql: a trigger on bench_rows broadcasts each row to room:<k>.
        Publisher::Table => format!(
            "WITH i AS (INSERT INTO bench_rows (k, n, t, body) SELECT k, n, {STAMP}, $3::text \
             FROM unnest($1::int8[], $2::int8[]) AS u(k, n) RETURNING 1) SELECT count(*) FROM i"
        ),
        // pgbench/changes_setup.sql: a published table with RLS; its changes are delivered to
        // the members of room k that subscribed with filter k=eq.<k>.
        Publisher::Changes => format!(
            "WITH i AS (INSERT INTO bench_changes (k, n, t, body) SELECT k, n, {STAMP}, $3::text \
             FROM unnest($1::int8[], $2::int8[]) AS u(k, n) RETURNING 1) SELECT count(*) FROM i"
        ),
        // Centrifugo's outbox consumer reads (method, payload, partition) rows in id order.
        Publisher::Outbox => format!(
            "WITH i AS (INSERT INTO centrifugo_outbox (method, payload, partition) \
             SELECT 'publish', jsonb_build_object('channel', $4 || k, 'data', \
             jsonb_build_object('t', {STAMP}, 'k', k, 'n', n, 'pad', $3::text)), 0 \
             FROM unnest($1::int8[], $2::int8[]) AS u(k, n) RETURNING 1) SELECT count(*) FROM i"
        ),
        Publisher::Clients | Publisher::None => unreachable!("not a database publisher"),
    }
}

/// Sends for `seconds` at `rate` messages/s; returns how long sending took.
pub async fn run(args: &Args, totals: &Totals) -> f64 {
    let (db, conn) = tokio_postgres::connect(&args.dsn, tokio_postgres::NoTls)
        .await
        .expect("connect to Postgres");
    tokio::spawn(conn);
    let stmt = db.prepare(&statement(args.publisher)).await.unwrap();
    let pad = "x".repeat(args.pad);
    let topics = args.topics.max(1) as i64;
    let ticks = args.seconds * 100;
    let mut interval = tokio::time::interval(Duration::from_millis(10));
    let mut m = 0i64;
    let start = Instant::now();
    for tick in 0..ticks {
        interval.tick().await;
        let due = (args.rate * (tick + 1) as f64 / 100.0).floor() as i64;
        if due <= m {
            continue;
        }
        let (ks, ns): (Vec<i64>, Vec<i64>) = (m..due).map(|x| (x % topics, x / topics + 1)).unzip();
        let params: [&(dyn ToSql + Sync); 4] = [&ks, &ns, &pad, &args.topic_prefix];
        // The table's trigger names the topic itself.
        let used = if matches!(args.publisher, Publisher::Table | Publisher::Changes) {
            3
        } else {
            4
        };
        db.query_one(&stmt, &params[..used])
            .await
            .expect("publishing statement");
        for &k in &ks {
            totals.sent_to(k as usize);
        }
        m = due;
    }
    start.elapsed().as_secs_f64()
}
