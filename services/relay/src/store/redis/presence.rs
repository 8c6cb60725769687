//! Tabs and replicas alive: the upkeep's refresh of the sessions a replica serves, and each
//! replica's presence in `replicas` (a pushing tab counts as connected while its
//! connection's replica does).

use super::records::{counted, unexpected, unreadable};
use super::{RedisStore, store_error};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::store::TabState;

/// Sessions one refresh script covers at most (on a Cluster: one, so that each script stays
/// in its session's slot), so that none holds Redis for long.
const REFRESH_BATCH: usize = 256;

impl RedisStore {
    /// [`SessionStore::refresh`]: the tabs' sessions, in pipelined scripts of up to
    /// [`REFRESH_BATCH`] sessions.
    pub(super) async fn refresh_tabs(
        &self,
        tabs: &[(SessionCode, String)],
        until: Option<Timestamp>,
    ) -> Result<Vec<TabState>, StoreError> {
        let batch = if self.cluster { 1 } else { REFRESH_BATCH };
        let until = until.map_or_else(String::new, |until| until.0.to_string());
        let mut states = Vec::with_capacity(tabs.len());
        let mut slid = Vec::new();
        // One pipeline of scripts, each over a batch of sessions: one round trip for them all.
        for chunk in tabs.chunks(batch * 16) {
            let mut pipe = redis::pipe();
            for sessions in chunk.chunks(batch) {
                let keys: Vec<String> = sessions.iter().map(|(code, _)| self.base(code)).collect();
                let mut invocation = self.invocation(&self.scripts.refresh, &keys);
                invocation.arg(&until);
                for (_, connection) in sessions {
                    invocation.arg(connection);
                }
                pipe.invoke_script(&invocation);
            }
            let answers: Vec<redis::Value> = pipe
                .query_async(&mut self.connection())
                .await
                .map_err(store_error)?;
            for (sessions, answer) in chunk.chunks(batch).zip(answers) {
                let (expired, _, answer) = counted(answer)?;
                self.metrics.calls_expired(expired);
                let found: Vec<(String, u64, i64, u8)> =
                    redis::from_redis_value(answer).map_err(unreadable)?;
                for ((code, _), (state, pending, expires_at, moved)) in sessions.iter().zip(found) {
                    states.push(match state.as_str() {
                        "ok" => {
                            if moved == 1 {
                                slid.push((code.clone(), expires_at));
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
