//! Graceful shutdown (SPEC §11), shared by the relay and the gateway of a process.
//!
//! On SIGTERM a server [`begin`](Drain::begin)s the drain: new calls, sessions and tab attaches
//! are refused with 503 and `Retry-After` (and `/readyz` turns red), while connected tabs keep
//! their connections and their answers are still accepted. Work in flight holds the drain open
//! ([`Drain::hold`]): a call delivered to a tab of this process and not answered yet, a caller
//! waiting for an answer. When nothing is held, or the drain deadline passes, the drain
//! [`end`](Drain::end)s: callers still waiting get 503 with their `requestId`, tabs are closed
//! with 1012 so that they reconnect elsewhere, and the servers stop.
//!
//! A relay whose store other relays share [`hand_over`](Drain::hand_over)s as it begins (a
//! rolling restart): it delivers no new call to its tabs — they stay queued in the store — and
//! tells each tab to move (1012) as soon as the calls delivered to it are answered, so that the
//! tab reconnects to another relay and takes its queued calls there. A relay alone (the memory
//! store) keeps delivering to the end, since there is nowhere else for its calls to go.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

/// The drain state of a process. Cheap to clone; clones share it.
#[derive(Clone, Debug)]
pub struct Drain {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    draining: CancellationToken,
    /// Cancelled before `draining` when tabs are to move to other relays.
    handing_over: CancellationToken,
    ended: CancellationToken,
    /// What is held now. A counter, not a channel: every call takes and releases holds, and
    /// only a draining process needs to hear when the count reaches zero.
    held: AtomicUsize,
    /// Told when the count reaches zero while draining.
    settled: Notify,
    /// Tabs' sockets: each tells its tab to reconnect when the drain ends, and the process
    /// waits for them before it exits (see [`Drain::spawn_socket`]).
    sockets: TaskTracker,
}

/// Something in flight that the drain waits for; dropping it lets the drain go on.
#[derive(Debug)]
pub struct Hold {
    inner: Arc<Inner>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let inner = &self.inner;
        if inner.held.fetch_sub(1, Ordering::AcqRel) == 1 && inner.draining.is_cancelled() {
            inner.settled.notify_waiters();
        }
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

impl Drain {
    /// A process that is not stopping.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                draining: CancellationToken::new(),
                handing_over: CancellationToken::new(),
                ended: CancellationToken::new(),
                held: AtomicUsize::new(0),
                settled: Notify::new(),
                sockets: TaskTracker::new(),
            }),
        }
    }

    /// Starts the drain: new work is refused from now on.
    pub fn begin(&self) {
        self.inner.draining.cancel();
    }

    /// Starts the drain of a relay that other relays stand in for: besides refusing new work,
    /// it delivers no new call, and its tabs move once their delivered calls are answered.
    pub fn hand_over(&self) {
        // Before `draining`: whoever sees the drain begun sees the hand-over too.
        self.inner.handing_over.cancel();
        self.inner.draining.cancel();
    }

    /// Whether the drain hands the tabs over to other relays (see [`Drain::hand_over`]).
    pub fn is_handing_over(&self) -> bool {
        self.inner.handing_over.is_cancelled()
    }

    /// Completes when the drain hands the tabs over to other relays.
    pub fn handing_over(&self) -> WaitForCancellationFutureOwned {
        self.inner.handing_over.clone().cancelled_owned()
    }

    /// Whether new work must be refused.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.is_cancelled()
    }

    /// Ends the drain: waiting callers give up, tabs are told to reconnect elsewhere.
    pub fn end(&self) {
        self.inner.draining.cancel();
        self.inner.ended.cancel();
    }

    /// Whether the drain has ended.
    pub fn has_ended(&self) -> bool {
        self.inner.ended.is_cancelled()
    }

    /// Completes when the drain ends.
    pub fn ended(&self) -> WaitForCancellationFutureOwned {
        self.inner.ended.clone().cancelled_owned()
    }

    /// Runs a tab's socket: when the drain ends it tells its tab to reconnect and closes, and
    /// [`Drain::sockets_closed`] waits for that, so the process never exits with a tab untold.
    pub fn spawn_socket<F>(&self, socket: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner.sockets.spawn(socket);
    }

    /// Waits up to `timeout` for every socket started with [`Drain::spawn_socket`] to close
    /// (call it once the drain has ended); whether they all did.
    pub async fn sockets_closed(&self, timeout: Duration) -> bool {
        self.inner.sockets.close();
        tokio::time::timeout(timeout, self.inner.sockets.wait())
            .await
            .is_ok()
    }

    /// Holds the drain open until the returned value is dropped.
    pub fn hold(&self) -> Hold {
        self.inner.held.fetch_add(1, Ordering::AcqRel);
        Hold {
            inner: Arc::clone(&self.inner),
        }
    }

    /// How much is held now.
    pub fn held(&self) -> usize {
        self.inner.held.load(Ordering::Acquire)
    }

    /// Begins the drain, waits until nothing is held or `deadline` has passed, then ends it.
    /// Returns how much was still held at the end.
    pub async fn run(&self, deadline: Duration) -> usize {
        self.begin();
        let settled = async {
            loop {
                // Listening before looking, so a release in between is not missed.
                let released = self.inner.settled.notified();
                let mut released = std::pin::pin!(released);
                released.as_mut().enable();
                if self.held() == 0 {
                    return;
                }
                released.await;
            }
        };
        if tokio::time::timeout(deadline, settled).await.is_err() {
            tracing::warn!(
                held = self.held(),
                "the drain deadline passed with calls unanswered; their callers are told to ask again"
            );
        }
        let left = self.held();
        self.end();
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_drain_waits_for_what_is_held_up_to_its_deadline() {
        let drain = Drain::new();
        let hold = drain.hold();
        let running = tokio::spawn({
            let drain = drain.clone();
            async move { drain.run(Duration::from_secs(10)).await }
        });
        tokio::task::yield_now().await;
        assert!(drain.is_draining() && !drain.has_ended());
        drop(hold);
        assert_eq!(running.await.unwrap(), 0);
        assert!(drain.has_ended());

        let stuck = Drain::new();
        let _hold = stuck.hold();
        let started = tokio::time::Instant::now();
        assert_eq!(stuck.run(Duration::from_secs(10)).await, 1);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert!(stuck.has_ended());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hand_over_is_a_drain_that_moves_tabs_and_a_plain_drain_is_not() {
        let alone = Drain::new();
        alone.begin();
        assert!(alone.is_draining() && !alone.is_handing_over());

        let shared = Drain::new();
        let handing_over = tokio::spawn(shared.handing_over());
        shared.hand_over();
        assert!(shared.is_draining() && shared.is_handing_over());
        handing_over.await.unwrap();
        // The drain then runs as any other.
        assert_eq!(shared.run(Duration::from_secs(10)).await, 0);
        assert!(shared.has_ended());
    }
}
