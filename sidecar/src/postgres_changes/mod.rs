//! The Postgres Changes extension of a channel: realtime-js's
//! `channel.on('postgres_changes', {event, schema, table, filter}, cb)`.
//!
//! A change's way: the extension captures each row change of a table in publication
//! `supabase_realtime` into the queue at commit (`extension/src/capture.rs`), and a drain
//! call decodes it into Supabase's `data` (`extension/src/change.rs`). On the drain's path,
//! with no database call, `stage` matches the batch's changes to the channels whose bindings
//! they meet (`subscribers`, `binding`, `filter`), leaves a slot at each change's place in
//! each such channel's order and hands each changed table's share to the check `pool`,
//! which runs beside the drain on connections of its own. There `deliver` asks the database,
//! in one call per table, which values the pattern filters match (Postgres's LIKE, ILIKE,
//! ~, ~*: in calls ordered so that no client's patterns spend another's, `pattern_calls`),
//! which channels may see each row (RLS) and which columns their role may read, and shapes
//! each channel its `postgres_changes` event; the pool fills the slots with them, so each
//! channel gets its changes in queue order with the batch's broadcasts, and only the
//! channels waiting for a check wait (`crate::out`).
//!
//! A join's way: the bindings are parsed (`binding`), refused at once when this server
//! cannot serve them, then checked against the database (`subscribable`: the table exists and is
//! published, columns and filter values are valid and readable by the role). Only then is
//! the join answered, the channel registered, and `system` "Subscribed to PostgreSQL" sent:
//! a client that sees SUBSCRIBED gets every change committed after.
//!
//! `binding` bindings and the join reply · `filter` their filters and the change they
//! judge · `bounds` what one join's bindings may cost · `subscribable` the join-time check ·
//! `subscribers` who listens to which table · `stage` the drain's step · `pool` the checks
//! beside the drain · `deliver/` a check by stage (matching, lookups, RLS, patterns,
//! shaping) · `pattern_calls` the order and size of its pattern calls · `position` a
//! channel's position after its changes, for those that asked.

pub mod binding;
pub mod bounds;
pub mod deliver;
pub mod filter;
pub mod pattern_calls;
pub mod pool;
pub mod position;
pub mod stage;
pub mod subscribable;
pub mod subscribers;
pub mod unserved;

pub use binding::{parse_bindings, Binding, BindingError};
pub use filter::Change;
pub use unserved::{parse_each, reply, Unserved};
