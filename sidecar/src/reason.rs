//! Every reason a client can be given, named in one place, as centrifuge names its errors
//! and disconnects: a socket's close (`Disconnect`, the WebSocket close frame), a refused
//! join or push (`Refusal`, the `reason` of an error `phx_reply`), and a channel closed by
//! the server (`ChannelClosed`, a `system` message before `phx_close`). Texts are Supabase's
//! where Supabase has one; tests and realtime-js apps compare them.

use crate::client_text::{BadText, Problem};
use crate::db_worker::DbFailure;
use crate::history::ask::AskError;
use crate::jwt::JwtError;
use crate::persist::PersistError;
use crate::postgres_changes::BindingError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// Why a socket is closed by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disconnect {
    ShuttingDown,
    /// The outbound queue overflowed: the client does not read fast enough.
    TooSlow,
    FrameTooLarge,
    InvalidFrame,
    IdleTimeout,
    /// The client sent a close frame.
    ClientClosed,
    JoinRateLimit,
    /// The large frames queued for the client's address would pass
    /// MAX_OUTBOUND_BYTES_PER_ADDRESS (`out::SharedBytes`).
    TooSlowForAddress,
    /// ... every connection's, MAX_SIDECAR_OUTBOUND_BYTES.
    TooSlowForSidecar,
    /// A frame would pass MAX_READING_BYTES_PER_ADDRESS (`reading`).
    ReadingFromAddress,
    /// A frame would pass MAX_READING_BYTES.
    Reading,
}

impl Disconnect {
    pub fn code(self) -> CloseCode {
        match self {
            Disconnect::ShuttingDown => CloseCode::Away,
            Disconnect::TooSlow
            | Disconnect::TooSlowForAddress
            | Disconnect::TooSlowForSidecar
            | Disconnect::JoinRateLimit => CloseCode::Policy,
            Disconnect::FrameTooLarge => CloseCode::Size,
            Disconnect::InvalidFrame => CloseCode::Protocol,
            Disconnect::IdleTimeout | Disconnect::ClientClosed => CloseCode::Normal,
            Disconnect::ReadingFromAddress | Disconnect::Reading => CloseCode::Again,
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            Disconnect::ShuttingDown => "server shutting down",
            Disconnect::TooSlow => "too slow: the client did not keep up with its messages",
            Disconnect::TooSlowForAddress => "too slow: large frames queued for this address would pass MAX_OUTBOUND_BYTES_PER_ADDRESS",
            Disconnect::TooSlowForSidecar => "too slow: large frames queued for every client would pass MAX_SIDECAR_OUTBOUND_BYTES",
            Disconnect::FrameTooLarge => "frame too large",
            Disconnect::InvalidFrame => "invalid WebSocket frame",
            Disconnect::IdleTimeout => "idle timeout: no heartbeat received",
            Disconnect::ClientClosed => "bye",
            Disconnect::JoinRateLimit => "ClientJoinRateLimitReached: Too many joins per second",
            Disconnect::ReadingFromAddress => READING_FROM_ADDRESS,
            Disconnect::Reading => READING,
        }
    }
}

/// A socket's frame or a REST body would pass MAX_READING_BYTES_PER_ADDRESS.
pub const READING_FROM_ADDRESS: &str = "ReadingBytesLimitReached: frames being read from this address would pass MAX_READING_BYTES_PER_ADDRESS";
/// ... or MAX_READING_BYTES.
pub const READING: &str =
    "ReadingBytesLimitReached: frames being read would pass MAX_READING_BYTES; retry later";

impl Disconnect {
    /// The close for a queue that overflowed: its own bounds, or the shared ones on large
    /// frames (`out::Receiver::cut_by`).
    pub fn too_slow(cut_by: Option<crate::byte_budget::Over>) -> Disconnect {
        match cut_by {
            None => Disconnect::TooSlow,
            Some(crate::byte_budget::Over::Address) => Disconnect::TooSlowForAddress,
            Some(crate::byte_budget::Over::Sidecar) => Disconnect::TooSlowForSidecar,
        }
    }

