//! Regression (issue 42: "the primary's cost grows with sidecars × messages"): every commit
//! woke every waiting drain (one condition variable for all slots), so the drain of a
//! consumer that listens to other topics woke, took the queue lock, read, skipped and slept
//! again at each commit: with N routed sidecars, N wake-ups a message where one did the work.
//! A commit now wakes only the slots that listen to something it carries
//! (`extension/src/wake.rs`). The wake-ups are counted as the drain backend's voluntary
//! context switches (`/proc/<pid>/status`: the test runs on the database's machine).

mod common;

use common::*;
use std::time::{Duration, Instant};

async fn voluntary_switches(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Polls (every 10 ms, at most 10 s) until backend `pid` sleeps in the drain's wait.
async fn wait_sleeping(db: &tokio_postgres::Client, pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = db
            .query_one(
                "SELECT coalesce(wait_event_type, '') FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap();
        if row.get::<_, String>(0) == "Extension" {
            return;
        }
        assert!(Instant::now() < deadline, "the drain never slept");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_commit_wakes_only_the_drains_that_listen_to_what_it_carries() {
    let db = db().await;
    // A name of this run's own: a drain of an earlier run that failed may still hold its
    // slot until its timeout.
    let consumer = format!("t_wake_{}", std::process::id());
    let (mine, others) = ("wake:mine", "wake:others");
    db.execute("SELECT realtime.create_consumer($1)", &[&consumer])
        .await
        .unwrap();
    db.execute("SELECT realtime.listen($1, ARRAY[$2])", &[&consumer, &mine])
        .await
        .unwrap();

    let drainer = common::db().await;
    let pid: i32 = drainer
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    // A drain that waits up to 30 s for its first message.
    let name = consumer.clone();
    let drain = tokio::spawn(async move {
        let rows = drainer
            .query(
                "SELECT kind, topic FROM realtime.drain($1, NULL, 1000, 30000, 0)",
                &[&name],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect::<Vec<_>>()
    });
    wait_sleeping(&db, pid).await;

    // 200 commits of another topic, each its own transaction.
    let before = voluntary_switches(pid).await;
    for n in 0..200i64 {
        db.execute(
            "SELECT realtime.send(jsonb_build_object('n', $1::int8), 'ev', $2, false)",
            &[&n, &others],
        )
        .await
        .unwrap();
    }
    let woken = voluntary_switches(pid).await - before;
    assert!(
        !drain.is_finished(),
        "the drain returned for others' messages"
    );
    // Before the fix: one wake-up per commit, or nearly (a few coalesce): 150 to 200 here.
    assert!(
        woken < 20,
        "the drain woke {woken} times for 200 commits it does not listen to"
    );

    // A commit of its topic wakes it, long before its 30 s are up.
    db.execute(
        "SELECT realtime.send('{\"n\": 1}'::jsonb, 'ev', $1, false)",
        &[&mine],
    )
    .await
    .unwrap();
    let rows = tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .expect("the drain was not woken by a commit of its topic")
        .unwrap();
    assert_eq!(
        rows.last(),
        Some(&("message".to_owned(), mine.to_owned())),
        "{rows:?}"
    );
    db.execute("SELECT realtime.drop_consumer($1)", &[&consumer])
        .await
        .unwrap();
}
