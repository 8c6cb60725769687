//! Whose turn it is to run a model: the MIP slots of one replica, shared fairly between
//! clients.
//!
//! A call takes a [`Turn`] for its fairness key (the session for calls through a session,
//! else the client's address) before its sandbox run or solve. With a slot free, and nobody
//! waiting, it runs at once: a client alone may use every slot. Otherwise it waits, for at
//! most the configured time, and then is refused `BUSY` with a retry hint. When a slot
//! frees, it goes to the waiter whose key runs the fewest models, the longest-waiting first
//! among those: so a key that runs nothing never waits behind a key that already runs
//! something, waiters are served first come first served across keys, and no key gets a
//! second slot while a key with none waits.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use toolrelay_relay::builtin::{FailureKind, ToolCode, ToolFailure};

/// When a refused caller is told to come back.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The slots of one replica and the calls waiting for one.
#[derive(Clone)]
pub struct Turns {
    queue: Arc<Mutex<Queue>>,
    max_wait: Duration,
}

struct Queue {
    slots: usize,
    in_use: usize,
    /// Models running per key (keys running none are left out).
    running: HashMap<String, usize>,
    /// Waiting calls, in the order they came.
    waiting: VecDeque<Waiter>,
    next_ticket: u64,
    /// Told the slots in use and the calls waiting after each change.
    report: Option<Box<dyn Fn(usize, usize) + Send>>,
}

struct Waiter {
    ticket: u64,
    key: String,
    /// Told when the waiter was given a slot (already counted for it).
    given: oneshot::Sender<()>,
}

impl Queue {
    fn start(&mut self, key: &str) {
        self.in_use += 1;
        *self.running.entry(key.to_owned()).or_default() += 1;
    }

    /// Frees a slot of `key` and hands the free slots to the waiters whose turn it is.
    fn finish(&mut self, key: &str) {
        self.in_use = self.in_use.saturating_sub(1);
        if let Some(count) = self.running.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                self.running.remove(key);
            }
        }
        while self.in_use < self.slots {
            let Some(next) = self.next_turn() else { break };
            let Some(waiter) = self.waiting.remove(next) else {
                break;
            };
            self.start(&waiter.key);
            // A waiter that went away meanwhile gives the slot back when its guard drops.
            let _ = waiter.given.send(());
        }
        self.report();
    }

    fn report(&self) {
        if let Some(report) = &self.report {
            report(self.in_use, self.waiting.len());
        }
    }

    /// The waiter to run next: the first of those whose key runs the fewest models.
    fn next_turn(&self) -> Option<usize> {
        self.waiting
            .iter()
            .enumerate()
            .min_by_key(|(index, waiter)| {
                let running = self.running.get(&waiter.key).copied().unwrap_or(0);
                (running, *index)
            })
            .map(|(index, _)| index)
    }
}

impl Turns {
    /// `slots` runs at once; a call waits at most `max_wait` for one.
    pub fn new(slots: usize, max_wait: Duration) -> Self {
        Self {
            queue: Arc::new(Mutex::new(Queue {
                slots: slots.max(1),
                in_use: 0,
                running: HashMap::new(),
                waiting: VecDeque::new(),
                next_ticket: 0,
                report: None,
            })),
            max_wait,
        }
    }

    /// The same turns, telling `report` the slots in use and the calls waiting whenever they
    /// change (for the metrics).
    #[must_use]
    pub fn reporting(self, report: impl Fn(usize, usize) + Send + 'static) -> Self {
        self.lock().report = Some(Box::new(report));
        self
    }

    /// A turn for `key`: at once when a slot is free and nobody waits, else when one frees
    /// and it is this call's turn, or `BUSY` after waiting the longest a call may wait.
    pub async fn take(&self, key: &str) -> Result<Turn, ToolFailure> {
        let (ticket, given) = {
            let mut queue = self.lock();
            if queue.in_use < queue.slots && queue.waiting.is_empty() {
                queue.start(key);
                queue.report();
                return Ok(self.turn(key));
            }
            let (sender, given) = oneshot::channel();
            let ticket = queue.next_ticket;
            queue.next_ticket += 1;
            queue.waiting.push_back(Waiter {
                ticket,
                key: key.to_owned(),
                given: sender,
            });
            queue.report();
            (ticket, given)
        };
        // Leaves the queue, or gives its slot back, when the caller goes away while waiting.
        let mut waiting = Waiting {
            turns: self,
            key,
            ticket,
            settled: false,
        };
        let outcome = tokio::time::timeout(self.max_wait, given).await;
        waiting.settled = true;
        let mut queue = self.lock();
        match queue
            .waiting
            .iter()
            .position(|waiter| waiter.ticket == ticket)
        {
            // Still waiting: the time is up.
            Some(index) => {
                queue.waiting.remove(index);
                queue.report();
                drop(queue);
                debug_assert!(outcome.is_err(), "a waiter was told but left queued");
                Err(queue_full(self.max_wait))
            }
            // Given a slot (perhaps just as the time ran out).
            None => Ok(self.turn(key)),
        }
    }