    /// The close for a frame the reading bound refused (`reading`).
    pub fn reading(over: crate::byte_budget::Over) -> Disconnect {
        match over {
            crate::byte_budget::Over::Address => Disconnect::ReadingFromAddress,
            crate::byte_budget::Over::Sidecar => Disconnect::Reading,
        }
    }
}

/// Why a connection, a join or a push is refused (for a join or push, the socket and its
/// other channels stay).
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// At upgrade (HTTP 401).
    MissingApiKey,
    /// At upgrade, past MAX_CONNECTIONS (HTTP 429).
    ConnectionRateLimitReached,
    /// At upgrade, past MAX_CONNECTIONS_PER_ADDRESS (HTTP 429).
    TooManyConnectionsFromAddress,
    /// At upgrade, past the limit of one of the address's wider blocks (the block, as
    /// `a::/56`; HTTP 429).
    TooManyConnectionsFromBlock(String),
    TopicNameRequired,
    /// A public channel while PRIVATE_ONLY is set.
    PrivateOnly,
    /// The topic breaks `realtime.send`'s rules.
    InvalidTopic(InvalidTopic),
    /// The request headers passed to policies are over MAX_POLICY_HEADER_BYTES (HTTP 431).
    RequestHeadersTooLarge {
        bytes: usize,
        limit: usize,
    },
    ChannelRateLimitReached,
    ClientJoinRateLimitReached,
    /// A join past MAX_JOINS_PER_SECOND_PER_ADDRESS (the socket is kept).
    AddressJoinRateLimitReached,
    /// A join past the rate of a wider block of addresses (MAX_JOINS_PER_SECOND_PER_IPV6_56
    /// and friends): the block.
    BlockJoinRateLimitReached(String),
    /// A join past MAX_SIDECAR_JOINS_PER_SECOND (clients' part of it).
    SidecarJoinRateLimitReached,
    JoinInProgress,
    /// A `postgres_changes` binding this server cannot serve (an unsupported filter, say).
    PostgresChanges(BindingError),
    /// A join whose bindings would bring its client address's connections past
    /// MAX_BINDINGS_PER_ADDRESS (refused as MAX_BINDINGS_PER_CONNECTION refuses).
    BindingsPerAddress {
        total: usize,
        limit: usize,
    },
    /// A join whose bindings would bring its client address's connections past
    /// MAX_PATTERNS_PER_ADDRESS pattern conditions.
    PatternsPerAddress {
        total: usize,
        limit: usize,
    },
    /// A join whose bindings or pattern conditions would bring a wider block of addresses
    /// past its limit (MAX_BINDINGS_PER_IPV6_56 and friends).
    BindingsPerBlock {
        /// "bindings" or "pattern conditions"
        what: &'static str,
        block: String,
        total: usize,
        limit: usize,
        setting: &'static str,
    },
    /// A join whose bindings would bring the sidecar past MAX_SCHEMA_WIDE_BINDINGS.
    SchemaWideBindings {
        total: usize,
        limit: usize,
    },
    /// A `replay` or `resume` that cannot be served.
    History(AskError),
    /// A broadcast that asked to be kept and cannot be.
    Persist(PersistError),
    /// No read permission; with the role guard's refusal when that is the cause.
    ReadDenied {
        topic: String,
        role_refusal: Option<String>,
    },
    WriteDenied {
        topic: String,
    },
    Jwt(JwtError),
    Database(DbFailure),
    UnmatchedTopic,
    /// A presence push other than `track` and `untrack` (its event, lowercased).
    UnknownPresenceEvent(String),
    /// A `track` whose payload is not a JSON object (Phoenix's presence metas are maps).
    PresenceNotAMap,
    /// A `track` on a private channel without the presence write verdict.
    PresenceWriteDenied {
        topic: String,
    },
    /// A track past MAX_CONNECTION_PRESENCE_EVENTS_PER_SECOND (`presence::budget`).
    PresenceConnectionBudget,
    /// A track past MAX_PRESENCE_EVENTS_PER_SECOND_PER_ADDRESS.
    PresenceAddressBudget,
    /// A track of one of the heaviest addresses once MAX_PRESENCE_EVENTS_PER_SECOND is spent.
    PresenceSidecarBudget,
    /// A first track into a topic with MAX_PRESENCE_MEMBERS_PER_TOPIC members.
    PresenceTopicFull {
        limit: usize,
    },
    /// A presence push to be held for its channel's verdicts whose bytes would pass the
    /// relay's bound (`held`).
    PresenceHeldBytes(crate::byte_budget::Over),
    /// A push while MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL of the channel's wait.
    PresencePushesWaiting {
        limit: usize,
    },
    /// A `track` or `untrack` the database refused (its reason).
    UnableToTrackPresence(String),
    UnknownEvent(String),
    UnableToBroadcast(String),
    /// A join's `join_ref` no frame may carry (a NUL, over 255 bytes).
    InvalidJoinRef(BadText),
    /// A presence key no database row may hold (a NUL), or over MAX_PRESENCE_KEY_BYTES.
    InvalidPresenceKey(BadText),
    /// The database refused to listen to one of the join's keys (the key, its message).
    NotListened(String, String),
}

