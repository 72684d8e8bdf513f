//! A message that cannot be sent, and what becomes of it.
//!
//! Supabase's `realtime.send` catches every failure and raises a WARNING
//! (`WarnSendingBroadcastMessage: <the error's text>`), so a trigger that broadcasts never
//! aborts the app's write. The app's producers here do the same by default (`By::App`:
//! `send`, `send_binary`, `broadcast_changes`, the broadcast triggers, captured changes), and
//! never silently:
//!
//! - the WARNING carries Supabase's prefix, the error's text and its hint;
//! - `realtime.stats()` counts the messages dropped, by reason;
//! - where the topic is usable, a small record takes the message's place in the transaction
//!   and so its sequence number (`FLAG_DROPPED`, `encode`): live subscribers of the topic
//!   get a `system` message naming it, and a resume over it answers `recovered: false`;
//! - a transaction's messages are dropped together or not at all: once they do not fit the
//!   queue, every one of them, before and after, becomes a dropped record (`xact.rs`).
//!
//! A message with no usable topic (NULL, empty, longer than a client can join) is counted and
//! warned only: no subscriber could be told. So is one its sender may not send
//! (`send_policy.rs`): it must not put even a notice before the topic's subscribers. `realtime.strict_send` (any role, for its own
//! transactions) makes all of these ERRORs again. The sidecar's producers (`By::Sidecar`:
//! `relay`, presence) always raise: the sidecar checked the client's input at its edge and
//! answers the client with the error. Misuse that no data explains (a standby, `PREPARE`,
//! a statement-level trigger) is an ERROR whatever the setting.

use crate::errors;
use crate::gucs;
use crate::message::{encode_record, record_len, FLAG_CHANGE, FLAG_DROPPED, FLAG_PRIVATE};
use crate::shared::queue;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use std::sync::atomic::Ordering::Relaxed;

/// Who is sending.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum By {
    /// The app's SQL: a failure drops the message unless `realtime.strict_send` is on.
    App,
    /// The sidecar, for a client (`relay`, presence): a failure is always an ERROR.
    Sidecar,
}

/// Why a message was not sent; its name is what subscribers and `realtime.stats()` see.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Reason {
    /// NULL, empty or too long a topic: nobody can be told.
    InvalidTopic,
    /// NULL, empty or too long an event.
    InvalidEvent,
    /// NULL, or not a JSON object.
    InvalidPayload,
    /// Over `realtime.max_message_size`.
    TooLarge,
    /// The transaction's messages do not fit the queue.
    QueueFull,
    /// The caller may not insert the message's row into `realtime.messages`
    /// (`send_policy.rs`): never a dropped record, only the count and the WARNING.
    Unauthorized,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::InvalidTopic => "invalid_topic",
            Reason::InvalidEvent => "invalid_event",
            Reason::InvalidPayload => "invalid_payload",
            Reason::TooLarge => "too_large",
            Reason::QueueFull => "queue_full",
            Reason::Unauthorized => "unauthorized",
        }
    }

    fn count(self, messages: u64) {
        let c = &queue().counters;
        let counter = match self {
            Reason::InvalidTopic | Reason::InvalidEvent | Reason::InvalidPayload => {
                &c.dropped_invalid
            }
            Reason::TooLarge => &c.dropped_too_large,
            Reason::QueueFull => &c.dropped_queue_full,
            Reason::Unauthorized => &c.dropped_unauthorized,
        };
        counter.fetch_add(messages, Relaxed);
    }
}

/// A message that cannot be sent, said as its ERROR would say it.
pub struct Refusal {
    pub reason: Reason,
    pub code: PgSqlErrorCode,
    pub message: String,
    pub hint: Option<&'static str>,
}

impl Refusal {
    pub fn invalid(reason: Reason, message: impl Into<String>, hint: Option<&'static str>) -> Self {
        Refusal {
            reason,
            code: PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            message: message.into(),
            hint,
        }
    }

