//! Rate budgets, locks and the sets of live things under a global ceiling, in memory.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;

use super::{MemoryStore, locked};
use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::store::{BudgetStore, RateBudget};

/// Rate budgets that have refilled are forgotten once this many keys are kept.
const RATES_PRUNE_AT: usize = 10_000;

#[async_trait]
impl BudgetStore for MemoryStore {
    async fn lock(&self, key: &str, holder: &str, until: Timestamp) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut locks = locked(&self.locks);
        if locks.len() >= RATES_PRUNE_AT && !locks.contains_key(key) {
            locks.retain(|_, (_, until)| *until > now);
        }
        match locks.get(key) {
            Some((other, until)) if other != holder && *until > now => Ok(false),
            _ => {
                locks.insert(key.to_owned(), (holder.to_owned(), until));
                Ok(true)
            }
        }
    }

    async fn unlock(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let mut locks = locked(&self.locks);
        if locks.get(key).is_some_and(|(other, _)| other == holder) {
            locks.remove(key);
        }
        Ok(())
    }

    async fn take_place(
        &self,
        set: &str,
        member: &str,
        cap: usize,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut places = locked(&self.places);
        let places = places.entry(set.to_owned()).or_default();
        Ok(places.take(member, cap, now, expires_at))
    }

    async fn spend(
        &self,
        key: &str,
        budget: RateBudget,
        now: Timestamp,
    ) -> Result<Option<Duration>, StoreError> {
        let now = now.0.saturating_mul(1000);
        let mut rates = locked(&self.rates);
        if rates.len() >= RATES_PRUNE_AT && !rates.contains_key(key) {
            // A key whose arrival time has passed is as good as a new one.
            rates.retain(|_, tat| *tat > now);
        }
        let tat = rates.get(key).copied().unwrap_or(now);
        match budget.spend(tat, now) {
            Ok(next) => {
                rates.insert(key.to_owned(), next);
                Ok(None)
            }
            Err(wait) => Ok(Some(wait)),
        }
    }
}

/// The members of one set of live things ([`BudgetStore::take_place`]) and when each expires.
#[derive(Debug, Default)]
pub(super) struct Places {
    expiries: HashMap<String, Timestamp>,
    /// The same, in expiry order: what has expired is pruned at the cost of what expired.
    by_expiry: std::collections::BTreeSet<(Timestamp, String)>,
}

impl Places {
    fn take(&mut self, member: &str, cap: usize, now: Timestamp, expires_at: Timestamp) -> bool {
        while let Some((when, gone)) = self.by_expiry.first().cloned()
            && when <= now
        {
            self.by_expiry.pop_first();
            self.expiries.remove(&gone);
        }
        if let Some(kept) = self.expiries.get_mut(member) {
            if expires_at > *kept {
                self.by_expiry.remove(&(*kept, member.to_owned()));
                self.by_expiry.insert((expires_at, member.to_owned()));
                *kept = expires_at;
            }
            return true;
        }
        if self.expiries.len() >= cap {
            return false;
        }
        self.expiries.insert(member.to_owned(), expires_at);
        self.by_expiry.insert((expires_at, member.to_owned()));
        true
    }
}