impl Refusal {
    pub fn text(&self) -> String {
        match self {
            Refusal::MissingApiKey => "MissingAPIKey: API key is missing".into(),
            Refusal::ConnectionRateLimitReached => {
                "ConnectionRateLimitReached: Too many connected users".into()
            }
            Refusal::TooManyConnectionsFromAddress => {
                "ConnectionRateLimitReached: Too many connections from this address".into()
            }
            Refusal::TooManyConnectionsFromBlock(block) => format!(
                "ConnectionRateLimitReached: Too many connections from this network ({block})"
            ),
            Refusal::TopicNameRequired => "TopicNameRequired: You must provide a topic name".into(),
            Refusal::PrivateOnly => "PrivateOnly: This project only allows private channels".into(),
            Refusal::InvalidTopic(why) => why.text(),
            Refusal::RequestHeadersTooLarge { bytes, limit } => format!(
                "RequestHeadersTooLarge: the request headers passed to policies take {bytes} bytes; the limit is {limit} (MAX_POLICY_HEADER_BYTES)"
            ),
            Refusal::ChannelRateLimitReached => "ChannelRateLimitReached: Too many channels".into(),
            Refusal::ClientJoinRateLimitReached => Disconnect::JoinRateLimit.text().into(),
            Refusal::AddressJoinRateLimitReached => {
                "ClientJoinRateLimitReached: Too many joins per second from this address".into()
            }
            Refusal::BlockJoinRateLimitReached(block) => format!(
                "ClientJoinRateLimitReached: Too many joins per second from this network ({block})"
            ),
            Refusal::SidecarJoinRateLimitReached => {
                "ClientJoinRateLimitReached: Too many joins per second on this server".into()
            }
            Refusal::JoinInProgress => {
                "JoinInProgress: a join of this topic is still waiting for its authorization".into()
            }
            Refusal::PostgresChanges(why) => why.text(),
            Refusal::BindingsPerAddress { total, limit } => BindingError::OverLimit(format!(
                "the channels of this client address would have bindings: {total}; the limit is {limit} (MAX_BINDINGS_PER_ADDRESS)"
            ))
            .text(),
            Refusal::PatternsPerAddress { total, limit } => BindingError::OverLimit(format!(
                "the channels of this client address would have pattern conditions: {total}; the limit is {limit} (MAX_PATTERNS_PER_ADDRESS)"
            ))
            .text(),
            Refusal::BindingsPerBlock {
                what,
                block,
                total,
                limit,
                setting,
            } => BindingError::OverLimit(format!(
                "the channels of this client network ({block}) would have {what}: {total}; the limit is {limit} ({setting})"
            ))
            .text(),
            Refusal::SchemaWideBindings { total, limit } => BindingError::OverLimit(format!(
                "the channels of this server would have bindings without a table: {total}; the limit is {limit} (MAX_SCHEMA_WIDE_BINDINGS)"
            ))
            .text(),
            Refusal::History(why) => why.text(),
            Refusal::Persist(why) => why.text(),
            Refusal::ReadDenied { topic, role_refusal } => {
                let mut t = format!("Unauthorized: You do not have permissions to read from this Channel topic: {topic}");
                if let Some(r) = role_refusal {
                    t.push_str(&format!(" ({r})"));
                }
                t
            }
            Refusal::WriteDenied { topic } => format!(
                "Unauthorized: You do not have permissions to write to this Channel topic: {topic}"
            ),
            Refusal::Jwt(e) => e.reason(),
            Refusal::Database(f) => f.reason().into(),
            Refusal::UnmatchedTopic => "unmatched topic".into(),
            Refusal::InvalidJoinRef(bad) => format!("InvalidJoinRef: {bad}"),
            Refusal::NotListened(key, why) => {
                format!("UnableToListen: the database refused to listen to {key}: {why}")
            }
            Refusal::InvalidPresenceKey(bad) => {
                let setting = match bad.why {
                    Problem::TooLong { .. } => " (MAX_PRESENCE_KEY_BYTES)",
                    _ => "",
                };
                format!("InvalidPresenceKey: {bad}{setting}")
            }
            Refusal::UnknownPresenceEvent(event) => format!(
                "UnknownPresenceEvent: a presence push is \"track\" or \"untrack\", not \"{event}\""
            ),
            // Supabase's text (InvalidPresencePayload in its logs).
            Refusal::PresenceNotAMap => "Presence track payload must be a map".into(),
            // Supabase replies a bare error; the reason says which permission is missing.
            Refusal::PresenceWriteDenied { topic } => format!(
                "Unauthorized: You do not have permissions to track presence on this Channel topic: {topic}"
            ),
            Refusal::UnableToTrackPresence(why) => format!("UnableToTrackPresence: {why}"),
            Refusal::PresenceConnectionBudget => {
                "Too many presence messages from this connection per second".into()
            }
            Refusal::PresenceAddressBudget => {
                "Too many presence messages from this address per second".into()
            }
            // Supabase's text (PresenceRateLimitReached); here the push is refused, and the
            // channel kept, since a bystander may be the one who tracks when it is spent.
            Refusal::PresenceSidecarBudget => "Too many presence messages per second".into(),
            Refusal::PresenceTopicFull { limit } => format!(
                "Too many presence members in this topic: the limit is {limit} (MAX_PRESENCE_MEMBERS_PER_TOPIC)"
            ),
            Refusal::PresenceHeldBytes(over) => match over {
                crate::byte_budget::Over::Address => "UnableToTrackPresence: this client address's presence pushes waiting for the database would pass MAX_RELAY_BYTES_PER_ADDRESS; retry".into(),
                crate::byte_budget::Over::Sidecar => "UnableToTrackPresence: the presence pushes waiting for the database would pass MAX_RELAY_BYTES; retry".into(),
            },
            Refusal::PresencePushesWaiting { limit } => format!(
                "Too many presence pushes of this channel are waiting for the database: the limit is {limit} (MAX_PRESENCE_PUSHES_WAITING_PER_CHANNEL)"
            ),
            Refusal::UnknownEvent(event) => {
                format!("UnknownEvent: this server does not handle event \"{event}\"")
            }
            Refusal::UnableToBroadcast(why) => format!("UnableToBroadcast: {why}"),
        }
    }
}

