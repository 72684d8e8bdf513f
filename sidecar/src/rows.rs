//! The rows `realtime.drain` and `realtime.history` return (the same columns, by name:
//! `extension/src/consumer.rs`, `extension/src/history.rs`), each read once into what it is,
//! so the drainer and the history worker match on a type instead of comparing kind strings.

use crate::hub::{Payload, QueueMessage, TopicKey};
use tokio_postgres::{Column, Row};

/// What one row is. Text is borrowed from the row where it is only looked at.
pub enum Entry<'r> {
    /// A message for the hub: sent in the database, or a client broadcast relayed.
    Message {
        committed_us: i64,
        message: QueueMessage,
    },
    /// Messages evicted before they were read (drain), or no longer retained (history).
    Gap { first: i64, last: i64 },
    /// Messages for topics this consumer does not listen to, read through (drain only).
    Filtered,
    /// A presence diff (drain only).
    Presence {
        committed_us: i64,
        key: TopicKey,
        diff: Option<&'r str>,
    },
    /// A captured row change, in Supabase's JSON when its table was decoded (drain only).
    Change {
        committed_us: i64,
        table: Option<&'r str>,
        data: Option<&'r str>,
    },
    /// How far a history call went (history only).
    End,
    /// A table whose changes before this position were left out, to bound the call's
    /// decoded bytes (history only; `extension/src/history.rs`): its topic text.
    Cut { table: Option<&'r str> },
}

/// One row: its position and what it is.
pub struct Read<'r> {
    pub seq: i64,
    pub entry: Entry<'r>,
}

/// How a message row becomes a `QueueMessage`.
#[derive(Clone, Copy)]
pub struct As {
    /// The queue's epoch, carried in every message's `meta`.
    pub epoch: i64,
    /// Sent from history at a join (`meta.replayed`).
    pub replayed: bool,
    /// A relayed client broadcast keeps its id: a replay's do (Supabase's replay gives each
    /// its row's id); live and resumed ones carry none, as Supabase's live ones.
    pub client_ids: bool,
}

/// Where each column is, found by name once per statement (a name lookup per value would
/// scan the columns for every value of every message).
pub struct Columns {
    seq: usize,
    kind: usize,
    topic: usize,
    event: usize,
    payload: usize,
    binary_payload: usize,
    private: usize,
    committed_us: usize,
    id: usize,
    lost_first: usize,
    lost_last: usize,
    origin: usize,
}

impl Columns {
    /// Err names the column missing.
    pub fn of(columns: &[Column]) -> Result<Self, &'static str> {
        let at = |name: &'static str| columns.iter().position(|c| c.name() == name).ok_or(name);
        Ok(Columns {
            seq: at("seq")?,
            kind: at("kind")?,
            topic: at("topic")?,
            event: at("event")?,
            payload: at("payload")?,
            binary_payload: at("binary_payload")?,
            private: at("private")?,
            committed_us: at("committed_us")?,
            id: at("id")?,
            lost_first: at("lost_first")?,
            lost_last: at("lost_last")?,
            origin: at("origin")?,
        })
    }

    /// Reads a row. Err: a kind this sidecar does not know (a newer extension).
    pub fn read<'r>(&self, row: &'r Row, how: As) -> Result<Read<'r>, String> {
        let seq: i64 = row.get(self.seq);
        let kind: &str = row.get(self.kind);
        let entry = match kind {
            "gap" => Entry::Gap {
                first: row.get(self.lost_first),
                last: row.get(self.lost_last),
            },
            "filtered" => Entry::Filtered,
            "end" => Entry::End,
            "cut" => Entry::Cut {
                table: row.get(self.topic),
            },
            "presence" => Entry::Presence {
                committed_us: row.get(self.committed_us),
                key: TopicKey {
                    topic: row.get(self.topic),
                    private: row.get(self.private),
                },
                diff: row.get(self.payload),
            },
            "change" => Entry::Change {
                committed_us: row.get(self.committed_us),
                table: row.get(self.topic),
                data: row.get(self.payload),
            },
            // A message dropped when it was sent comes in its place, as a message the hub
            // turns into a `system` notice (`QueueMessage::dropped`).
            "message" | "dropped" => {
                let origin: Option<i64> = row.get(self.origin);
                Entry::Message {
                    committed_us: row.get(self.committed_us),
                    message: QueueMessage {
                        topic: row.get(self.topic),
                        event: row.get(self.event),
                        payload: Payload::from_columns(
                            row.get(self.binary_payload),
                            row.get(self.payload),
                        ),
                        private: row.get(self.private),
                        id: if origin.is_some() && !how.client_ids {
                            None
                        } else {
                            row.get(self.id)
                        },
                        origin,
                        epoch: how.epoch,
                        seq,
                        replayed: how.replayed,
                        dropped: kind == "dropped",
                    },
                }
            }
            other => return Err(format!("a row of unknown kind {other:?}")),
        };
        Ok(Read { seq, entry })
    }
}
