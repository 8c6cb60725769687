//! Tabs and replicas alive: the upkeep's refresh of the sessions a replica serves, and each
//! replica's presence in `replicas` (a pushing tab counts as connected while its
//! connection's replica does).

use super::records::{counted, missing, unexpected, unreadable};
use super::{RedisStore, store_error};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::store::TabState;

/// Sessions one refresh script covers at most, so that none holds Redis for long.
const REFRESH_BATCH: usize = 256;
/// Refresh scripts sent in one pipeline.
const SCRIPTS_PER_PIPELINE: usize = 16;

/// The Cluster slot of a session's keys: CRC16 (XMODEM) of its hash tag, the code.
fn slot(code: &SessionCode) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(code.as_str().as_bytes()) % 16384
}

/// Splits sessions into the refresh scripts' batches (indexes into `slots`): at most
/// [`REFRESH_BATCH`] each and, when `by_slot` (a Cluster), each of one slot's sessions only.
fn batches(slots: &[u16], by_slot: bool) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..slots.len()).collect();
    if by_slot {
        order.sort_by_key(|&at| slots[at]);
    }
    let mut batches: Vec<Vec<usize>> = Vec::new();
    for at in order {
        match batches.last_mut() {
            Some(batch)
                if batch.len() < REFRESH_BATCH && (!by_slot || slots[batch[0]] == slots[at]) =>
            {
                batch.push(at);
            }
            _ => batches.push(vec![at]),
        }
    }
    batches
}

impl RedisStore {
    /// [`SessionStore::refresh`]: the tabs' sessions, in pipelined scripts of up to
    /// [`REFRESH_BATCH`] sessions (on a Cluster, each script over one slot's sessions).
    pub(super) async fn refresh_tabs(
        &self,
        tabs: &[(SessionCode, String)],
        until: Option<Timestamp>,
    ) -> Result<Vec<TabState>, StoreError> {
        let until = until.map_or_else(String::new, |until| until.0.to_string());
        let slots: Vec<u16> = tabs.iter().map(|(code, _)| slot(code)).collect();
        let mut states: Vec<Option<TabState>> = vec![None; tabs.len()];
        let mut slid = Vec::new();
        // Pipelines of scripts, each over a batch of sessions: one round trip for many.
        for pipeline in batches(&slots, self.cluster).chunks(SCRIPTS_PER_PIPELINE) {
            let mut pipe = redis::pipe();
            for batch in pipeline {
                let keys: Vec<String> = batch.iter().map(|&at| self.base(&tabs[at].0)).collect();
                let mut invocation = self.invocation(&self.scripts.refresh, &keys);
                invocation.arg(&until);
                for &at in batch {
                    invocation.arg(&tabs[at].1);
                }
                pipe.invoke_script(&invocation);
            }
            let answers: Vec<redis::Value> = pipe
                .query_async(&mut self.connection())
                .await
                .map_err(store_error)?;
            for (batch, answer) in pipeline.iter().zip(answers) {
                let (expired, _, answer) = counted(answer)?;
                self.metrics.calls_expired(expired);
                let found: Vec<(String, u64, i64, u8)> =
                    redis::from_redis_value(answer).map_err(unreadable)?;
                for (&at, (state, pending, expires_at, moved)) in batch.iter().zip(found) {
                    states[at] = Some(match state.as_str() {
                        "ok" => {
                            if moved == 1 {
                                slid.push((tabs[at].0.clone(), expires_at));
                            }
                            TabState::Serving {
                                pending,
                                expires_at: Timestamp(expires_at),
                            }
                        }
                        "replaced" => TabState::Replaced,
                        "gone" => TabState::Gone,
                        other => return Err(unexpected(other)),
                    });
                }
            }
        }
        let states = states
            .into_iter()
            .collect::<Option<Vec<TabState>>>()
            .ok_or_else(|| missing("session's state"))?;
        if !slid.is_empty() {
            let mut pipe = redis::pipe();
            for (code, expires_at) in &slid {
                pipe.cmd("ZADD")
                    .arg(self.key("sessions"))
                    .arg("GT")
                    .arg(expires_at)
                    .arg(code.as_str())
                    .ignore();
            }
            let () = pipe
                .query_async(&mut self.connection())
                .await
                .map_err(store_error)?;
        }
        Ok(states)
    }

    /// [`SessionStore::keep_replica`].
    pub(super) async fn keep_replica_alive(
        &self,
        replica: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<(String, Timestamp)>, StoreError> {
        let replicas = self.key("replicas");
        let (live,): (Vec<(String, i64)>,) = redis::pipe()
            .cmd("ZADD")
            .arg(&replicas)
            .arg("GT")
            .arg(until.0)
            .arg(replica)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&replicas)
            .arg("-inf")
            .arg(now.0)
            .ignore()
            .add_command(self.live_replicas_command(now))
            .query_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(alive(live))
    }

    /// [`SessionStore::live_replicas`].
    pub(super) async fn replicas_alive(
        &self,
        now: Timestamp,
    ) -> Result<Vec<(String, Timestamp)>, StoreError> {
        let live: Vec<(String, i64)> = self
            .live_replicas_command(now)
            .query_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(alive(live))
    }

    /// The replicas alive after `now`, with when each stops counting as alive.
    fn live_replicas_command(&self, now: Timestamp) -> redis::Cmd {
        let mut command = redis::cmd("ZRANGE");
        command
            .arg(self.key("replicas"))
            .arg(format!("({}", now.0))
            .arg("+inf")
            .arg("BYSCORE")
            .arg("WITHSCORES");
        command
    }
}

/// Replicas with when each stops counting as alive.
fn alive(replicas: Vec<(String, i64)>) -> Vec<(String, Timestamp)> {
    replicas
        .into_iter()
        .map(|(replica, until)| (replica, Timestamp(until)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's own example: the slot of `123456789` (CRC16 0x31C3).
    #[test]
    fn a_code_s_slot_is_redis_cluster_s() {
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31C3
        );
        let code = SessionCode::parse("ABCD-EFGH").unwrap();
        assert_eq!(
            slot(&code),
            crc16::State::<crc16::XMODEM>::calculate(b"ABCDEFGH") % 16384
        );
    }

    #[test]
    fn on_a_cluster_each_batch_is_one_slot_s_sessions_and_never_over_the_bound() {
        let slots: Vec<u16> = (0..600).map(|at| [7, 3, 7, 9][at % 4]).collect();
        let on_cluster = batches(&slots, true);
        for batch in &on_cluster {
            assert!(batch.len() <= REFRESH_BATCH);
            assert!(batch.iter().all(|&at| slots[at] == slots[batch[0]]));
        }
        // 150 of slot 3, 300 of slot 7 (two batches), 150 of slot 9.
        assert_eq!(on_cluster.len(), 4);
        let mut all: Vec<usize> = on_cluster.concat();
        all.sort_unstable();
        assert_eq!(all, (0..600).collect::<Vec<_>>());
        // Elsewhere, in order, full batches.
        let plain = batches(&slots, false);
        assert_eq!(
            plain.iter().map(Vec::len).collect::<Vec<_>>(),
            [256, 256, 88]
        );
        assert_eq!(plain.concat(), (0..600).collect::<Vec<_>>());
    }
}