/// Why a topic cannot be used: the rules `realtime.send` applies, checked before a topic
/// reaches a batched database call it could fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvalidTopic {
    /// A NUL is valid JSON but not valid Postgres text.
    Nul,
    TooLong {
        bytes: usize,
        limit: usize,
    },
}

impl InvalidTopic {
    pub fn text(&self) -> String {
        match self {
            InvalidTopic::Nul => "InvalidTopic: the topic must not contain a NUL character".into(),
            InvalidTopic::TooLong { bytes, limit } => {
                format!("InvalidTopic: the topic is {bytes} bytes long; the limit is {limit} bytes")
            }
        }
    }
}

/// Why the server closes one channel (a `system` error, then `phx_close`).
#[derive(Clone, Debug, PartialEq)]
pub enum ChannelClosed {
    NoLongerPermitted {
        topic: String,
    },
    TooManyMessages,
    TokenExpired {
        seconds_ago: i64,
    },
    TokenRefused(JwtError),
    /// The channel sent more presence pushes per second than MAX_CLIENT_PRESENCE_EVENTS_PER_SECOND.
    ClientPresenceRateLimit,
    /// A track's meta is over MAX_PRESENCE_META_BYTES.
    TrackTooLarge,
}

impl ChannelClosed {
    pub fn text(&self) -> String {
        match self {
            ChannelClosed::NoLongerPermitted { topic } => {
                format!("You no longer have permission to read from this Channel topic: {topic}")
            }
            ChannelClosed::TooManyMessages => "Too many messages per second".into(),
            // In a system message Supabase says it without the error code.
            ChannelClosed::TokenExpired { seconds_ago } => {
                format!("Token has expired {seconds_ago} seconds ago")
            }
            ChannelClosed::TokenRefused(e) => e.reason(),
            // Supabase's texts (their log names: ClientPresenceRateLimitReached,
            // PayloadSizeExceeded).
            ChannelClosed::ClientPresenceRateLimit => "Client presence rate limit exceeded".into(),
            ChannelClosed::TrackTooLarge => "Track message size exceeded".into(),
        }
    }
}

