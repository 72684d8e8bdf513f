//! A history being sent is a broadcast read: it stops once a re-check revokes broadcast
//! read, even while presence read keeps the channel (security review L5).

mod common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

const USER: &str = "55555555-5555-4555-8555-555555555555";

/// A private topic whose presence every authenticated user may read, and whose broadcasts
/// only members (`private_members`) may: USER joins it with presence and a resume from
/// before 6,000 messages of 2 KB (12 MB, far more than the socket's buffers hold), reading
/// slowly. Once the membership is deleted, the next re-check (every second here) keeps the
/// channel for presence but must stop the history: the client gets fewer than the 6,000.
#[tokio::test]
async fn a_history_stops_once_broadcast_read_is_revoked_while_presence_read_keeps_the_channel() {
    let sidecar = Sidecar::start(
        "t_history_revoked",
        &[
            ("AUTHORIZATION_TTL_SECS", "1"),
            ("MAX_OUTBOUND_FRAMES", "100"),
        ],
    )
    .await;
    let db = db().await;
    load_private_policies(&db).await;
    let room = "revoke-history";
    db.batch_execute(&format!(
        "DROP POLICY IF EXISTS revoke_history_presence ON realtime.messages;
         CREATE POLICY revoke_history_presence ON realtime.messages FOR SELECT TO authenticated
             USING ((SELECT realtime.topic()) = '{room}' AND realtime.messages.extension = 'presence');
         DELETE FROM private_members WHERE room = '{room}';
         INSERT INTO private_members VALUES ('{USER}', '{room}', false);"
    ))
    .await
    .unwrap();
    let (epoch, from) = queue_position(&db).await;
    db.execute(
        "SELECT realtime.send(jsonb_build_object('n', g, 'pad', repeat('x', 2000)), 'h', $1, true) \
         FROM generate_series(1, 6000) g",
        &[&room],
    )
    .await
    .unwrap();

    let mut c = Client::connect_small_buffer(sidecar.port, "1.0.0").await;
    let join = json!({
        "config": {"private": true, "presence": {"enabled": true},
                   "broadcast": {"resume": {"epoch": epoch.to_string(), "seq": from}}},
        "access_token": user_token(USER),
    });
    let r = c
        .push(Some("1"), &format!("realtime:{room}"), "phx_join", join)
        .await;
    // The reply comes first, before the history (read past presence_state if any).
    let reply = c.reply(&r).await;
    assert_eq!(reply["status"], "ok", "{reply}");

    // Read slowly (a connection whose client does not read at all cannot re-check: its
    // task waits on the socket). After 100 frames the membership is deleted; re-checks run
    // every second, and two more authorization batches after the delete mean one was asked
    // after it and its verdict applied. Then read everything until the sidecar has been
    // quiet for 3 s (the history stopped) or all 6,000 came (fail-safe 120 s).
    let (mut history, mut closed) = (0, false);
    let mut asked: Option<f64> = None;
    let mut revoked_at: Option<usize> = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let Some(m) = c.next_json(3).await else { break };
        match m["event"].as_str() {
            Some("broadcast") => history += 1,
            Some("phx_close") => closed = true,
            _ => {}
        }
        if history == 100 && asked.is_none() {
            db.execute("DELETE FROM private_members WHERE room = $1", &[&room])
                .await
                .unwrap();
            asked = Some(sidecar.metric("realtime_auth_batches_total").await);
        }
        if let (Some(a), None, true) = (asked, revoked_at, history % 50 == 0) {
            if sidecar.metric("realtime_auth_batches_total").await >= a + 2.0 {
                revoked_at = Some(history);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let revoked_at = revoked_at.expect("a re-check ran after the delete");
    assert!(!closed, "presence read keeps the channel");
    assert!(
        history < 6000,
        "the history went on after broadcast read was revoked (at frame {revoked_at}): \
         {history} of 6000 sent"
    );
    db.batch_execute("DROP POLICY revoke_history_presence ON realtime.messages")
        .await
        .unwrap();
}
