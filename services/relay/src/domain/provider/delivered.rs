//! The calls delivered to a tab's connection and not answered yet, and the ones it answered
//! last: the one record of what the connection was given, with no IO in it.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use hashbrown::HashTable;

use tokio::time::Instant;
use toolrelay::wire::ProgressFrame;

/// Answered calls a connection remembers (see [`Delivered::is_new`]).
const ANSWERED_KEPT: usize = 256;
/// The least time between two progress reports of one call that reach its caller (at most 4
/// a second): a report sooner waits, merged with any after it (the last kept).
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Where a delivered call's progress stands: the highest value taken, when the last report
/// went to the caller, and a report waiting for its turn.
#[derive(Debug, Default)]
struct Pace {
    highest: Option<f64>,
    sent_at: Option<Instant>,
    waiting: Option<ProgressFrame>,
}

impl Pace {
    fn due_at(&self) -> Option<Instant> {
        self.waiting.as_ref()?;
        self.sent_at.map(|sent| sent + PROGRESS_EVERY)
    }
}

/// What a connection was given: each call delivered and not answered with what it holds
/// (`H`: the drain held open and the call counted in the queue depth, until it is answered),
/// and the last [`ANSWERED_KEPT`] calls it answered.
#[derive(Debug)]
pub(crate) struct Delivered<H> {
    calls: HashMap<String, (H, Pace)>,
    /// The calls answered lately, the oldest first, each once, with the hash of its id.
    answered: VecDeque<(u64, String)>,
    /// The hashes of their ids, each with how many of them have it. Every handed call is
    /// looked up here: a new call (nearly every one) is told apart by its hash alone. A scan of
    /// the list was 2 % of the one-process loop's CPU, and a set of the ids, whose every probe
    /// reads an id, 1.6 %.
    answered_hashes: HashTable<(u64, u32)>,
    hasher: RandomState,
}

impl<H> Default for Delivered<H> {
    fn default() -> Self {
        Self {
            calls: HashMap::new(),
            answered: VecDeque::new(),
            answered_hashes: HashTable::new(),
            hasher: RandomState::new(),
        }
    }
}

