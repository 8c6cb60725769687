//! How the Redis store runs a script: a session script's one round trip (`EVALSHA` with the
//! common arguments, the script loaded again when Redis lost it, `WAIT` in the same round trip
//! when `REDIS_WAIT_REPLICAS` asks for it) and what it does with the envelope every session
//! script answers in (the calls it expired, the expiry it slid the session to).

use redis::Script;

use super::records::{self, counted, unreadable};
use super::scripts::{Arguments, Named, SessionScript};
use super::{RedisStore, millis, store_error};
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::store::SessionRecord;

impl RedisStore {
    /// A script on `keys` (the first a session's key base) with the common arguments every
    /// session script reads first: now, the retention of finished calls.
    pub(super) fn invocation<'a>(
        &self,
        script: &'a Script,
        keys: &[String],
    ) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        invocation
            .arg(self.clock.now().0)
            .arg(millis(self.limits.retention));
        invocation
    }

    /// Runs a session script on the session's keys, then `extra`, with `args` after the
    /// common ones. Counts the calls it expired, and files the session in the sessions by
    /// expiry when the script moved its expiry.
    pub(super) async fn run<A: Named, T: redis::FromRedisValue>(
        &self,
        script: &SessionScript<A>,
        code: &SessionCode,
        extra: &[String],
        args: A::With<'_>,
    ) -> Result<T, StoreError> {
        let mut keys = vec![self.base(code)];
        keys.extend_from_slice(extra);
        let mut command = redis::cmd("EVALSHA");
        command
            .arg(script.script.get_hash())
            .arg(keys.len())
            .arg(&keys)
            .arg(self.clock.now().0)
            .arg(millis(self.limits.retention));
        args.push(&mut command);
        let answer = self
            .evaluate(&script.script, &command, script.replicated)
            .await?;
        let (expired, slid_to, answer) = counted(answer)?;
        self.metrics.calls_expired(expired);
        if let Some(slid_to) = slid_to {
            self.index_session(code, slid_to).await?;
        }
        T::from_redis_value(answer).map_err(unreadable)
    }

    /// Runs a script's `EVALSHA` `command`, loading the script first when Redis does not have
    /// it (a Redis restarted, or a replica promoted, since this replica loaded it). When
    /// `replicated` and `REDIS_WAIT_REPLICAS` is set, `WAIT` goes in the same round trip, and
    /// a write the replicas did not confirm in time is an error (retryable: the write stays,
    /// and the idempotent scripts find it when called again).
    pub(super) async fn evaluate(
        &self,
        script: &Script,
        command: &redis::Cmd,
        replicated: bool,
    ) -> Result<redis::Value, StoreError> {
        let wait = self.wait.filter(|_| replicated);
        let mut connection = match wait {
            Some(_) => self.link.waiting(),
            None => self.connection(),
        };
        let mut loaded = false;
        loop {
            let answered = match wait {
                None => command.query_async(&mut connection).await,
                Some(wait) => {
                    let replicated: redis::RedisResult<(redis::Value, u32)> = redis::pipe()
                        .add_command(command.clone())
                        .cmd("WAIT")
                        .arg(wait.replicas)
                        .arg(wait.timeout_ms)
                        .query_async(&mut connection)
                        .await;
                    match replicated {
                        Ok((_, confirmed)) if confirmed < wait.replicas => {
                            return Err(StoreError(format!(
                                "Redis confirmed the write on {confirmed} of {} replicas within {} ms (REDIS_WAIT_REPLICAS, REDIS_WAIT_MS)",
                                wait.replicas, wait.timeout_ms
                            )));
                        }
                        replicated => replicated.map(|(answer, _)| answer),
                    }
                }
            };
            match answered {
                Err(error)
                    if !loaded
                        && error.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    let _: String = script
                        .prepare_invoke()
                        .load_async(&mut connection)
                        .await
                        .map_err(store_error)?;
                    loaded = true;
                }
                answered => return answered.map_err(store_error),
            }
        }
    }

    /// Files the session in the sessions by expiry (what the metrics count).
    pub(super) async fn index_session(
        &self,
        code: &SessionCode,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("ZADD")
            .arg(self.key("sessions"))
            .arg(expires_at)
            .arg(code.as_str())
            .query_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// A session script's answer that is a session (or false).
    pub(super) async fn session_of<A: Named>(
        &self,
        script: &SessionScript<A>,
        code: &SessionCode,
        args: A::With<'_>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let values: Option<Vec<String>> = self.run(script, code, &[], args).await?;
        values.map(|values| records::session(&values)).transpose()
    }
}
