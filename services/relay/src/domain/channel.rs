//! The bounded channels between a provider's transport and its driver ([`crate::provider`]).
//!
//! Every attached tab keeps two of them for as long as it stays, mostly empty: Tokio's `mpsc`
//! allocates a block of 32 messages and a cache-padded channel (~3 KB for the pair) when it is
//! made, which an idle tab would pay whatever it does. These hold what is queued in a
//! `VecDeque` that grows as it fills and is given back once a burst is over (an idle tab's
//! stays at a few slots), behind a mutex held for one queue operation, never across an
//! `.await`. The API is `mpsc`'s, as far as the
//! transports use it: `send`, `reserve`, `try_send`, `closed` on the sending side; `recv`, `try_recv`,
//! `close`, `len` and a [`Stream`] on the receiving side.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use tokio::sync::Notify;

/// Slots a channel keeps once it is empty again; more are given back.
const KEPT_SLOTS: usize = 8;

/// A channel holding at most `capacity` messages (at least one).
pub fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            capacity: capacity.max(1),
            reserved: 0,
            senders: 1,
            closed: false,
            receiver: None,
        }),
        space: Notify::new(),
        receiver_closed: Notify::new(),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    )
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Notified when a full channel has room again, or the receiver closed it.
    space: Notify,
    /// Notified when the receiver closes the channel (or is dropped).
    receiver_closed: Notify,
}

struct State<T> {
    queue: VecDeque<T>,
    capacity: usize,
    /// Slots promised to [`Permit`]s not used yet.
    reserved: usize,
    /// Live senders: when the last goes, the receiver sees the end once the queue is empty.
    senders: usize,
    /// The receiver closed the channel or went away: nothing more is accepted.
    closed: bool,
    /// The receiver waiting for a message.
    receiver: Option<Waker>,
}

impl<T> State<T> {
    fn is_full(&self) -> bool {
        self.queue.len() + self.reserved >= self.capacity
    }
}

impl<T> Shared<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        // Held for one queue operation: a panic cannot leave the queue half changed.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a message the caller has room for, and wakes the receiver.
    fn push(&self, mut state: MutexGuard<'_, State<T>>, value: T) {
        state.queue.push_back(value);
        let receiver = state.receiver.take();
        drop(state);
        if let Some(receiver) = receiver {
            receiver.wake();
        }
    }
}

/// The sending half; cloning it adds a sender.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The message a [`Sender`] could not deliver: the receiver is gone.
#[derive(Debug, PartialEq, Eq)]
pub struct SendError<T>(pub T);

/// Why [`Sender::try_send`] gave a message back.
#[derive(Debug, PartialEq, Eq)]
pub enum TrySendError<T> {
    /// There is no room now.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

/// A slot reserved by [`Sender::reserve`]; dropped unused, it is given back.
pub struct Permit<'a, T> {
    shared: &'a Shared<T>,
}

impl<T> Sender<T> {
    /// Waits for room, then queues `value`; gives it back if the receiver is gone.
    pub async fn send(&self, value: T) -> Result<(), SendError<T>> {
        match self.reserve().await {
            Ok(permit) => {
                permit.send(value);
                Ok(())
            }
            Err(SendError(())) => Err(SendError(value)),
        }
    }

    /// Waits for room and reserves it, or fails if the receiver is gone. Cancel-safe: a
    /// reservation dropped before it completes takes nothing.
    pub async fn reserve(&self) -> Result<Permit<'_, T>, SendError<()>> {
        loop {
            // Made before looking, so that room made after the look wakes it.
            let space = self.shared.space.notified();
            {
                let mut state = self.shared.state();
                if state.closed {
                    return Err(SendError(()));
                }
                if !state.is_full() {
                    state.reserved += 1;
                    return Ok(Permit {
                        shared: &self.shared,
                    });
                }
            }
            space.await;
        }
    }

    /// Queues `value` if there is room now.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        let state = self.shared.state();
        if state.closed {
            return Err(TrySendError::Closed(value));
        }
        if state.is_full() {
            return Err(TrySendError::Full(value));
        }
        self.shared.push(state, value);
        Ok(())
    }

    /// Completes when the receiver has closed the channel or gone away.
    pub async fn closed(&self) {
        loop {
            let closed = self.shared.receiver_closed.notified();
            if self.is_closed() {
                return;
            }
            closed.await;
        }
    }

    /// Whether the receiver has closed the channel or gone away.
    pub fn is_closed(&self) -> bool {
        self.shared.state().closed
    }
}

