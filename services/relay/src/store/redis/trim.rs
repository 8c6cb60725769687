//! The answer budget across sessions (`RESPONSE_BUDGET_MB`), kept off the calls' path.
//!
//! Each session's answers are counted in its own hash and capped at its share on the way in
//! (the finish script). The total is kept by each replica apart: every [`TRIM_INTERVAL`] it
//! reads what the sessions whose answers went through it keep (one pipeline), files its sum
//! under its own field of `answer-bytes` (with an expiry, so a replica that died stops
//! counting), and, when the fields together pass the budget, evicts its share of the excess
//! from its sessions, their oldest answers first across them (as the memory store evicts
//! them). A session answered through two
//! replicas within the retention is counted by both: the budget errs on the side of evicting.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::scripts::Evict;
use super::{RedisStore, millis, store_error};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;

/// How often each replica trims.
const TRIM_INTERVAL: Duration = Duration::from_secs(5);
/// The most evict scripts one round runs (the next round goes on).
const EVICT_RUNS: usize = 1000;
/// How long a replica's count stands without being renewed.
const COUNT_LIFETIME: Duration = Duration::from_secs(30);

/// The sessions whose answers went through this replica, and when their last one did.
#[derive(Default)]
pub(super) struct Answered(HashMap<SessionCode, Timestamp>);

impl RedisStore {
    /// Notes that an answer of the session went through this replica.
    pub(super) fn answered(&self, code: &SessionCode) {
        let now = self.clock.now();
        let mut answered = self
            .answered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        answered.0.insert(code.clone(), now);
    }

