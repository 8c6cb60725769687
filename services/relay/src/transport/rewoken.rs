//! A task's parts that wake each other, polled again rather than woken.
//!
//! A tab's task runs the link's driver beside the socket's loop ([`super::ws::serve_link`]): the
//! driver hands the loop a call, the loop hands the driver an answer, the driver hands back its
//! `ack` — three times a call one part wakes the other while the task is being polled. An HTTP
//! connection's task does the same (hyper's connection and the request's handler). tokio
//! takes a task woken during its own poll as one that yields: it queues it behind the others
//! and wakes another worker to share the work, which on a quiet relay means a write to the
//! runtime's eventfd and a worker woken for nothing (`strace`: ~3 a call, BENCHMARKS.md).
//! [`Rewoken`] gives its future a waker of its own: a wake while the future is being polled
//! only marks it, and the future is polled again at once; any other wake is the task's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// How many times in a row a future is polled again before the task yields as tokio would
/// have it (so a part that keeps waking the other cannot hold the worker).
const REPOLLS: usize = 16;

pin_project_lite::pin_project! {
    /// `future`, polled again at once when it wakes itself while being polled.
    pub(crate) struct Rewoken<F> {
        #[pin]
        future: F,
        // Made at the first poll, and kept for the task's life.
        wake: Option<Arc<LocalWake>>,
    }
}

impl<F: Future> Rewoken<F> {
    pub(crate) fn new(future: F) -> Self {
        Self { future, wake: None }
    }
}

/// The future is not being polled: a wake is the task's.
const IDLE: u8 = 0;
/// The future is being polled.
const POLLING: u8 = 1;
/// The future was woken while being polled: it is polled again.
const WOKEN: u8 = 2;

/// The waker [`Rewoken`] polls its future with.
#[derive(Default)]
struct LocalWake {
    /// [`IDLE`], [`POLLING`] or [`WOKEN`]: one word, so that a wake racing the end of a poll
    /// is either seen by the poll (which polls again) or finds the future idle (and wakes the
    /// task) — never lost between the two.
    state: AtomicU8,
    /// The task's own waker, for a wake from anywhere else.
    task: AtomicWaker,
}

impl Wake for LocalWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) | Err(WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

impl<F: Future> Future for Rewoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        let wake = Arc::clone(this.wake.get_or_insert_with(Default::default));
        wake.task.register(cx.waker());
        let waker = Waker::from(Arc::clone(&wake));
        let mut own = Context::from_waker(&waker);
        for _ in 0..REPOLLS {
            wake.state.store(POLLING, Ordering::SeqCst);
            let polled = this.future.as_mut().poll(&mut own);
            let woken = wake.state.swap(IDLE, Ordering::SeqCst) == WOKEN;
            if polled.is_ready() {
                return polled;
            }
            // Woken while polled: poll again, unless the task has spent its budget (a resource
            // out of budget wakes the task to be polled later, not now).
            if !woken {
                return Poll::Pending;
            }
            if !tokio::task::coop::has_budget_remaining() {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// The task's waker: counts its wakes.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself the first `times` polls (as one part of a task handing the other work),
    /// keeping the waker it was last polled with; then ready.
    struct SelfWaking {
        times: usize,
        polls: usize,
        kept: Arc<Mutex<Option<Waker>>>,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            *self.kept.lock().unwrap() = Some(cx.waker().clone());
            if self.polls > self.times {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn poll_once<F: Future>(future: Pin<&mut F>, task: &Arc<Counted>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(task));
        future.poll(&mut Context::from_waker(&waker))
    }

    #[tokio::test]
    async fn a_future_that_wakes_itself_is_polled_again_not_woken() {
        let task = Arc::new(Counted::default());
        let kept = Arc::new(Mutex::new(None));
        let future = SelfWaking {
            times: 3,
            polls: 0,
            kept: Arc::clone(&kept),
        };
        let mut rewoken = std::pin::pin!(Rewoken::new(future));
        assert_eq!(poll_once(rewoken.as_mut(), &task), Poll::Ready(4));
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "the task was woken");
    }

    #[tokio::test]
    async fn a_wake_from_elsewhere_is_the_tasks() {
        let task = Arc::new(Counted::default());
        let kept = Arc::new(Mutex::new(None));
        // Pending without waking itself: it waits for someone else.
        let future = std::future::poll_fn({
            let kept = Arc::clone(&kept);
            move |cx: &mut Context<'_>| {
                *kept.lock().unwrap() = Some(cx.waker().clone());
                Poll::<()>::Pending
            }
        });
        let mut rewoken = std::pin::pin!(Rewoken::new(future));
        assert!(poll_once(rewoken.as_mut(), &task).is_pending());
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
        let waker = kept.lock().unwrap().take().unwrap();
        std::thread::spawn(move || waker.wake()).join().unwrap();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task was not woken");
    }

    #[tokio::test]
    async fn a_future_that_keeps_waking_itself_yields_the_worker() {
        let task = Arc::new(Counted::default());
        let kept = Arc::new(Mutex::new(None));
        let future = SelfWaking {
            times: usize::MAX,
            polls: 0,
            kept,
        };
        let mut rewoken = std::pin::pin!(Rewoken::new(future));
        assert!(poll_once(rewoken.as_mut(), &task).is_pending());
        // Polled as often as allowed, then the task is woken to be polled later.
        assert_eq!(rewoken.as_mut().project().future.polls, REPOLLS);
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
    }

    /// Hands its waker to a thread that wakes it at once, racing the end of the poll; ready
    /// when polled again.
    struct WokenFromElsewhere {
        polls: usize,
    }

    impl Future for WokenFromElsewhere {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls += 1;
            if self.polls > 1 {
                return Poll::Ready(());
            }
            let waker = cx.waker().clone();
            std::thread::spawn(move || waker.wake());
            Poll::Pending
        }
    }

    #[test]
    fn a_wake_from_another_thread_racing_the_end_of_a_poll_is_never_lost() {
        for _ in 0..2_000 {
            let task = Arc::new(Counted::default());
            let mut rewoken = std::pin::pin!(Rewoken::new(WokenFromElsewhere { polls: 0 }));
            if poll_once(rewoken.as_mut(), &task).is_ready() {
                // The wake came while it was polled: it was polled again at once.
                continue;
            }
            // Otherwise the task itself must be woken.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while task.0.load(Ordering::SeqCst) == 0 {
                assert!(std::time::Instant::now() < deadline, "a wake was lost");
                std::thread::yield_now();
            }
            assert!(poll_once(rewoken.as_mut(), &task).is_ready());
        }
    }
}