impl<T> Permit<'_, T> {
    /// Queues `value` in the reserved slot.
    pub fn send(self, value: T) {
        let shared = self.shared;
        // The slot becomes the message's; `Drop` must not give it back.
        std::mem::forget(self);
        let mut state = shared.state();
        state.reserved -= 1;
        if state.closed {
            // The receiver went away meanwhile: the message goes with it.
            drop(state);
            drop(value);
            return;
        }
        shared.push(state, value);
    }
}

impl<T> Drop for Permit<'_, T> {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        let was_full = state.is_full();
        state.reserved -= 1;
        drop(state);
        if was_full {
            self.shared.space.notify_waiters();
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.state().senders += 1;
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.senders -= 1;
        let receiver = if state.senders == 0 {
            state.receiver.take()
        } else {
            None
        };
        drop(state);
        if let Some(receiver) = receiver {
            receiver.wake();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// The receiving half.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// Why [`Receiver::try_recv`] returned nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum TryRecvError {
    /// Nothing is queued now.
    Empty,
    /// Nothing is queued and nothing more will be: every sender is gone, or the channel was
    /// closed.
    Disconnected,
}

impl<T> Receiver<T> {
    /// The next message; `None` once the queue is empty and every sender is gone (or the
    /// channel was closed). Cancel-safe.
    pub async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Polls for the next message (see [`Receiver::recv`]). Each message spends the task's
    /// budget, as Tokio's channels do: a task that always finds one still yields now and then.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let budget = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let mut state = self.shared.state();
        match self.pop(&mut state) {
            Ok(value) => {
                let was_full = state.queue.len() + 1 + state.reserved >= state.capacity;
                drop(state);
                if was_full {
                    self.shared.space.notify_waiters();
                }
                budget.made_progress();
                Poll::Ready(Some(value))
            }
            Err(TryRecvError::Disconnected) => {
                budget.made_progress();
                Poll::Ready(None)
            }
            Err(TryRecvError::Empty) => {
                if !state
                    .receiver
                    .as_ref()
                    .is_some_and(|waker| waker.will_wake(cx.waker()))
                {
                    state.receiver = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    /// The next message if one is queued now.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut state = self.shared.state();
        let popped = self.pop(&mut state);
        if popped.is_ok() {
            let was_full = state.queue.len() + 1 + state.reserved >= state.capacity;
            drop(state);
            if was_full {
                self.shared.space.notify_waiters();
            }
        }
        popped
    }

    fn pop(&self, state: &mut State<T>) -> Result<T, TryRecvError> {
        match state.queue.pop_front() {
            Some(value) => {
                if state.queue.is_empty() && state.queue.capacity() > KEPT_SLOTS {
                    // A burst is over: an idle tab does not keep the room it took.
                    state.queue = VecDeque::new();
                }
                Ok(value)
            }
            None if state.senders == 0 || state.closed => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Refuses further messages; those already queued can still be received.
    pub fn close(&mut self) {
        let mut state = self.shared.state();
        let newly = !state.closed;
        state.closed = true;
        drop(state);
        if newly {
            self.shared.receiver_closed.notify_waiters();
            self.shared.space.notify_waiters();
        }
    }

    /// Messages queued now.
    pub fn len(&self) -> usize {
        self.shared.state().queue.len()
    }

    /// Whether nothing is queued now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.close();
        // What was never received goes now, not with the last sender.
        let queued = std::mem::take(&mut self.shared.state().queue);
        drop(queued);
    }
}

impl<T> Stream for Receiver<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.get_mut().poll_recv(cx)
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn messages_arrive_in_order_and_the_end_after_them() {
        let (sender, mut receiver) = channel(4);
        for n in 0..3 {
            sender.send(n).await.unwrap();
        }
        assert_eq!(receiver.len(), 3);
        drop(sender);
        assert_eq!(receiver.recv().await, Some(0));
        assert_eq!(receiver.try_recv(), Ok(1));
        assert_eq!(receiver.recv().await, Some(2));
        assert_eq!(receiver.recv().await, None);
        assert_eq!(receiver.try_recv(), Err(TryRecvError::Disconnected));
    }

    #[tokio::test]
    async fn room_is_taken_as_messages_queue_and_given_back_after_a_burst() {
        let (sender, mut receiver) = channel(128);
        let slots = |receiver: &Receiver<u32>| receiver.shared.state().queue.capacity();
        assert_eq!(slots(&receiver), 0, "an empty channel holds no room");
        for n in 0..100 {
            sender.send(n).await.unwrap();
        }
        assert!(slots(&receiver) >= 100);
        for n in 0..100 {
            assert_eq!(receiver.recv().await, Some(n));
        }
        assert_eq!(slots(&receiver), 0, "the burst's room was kept");
        sender.send(1).await.unwrap();
        assert_eq!(receiver.recv().await, Some(1));
        assert!(slots(&receiver) <= KEPT_SLOTS);
    }

    #[tokio::test]
    async fn a_full_channel_makes_the_sender_wait_for_room() {
        let (sender, mut receiver) = channel(2);
        sender.send(1).await.unwrap();
        sender.send(2).await.unwrap();
        let waiting = tokio::spawn(async move {
            sender.send(3).await.unwrap();
            sender
        });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "a full channel took a third message"
        );
        assert_eq!(receiver.try_recv(), Ok(1));
        let sender = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room made did not wake the sender")
            .unwrap();
        assert_eq!(receiver.len(), 2);
        assert_eq!(receiver.try_recv(), Ok(2));
        assert_eq!(receiver.try_recv(), Ok(3));
        assert_eq!(receiver.try_recv(), Err(TryRecvError::Empty));
        drop(sender);
    }

    #[tokio::test]
    async fn a_reservation_holds_a_slot_until_used_or_dropped() {
        let (sender, mut receiver) = channel(1);
        let permit = sender.reserve().await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(20), sender.reserve())
                .await
                .is_err(),
            "two reservations in a channel of one"
        );
        drop(permit);
        let permit = sender.reserve().await.unwrap();
        assert_eq!(sender.try_send("over"), Err(TrySendError::Full("over")));
        permit.send("sent");
        assert_eq!(receiver.recv().await, Some("sent"));
        assert_eq!(sender.try_send("then"), Ok(()));
        drop(receiver);
        assert_eq!(sender.try_send("gone"), Err(TrySendError::Closed("gone")));
    }

    #[tokio::test]
    async fn the_receivers_end_is_seen_by_senders() {
        let (sender, mut receiver) = channel(1);
        sender.send(1).await.unwrap();
        let closed = tokio::spawn({
            let sender = sender.clone();
            async move { sender.closed().await }
        });
        // Full: this send waits, and fails once the receiver closes.
        let blocked = tokio::spawn({
            let sender = sender.clone();
            async move { sender.send(2).await }
        });
        tokio::task::yield_now().await;
        receiver.close();
        assert_eq!(receiver.recv().await, Some(1), "queued before the close");
        assert_eq!(receiver.recv().await, None);
        tokio::time::timeout(Duration::from_secs(5), closed)
            .await
            .expect("closed() did not complete")
            .unwrap();
        assert_eq!(blocked.await.unwrap(), Err(SendError(2)));
        drop(receiver);
        assert!(sender.is_closed());
        assert_eq!(sender.send(3).await, Err(SendError(3)));
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_message_or_the_last_sender_leaving() {
        let (sender, mut receiver) = channel::<u8>(1);
        let other = sender.clone();
        let waiting = tokio::spawn(async move {
            let first = receiver.recv().await;
            let end = receiver.recv().await;
            (first, end)
        });
        tokio::task::yield_now().await;
        sender.send(7).await.unwrap();
        drop(sender);
        tokio::task::yield_now().await;
        drop(other);
        let received = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the receiver was not woken")
            .unwrap();
        assert_eq!(received, (Some(7), None));
    }
}
