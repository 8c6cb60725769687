//! A session's listeners on this replica, shared by the stores: streams of all the session's
//! events (its tab, manifest watchers) and callers waiting for one call's answer.
//!
//! A waiting caller is woken by its own call's answer alone (and by what ends every wait: the
//! session ending, events lost), never by the session's other calls: with many callers on one
//! session, a broadcast would wake each of them for every call of the others.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use tokio::sync::{Notify, broadcast};
use tokio_stream::wrappers::BroadcastStream;

use super::{EventStream, SessionEvent};

/// Events a slow subscriber may fall behind by before it gets [`SessionEvent::Missed`]: events
/// are hints that readers follow by looking at the state, so a few are plenty. (Answers go to
/// their waiters apart, so what a session's stream carries is its tab's work: two events a
/// call.) Every session with a tab keeps the buffer: 8 slots are ~0.6 KB.
const EVENT_BUFFER: usize = 8;

/// The largest answer (as the budget counts it, [`super::rules::answer_cost`]) a session's
/// stream is sent with its finished call, the record its waiters get (shared, not copied);
/// past it the stream gets the call without its answer, so that what a slow stream has not
/// read yet ([`EVENT_BUFFER`] events) holds little.
pub(crate) const STREAMED_ANSWER_BYTES: usize = 4 * 1024;

/// Callers waiting for an answer, by call id (shared with each waiter's registration): each
/// with its token and mailbox.
type Waiters = HashMap<Arc<str>, Vec<(u64, Arc<Mailbox>)>>;

/// How long news of a call nobody waits for is kept for its next waiter (a caller between two
/// waits, as the MCP server waits in rounds).
const NEWS_HELD: std::time::Duration = std::time::Duration::from_secs(2);
/// News kept for no waiter, of all the session's calls together, at most.
const NEWS_HELD_MAX: usize = 64;

/// One session's listeners.
pub(crate) struct SessionChannel {
    events: broadcast::Sender<SessionEvent>,
    /// Callers waiting for an answer.
    waiters: Mutex<Waiters>,
    next_waiter: AtomicU64,
    /// News of calls nobody waited for at the moment, oldest first, for their next waiter.
    unclaimed: Mutex<std::collections::VecDeque<(std::time::Instant, SessionEvent)>>,
}