/// What a `system` message tells a channel that stays open: the database's state, lost or
/// withheld messages, a check that could not be made. Each is sent with its `status`.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
    /// The drain connection was lost (to every channel of the sidecar).
    DatabaseUnavailable,
    /// It is back, same epoch.
    DatabaseBack,
    /// It is back after a restart: the queue's undelivered messages were lost.
    DatabaseRestarted,
    /// The queue evicted messages before this sidecar read them.
    MessagesLost { first: i64, last: i64 },
    /// Supabase's opt-in `replication_ready` answer: the drain connection is up, or not yet.
    ReplicationReady { up: bool },
    /// A private channel's re-check could not be made; it is retried after `backoff_secs`.
    RecheckFailed {
        why: &'static str,
        backoff_secs: u64,
    },
    /// Changes of a table could not be checked by RLS and were withheld from the channel.
    ChangesWithheld {
        schema: String,
        table: String,
        why: String,
    },
    /// A change could not be decoded (its table dropped or altered before it was drained).
    ChangeLost { table: String, why: String },
    /// A channel's `match` or `imatch` filter could not be evaluated (over its time budget):
    /// the changes it would have let through were withheld from that channel.
    FilterFailed {
        schema: String,
        table: String,
        why: String,
    },
    /// The same, told to a channel listening to whole schemas, which names no table.
    SomeChangeLost,
    /// A join's history was not read: MAX_RESUMES_PER_ADDRESS of its client address's are
    /// being sent and MAX_RESUMES_WAITING_PER_ADDRESS wait (`history::line`). The channel is
    /// live, in the `system` message of a resume that cannot be served.
    ResumeLineFull { running: u64, waiting: u64 },
    /// A message for the channel's topic was dropped when it was sent
    /// (`extension/src/dropped.rs`): its event, why (the extension's reason name) and size.
    MessageDropped {
        event: String,
        reason: String,
        size: u64,
    },
}

