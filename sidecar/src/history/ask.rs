//! What a join asks of the queue's history, read from `config.broadcast`: Supabase's
//! `replay: {since, limit}`, or this server's `resume: {epoch, seq}` (the `meta` of the
//! last message the client saw). A join asks for one or the other.

use serde_json::Value;

/// Supabase's limit on replayed messages, which is also the default.
pub const MAX_REPLAY: u32 = 25;
/// How far in the future a replay's `since` may be (clocks differ) before it is refused.
const SINCE_SKEW_MS: i64 = 60_000;

#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// The newest `limit` database-originated messages committed at or after `since_ms`
    /// (unix milliseconds), as Supabase replays them.
    Replay { since_ms: i64, limit: u32 },
    /// Every message after this position.
    Resume { epoch: i64, seq: i64 },
}

#[derive(Clone, Debug, PartialEq)]
pub enum AskError {
    /// Supabase's text for a `replay` it cannot read; the detail is ours.
    ReplayParams(&'static str),
    ReplayOnPublic,
    ResumePosition(&'static str),
    Both,
}

impl AskError {
    pub fn text(&self) -> String {
        match self {
            AskError::ReplayParams(why) => {
                format!("UnableToReplayMessages: Replay params are not valid: {why}")
            }
            AskError::ReplayOnPublic => {
                "UnableToReplayMessages: Replay is not allowed for public channels".into()
            }
            AskError::ResumePosition(why) => format!(
                "UnableToResume: config.broadcast.resume must be the {{epoch, seq}} of a message's meta: {why}"
            ),
            AskError::Both => "UnableToReplayMessages: replay and resume cannot be combined; resume alone sends everything after the position".into(),
        }
    }
}

/// An integer, or a string holding one (an epoch is sent as a string; a client may send
/// the sequence either way).
fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// What `config.broadcast` asks of the history; None for nothing (a `resume` without a
/// sequence is a client that has not seen a message yet: it joins live).
pub fn parse(
    broadcast: Option<&Value>,
    private: bool,
    now_ms: i64,
) -> Option<Result<Ask, AskError>> {
    let get = |k: &str| broadcast.and_then(|b| b.get(k)).filter(|v| !v.is_null());
    let replay = get("replay").map(|r| replay(r, private, now_ms));
    let resume = get("resume").and_then(resume);
    match (replay, resume) {
        (None, None) => None,
        (Some(r), None) | (None, Some(r)) => Some(r),
        (Some(_), Some(_)) => Some(Err(AskError::Both)),
    }
}

/// Whether the channel's position covers its Postgres Changes (`config.broadcast.resume`
/// with `changes: true`, with or without a position yet): its changes are then resumed with
/// its broadcasts, and each delivered batch of them is followed by a `system` message with
/// the position (`postgres_changes::position`). Asked for, so that apps that did not ask see
/// nothing new.
pub fn change_positions(broadcast: Option<&Value>) -> bool {
    match broadcast
        .and_then(|b| b.get("resume"))
        .and_then(|r| r.get("changes"))
    {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

fn replay(r: &Value, private: bool, now_ms: i64) -> Result<Ask, AskError> {
    if !private {
        return Err(AskError::ReplayOnPublic);
    }
    let since_ms = match r.get("since") {
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or(AskError::ReplayParams("since must be an integer"))?,
        None | Some(Value::Null) => return Err(AskError::ReplayParams("since is required")),
        Some(_) => return Err(AskError::ReplayParams("since must be an integer")),
    };
    if since_ms < 0 {
        return Err(AskError::ReplayParams("since must not be negative"));
    }
    if since_ms > now_ms + SINCE_SKEW_MS {
        return Err(AskError::ReplayParams("since is in the future"));
    }
    let limit = match r.get("limit") {
        None | Some(Value::Null) => MAX_REPLAY,
        Some(Value::Number(n)) => {
            let n = n
                .as_i64()
                .ok_or(AskError::ReplayParams("limit must be an integer"))?;
            n.clamp(1, MAX_REPLAY as i64) as u32
        }
        Some(_) => return Err(AskError::ReplayParams("limit must be an integer")),
    };
    Ok(Ask::Replay { since_ms, limit })
}

fn resume(r: &Value) -> Option<Result<Ask, AskError>> {
    let Value::Object(o) = r else {
        return Some(Err(AskError::ResumePosition("not an object")));
    };
    let seq = o.get("seq").filter(|v| !v.is_null())?;
    let Some(seq) = integer(seq) else {
        return Some(Err(AskError::ResumePosition("seq is not an integer")));
    };
    if seq < 0 {
        return Some(Err(AskError::ResumePosition("seq is negative")));
    }
    let Some(epoch) = o.get("epoch").and_then(integer) else {
        return Some(Err(AskError::ResumePosition(
            "epoch is missing or not an integer",
        )));
    };
    Some(Ok(Ask::Resume { epoch, seq }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000_000;

    fn ask(b: Value, private: bool) -> Option<Result<Ask, AskError>> {
        parse(Some(&b), private, NOW)
    }

    #[test]
    fn supabase_replay_defaults_and_clamps_its_limit() {
        assert_eq!(
            ask(json!({"replay": {"since": 5}}), true),
            Some(Ok(Ask::Replay {
                since_ms: 5,
                limit: 25
            }))
        );
        for (given, kept) in [(0, 1), (7, 7), (1000, 25)] {
            assert_eq!(
                ask(json!({"replay": {"since": 5, "limit": given}}), true),
                Some(Ok(Ask::Replay {
                    since_ms: 5,
                    limit: kept
                }))
            );
        }
    }

    #[test]
    fn change_positions_are_asked_for_in_resume() {
        let asked = |b: Value| change_positions(Some(&b));
        assert!(asked(json!({"resume": {"changes": true}})));
        assert!(asked(
            json!({"resume": {"epoch": "1", "seq": 2, "changes": "true"}})
        ));
        assert!(!asked(json!({"resume": {"epoch": "1", "seq": 2}})));
        assert!(!asked(json!({"resume": {"changes": false}})));
        assert!(!asked(json!({"self": true})));
        assert!(!change_positions(None));
        // No position yet: a live join that still asks for positions.
        assert_eq!(ask(json!({"resume": {"changes": true}}), false), None);
    }

    #[test]
    fn bad_replays_get_supabase_errors() {
        let err = |b: Value, private| ask(b, private).unwrap().unwrap_err().text();
        assert_eq!(
            err(json!({"replay": {"since": 5}}), false),
            "UnableToReplayMessages: Replay is not allowed for public channels"
        );
        for bad in [
            json!({"replay": {}}),
            json!({"replay": {"since": "5"}}),
            json!({"replay": {"since": 1.5}}),
            json!({"replay": {"since": -1}}),
            json!({"replay": {"since": 5, "limit": "x"}}),
            json!({"replay": {"since": NOW + 3_600_000}}),
        ] {
            assert!(
                err(bad.clone(), true)
                    .starts_with("UnableToReplayMessages: Replay params are not valid"),
                "{bad}"
            );
        }
    }

    #[test]
    fn resume_reads_a_messages_meta_and_refuses_what_is_not_a_position() {
        assert_eq!(
            ask(json!({"resume": {"epoch": "17", "seq": 9}}), false),
            Some(Ok(Ask::Resume { epoch: 17, seq: 9 }))
        );
        assert_eq!(
            ask(json!({"resume": {"epoch": 17, "seq": "9"}}), true),
            Some(Ok(Ask::Resume { epoch: 17, seq: 9 }))
        );
        // No position yet: a live join.
        assert_eq!(ask(json!({"resume": {}}), false), None);
        assert_eq!(ask(json!({"resume": null, "self": true}), false), None);
        for bad in [
            json!({"resume": 5}),
            json!({"resume": {"epoch": "17", "seq": -1}}),
            json!({"resume": {"epoch": "17", "seq": "x"}}),
            json!({"resume": {"seq": 3}}),
            json!({"resume": {"epoch": "e", "seq": 3}}),
        ] {
            let e = ask(bad.clone(), false).unwrap().unwrap_err();
            assert!(e.text().starts_with("UnableToResume: "), "{bad}");
        }
        assert_eq!(
            ask(
                json!({"resume": {"epoch": "1", "seq": 1}, "replay": {"since": 1}}),
                true
            ),
            Some(Err(AskError::Both))
        );
    }
}
