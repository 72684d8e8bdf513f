//! The drainer reads a batch as one packed value (`realtime.drain_packed`, `packed::read`)
//! where it read rows before (`realtime.drain`, `rows::Columns`): the same batch, read both
//! ways from a real database, gives the same typed rows, for every kind a drain returns.

mod common;

use realtime_sidecar::hub::Payload;
use realtime_sidecar::packed;
use realtime_sidecar::rows::{As, Columns, Entry, Read};

/// The row form, as the drainer queried it before the packed one.
const ROWS_SQL: &str = "SELECT seq, kind, topic, event, payload::text AS payload, binary_payload, \
     private, (extract(epoch FROM committed_at) * 1000000)::int8 AS committed_us, id::text AS id, \
     lost_first, lost_last, origin \
     FROM realtime.drain($1, $2, 100000, 0, 0, NULL)";
const PACKED_SQL: &str = "SELECT realtime.drain_packed($1, $2, 100000, 0, 0, NULL) AS packed";

/// Everything a typed row says, as text.
fn describe(r: &Read) -> String {
    let what = match &r.entry {
        Entry::Message {
            committed_us,
            message: m,
        } => {
            let payload = match &m.payload {
                Payload::Json(j) => format!("json {j}"),
                Payload::Binary(b) => format!("binary {b:?}"),
            };
            format!(
                "message at {committed_us}: {} {} {payload} private={} id={:?} origin={:?} epoch={} seq={} replayed={}",
                m.topic, m.event, m.private, m.id, m.origin, m.epoch, m.seq, m.replayed
            )
        }
        Entry::Gap { first, last } => format!("gap {first}..={last}"),
        Entry::Filtered => "filtered".into(),
        Entry::End => "end".into(),
        Entry::Cut { table } => format!("cut {table:?}"),
        Entry::Presence {
            committed_us,
            key,
            diff,
        } => format!(
            "presence at {committed_us}: {} private={} {diff:?}",
            key.topic, key.private
        ),
        Entry::Change {
            committed_us,
            table,
            data,
        } => format!("change at {committed_us}: {table:?} {data:?}"),
    };
    format!("{} {what}", r.seq)
}

#[tokio::test]
async fn a_packed_batch_reads_as_its_rows_do() {
    let db = common::db().await;
    let consumer = format!("packed_test_{}", std::process::id());
    let base: i64 = db
        .query_one("SELECT realtime.create_consumer($1)", &[&consumer])
        .await
        .unwrap()
        .get(0);
    let table = format!("packed_test_{}", std::process::id());
    db.batch_execute(&format!(
        "SELECT realtime.send('{{\"text\": \"h\u{e9}llo \\\"q\\\"\"}}', 'chat', 'room:packed');
         SELECT realtime.send('{{\"n\": 2}}', 'chat', 'room:packed-public', false);
         SELECT realtime.send_binary('\\x00ff80', 'blob', 'room:packed-bin');
         SELECT realtime.relay(7, 'room:packed', 'typing', false, '{{\"a\": 1}}', NULL);
         SELECT realtime.relay(8, 'room:packed', 'bytes', true, NULL, '\\x0102');
         SELECT realtime.queue_presence('room:packed-p', true, '{{\"joins\": {{}}, \"leaves\": {{}}}}');
         CREATE TABLE {table} (id int PRIMARY KEY, name text);
         ALTER PUBLICATION supabase_realtime ADD TABLE {table};
         INSERT INTO {table} VALUES (1, 'one');
         ALTER PUBLICATION supabase_realtime DROP TABLE {table};
         DROP TABLE {table};"
    ))
    .await
    .unwrap();

    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&consumer, &base];
    let rows = db.query(ROWS_SQL, &params).await.unwrap();
    let packed_row = db.query_one(PACKED_SQL, &params).await.unwrap();
    let cols = Columns::of(rows[0].columns()).unwrap();
    for client_ids in [false, true] {
        let how = As {
            epoch: 5,
            replayed: client_ids,
            client_ids,
        };
        let from_rows: Vec<String> = rows
            .iter()
            .map(|r| describe(&cols.read(r, how).unwrap()))
            .collect();
        let from_packed: Vec<String> = packed::read(packed_row.get("packed"), how)
            .unwrap()
            .iter()
            .map(describe)
            .collect();
        assert_eq!(from_packed, from_rows);
        // Every kind was there to compare (other tests may add messages of their own).
        for kind in ["message", "presence", "change"] {
            assert!(
                from_rows
                    .iter()
                    .any(|r| r.contains(&format!(" {kind} at "))),
                "no {kind} in {from_rows:#?}"
            );
        }
        assert!(from_rows.iter().any(|r| r.contains("binary")));
        assert!(from_rows.iter().any(|r| r.contains("origin=Some(8)")));
    }
    db.execute("SELECT realtime.drop_consumer($1)", &[&consumer])
        .await
        .unwrap();
}