    pub fn null(reason: Reason, what: &str) -> Self {
        Refusal {
            reason,
            code: PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            message: format!("{what} must not be NULL"),
            hint: None,
        }
    }

    pub fn limit(reason: Reason, message: String, hint: &'static str) -> Self {
        Refusal {
            reason,
            code: PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            message,
            hint: Some(hint),
        }
    }

    /// Whether this refusal must be raised rather than dropped.
    pub fn raises(by: By) -> bool {
        by == By::Sidecar || gucs::strict_send()
    }

    /// Raises the ERROR, when `by` or `realtime.strict_send` says so. Otherwise counts
    /// `messages` dropped for its reason and warns, in Supabase's words; `told` says whether
    /// the topic's subscribers are told (a dropped record was or will be queued).
    pub fn raise_or_warn(self, by: By, messages: u64, told: bool) {
        if Self::raises(by) {
            if self.reason == Reason::TooLarge {
                queue().counters.oversize_rejections.fetch_add(1, Relaxed);
            }
            errors::fail(self.code, self.message, self.hint);
        }
        self.reason.count(messages);
        let detail = if told {
            "The message was not sent and the transaction goes on; the topic's subscribers are told. With realtime.strict_send = on this is an ERROR."
        } else if self.reason == Reason::Unauthorized {
            "The message was not sent and the transaction goes on; the topic's subscribers are not told: its sender may not send to it. With realtime.strict_send = on this is an ERROR."
        } else {
            "The message was not sent and the transaction goes on; with no usable topic, no subscriber can be told. With realtime.strict_send = on this is an ERROR."
        };
        let mut report = ErrorReport::new(
            self.code,
            format!("WarnSendingBroadcastMessage: {}", self.message),
            "pg_realtime",
        )
        .set_detail(detail);
        if let Some(h) = self.hint {
            report = report.set_hint(h);
        }
        report.report(PgLogLevel::WARNING);
    }
}

/// The dropped record's payload: `{"reason": ..., "size": ...}`.
fn payload(reason: Reason, size: usize) -> String {
    format!("{{\"reason\":\"{}\",\"size\":{size}}}", reason.name())
}

/// The length of the record `encode` writes.
pub fn len(topic: &str, event: &str, flags: u8, reason: Reason, size: usize) -> usize {
    let table = if flags & FLAG_CHANGE != 0 { 4 } else { 0 };
    record_len(topic, event, table + payload(reason, size).len())
}

/// Appends the record that takes a dropped message's place: its topic, its event (empty
/// when the event is what was wrong), its id, and why. A dropped change keeps its table's
/// oid in front of the payload (`capture.rs`), so `realtime.history` finds it by table and
/// the drain names the table in the change's error.
#[allow(clippy::too_many_arguments)]
pub fn encode(
    out: &mut Vec<u8>,
    topic: &str,
    event: &str,
    flags: u8,
    id: [u8; 16],
    original: &[u8],
    reason: Reason,
    size: usize,
) {
    let mut body = Vec::with_capacity(48);
    let mut kept = flags & FLAG_PRIVATE;
    if flags & FLAG_CHANGE != 0 {
        kept |= FLAG_CHANGE;
        body.extend_from_slice(original.get(0..4).unwrap_or(&[0; 4]));
    }
    body.extend_from_slice(payload(reason, size).as_bytes());
    encode_record(out, topic, event, &body, kept | FLAG_DROPPED, id, 0);
}

/// A dropped record's reason and size, from its payload (after a change's table oid).
pub fn read(payload: &[u8], change: bool) -> (String, u64) {
    let json = if change {
        payload.get(4..).unwrap_or_default()
    } else {
        payload
    };
    let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
    (
        v["reason"].as_str().unwrap_or("unknown").to_owned(),
        v["size"].as_u64().unwrap_or(0),
    )
}