impl Notice {
    pub fn status(&self) -> &'static str {
        match self {
            Notice::DatabaseBack | Notice::ReplicationReady { up: true } => "ok",
            _ => "error",
        }
    }

    pub fn text(&self) -> String {
        match self {
            Notice::DatabaseUnavailable => "The database is unavailable; reconnecting. Messages are kept and delivered when it returns, unless it restarts.".into(),
            Notice::DatabaseBack => "The database is available again; no messages were lost.".into(),
            Notice::DatabaseRestarted => "The database restarted; messages committed before the restart and not yet delivered were lost. Messages committed since are delivered.".into(),
            Notice::MessagesLost { first, last } => format!(
                "Messages {first} to {last} were lost: this server fell behind the database's queue."
            ),
            // Supabase's text when it is up.
            Notice::ReplicationReady { up: true } => "Replication connection established".into(),
            Notice::ReplicationReady { up: false } => "Replication connection is not established yet; changes are kept and delivered once it is".into(),
            Notice::RecheckFailed { why, backoff_secs } => format!(
                "Realtime could not re-check this channel's permissions ({why}); retrying in {backoff_secs} s"
            ),
            Notice::ChangesWithheld { schema, table, why } => format!(
                "Changes to {schema}.{table} could not be authorized and were not delivered: {why}"
            ),
            Notice::ChangeLost { table, why } => format!("A change to table {table} was lost: {why}"),
            Notice::FilterFailed { schema, table, why } => format!(
                "Changes to {schema}.{table} were not delivered to this channel: its filter could not be evaluated: {why}"
            ),
            Notice::SomeChangeLost => "A change was lost: its table was dropped or altered before it was delivered".into(),
            Notice::MessageDropped {
                event,
                reason,
                size,
            } => {
                let why = match reason.as_str() {
                    "too_large" => "it exceeds realtime.max_message_size",
                    "queue_full" => "its transaction's messages did not fit the realtime queue",
                    "invalid_event" => "its event is missing, empty or longer than 255 bytes",
                    "invalid_payload" => "its payload is missing or not a JSON object",
                    _ => "the database could not send it",
                };
                format!("A message of {size} bytes (event {event:?}) was not sent to this channel: {why}")
            }
            Notice::ResumeLineFull { running, waiting } => format!(
                "Too many joins of this client address are resuming: MAX_RESUMES_PER_ADDRESS ({running}) are being sent and MAX_RESUMES_WAITING_PER_ADDRESS ({waiting}) are waiting; this channel was not resumed and is live from now on"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supabase_texts_are_kept() {
        assert_eq!(
            Refusal::ReadDenied {
                topic: "t".into(),
                role_refusal: None
            }
            .text(),
            "Unauthorized: You do not have permissions to read from this Channel topic: t"
        );
        assert_eq!(
            Refusal::ChannelRateLimitReached.text(),
            "ChannelRateLimitReached: Too many channels"
        );
        assert_eq!(
            ChannelClosed::NoLongerPermitted { topic: "t".into() }.text(),
            "You no longer have permission to read from this Channel topic: t"
        );
        assert_eq!(Disconnect::TooSlow.code(), CloseCode::Policy);
        assert_eq!(Disconnect::FrameTooLarge.code(), CloseCode::Size);
    }

    /// Regression: the reading bound's first close reasons were 150 bytes long; a close
    /// frame is a control frame (125 bytes of payload at most, 2 of them the code), and
    /// tungstenite's client dropped the connection on it instead of reporting the reason.
    #[test]
    fn every_close_reason_fits_a_close_frame() {
        use Disconnect::*;
        let all = [
            ShuttingDown,
            TooSlow,
            TooSlowForAddress,
            TooSlowForSidecar,
            FrameTooLarge,
            InvalidFrame,
            IdleTimeout,
            ClientClosed,
            JoinRateLimit,
            ReadingFromAddress,
            Reading,
        ];
        for d in all {
            // A variant added without being listed here fails to compile.
            match d {
                ShuttingDown | TooSlow | TooSlowForAddress | TooSlowForSidecar | FrameTooLarge
                | InvalidFrame | IdleTimeout | ClientClosed | JoinRateLimit
                | ReadingFromAddress | Reading => {}
            }
            assert!(d.text().len() <= 123, "{d:?}: {} bytes", d.text().len());
        }
    }
}
