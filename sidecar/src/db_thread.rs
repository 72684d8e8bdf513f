//! A thread of its own for the database round trips that connections wait on: the batched
//! verdicts of private joins (`authorizer`), the interest upload a join is answered after
//! (`interest`), and the presence lease.
//!
//! Why: on the shared runtime these workers, and the tokio-postgres connections they
//! spawn, are tasks among the connections' tasks. In a join storm thousands of connection
//! tasks are ready at once, and a worker woken by a reply from the database runs only after
//! the ready tasks ahead of it: in a storm of 15,000 private joins the database sat idle up
//! to 188 ms between two `realtime.authorize` calls (`pgbench/joins.py` reads the calls'
//! timeline from the server log; 16 to 23 ms here), and under 250,000 connections sidecars
//! missed their 3 s presence lease (`pgbench/RESULTS.md`, "Connections held"; none here).
//! Here they run on a current-thread runtime of their own, so a round trip's next step
//! waits for the kernel, not for the run queue.
//! What they do per round trip is small (build one call's arrays, hand back verdicts), so
//! one thread is enough; the drain and the other workers that also write frames to many
//! connections stay on the shared runtime, where that work is spread over its threads.
//!
//! The history worker gets a thread of this kind too (`start_named("history")`), for the
//! opposite reason: its work is large, not its waits. A resume reads and frames up to
//! MAX_RESUME_MESSAGES at once (20 MB for the soak's resumers from seq 0), and its sending
//! tasks with it; on the shared runtime that held one of its threads for tens of
//! milliseconds at a time, and every connection and the drain behind it. On a thread of its
//! own the kernel shares the cores between it and the runtime's threads: with two clients
//! resuming 20 MB every two seconds the ordinary broadcasts' p99 was 10.6 ms against
//! 48-50 on the shared runtime (4.7-5.9 without them; `pgbench/RESULTS.md`). There its
//! worker is never kept waiting for its turn, so a storm of rejoins no longer piles up
//! behind it into few walks of the ring by itself: the worker gathers a storm's joins for
//! a moment instead (`db_worker::gather_storm`), or the storm costs hundreds of walks.

use std::future::Future;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The thread and its runtime; both end when this is dropped.
pub struct DbThread {
    handle: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl DbThread {
    pub fn start() -> std::io::Result<Self> {
        Self::start_named("db-round-trips")
    }

    /// A thread of this kind under another name, for other work kept off the shared runtime.
    pub fn start_named(name: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Runs the spawned workers until `stop` is sent or dropped; dropping the
                // runtime then cancels whatever is left.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(DbThread {
            handle,
            stop: Some(stop),
        })
    }

    /// Runs `work` on this thread; the handle can be awaited from any runtime.
    pub fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(work)
    }
}

impl Drop for DbThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name of the thread that work spawned from inside `thread`'s work runs on, as a
    /// worker spawns its tokio-postgres connection.
    async fn inner_thread_name(thread: &DbThread) -> Option<String> {
        thread
            .spawn(async {
                tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
                    .await
                    .unwrap()
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn work_spawned_here_runs_on_its_own_thread_and_answers_the_caller() {
        let db = DbThread::start().unwrap();
        let name = db
            .spawn(async { std::thread::current().name().map(str::to_owned) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("db-round-trips"));
        // Spawned from inside: lands here too.
        assert_eq!(
            inner_thread_name(&db).await.as_deref(),
            Some("db-round-trips")
        );
        // Another of its kind, by its name: the history worker and its sending tasks.
        let history = DbThread::start_named("history").unwrap();
        assert_eq!(
            inner_thread_name(&history).await.as_deref(),
            Some("history")
        );
    }

    #[tokio::test]
    async fn dropping_it_cancels_what_still_runs() {
        let db = DbThread::start().unwrap();
        let forever = db.spawn(std::future::pending::<()>());
        drop(db);
        let joined = tokio::time::timeout(std::time::Duration::from_secs(5), forever)
            .await
            .expect("the runtime's end cancels its tasks");
        assert!(joined.unwrap_err().is_cancelled());
    }
}