impl SessionChannel {
    pub(crate) fn new() -> Arc<Self> {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Arc::new(Self {
            events,
            waiters: Mutex::new(HashMap::new()),
            next_waiter: AtomicU64::new(0),
            unclaimed: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        // Held for one map operation, never across an `.await`.
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn unclaimed(
        &self,
    ) -> MutexGuard<'_, std::collections::VecDeque<(std::time::Instant, SessionEvent)>> {
        // Held for one short operation, never across an `.await`.
        self.unclaimed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every event of the session from now on.
    pub(crate) fn subscribe(&self) -> EventStream {
        Box::pin(
            BroadcastStream::new(self.events.subscribe())
                .map(|event| event.unwrap_or(SessionEvent::Missed)),
        )
    }

    /// From now on, the answer to call `id` ([`SessionEvent::ResponseReady`]), and
    /// [`SessionEvent::SessionEnded`] and [`SessionEvent::Missed`]; nothing else.
    pub(crate) fn wait_for(self: &Arc<Self>, id: &str) -> EventStream {
        let mailbox = Arc::new(Mailbox::default());
        let token = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        let id: Arc<str> = Arc::from(id);
        {
            let mut waiters = self.waiters();
            waiters
                .entry(Arc::clone(&id))
                .or_default()
                .push((token, mailbox.clone()));
            // News that came while nobody waited (under the waiters' lock, as it is kept).
            let mut unclaimed = self.unclaimed();
            let fresh = std::time::Instant::now().checked_sub(NEWS_HELD);
            unclaimed.retain(|(at, event)| {
                let mine = matches!(event, SessionEvent::News { id: told, .. } if **told == *id);
                if mine && fresh.is_none_or(|fresh| *at >= fresh) {
                    mailbox.put(event.clone());
                }
                !mine
            });
        }
        let waiting = Waiting {
            channel: self.clone(),
            id,
            token,
            mailbox,
        };
        Box::pin(futures::stream::unfold(waiting, |waiting| async move {
            let event = waiting.mailbox.next().await;
            Some((event, waiting))
        }))
    }

    /// Tells the listeners who want to know: the session's streams hear of everything (of an
    /// answer, the finished call — how it ended, so that the tab's connection knows a
    /// cancelled call without reading it — when the store sent it along, without its answer
    /// past [`STREAMED_ANSWER_BYTES`]);
    /// an answer's waiters of it, with the finished call; every waiter of the session's end
    /// and of lost events.
    pub(crate) fn announce(&self, event: SessionEvent) {
        match event {
            SessionEvent::ResponseReady { id, record } => {
                // Taken before the waiters take the record; none when nobody listens.
                let brief = record
                    .as_ref()
                    .filter(|_| self.events.receiver_count() > 0)
                    .map(|record| match &record.response {
                        Some(answer)
                            if super::rules::answer_cost(answer) > STREAMED_ANSWER_BYTES =>
                        {
                            Arc::new(record.without_answer())
                        }
                        _ => Arc::clone(record),
                    });
                // Mailboxes are filled under the map's lock (each put is one short lock of its
                // own, never the other way round): no copy of the list per answer.
                if let Some(((_, last), others)) = self
                    .waiters()
                    .get(id.as_str())
                    .and_then(|waiting| waiting.split_last())
                {
                    for (_, mailbox) in others {
                        mailbox.put(SessionEvent::ResponseReady {
                            id: id.clone(),
                            record: record.clone(),
                        });
                    }
                    last.put(SessionEvent::ResponseReady {
                        id: id.clone(),
                        record,
                    });
                }
                // No subscribers is normal: nobody is listening.
                let _ = self
                    .events
                    .send(SessionEvent::ResponseReady { id, record: brief });
            }
            // News of a running call is its waiters' alone; kept a moment for the next one when
            // none waits.
            SessionEvent::News { ref id, .. } => {
                let waiters = self.waiters();
                match waiters.get(id.as_str()) {
                    Some(waiting) => {
                        for (_, mailbox) in waiting {
                            mailbox.put(event.clone());
                        }
                    }
                    None => {
                        let now = std::time::Instant::now();
                        let mut unclaimed = self.unclaimed();
                        while unclaimed.len() >= NEWS_HELD_MAX
                            || unclaimed
                                .front()
                                .is_some_and(|(at, _)| now.duration_since(*at) > NEWS_HELD)
                        {
                            unclaimed.pop_front();
                        }
                        unclaimed.push_back((now, event));
                    }
                }
            }
            SessionEvent::SessionEnded | SessionEvent::Missed => {
                for waiting in self.waiters().values() {
                    for (_, mailbox) in waiting {
                        mailbox.put(event.clone());
                    }
                }
                let _ = self.events.send(event);
            }
            event => {
                let _ = self.events.send(event);
            }
        }
    }

    /// Whether a caller on this replica waits for call `id`'s answer.
    pub(crate) fn waiting_for(&self, id: &str) -> bool {
        self.waiters().contains_key(id)
    }

    /// Whether anyone on this replica listens.
    pub(crate) fn in_use(&self) -> bool {
        self.events.receiver_count() > 0 || !self.waiters().is_empty()
    }

    fn forget(&self, id: &str, token: u64) {
        let mut waiters = self.waiters();
        if let Some(waiting) = waiters.get_mut(id) {
            waiting.retain(|(other, _)| *other != token);
            if waiting.is_empty() {
                waiters.remove(id);
            }
        }
    }
}

/// A waiter's registration; withdrawn when its stream is dropped.
struct Waiting {
    channel: Arc<SessionChannel>,
    id: Arc<str>,
    token: u64,
    mailbox: Arc<Mailbox>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.channel.forget(&self.id, self.token);
    }
}

/// News a waiter may fall behind by; past it, the oldest goes (progress is merged first).
const NEWS_KEPT: usize = 32;

/// What a waiter has yet to read: the call's news in order ([`SessionEvent::News`]), then one
/// event, enough since every other event tells it to look at the call again (an answer that
/// came with its record is kept over any later event).
#[derive(Default)]
struct Mailbox {
    slot: Mutex<Slot>,
    ready: Notify,
}

#[derive(Default)]
struct Slot {
    news: std::collections::VecDeque<SessionEvent>,
    event: Option<SessionEvent>,
}

impl Mailbox {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn put(&self, event: SessionEvent) {
        {
            let mut slot = self.slot();
            if let SessionEvent::News { news, .. } = &event {
                let is_progress = |event: &SessionEvent| matches!(event, SessionEvent::News { news, .. } if matches!(**news, super::CallNews::Progress(_)));
                // Newer progress replaces progress not read yet.
                if matches!(**news, super::CallNews::Progress(_)) {
                    slot.news.retain(|queued| !is_progress(queued));
                }
                if slot.news.len() >= NEWS_KEPT {
                    slot.news.pop_front();
                }
                slot.news.push_back(event);
            } else {
                let keeps_record = matches!(
                    slot.event,
                    Some(SessionEvent::ResponseReady {
                        record: Some(_),
                        ..
                    })
                );
                if !keeps_record {
                    slot.event = Some(event);
                }
            }
        }
        self.ready.notify_one();
    }

    async fn next(&self) -> SessionEvent {
        loop {
            {
                let mut slot = self.slot();
                if let Some(news) = slot.news.pop_front() {
                    return news;
                }
                if let Some(event) = slot.event.take() {
                    return event;
                }
            }
            // A `put` since the slot was empty left a permit: this returns at once.
            self.ready.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewRequest, RequestRecord};

    fn answered(id: &str) -> SessionEvent {
        SessionEvent::ResponseReady {
            id: id.to_owned(),
            record: None,
        }
    }

    /// The finished call an answer's event carries, if any.
    fn carried(event: &SessionEvent) -> Option<&RequestRecord> {
        match event {
            SessionEvent::ResponseReady { record, .. } => record.as_deref(),
            _ => None,
        }
    }

    /// Polls a stream once without waiting: what is there now, if anything.
    fn ready(stream: &mut EventStream) -> Option<SessionEvent> {
        futures::FutureExt::now_or_never(stream.next()).flatten()
    }

    fn news(id: &str, progress: f64) -> SessionEvent {
        SessionEvent::News {
            id: id.to_owned(),
            news: Box::new(crate::store::CallNews::Progress(
                crate::store::CallProgress {
                    progress,
                    total: None,
                    message: None,
                    at: crate::clock::Timestamp(0),
                },
            )),
        }
    }

    /// News that comes while nobody waits for its call (a caller between two waits) goes to
    /// the call's next waiter, once, in order; not to another call's.
    #[tokio::test]
    async fn news_between_two_waits_reaches_the_next_waiter() {
        let channel = SessionChannel::new();
        channel.announce(news("a", 1.0));
        channel.announce(news("b", 5.0));
        let mut other = channel.wait_for("c");
        let mut next = channel.wait_for("a");
        assert_eq!(ready(&mut next), Some(news("a", 1.0)));
        assert_eq!(ready(&mut next), None);
        assert_eq!(ready(&mut other), None);
        drop(next);
        let mut again = channel.wait_for("a");
        assert_eq!(ready(&mut again), None, "told once");
        channel.announce(news("a", 2.0));
        assert_eq!(
            ready(&mut again),
            Some(news("a", 2.0)),
            "a waiter hears it at once"
        );
    }

    #[tokio::test]
    async fn a_waiter_hears_of_its_own_answer_and_of_nothing_else() {
        let channel = SessionChannel::new();
        let mut mine = channel.wait_for("a");
        let mut other = channel.wait_for("b");
        let mut session = channel.subscribe();
        channel.announce(SessionEvent::RequestQueued);
        channel.announce(SessionEvent::ProviderChanged("c1".into()));
        channel.announce(SessionEvent::ManifestChanged);
        channel.announce(answered("b"));
        assert_eq!(ready(&mut mine), None, "woken by another call's events");
        assert_eq!(ready(&mut other), Some(answered("b")));
        channel.announce(answered("a"));
        assert_eq!(ready(&mut mine), Some(answered("a")));
        // The session's stream hears of everything, in order.
        let mut heard = Vec::new();
        while let Some(event) = ready(&mut session) {
            heard.push(event);
        }
        assert_eq!(
            heard,
            vec![
                SessionEvent::RequestQueued,
                SessionEvent::ProviderChanged("c1".into()),
                SessionEvent::ManifestChanged,
                answered("b"),
                answered("a"),
            ]
        );
    }

    #[tokio::test]
    async fn every_waiter_hears_of_the_end_and_of_lost_events() {
        let channel = SessionChannel::new();
        let mut first = channel.wait_for("a");
        let mut second = channel.wait_for("b");
        channel.announce(SessionEvent::Missed);
        assert_eq!(ready(&mut first), Some(SessionEvent::Missed));
        assert_eq!(ready(&mut second), Some(SessionEvent::Missed));
        channel.announce(SessionEvent::SessionEnded);
        assert_eq!(ready(&mut first), Some(SessionEvent::SessionEnded));
        assert_eq!(ready(&mut second), Some(SessionEvent::SessionEnded));
    }

    #[tokio::test]
    async fn an_answer_with_its_record_is_not_overwritten_and_reaches_each_waiter() {
        let channel = SessionChannel::new();
        let mut first = channel.wait_for("a");
        let mut second = channel.wait_for("a");
        let record = RequestRecord::queued(
            NewRequest {
                id: "a".into(),
                tool_id: None,
                function_name: "f".into(),
                args: serde_json::json!({}),
                created_at: crate::clock::Timestamp(1),
                deadline: crate::clock::Timestamp(2),
                builtin: false,
                correlation_id: None,
                caller: None,
            },
            1,
        );
        channel.announce(SessionEvent::ResponseReady {
            id: "a".into(),
            record: Some(Arc::new(record.clone())),
        });
        channel.announce(SessionEvent::Missed);
        for waiter in [&mut first, &mut second] {
            let event = ready(waiter).expect("the answer");
            assert_eq!(carried(&event), Some(&record));
            assert_eq!(ready(waiter), None);
        }
    }

    #[tokio::test]
    async fn a_waiter_that_is_gone_is_forgotten() {
        let channel = SessionChannel::new();
        let waiter = channel.wait_for("a");
        assert!(channel.in_use());
        drop(waiter);
        assert!(!channel.in_use(), "a dropped waiter still counted");
        let session = channel.subscribe();
        assert!(channel.in_use());
        drop(session);
        assert!(!channel.in_use());
    }

    #[tokio::test]
    async fn a_waiter_sleeping_before_its_answer_is_woken_by_it() {
        let channel = SessionChannel::new();
        let mut waiter = channel.wait_for("a");
        let woken = tokio::spawn(async move { waiter.next().await });
        tokio::task::yield_now().await;
        channel.announce(answered("a"));
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), woken)
            .await
            .expect("woken")
            .expect("the task");
        assert_eq!(event, Some(answered("a")));
    }
}