/// A sidecar newer than its login's grants (an extension upgraded without the new grant, or
/// a login made by hand from an older README) may drain but not drain packed: it falls back
/// to rows, says so once in its log, and delivers.
#[tokio::test]
async fn a_login_without_drain_packed_falls_back_to_rows_and_delivers() {
    let db = common::db().await;
    // The sidecar login's grants, less realtime.drain_packed.
    db.batch_execute(
        "DO $$
         DECLARE f regprocedure;
         BEGIN
             IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'realtime_rows_sidecar') THEN
                 CREATE ROLE realtime_rows_sidecar LOGIN;
             END IF;
             FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                      JOIN pg_namespace n ON n.oid = p.pronamespace
                      WHERE n.nspname = 'realtime' AND p.proname <> 'drain_packed'
                        AND has_function_privilege('realtime_sidecar', p.oid, 'EXECUTE') LOOP
                 EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO realtime_rows_sidecar', f);
             END LOOP;
         END $$;
         GRANT USAGE ON SCHEMA realtime TO realtime_rows_sidecar;
         GRANT SELECT, INSERT, UPDATE, DELETE ON realtime.presences, realtime.presence_sessions
             TO realtime_rows_sidecar;
         GRANT USAGE ON SEQUENCE realtime.presence_refs TO realtime_rows_sidecar;
         GRANT SELECT, INSERT, DELETE ON realtime.persisted_messages TO realtime_rows_sidecar;
         GRANT SELECT, UPDATE ON realtime.persisted_totals TO realtime_rows_sidecar;
         GRANT SELECT, INSERT, UPDATE, DELETE ON realtime.persisted_senders TO realtime_rows_sidecar;
         GRANT anon, authenticated, service_role TO realtime_rows_sidecar;",
    )
    .await
    .unwrap();
    let packed: bool = db
        .query_one(
            "SELECT has_function_privilege('realtime_rows_sidecar', \
             'realtime.drain_packed(text, bigint, integer, integer, integer, oid[])', 'EXECUTE')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!packed, "the login must lack drain_packed for this test");
    let dsn = common::sidecar_dsn().replace("user=realtime_sidecar", "user=realtime_rows_sidecar");
    assert!(dsn.contains("realtime_rows_sidecar"), "{dsn}");
    let sidecar = common::Sidecar::start("packed_fallback", &[("DATABASE_URL", &dsn)]).await;
    let mut c = common::Client::connect(sidecar.port, "1.0.0").await;
    c.join_public("realtime:rows-only").await;
    common::send(&db, serde_json::json!({"n": 1}), "e", "rows-only").await;
    let m = loop {
        let m = c.next_json(10).await.expect("the message, drained as rows");
        if m["event"] == "broadcast" {
            break m;
        }
    };
    assert_eq!(m["payload"]["payload"]["n"], 1, "{m}");
    assert!(
        sidecar
            .log()
            .contains("realtime.drain_packed is not available to this role; draining rows"),
        "{}",
        sidecar.log()
    );
}