    /// Calls waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    fn turn(&self, key: &str) -> Turn {
        Turn {
            queue: Arc::clone(&self.queue),
            key: key.to_owned(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        lock(&self.queue)
    }
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A call's place in the queue while it waits.
struct Waiting<'a> {
    turns: &'a Turns,
    key: &'a str,
    ticket: u64,
    /// The wait ended normally, and [`Turns::take`] settles it.
    settled: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut queue = self.turns.lock();
        match queue
            .waiting
            .iter()
            .position(|waiter| waiter.ticket == self.ticket)
        {
            Some(index) => {
                queue.waiting.remove(index);
                queue.report();
            }
            // It was given a slot it will not use.
            None => queue.finish(self.key),
        }
    }
}

/// A slot held by one run; freed, for the next waiter, when dropped.
pub struct Turn {
    queue: Arc<Mutex<Queue>>,
    key: String,
}

impl Drop for Turn {
    fn drop(&mut self) {
        lock(&self.queue).finish(&self.key);
    }
}

/// No slot came free for this call in time.
fn queue_full(waited: Duration) -> ToolFailure {
    ToolFailure {
        kind: FailureKind::Busy,
        code: ToolCode::Busy.into(),
        message: format!(
            "The relay is running as many models as it can at once, and none finished in the {} s a call waits for its turn. Try again in a few seconds.",
            waited.as_secs()
        ),
        retry_after: Some(RETRY_AFTER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    const WAIT: Duration = Duration::from_secs(10);

    /// Starts a call for `key` in the background; its turn lands in `started` (in order).
    fn call(
        turns: &Turns,
        key: &'static str,
        started: &Arc<StdMutex<Vec<&'static str>>>,
    ) -> tokio::task::JoinHandle<Result<Turn, ToolFailure>> {
        let (turns, started) = (turns.clone(), Arc::clone(started));
        tokio::spawn(async move {
            let turn = turns.take(key).await;
            if turn.is_ok() {
                started.lock().unwrap().push(key);
            }
            turn
        })
    }

    /// Lets every spawned task run until it waits.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn log() -> Arc<StdMutex<Vec<&'static str>>> {
        Arc::new(StdMutex::new(Vec::new()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_key_uses_every_slot_while_nobody_waits() {
        let turns = Turns::new(2, WAIT);
        let first = turns.take("a").await.unwrap();
        let second = turns.take("a").await.unwrap();
        assert_eq!(turns.waiting(), 0);
        drop((first, second));
        let _again = turns.take("a").await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_first_come_first_served_across_keys() {
        let turns = Turns::new(1, WAIT);
        let started = log();
        let running = turns.take("x").await.unwrap();
        let mut calls = Vec::new();
        for key in ["b", "c", "d"] {
            calls.push(call(&turns, key, &started));
            settle().await;
        }
        assert_eq!(turns.waiting(), 3);
        drop(running);
        for call in calls {
            let turn = call.await.unwrap().unwrap();
            drop(turn);
        }
        assert_eq!(*started.lock().unwrap(), ["b", "c", "d"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_gets_no_second_slot_while_another_key_waits() {
        let turns = Turns::new(2, WAIT);
        let started = log();
        // "a" alone takes both slots, then asks for a third before "b" comes.
        let a1 = turns.take("a").await.unwrap();
        let a2 = turns.take("a").await.unwrap();
        let a3 = call(&turns, "a", &started);
        settle().await;
        let b = call(&turns, "b", &started);
        settle().await;
        assert_eq!(turns.waiting(), 2);
        // The first slot to free goes to "b", which runs nothing, though "a" asked first.
        drop(a1);
        settle().await;
        assert_eq!(*started.lock().unwrap(), ["b"]);
        // The next goes to "a" again.
        drop(a2);
        settle().await;
        assert_eq!(*started.lock().unwrap(), ["b", "a"]);
        drop((a3.await.unwrap(), b.await.unwrap()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_waits_too_long_is_busy_with_a_retry_hint() {
        let turns = Turns::new(1, WAIT);
        let held = turns.take("a").await.unwrap();
        let started = tokio::time::Instant::now();
        let refused = turns.take("b").await.err().unwrap();
        assert_eq!(started.elapsed(), WAIT, "waited its full time, no longer");
        assert_eq!(
            (refused.kind, refused.code),
            (FailureKind::Busy, ToolCode::Busy.into())
        );
        assert_eq!(refused.retry_after, Some(RETRY_AFTER));
        assert_eq!(turns.waiting(), 0, "it left the queue");
        // The slot still goes to the next caller once free.
        drop(held);
        let _next = turns.take("b").await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_leaves_gives_its_place_and_its_slot_back() {
        let turns = Turns::new(1, WAIT);
        let started = log();
        let held = turns.take("a").await.unwrap();
        let leaving = call(&turns, "b", &started);
        settle().await;
        leaving.abort();
        settle().await;
        assert_eq!(turns.waiting(), 0);
        let c = call(&turns, "c", &started);
        settle().await;
        drop(held);
        drop(c.await.unwrap().unwrap());
        assert_eq!(*started.lock().unwrap(), ["c"]);
        // Every slot is free again.
        let _one = turns.take("d").await.unwrap();
    }
}
