//! The realtime sidecar: Supabase Realtime's WebSocket protocol (and its REST broadcast)
//! served from pg_realtime's shared-memory queue.
//!
//! # What it is for
//!
//! The extension puts every message a transaction sends into its queue at commit, in commit
//! order, numbered by a gapless sequence (`extension/src/queue.rs` tells how). The sidecar
//! moves those messages to WebSocket subscribers and moves clients' own broadcasts into the
//! queue; the database stays the judge of who may read and write a topic. It keeps no
//! message longer than one fan-out: what it has not delivered, the queue still holds.
//!
//! # A message's way: drain → hub → socket
//!
//! 1. `drainer` holds one Postgres connection and calls `realtime.drain(consumer, pos, ...)`
//!    in a loop. The call confirms `pos` (the last sequence handed to the hub) and returns
//!    what was committed after it, waiting up to a second when there is nothing. After a
//!    reconnect the consumer slot resumes from the confirmed position, so nothing within
//!    the queue's capacity is lost (the last batch may be delivered twice). The drain
//!    returns only the topics (and captured tables) this process's channels joined: the
//!    `interest` worker keeps them in the database (`realtime.listen`), and a join is
//!    answered only once its topic is there, so what commits after the reply is drained.
//!    A gap the queue
//!    reports (messages evicted before they were read), an outage and a restart (a new
//!    epoch) each reach every subscriber as a `system` message.
//! 2. The batch is read in place (`packed`, `rows::Entry`); its consecutive broadcasts become
//!    one run of `hub::QueueMessage`s. `Hub::dispatch_batch` looks each topic up under one
//!    read lock, encodes each frame at most once per serializer, and hands every subscriber
//!    its frames of the run at once through the channel's `out::Reach`, the one door to a
//!    socket. When nothing waits at that socket, the frames are written from the drainer's
//!    own task, in one `send(2)`, without waking the connection's task. The hub never waits
//!    on a socket: a queue that is full marks itself overflowed, and its connection closes
//!    as too slow (the rule lives in `out` and the socket loop alone).
//! 3. `socket` (one task per connection) writes what the socket did not take, and anything
//!    queued while something waited, from the queue's head (`out::Receiver::write_some`).
//!
//! `out/mod.rs` tells a live frame's whole way out: a rejoining channel's gate, the Postgres
//! Changes slots, the queue, the write; what may drop or cut off at each step; its locks.
//!
//! Captured row changes (Postgres Changes, `extension/src/capture.rs`) come through the
//! same drain as rows of kind `change`, in Supabase's JSON for the tables some channel
//! listens to (the drain is told which; a channel that joined during a drain makes the
//! drainer drain again from its table's first undecoded change). On the drain's path, with
//! no database call, `postgres_changes::deliver::matched` finds the channels whose bindings
//! match each change; the drainer leaves a slot at the change's place in each such
//! channel's order (`out::Reach::slot`), hands a job per changed table to the check pool
//! (`postgres_changes::pool`) and hands out the rest of the batch at once. The pool asks
//! the database beside the drain, on connections of its own, in one call per changed table,
//! which channels may see each row under RLS and which columns their role may read, then
//! fills each slot with that channel's frame (or a notice, or nothing), which lets out what
//! waited behind it. A channel's frames thus keep the queue's order, and one slow table's
//! check never holds the drain or another channel. A change is never dispatched as a
//! broadcast.
//!
//! # A private join's way: socket → channels → authorizer → channels
//!
//! `socket` parses each client frame once into a `command::Command` and hands it to the
//! connection's `channels::Channels`, which own the channel lifecycle. A join of a private
//! channel is answered later: its questions (broadcast read and write, presence read when
//! presence is enabled) go to the `authorizer` task, which puts whatever every connection
//! asked meanwhile into one `realtime.authorize` call. The database evaluates the RLS
//! policies on `realtime.messages` as the JWT's role with its claims and the socket's
//! headers. Each question is a future the connection holds, polled by its own socket loop
//! (`channels::Channels::next_answer`): no task is spawned for it, the pending join stays
//! in the connection, and only the answer comes back (`channels::Answer`). A call that
//! fails is split until only the bad request is denied (`db_worker::Batched`, the shape the
//! authorizer, the bindings' check and the relay share), and a database that cannot answer
//! is never a denial. Verdicts are checked again every
//! AUTHORIZATION_TTL_SECS and on a new token; a read no longer allowed closes the channel.
//! A join with `postgres_changes` bindings (private or public) waits the same way for
//! `postgres_changes::subscribable`, which checks the bindings of every waiting join in one
//! `realtime.subscribable` call; the channel is registered before it is answered.
//!
//! # A client broadcast's way: socket → relay → queue → every sidecar
//!
//! A `broadcast` push on a channel the client may write (`broadcast::push`), or a message
//! of `POST /api/broadcast` (`rest`), goes to the `relay` task, which writes whatever is
//! waiting with one `realtime.relay(origin, ...)` statement. Committed, the messages are in
//! the queue like any other: every sidecar delivers them in the one order the queue gives,
//! and the hub skips the sending connection (named by `origin`) unless it joined with
//! `self: true`. The sender hears how it ended (with `ack: true` a reply; a failure always).
//!
//! # A rejoining channel's history: channels → history → socket
//!
//! A join with `config.broadcast.replay` (Supabase's) or `config.broadcast.resume` (a
//! position, `meta.epoch` and `meta.seq` of the last message the client saw) is answered and
//! subscribed in the hub at once, behind a gate (its `out::Reach`'s) that holds its live
//! frames. The
//! `history::worker` task reads the history of every waiting join in one `realtime.history`
//! call (one walk of the queue's ring for all their topics), sends each join its share,
//! paced, with a `system` message saying whether everything was recovered, then opens the
//! gate at the sequence the history went through: held frames after it follow, the rest were
//! already sent. Nothing is missed at the seam because the subscription comes before the read.
//! At most MAX_RESUMES_PER_ADDRESS joins of one client address have their history read or
//! sent at once; the others are answered as usual and wait in their address's line
//! (`history::line`), never in another address's way.
//!
//! # Presence: channels → members → presence worker → queue → every sidecar's views
//!
//! A `track` or `untrack` push becomes the channel's wish (`presence::members`); the
//! `presence::worker` (one connection) writes every changed wish in one statement of
//! `realtime.presence_track`/`_untrack`, each committing its diff to the queue, and runs
//! the reaper every second; the `presence::lease` task renews this sidecar's lease. The drainer hands each drained diff to
//! `presence::view`, which keeps a view only of the topics this sidecar's channels watch
//! (loaded from the table, then moved by the diffs, idempotently) and sends the watchers a
//! `presence_state` first and coalesced diffs after (`presence/mod.rs` tells the whole of it).
//!
//! # Tasks and their shared state
//!
//! One task each for the listener (`server`), the drainer, the interest worker, the
//! authorizer, the relay, the bindings' check, the history, the presence worker, lease and
//! flusher, CHANGES_CHECK_CONNECTIONS for the Postgres Changes check pool, and one per
//! connection. The authorizer, the interest worker and the lease,
//! whose round trips joins and presence wait on, run on a thread of their own
//! (`db_thread`), so a storm of ready connection tasks never holds them up; the history
//! worker and its sending tasks on another, so reading and framing a long history never
//! holds up the connections or the drain; the others share the runtime's threads. They
//! share `state::Shared` (settings, the hub, the Postgres Changes subscribers, presence's
//! views and wishes, the topics held, the token verifier, the metrics, the request queues)
//! and nothing else; a connection's channels are touched only by its own task, which also
//! polls the connection's questions to the database (no task per question: they are
//! bounded by its channels and dropped with it).
//! Short-lived tasks: the metrics' `upkeep`, and one per history being sent (paced
//! against the connection's outbound queue, ended by its gate).
//!
//! Locks are std locks held for a few instructions and never across an `.await`. The
//! order, where two are held at once: a registry (the hub, the Postgres Changes
//! listeners, presence's views), then a rejoining channel's gate, then its Postgres Changes
//! slots, then its connection's queue (`out`). Never two registries at once. On SIGTERM the listener stops, every socket is sent
//! a close frame with its reason (`reason::Disconnect`) and the drainer confirms its
//! position, so a restarted sidecar resumes where this one stopped (`shutdown`).
//!
//! # Files, by wing
//!
//! - **The edge**: `server` (the listener, HTTP routes, upgrades), `supabase_health`
//!   (Supabase's health routes), `url`, `cors`, `address`
//!   (who a client is on the network, trusted proxies), `tally` (per-key rates and counts in
//!   flight), `byte_budget` (bytes held for clients, per address and in all), `reading` (the
//!   bytes of client frames being read, metered under tungstenite), `rate`, `rest`, `rest_body` and `rest_limits` (the REST broadcast, its body and
//!   its bounds), `metrics_auth`, `jwt/` (tokens as Supabase verifies them: cleaning, the key
//!   an `alg` and `kid` choose from API_JWT_SECRET and API_JWT_JWKS, the claims).
//! - **A connection**: `socket` (its loop), `command` (a client frame parsed into what it
//!   asks), `frame` (both serializers' wire format), `client_text` (the rules for client
//!   strings that reach SQL), `channels/` (the channel lifecycle: the registry, a join,
//!   one channel, its lifetime, its pushes), `held` (pushes held behind a verdict),
//!   `join_config`, `broadcast`.
//! - **The way out**: `out/` (a channel's `Reach`, the gate, the slots, the queue, the
//!   writes), `hub` (topics and fan-out).
//! - **The queue side**: `drainer`, `packed` and `rows` (a drained batch read once),
//!   `interest/` (the topics and tables this process drains, and the worker that
//!   uploads them).
//! - **Features**: `postgres_changes/` (bindings and filters, their bounds, the join-time
//!   check, who listens, the check pool, delivery by stage, positions), `history/` (replay
//!   and resume: the worker and its stages, the per-address line, the bytes in flight),
//!   `presence/`, `relay`, `persist` and `persist_full` (client broadcasts kept, and their
//!   quotas).
//! - **The database workers**: `db_worker` (a connection kept up; the batched-worker shape),
//!   `db_tls` (TLS to Postgres, verified), `db_thread`, `authorizer` and `verdict_queue` (batched verdicts, a line per address),
//!   `privileges` (the rights that reach the extension's code, logged at start),
//!   `app_objects` (what the extension keeps on the app's objects, made again after a
//!   `pg_upgrade`).
//! - **Vocabulary and plumbing**: `config/`, `state`, `reason` (every reason a client can be
//!   given), `metrics`, `shutdown`, `fuzz` (tests).