    /// One round of the trim; returns what every replica's sessions keep after it.
    pub(super) async fn trim(&self) -> Result<usize, StoreError> {
        let replica = self.replica.as_str();
        let now = self.clock.now();
        let codes: Vec<SessionCode> = {
            let mut answered = self
                .answered
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            answered
                .0
                .retain(|_, at| now.since(*at) <= self.limits.retention);
            answered.0.keys().cloned().collect()
        };
        let mut pipe = redis::pipe();
        for code in &codes {
            pipe.cmd("HMGET")
                .arg(format!("{}s", self.base(code)))
                .arg("answer_bytes")
                .arg("oldest_at");
        }
        let kept: Vec<(Option<String>, Option<String>)> = if codes.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(&mut self.connection())
                .await
                .map_err(store_error)?
        };
        // Fields a session has not written yet, or empty (no finished call), count as none.
        let kept: Vec<(Option<u64>, Option<i64>)> = kept
            .into_iter()
            .map(|(bytes, oldest)| {
                (
                    bytes.and_then(|bytes| bytes.parse().ok()),
                    oldest.and_then(|oldest| oldest.parse().ok()),
                )
            })
            .collect();
        let mine: u64 = kept.iter().filter_map(|(bytes, _)| *bytes).sum();
        let expires = now.plus(COUNT_LIFETIME).0;
        let key = self.key("answer-bytes");
        let (counts,): (Vec<String>,) = redis::pipe()
            .cmd("HSET")
            .arg(&key)
            .arg(replica)
            .arg(format!("{mine}:{expires}"))
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(millis(COUNT_LIFETIME))
            .ignore()
            .cmd("HVALS")
            .arg(&key)
            .query_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        let total = total(&counts, now.0) as u64;
        let budget = self.limits.answer_budget as u64;
        if total <= budget || mine == 0 {
            return Ok(total as usize);
        }
        // This replica's share of the excess: its sessions' answers, oldest first across them.
        let excess = (total - budget).saturating_mul(mine).div_ceil(total);
        let mut sessions: Vec<(&SessionCode, u64, i64)> = codes
            .iter()
            .zip(&kept)
            .filter_map(|(code, (bytes, oldest))| Some((code, (*bytes)?, oldest.unwrap_or(0))))
            .collect();
        let evicted = self.evict_oldest(&mut sessions, excess).await?;
        let left = mine.saturating_sub(evicted);
        let () = redis::cmd("HSET")
            .arg(&key)
            .arg(replica)
            .arg(format!("{left}:{expires}"))
            .query_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok((total - mine + left) as usize)
    }

    /// Evicts `excess` bytes of the answers of `sessions` (each with what it keeps and when
    /// its oldest call finished), the oldest first across them, as the memory store does: each
    /// run of the evict script takes one session's answers up to the next session's oldest,
    /// at most [`EVICT_RUNS`] runs a round. Records go only when no answer is left (the oldest
    /// sessions' first). Returns what was freed.
    async fn evict_oldest(
        &self,
        sessions: &mut [(&SessionCode, u64, i64)],
        excess: u64,
    ) -> Result<u64, StoreError> {
        let mut freed = 0;
        // By when each session's oldest kept answer finished (at first, its oldest call: no
        // later than that answer, so a session comes up early at worst and then says when).
        let mut oldest: BinaryHeap<Reverse<(i64, usize)>> = sessions
            .iter()
            .enumerate()
            .filter(|(_, (_, bytes, _))| *bytes > 0)
            .map(|(at, (_, _, oldest))| Reverse((*oldest, at)))
            .collect();
        let mut runs = 0;
        while freed < excess && runs < EVICT_RUNS {
            let Some(Reverse((_, at))) = oldest.pop() else {
                break;
            };
            let before = oldest.peek().map_or(i64::MAX, |Reverse((next, _))| *next);
            let (code, bytes, _) = &mut sessions[at];
            let (kept, next) = self
                .evict(code, bytes.saturating_sub(excess - freed), Some(before))
                .await?;
            freed += bytes.saturating_sub(kept);
            *bytes = kept;
            if let Some(next) = next {
                oldest.push(Reverse((next, at)));
            }
            runs += 1;
        }
        // Every answer is gone and that was not enough: the oldest sessions' records go.
        if oldest.is_empty() && freed < excess {
            sessions.sort_by_key(|(_, _, oldest)| *oldest);
            for (code, bytes, _) in sessions.iter_mut() {
                if freed >= excess {
                    break;
                }
                let (kept, _) = self
                    .evict(code, bytes.saturating_sub(excess - freed), None)
                    .await?;
                freed += bytes.saturating_sub(kept);
                *bytes = kept;
            }
        }
        Ok(freed)
    }

    /// Runs the evict script on a session: what it keeps after, and when its oldest answer
    /// still kept finished.
    async fn evict(
        &self,
        code: &SessionCode,
        keep: u64,
        before: Option<i64>,
    ) -> Result<(u64, Option<i64>), StoreError> {
        self.run(
            &self.scripts.evict,
            code,
            &[],
            Evict {
                keep_bytes: &keep.to_string(),
                before: &before.map_or_else(String::new, |before| before.to_string()),
            },
        )
        .await
    }
}

/// What every replica's sessions keep together, from the `answer-bytes` fields
/// (`<bytes>:<valid until>`), leaving out counts not renewed in time.
pub(super) fn total(counts: &[String], now: i64) -> usize {
    counts
        .iter()
        .filter_map(|count| {
            let (bytes, until) = count.split_once(':')?;
            (until.parse::<i64>().ok()? > now).then(|| bytes.parse::<usize>().ok())?
        })
        .sum()
}

/// Runs the trim every [`TRIM_INTERVAL`] while the store lives.
pub(super) fn start(store: &Arc<RedisStore>) {
    let store: Weak<RedisStore> = Arc::downgrade(store);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(TRIM_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(store) = store.upgrade() else { return };
            if let Err(error) = store.trim().await {
                tracing::warn!(%error, "could not keep the answers within their budget");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_leaves_out_counts_not_renewed() {
        let counts = [
            "100:2000".to_owned(),
            "50:999".to_owned(),
            "7:1001".to_owned(),
        ];
        assert_eq!(total(&counts, 1000), 107);
        assert_eq!(total(&["junk".to_owned()], 0), 0);
    }
}
