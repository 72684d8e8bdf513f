//! The Postgres Changes extension of a channel: realtime-js's
//! `channel.on('postgres_changes', {event, schema, table, filter}, cb)`.
//!
//! A change's way: the extension captures each row change of a table in publication
//! `supabase_realtime` into the queue at commit (`extension/src/capture.rs`), and a drain
//! call decodes it into Supabase's `data` (`extension/src/change.rs`). The drainer hands
//! the batch's changes to `deliver`, which finds the channels whose bindings match
//! (`subscribers`, `binding`), asks the database in one call per table and batch which
//! values their pattern filters match (Postgres's LIKE, ILIKE, ~, ~*: in calls ordered so that
//! no client's patterns spend another's, `pattern_calls`), which of them may see
//! each row (RLS) and which columns their role may read, and queues each
//! channel its `postgres_changes` event, in queue order with the batch's broadcasts. The
//! checks run beside the drain (`checks`): only the channels waiting for one wait
//! (`change_hold`).
//!
//! A join's way: the bindings are parsed (`binding`), refused at once when this server
//! cannot serve them, then checked against the database (`check`: the table exists and is
//! published, columns and filter values are valid and readable by the role). Only then is
//! the join answered, the channel registered, and `system` "Subscribed to PostgreSQL" sent:
//! a client that sees SUBSCRIBED gets every change committed after.
//!
//! `binding` bindings, filters, matching and the join reply · `bounds` what one join's
//! bindings may cost · `check` the join-time check ·
//! `subscribers` who listens to which table · `deliver` the drained batch's stage (matching,
//! checking, shaping) · `pattern_calls` the order and size of its pattern calls · `checks` the pool its checks run on, beside the drain ·
//! `position` a channel's position after its changes, for those that asked.

pub mod binding;
pub mod bounds;
pub mod check;
pub mod checks;
pub mod deliver;
pub mod filter;
pub mod pattern_calls;
pub mod position;
pub mod subscribers;

pub use binding::{parse_bindings, reply, Binding, BindingError};
pub use filter::Change;