pub mod address;
pub mod app_objects;
pub mod authorizer;
pub mod broadcast;
pub mod byte_budget;
pub mod channels;
pub mod client_text;
pub mod command;
pub mod config;
pub mod cors;
pub mod db_thread;
pub mod db_tls;
pub mod db_worker;
pub mod drainer;
pub mod frame;
#[cfg(test)]
mod fuzz;
pub mod held;
pub mod history;
pub mod hub;
pub mod interest;
pub mod join_config;
pub mod jwt;
pub mod metrics;
pub mod metrics_auth;
pub mod out;
pub mod packed;
pub mod persist;
pub mod persist_full;
pub mod postgres_changes;
pub mod presence;
pub mod privileges;
pub mod rate;
pub mod reading;
pub mod reason;
pub mod relay;
pub mod rest;
pub mod rest_body;
pub mod rest_limits;
pub mod rows;
pub mod server;
pub mod shutdown;
pub mod socket;
pub mod state;
pub mod supabase_health;
pub mod tally;
pub mod url;
pub mod verdict_queue;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Serves until `stop` completes, then shuts down gracefully.
pub async fn run(cfg: config::Config, stop: impl Future<Output = ()>) -> std::io::Result<()> {
    let cfg = Arc::new(cfg);
    let verifier = cfg
        .verifier(|why| tracing::warn!("API_JWT_JWKS: {why}"))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let addr = SocketAddr::new(cfg.bind, cfg.port);
    let listener = server::bind(addr)?;
    let (trigger, shutdown) = tokio::sync::watch::channel(false);
    let metrics = Arc::new(metrics::Metrics::default());
    let hub = Arc::new(hub::Hub::new(metrics.clone()));
    let (relay_tx, relay_rx) = tokio::sync::mpsc::channel(relay::QUEUE);
    // Bounded: a flood of joins waits here (backpressure) rather than timing out.
    let (authorize_tx, authorize_rx) = tokio::sync::mpsc::channel(20_000);
    let (check_tx, check_rx) = tokio::sync::mpsc::channel(20_000);
    let (history_tx, history_rx) = tokio::sync::mpsc::channel(20_000);
    let changes = Arc::new(postgres_changes::subscribers::Subscribers::default());
    let presence = Arc::new(presence::Presence::new(metrics.clone(), &cfg));
    let instance = state::instance_id();
    let interest = interest::Interest::new(cfg.filter_topics);
    let persist_full = Arc::new(persist_full::FullQuotas::default());
    let (reading, relay_bytes) = cfg.byte_budgets();
    let shared = Arc::new(state::Shared {
        reading,
        relay_bytes,
        outbound: cfg.outbound_bytes(),
        persist_full: persist_full.clone(),
        interest: interest.clone(),
        cfg: cfg.clone(),
        hub: hub.clone(),
        verifier,
        metrics_auth: metrics_auth::MetricsAuth::new(cfg.metrics_jwt_secret.as_deref()),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        relay: relay_tx,
        authorize: authorize_tx,
        check: check_tx,
        history: history_tx.clone(),
        changes: changes.clone(),
        presence: presence.clone(),
        rest_limits: rest_limits::RestLimits::new(
            &cfg,
            relay::QUEUE,
            metrics.rest_requests_in_flight.clone(),
        ),
        connections_by_address: tally::InFlight::default(),
        connections_by_block: tally::InFlight::default(),
        http_connections: tally::InFlight::default(),
        http_connections_by_peer: tally::InFlight::default(),
        joins_by_address: tally::RateTally::new(cfg.max_connections),
        joins_by_block: tally::RateTally::new(cfg.max_connections),
        joins_total: tally::RateTally::new(1),
        bindings_by_address: tally::Amounts::default(),
        patterns_by_address: tally::Amounts::default(),
        bindings_by_block: tally::Amounts::default(),
        patterns_by_block: tally::Amounts::default(),
        schema_wide_bindings: tally::Amounts::default(),
        resumes: history::line::Line::new(
            cfg.max_resumes_per_address,
            cfg.max_resumes_waiting_per_address,
            history_tx.clone(),
            metrics.clone(),
        ),
        instance,
    });
    tracing::info!(%addr, consumer = %cfg.consumer, "listening");
    // The workers whose round trips joins and presence wait on, off the connections' run
    // queue (`db_thread`).
    let db_thread = db_thread::DbThread::start()?;
    // Histories: a resume reads and frames up to MAX_RESUME_MESSAGES at once.
    let history_thread = db_thread::DbThread::start_named("history")?;
    // The Postgres Changes checks, beside the drain (`postgres_changes::pool`).
    let checks = postgres_changes::pool::Checks::new(&cfg);
    let check_workers = checks.start(cfg.clone(), metrics.clone(), shutdown.clone());
    let drainer = tokio::spawn(drainer::run(
        cfg.clone(),
        hub,
        changes,
        checks,
        presence.views.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    let session = Arc::new(presence::lease::Session::new(&cfg.consumer, instance));
    let presence_worker = tokio::spawn(
        presence::worker::Worker::new(
            cfg.clone(),
            presence.views.clone(),
            presence.members.clone(),
            metrics.clone(),
            session.clone(),
        )
        .run(shutdown.clone()),
    );
    // The lease outlives the worker: it ends the session once the worker has written the
    // untracks of the closing sockets (ending it meanwhile would race those writes).
    let (end_presence, presence_ends) = tokio::sync::watch::channel(false);
    let presence_lease = db_thread.spawn(presence::lease::run(
        cfg.clone(),
        session,
        metrics.clone(),
        presence_ends,
    ));
    let presence_flusher = tokio::spawn(presence::view::flusher(
        presence.views.clone(),
        Duration::from_millis(cfg.presence_window_ms),
        shutdown.clone(),
    ));
    let relay = tokio::spawn(relay::run(
        cfg.clone(),
        relay_rx,
        persist_full,
        metrics.clone(),
        shutdown.clone(),
    ));
    // Verdict requests wait in a line per client address, taken in turn (`verdict_queue`).
    let (ahead_tx, ahead_rx) = tokio::sync::mpsc::channel(verdict_queue::AHEAD);
    let lines = verdict_queue::Lines::new(
        cfg.max_verdicts_waiting_per_address as usize,
        cfg.max_verdicts_waiting as usize,
    );
    db_thread.spawn(verdict_queue::serve(
        authorize_rx,
        ahead_tx,
        lines,
        metrics.clone(),
    ));
    let authorizer = db_thread.spawn(authorizer::run(
        cfg.clone(),
        ahead_rx,
        metrics.clone(),
        shutdown.clone(),
    ));
    let checker = tokio::spawn(postgres_changes::subscribable::run(
        cfg.clone(),
        check_rx,
        metrics.clone(),
        shutdown.clone(),
    ));
    let history = history_thread.spawn(history::worker::run(
        cfg.clone(),
        history_rx,
        history_tx.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    let interest_worker = db_thread.spawn(interest::upload::worker(
        cfg.clone(),
        interest,
        metrics.clone(),
        shutdown.clone(),
    ));
    let accept = tokio::spawn(server::serve(listener, shared));
    let upkeep = tokio::spawn({
        let metrics = metrics.clone();
        async move {
            let mut every = tokio::time::interval(metrics::UPKEEP_EVERY);
            loop {
                every.tick().await;
                metrics.run_upkeep();
            }
        }
    });

    stop.await;
    tracing::info!("shutting down: closing connections and confirming the queue position");
    let _ = trigger.send(true);
    let _ = accept.await;
    let grace = Duration::from_secs(5);
    let _ = tokio::time::timeout(grace, drainer).await;
    let _ = tokio::time::timeout(grace, relay).await;
    let _ = tokio::time::timeout(grace, authorizer).await;
    let _ = tokio::time::timeout(grace, checker).await;
    for w in check_workers {
        let _ = tokio::time::timeout(grace, w).await;
    }
    let _ = tokio::time::timeout(grace, history).await;
    let _ = tokio::time::timeout(grace, interest_worker).await;
    let _ = tokio::time::timeout(grace, presence_worker).await;
    // Ends this sidecar's presence session: its members leave everyone's view now.
    let _ = end_presence.send(true);
    let _ = tokio::time::timeout(grace, presence_lease).await;
    presence_flusher.abort();
    shutdown::wait_for_connections(&metrics, grace).await;
    upkeep.abort();
    drop(db_thread);
    drop(history_thread);
    Ok(())
}