impl<H> Delivered<H> {
    /// How many calls wait for their answer.
    pub(crate) fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether no call waits for its answer.
    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Whether call `id` was delivered and waits for its answer.
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.calls.contains_key(id)
    }

    /// Whether call `id`, handed to this connection, is news to it: neither delivered and
    /// waiting nor answered lately (an event that handed a call over may come after a
    /// redelivery sent it and its answer came back).
    pub(crate) fn is_new(&self, id: &str) -> bool {
        !self.holds(id) && !self.was_answered(self.hasher.hash_one(id), id)
    }

    /// Whether call `id`, whose id hashes to `hash`, is among the answered ones.
    fn was_answered(&self, hash: u64, id: &str) -> bool {
        self.answered_hashes
            .find(hash, |&(kept, _)| kept == hash)
            .is_some()
            && self
                .answered
                .iter()
                .any(|(kept, answered)| *kept == hash && answered == id)
    }

    /// Records call `id` as delivered, holding `held` until it is answered.
    pub(crate) fn deliver(&mut self, id: String, held: H) {
        self.calls.insert(id, (held, Pace::default()));
    }

    /// A report of progress on call `id`: what goes to its caller now, if anything. A call not
    /// waiting here, or a value not above the highest taken, is dropped (progress increases);
    /// one sooner than [`PROGRESS_EVERY`] after the last sent waits ([`Delivered::due`]),
    /// replacing any report waiting before it.
    pub(crate) fn progress(
        &mut self,
        report: ProgressFrame,
        now: Instant,
    ) -> Option<ProgressFrame> {
        let (_, pace) = self.calls.get_mut(&report.request_id)?;
        if !report.progress.is_finite()
            || pace
                .highest
                .is_some_and(|highest| report.progress <= highest)
        {
            return None;
        }
        pace.highest = Some(report.progress);
        match pace.sent_at {
            Some(sent) if now < sent + PROGRESS_EVERY => {
                pace.waiting = Some(report);
                None
            }
            _ => {
                pace.sent_at = Some(now);
                Some(report)
            }
        }
    }

    /// The reports whose turn has come by `now`.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<ProgressFrame> {
        let mut due = Vec::new();
        for (_, pace) in self.calls.values_mut() {
            if pace.due_at().is_some_and(|at| at <= now) {
                due.extend(pace.waiting.take());
                pace.sent_at = Some(now);
            }
        }
        due
    }

    /// When the next waiting report is due, if one waits.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.calls
            .values()
            .filter_map(|(_, pace)| pace.due_at())
            .min()
    }

    /// Call `id` has its answer: it holds nothing more, and is remembered as answered.
    /// Whether it was waiting.
    pub(crate) fn settle(&mut self, id: &str) -> bool {
        let Some((id, _)) = self.calls.remove_entry(id) else {
            return false;
        };
        let hash = self.hasher.hash_one(&id);
        if self.was_answered(hash, &id) {
            // Answered before, then delivered again: it moves to the end of the list.
            self.answered.retain(|(_, answered)| *answered != id);
            self.forget_hash(hash);
        } else if self.answered.len() >= ANSWERED_KEPT
            && let Some((oldest, _)) = self.answered.pop_front()
        {
            self.forget_hash(oldest);
        }
        match self
            .answered_hashes
            .find_mut(hash, |&(kept, _)| kept == hash)
        {
            Some((_, count)) => *count += 1,
            None => {
                self.answered_hashes
                    .insert_unique(hash, (hash, 1), |&(kept, _)| kept);
            }
        }
        self.answered.push_back((hash, id));
        true
    }

    /// One answered call whose id hashes to `hash` is no longer in the list.
    fn forget_hash(&mut self, hash: u64) {
        if let Ok(mut entry) = self
            .answered_hashes
            .find_entry(hash, |&(kept, _)| kept == hash)
        {
            let (_, count) = entry.get_mut();
            *count -= 1;
            if *count == 0 {
                entry.remove();
            }
        }
    }

    /// The calls waiting for their answer.
    pub(crate) fn waiting(&self) -> Vec<String> {
        self.calls.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a connection's record of what it was given, and what it then says.
    enum Step {
        Deliver(&'static str),
        Settle(&'static str, bool),
        Expect {
            waiting: usize,
            new: &'static [&'static str],
            known: &'static [&'static str],
        },
    }

    fn run(steps: &[Step]) {
        let mut delivered = Delivered::<()>::default();
        for (n, step) in steps.iter().enumerate() {
            match step {
                Step::Deliver(id) => delivered.deliver((*id).to_owned(), ()),
                Step::Settle(id, was_waiting) => {
                    assert_eq!(delivered.settle(id), *was_waiting, "step {n}: settle {id}");
                }
                Step::Expect {
                    waiting,
                    new,
                    known,
                } => {
                    assert_eq!(delivered.len(), *waiting, "step {n}: waiting");
                    assert_eq!(delivered.is_empty(), *waiting == 0, "step {n}: empty");
                    for id in *new {
                        assert!(delivered.is_new(id), "step {n}: {id} should be new");
                    }
                    for id in *known {
                        assert!(!delivered.is_new(id), "step {n}: {id} should be known");
                    }
                }
            }
        }
    }

    #[test]
    fn a_call_is_waiting_until_answered_then_known_as_answered() {
        use Step::*;
        run(&[
            Expect {
                waiting: 0,
                new: &["a"],
                known: &[],
            },
            Deliver("a"),
            Deliver("b"),
            Expect {
                waiting: 2,
                new: &["c"],
                known: &["a", "b"],
            },
            // The answer, then a duplicate answer (any path may settle it first).
            Settle("a", true),
            Settle("a", false),
            Expect {
                waiting: 1,
                new: &["c"],
                known: &["a", "b"],
            },
            // An answer for a call never delivered here settles nothing.
            Settle("x", false),
            Expect {
                waiting: 1,
                new: &["x"],
                known: &["b"],
            },
            Settle("b", true),
            Expect {
                waiting: 0,
                new: &["c", "x"],
                known: &["a", "b"],
            },
        ]);
    }

    #[test]
    fn only_the_last_answered_calls_are_remembered() {
        let mut delivered = Delivered::<()>::default();
        for n in 0..=ANSWERED_KEPT {
            delivered.deliver(n.to_string(), ());
            assert!(delivered.settle(&n.to_string()));
        }
        assert!(delivered.is_new("0"), "the oldest is forgotten");
        assert!(!delivered.is_new("1"));
        assert!(!delivered.is_new(&ANSWERED_KEPT.to_string()));
        assert!(delivered.waiting().is_empty());
    }

    #[test]
    fn a_call_answered_twice_is_remembered_once_from_its_last_answer() {
        let mut delivered = Delivered::<()>::default();
        delivered.deliver("again".to_owned(), ());
        assert!(delivered.settle("again"));
        // Handed over again (a claim does not ask whether it was answered) and answered.
        delivered.deliver("again".to_owned(), ());
        assert!(delivered.settle("again"));
        // ANSWERED_KEPT - 1 more keep it: it counts once, from its last answer.
        for n in 1..ANSWERED_KEPT {
            delivered.deliver(n.to_string(), ());
            assert!(delivered.settle(&n.to_string()));
        }
        assert!(!delivered.is_new("again"));
        delivered.deliver("one more".to_owned(), ());
        assert!(delivered.settle("one more"));
        assert!(delivered.is_new("again"), "the oldest is forgotten");
        assert!(!delivered.is_new("1") && !delivered.is_new("one more"));
    }
}
