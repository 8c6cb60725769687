//! The Redis [`Store`]: state shared by every relay replica (`REDIS_URL`).
//!
//! # Layout
//! Every key starts with a configurable prefix. A session's keys carry its code as a hash tag,
//! `<prefix>{<CODE>}:…`, so a Redis Cluster keeps a session in one slot: `s` (hash: the
//! session, its counters, its provider, its queue, and each of its calls (`records.rs`) in a field
//! `r:<id>`), `f` (list: its finished calls), and the channel `ev` (its events);
//! `lua/library.lua` has the details. Every script touches the keys
//! of one session only: each carries a `#!lua` line, so a Cluster node refuses a script that
//! strays into another slot. Outside sessions, each written apart from the scripts and never
//! on a call's path: `h:<handle>` (connector handle → code), `sessions` (sorted set: sessions
//! by expiry, for the metrics; moved when a session's expiry moves, about once per tenth of its
//! time to live), `m:{<hash>}` (a manifest's JSON by its SHA-256, shared by every session that
//! registered it), `answer-bytes` (hash: what each replica's sessions keep of answers),
//! `{tickets}:…` (claim checks), `{mcp}:…` (MCP client sessions), `rate:…` and `lock:…`, and
//! `replicas` (sorted set: the relay replicas by when they stop counting as alive; a pushing
//! tab counts as connected while its connection's replica does).
//!
//! # A call's path
//! Two round trips: the enqueue script (rate budget, manifest revision, idempotency, pending
//! limit, and the call handed to the session's tab connection, announced whole so the tab's
//! replica forwards it without a claim) and the finish script (the answer, announced whole to
//! the waiting caller's replica). Each script reads its session and its call with one `HMGET`
//! and writes them with one `HSET`: about ten commands a call, scripts' own included.
//! Housekeeping is off the path: finished calls past the retention time go in batches when
//! their session is next looked at, a call past its deadline is expired by whoever looks at it, the
//! session's expiry moves at most once per tenth of its time to live, and the answer budget
//! across sessions is kept by each replica's trim ([`trim`]).
//!
//! # Time
//! Each replica passes its own clock's `now` into every script (clocks agree to milliseconds
//! with NTP, and a skew only moves an expiry by as much); Redis' TTLs follow the same
//! timestamps (`PEXPIREAT`).
//!
//! # Events
//! Scripts `PUBLISH` a session's changes on its channel; each replica holds one pub/sub
//! connection ([`hub::EventHub`]). After that connection is lost, every reader hears
//! [`SessionEvent::Missed`] and looks again; the relay's upkeep of the tabs it serves
//! ([`Store::refresh`]) catches anything else, at the latest when it next slides the session.

mod hub;
mod keyed;
mod link;
mod presence;
mod records;
mod route;
mod scripts;
mod trim;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use redis::{AsyncCommands, Script};
use toolrelay::wire::{RequestStatus, ToolResponse};

use self::hub::EventHub;
pub use self::link::install_tls_provider;
use self::link::{Connection, Link};
use self::records::{call_in, counted, is_slow, missing, outcome, unexpected, unreadable};
use self::route::Router;
use self::scripts::{
    Arguments, ChangeApprovals, ClaimCalls, ClearProvider, Enqueue, Finish, FlatEnqueue, Insert,
    LeaseBuiltin, Named, NoArguments, Request, Scripts, SessionScript, SetManifest, SetProvider,
    SetToken, Touch,
};
use super::memory::StoreLimits;
use super::{
    Answerer, ApprovalChange, ApprovalCheck, ApprovalState, Claim, EnqueueChecks, Enqueued,
    EventStream, Finished, Inserted, NewRequest, ProviderInfo, Reachable, Release, RequestRecord,
    RoutedAnswer, SessionEvent, SessionRecord, SessionStore, StoreUsage, TabState, rules,
};
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::config::{RedisSettings, Topology, WaitReplicas};
use crate::error::StoreError;
use crate::metrics::{Metrics, Route};

/// How long a command may take before the store counts as unreachable.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the event connection is pinged, to notice a Redis that went away silently.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Sessions, calls and claim checks in Redis, shared by every replica.
pub struct RedisStore {
    link: Arc<Link>,
    prefix: String,
    clock: Clock,
    limits: StoreLimits,
    events: Arc<EventHub>,
    scripts: Scripts,
    /// Where the calls its scripts expire, and the sessions found expired, are counted.
    metrics: Metrics,
    /// Whether Redis runs as a Cluster node: then each refresh script covers one session.
    cluster: bool,
    /// Replicas the enqueue and finish scripts' writes must reach (`WAIT`), when set.
    wait: Option<WaitReplicas>,
    /// The sessions whose answers went through this replica, for the budget's trim.
    answered: Mutex<trim::Answered>,
    /// This replica's name in the answer budget's counts.
    replica: String,
    /// Where calls are routed to their tab's replica (`REPLICA_URL`), when they are.
    router: Option<Arc<Router>>,
}

impl RedisStore {
    /// A store on the Redis `settings` name, counting the sessions and calls it expires into
    /// `metrics`. Waits (retrying, and saying so in the log) until Redis answers, so a
    /// replica started before its Redis comes up rather than crash-looping; a refused
    /// password, a missing permission or an untrusted certificate is an error at once.
    pub async fn connect(
        settings: &RedisSettings,
        clock: Clock,
        limits: StoreLimits,
        metrics: Metrics,
    ) -> Result<Arc<Self>, StoreError> {
        let link = Link::connect(settings, metrics.clone()).await?;
        // On a Cluster, events go by sharded pub/sub: a message reaches only the shard that
        // holds its session (plain `PUBLISH` is copied to every node).
        let sharded = matches!(settings.topology, Topology::Cluster(_));
        let scripts = Scripts::new(sharded);
        let mut connection = link.commands();
        let refused = |error: redis::RedisError| match error.kind() {
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => StoreError(format!(
                "the Redis user may not do what toolrelay needs ({error}): grant it the README's ACL line (`{}`)",
                link::acl_line(settings)
            )),
            _ => store_error(error),
        };
        // Loaded up front, so the first calls after a start do not each meet NOSCRIPT.
        for script in scripts.all() {
            let loaded: Result<String, _> =
                script.prepare_invoke().load_async(&mut connection).await;
            loaded.map_err(refused)?;
        }
        // The events' channels are allowed too (a user without them would hear nothing).
        let _: i64 = redis::cmd(if sharded { "SPUBLISH" } else { "PUBLISH" })
            .arg(format!("{}probe", settings.prefix))
            .arg("")
            .query_async(&mut connection)
            .await
            .map_err(refused)?;
        // A Cluster node refuses scripts that stray out of a slot. `INFO` may be denied to a
        // least-privilege user: then only a Cluster named as one counts as one.
        let cluster = sharded || {
            let info: Option<String> = redis::cmd("INFO")
                .arg("cluster")
                .query_async(&mut connection)
                .await
                .ok();
            info.is_some_and(|info| info.contains("cluster_enabled:1"))
        };
        let events = EventHub::start(link.clone());
        let router = match &settings.routing {
            Some(routing) => Some(
                Router::new(routing, sharded, clock.clone(), metrics.clone())
                    .map_err(StoreError)?,
            ),
            None => None,
        };
        let store = Arc::new(Self {
            link,
            prefix: settings.prefix.clone(),
            clock,
            limits,
            events,
            scripts,
            metrics,
            cluster,
            wait: settings.wait,
            answered: Mutex::new(trim::Answered::default()),
            replica: crate::code::random_id(),
            router,
        });
        trim::start(&store);
        Ok(store)
    }

    fn base(&self, code: &SessionCode) -> String {
        format!("{}{{{}}}:", self.prefix, code.as_str())
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn rate_key(&self, key: &str) -> String {
        format!("{}rate:{key}", self.prefix)
    }

    /// An MCP client session script with its common keys and arguments (`lua/mcp.lua`).
    fn mcp_script<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        let prefix = format!("{}{{mcp}}:", self.prefix);
        let mut invocation = script.key(format!("{prefix}live"));
        invocation.arg(prefix).arg(self.clock.now().0);
        invocation
    }

    fn connection(&self) -> Connection {
        self.link.commands()
    }

    /// A script on `keys` (the first a session's key base) with the common arguments every
    /// session script reads first: now, the retention of finished calls.
    fn invocation<'a>(&self, script: &'a Script, keys: &[String]) -> redis::ScriptInvocation<'a> {
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
    /// Hands a call the queueing script routed (`routed`: 'local', or the URL of the replica
    /// holding the session's tab; '' when it announced it) to its tab.
    fn hand_routed(&self, code: &SessionCode, record: &RequestRecord, routed: &str) {
        let Some(router) = self.router.as_ref().filter(|_| !routed.is_empty()) else {
            return;
        };
        let base = self.base(code);
        if routed == "local" {
            router.hold_until(format!("{base}{}", record.id), record.deadline);
            router.counted(Route::Local);
            self.handed_here(&base, record.clone());
        } else {
            router.forward(
                self.events.clone(),
                self.link.clone(),
                base,
                code.as_str().to_owned(),
                routed.to_owned(),
                record.clone(),
            );
        }
    }

    /// Tells this replica's listeners of the session with key base `base` that `record` was
    /// handed to its tab (what its announcement on Redis would): a routed call is not announced.
    fn handed_here(&self, base: &str, record: RequestRecord) {
        self.events.announce(
            &format!("{base}ev"),
            SessionEvent::CallHanded(Box::new(record)),
        );
    }

    /// Tells this replica's listeners of the session that `record` finished (what its
    /// announcement on Redis would): a routed call's answer is not announced.
    fn told_here(&self, code: &SessionCode, record: &RequestRecord) {
        self.events.announce(
            &format!("{}ev", self.base(code)),
            SessionEvent::ResponseReady {
                id: record.id.clone(),
                record: Some(Box::new(record.clone())),
            },
        );
    }

    async fn run<A: Named, T: redis::FromRedisValue>(
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
    async fn evaluate(
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
    async fn index_session(&self, code: &SessionCode, expires_at: i64) -> Result<(), StoreError> {
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
    async fn session_of<A: Named>(
        &self,
        script: &SessionScript<A>,
        code: &SessionCode,
        args: A::With<'_>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let values: Option<Vec<String>> = self.run(script, code, &[], args).await?;
        values.map(|values| records::session(&values)).transpose()
    }
}

fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "Redis did not answer in time",
    ))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn store_error(error: redis::RedisError) -> StoreError {
    // At `maxmemory` with `noeviction`, Redis refuses writes (scripts included) with `OOM`.
    if error.code() == Some("OOM") {
        return StoreError::Full(format!("Redis: {error}"));
    }
    StoreError(format!("Redis: {error}"))
}

#[async_trait]
impl Reachable for RedisStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.connection().ping().await.map_err(store_error)?;
        // Without the event connection no tab hears of a call but by the sweep.
        if !self.events.alive().await {
            return Err(StoreError("the Redis event connection is down".into()));
        }
        Ok(())
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn insert_session_within(
        &self,
        session: SessionRecord,
        max_live: usize,
    ) -> Result<Inserted, StoreError> {
        // The place among the live sessions first (the set the metrics count, one key): the
        // session's own keys are in its slot, so the two cannot share a script on a Cluster.
        // A place whose session then finds its code taken is the live session's own.
        if max_live < usize::MAX {
            let (code, now) = (session.code.as_str(), self.clock.now());
            let sessions = self.key("sessions");
            // Not pruned here: the usage read prunes it, counting each expiry once.
            let prune = false;
            if !self
                .place(sessions, code, max_live, now, session.expires_at, prune)
                .await?
            {
                return Ok(Inserted::Full);
            }
        }
        let inserted: i64 = self
            .run(
                &self.scripts.insert,
                &session.code,
                &[],
                Insert {
                    code: session.code.as_str(),
                    token_hash: &session.token_hash,
                    created_at: &session.created_at.0.to_string(),
                    expires_at: &session.expires_at.0.to_string(),
                    max_expires_at: &session.max_expires_at.0.to_string(),
                    mcp_handle: &session.mcp_handle,
                },
            )
            .await?;
        if inserted != 1 {
            return Ok(Inserted::Taken);
        }
        let () = redis::pipe()
            .cmd("SET")
            .arg(self.key(&format!("h:{}", session.mcp_handle)))
            .arg(session.code.as_str())
            .arg("PXAT")
            .arg(session.max_expires_at.0)
            .ignore()
            .cmd("ZADD")
            .arg(self.key("sessions"))
            .arg(session.expires_at.0)
            .arg(session.code.as_str())
            .ignore()
            .query_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(Inserted::Inserted)
    }

    async fn session(&self, code: &SessionCode) -> Result<Option<SessionRecord>, StoreError> {
        self.session_of(&self.scripts.session, code, NoArguments)
            .await
    }

    async fn session_by_handle(&self, handle: &str) -> Result<Option<SessionCode>, StoreError> {
        let code: Option<String> = self
            .connection()
            .get(self.key(&format!("h:{handle}")))
            .await
            .map_err(store_error)?;
        let Some(code) = code.and_then(|code| SessionCode::parse(&code).ok()) else {
            return Ok(None);
        };
        let owns = self
            .session(&code)
            .await?
            .is_some_and(|session| session.mcp_handle == handle);
        Ok(owns.then_some(code))
    }

    async fn touch_session(
        &self,
        code: &SessionCode,
        _now: Timestamp, // the scripts take `now` from the clock, as every script does
        until: Timestamp,
        seen: Option<&str>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let until = until.0.to_string();
        self.session_of(
            &self.scripts.touch,
            code,
            Touch {
                until_ms: &until,
                seen: seen.unwrap_or_default(),
            },
        )
        .await
    }

    async fn refresh(
        &self,
        tabs: &[(SessionCode, String)],
        _now: Timestamp,
        until: Option<Timestamp>,
    ) -> Result<Vec<TabState>, StoreError> {
        self.refresh_tabs(tabs, until).await
    }

    async fn keep_replica(
        &self,
        replica: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<(String, Timestamp)>, StoreError> {
        self.keep_replica_alive(replica, now, until).await
    }

    async fn live_replicas(&self, now: Timestamp) -> Result<Vec<(String, Timestamp)>, StoreError> {
        self.replicas_alive(now).await
    }

    async fn delete_session(&self, code: &SessionCode) -> Result<bool, StoreError> {
        let deleted: i64 = self
            .run(&self.scripts.delete, code, &[], NoArguments)
            .await?;
        let _: i64 = self
            .connection()
            .zrem(self.key("sessions"), code.as_str())
            .await
            .map_err(store_error)?;
        Ok(deleted == 1)
    }

    async fn set_provider(
        &self,
        code: &SessionCode,
        provider: ProviderInfo,
    ) -> Result<Option<SessionRecord>, StoreError> {
        self.session_of(
            &self.scripts.set_provider,
            code,
            SetProvider {
                connection: &provider.connection_id,
                transport: provider.transport.as_str(),
                connected_at: &provider.connected_at.0.to_string(),
                last_seen: &provider.last_seen.0.to_string(),
                replica: self.router.as_ref().map_or("", |router| router.me.as_str()),
            },
        )
        .await
    }

    async fn clear_provider(
        &self,
        code: &SessionCode,
        connection_id: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .run(
                &self.scripts.clear_provider,
                code,
                &[],
                ClearProvider {
                    connection: connection_id,
                },
            )
            .await?;
        Ok(())
    }

    async fn set_token(&self, code: &SessionCode, token_hash: &str) -> Result<bool, StoreError> {
        let set: i64 = self
            .run(&self.scripts.set_token, code, &[], SetToken { token_hash })
            .await?;
        Ok(set == 1)
    }

    async fn set_manifest(
        &self,
        code: &SessionCode,
        json: String,
    ) -> Result<Option<u64>, StoreError> {
        let Some(session) = self.session(code).await? else {
            return Ok(None);
        };
        let hash = manifest_hash(&json);
        let _: i64 = self
            .scripts
            .store_manifest
            .key(self.key(&format!("m:{{{hash}}}")))
            .arg(json)
            .arg(session.max_expires_at.0)
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        self.run(
            &self.scripts.set_manifest,
            code,
            &[],
            SetManifest { manifest: &hash },
        )
        .await
    }

    async fn manifest(
        &self,
        code: &SessionCode,
    ) -> Result<Option<(u64, Option<String>)>, StoreError> {
        let found: Option<(u64, String)> = self
            .run(&self.scripts.manifest, code, &[], NoArguments)
            .await?;
        let Some((revision, hash)) = found else {
            return Ok(None);
        };
        if hash.is_empty() {
            return Ok(Some((revision, None)));
        }
        let json: Option<String> = self
            .connection()
            .get(self.key(&format!("m:{{{hash}}}")))
            .await
            .map_err(store_error)?;
        match json {
            Some(json) => Ok(Some((revision, Some(json)))),
            None => Err(StoreError(format!(
                "the session's manifest (revision {revision}) is missing from Redis; register the tools again"
            ))),
        }
    }

    async fn enqueue_checked(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        max_pending: usize,
        until: Timestamp,
        checks: EnqueueChecks,
    ) -> Result<(Enqueued, Option<SessionRecord>), StoreError> {
        let (rate_key, interval, tolerance) = match &checks.charge {
            Some(charge) => (
                vec![self.rate_key(&charge.key)],
                charge.budget.interval_micros().to_string(),
                charge.budget.tolerance_micros().to_string(),
            ),
            None => (Vec::new(), String::new(), String::new()),
        };
        let revision = checks
            .manifest_revision
            .map_or_else(String::new, |revision| revision.to_string());
        let (approval_mode, approver) = match &checks.approval {
            ApprovalCheck::Exempt => ("", ""),
            ApprovalCheck::Ask(caller) => ("ask", caller.as_str()),
            ApprovalCheck::Handle(caller) => ("handle", caller.as_str()),
        };
        let max_pending = max_pending.to_string();
        let until_ms = until.0.to_string();
        // The common path first, flat; anything else the library's script decides.
        let queued = RequestRecord::queued(request.clone(), 0);
        let [state, rest] = records::pieces(&queued);
        let (me, avoid) = match &self.router {
            Some(router) if checks.route => (router.me.as_str(), router.avoided()),
            _ => ("", String::new()),
        };
        let flat: redis::Value = self
            .run(
                &self.scripts.flat_enqueue,
                code,
                &rate_key,
                FlatEnqueue {
                    id: &request.id,
                    state: &state,
                    rest: &rest,
                    builtin: if request.builtin { "1" } else { "0" },
                    lease: &records::handed_lease(&queued),
                    max_pending: &max_pending,
                    until_ms: &until_ms,
                    revision: &revision,
                    rate_interval: &interval,
                    rate_tolerance: &tolerance,
                    approval: approval_mode,
                    approver,
                    me,
                    avoid: &avoid,
                    route: if me.is_empty() { "" } else { "1" },
                },
            )
            .await?;
        if let Some(queued) = records::flat_queued(&queued, code, &flat)? {
            let (record, session, routed) = queued;
            self.hand_routed(code, &record, &routed);
            return Ok((Enqueued::Queued(record), Some(session)));
        }
        let answer = if is_slow(&flat) {
            let packed = records::stored(&queued);
            let arguments = Enqueue {
                id: &request.id,
                packed: &packed,
                max_pending: &max_pending,
                until_ms: &until_ms,
                revision: &revision,
                rate_interval: &interval,
                rate_tolerance: &tolerance,
                approval: approval_mode,
                approver,
            };
            self.run(&self.scripts.enqueue, code, &rate_key, arguments)
                .await?
        } else {
            flat
        };
        let (outcome, items) = outcome(answer)?;
        let mut items = items.into_iter();
        let record = call_in(items.next())?;
        let session = match items.next() {
            None | Some(redis::Value::Nil | redis::Value::Boolean(false)) => None,
            Some(values) => {
                let values: Vec<String> = redis::from_redis_value(values).map_err(unreadable)?;
                Some(records::session(&values)?)
            }
        };
        let call = || record.clone().ok_or_else(|| missing("call"));
        let enqueued = match outcome.as_str() {
            "queued" => Enqueued::Queued(call()?),
            "existing" => Enqueued::Existing(call()?),
            "conflict" => Enqueued::Conflict,
            "full" => Enqueued::Full,
            "stale" => Enqueued::StaleManifest,
            "nosession" => Enqueued::NoSession,
            "refused" => Enqueued::ApprovalRefused,
            "disconnected" => Enqueued::Disconnected,
            "limited" => {
                let over: i64 = items
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()
                    .map_err(unreadable)?
                    .ok_or_else(|| missing("time to wait"))?;
                Enqueued::RateLimited(Duration::from_micros(over.unsigned_abs()))
            }
            other => return Err(unexpected(other)),
        };
        Ok((enqueued, session))
    }

    async fn approvals(&self, code: &SessionCode) -> Result<Option<ApprovalState>, StoreError> {
        type Found = (String, String, String, String, String, Vec<String>);
        let found: Option<Found> = self
            .run(&self.scripts.approvals, code, &[], NoArguments)
            .await?;
        Ok(found.map(
            |(approves, refused, has_book, book, held, allowed)| ApprovalState {
                approves: approves == "1",
                refused: refused == "1",
                book: (has_book == "1").then_some(book),
                allowed: allowed
                    .chunks_exact(2)
                    .map(|pair| (pair[0].clone(), pair[1].clone()))
                    .collect(),
                held: held
                    .split_whitespace()
                    .filter_map(|entry| entry.split_once('='))
                    .map(|(caller, id)| (caller.to_owned(), id.to_owned()))
                    .collect(),
            },
        ))
    }

    async fn change_approvals(
        &self,
        code: &SessionCode,
        change: &ApprovalChange,
        _now: Timestamp,
    ) -> Result<Option<bool>, StoreError> {
        let flag = |value: Option<bool>| match value {
            None => "",
            Some(true) => "1",
            Some(false) => "0",
        };
        let (book_set, expected_set, expected, book) = match &change.book {
            None => ("", "", "", ""),
            Some((expected, book)) => (
                "1",
                if expected.is_some() { "1" } else { "" },
                expected.as_deref().unwrap_or(""),
                book.as_str(),
            ),
        };
        let (allow, allow_kept) = change
            .allow
            .as_ref()
            .map_or(("", ""), |(id, kept)| (id.as_str(), kept.as_str()));
        let (release, release_mode, fail_code, fail_message) = match &change.release {
            None => ("", "", "", ""),
            Some((caller, Release::Queue)) => (caller.as_str(), "queue", "", ""),
            Some((caller, Release::Fail { code, message })) => {
                (caller.as_str(), "fail", code.as_str(), message.as_str())
            }
        };
        let changed: Option<i64> = self
            .run(
                &self.scripts.change_approvals,
                code,
                &[],
                ChangeApprovals {
                    book_set,
                    expected_set,
                    expected,
                    book,
                    approves: flag(change.approves),
                    refused: flag(change.refused),
                    allow,
                    allow_kept,
                    revoke: change.revoke.as_deref().unwrap_or(""),
                    release,
                    release_mode,
                    fail_code,
                    fail_message,
                },
            )
            .await?;
        Ok(changed.map(|changed| changed == 1))
    }

    async fn request(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        let answer: redis::Value = self
            .run(&self.scripts.request, code, &[], Request { id })
            .await?;
        let (outcome, items) = outcome(answer)?;
        match outcome.as_str() {
            "found" => call_in(items.into_iter().next()),
            "nosession" | "norequest" => Ok(None),
            other => Err(unexpected(other)),
        }
    }

    async fn responses(
        &self,
        code: &SessionCode,
        caller: Option<&str>,
    ) -> Result<Option<Vec<ToolResponse>>, StoreError> {
        let found: Option<Vec<String>> = self
            .run(&self.scripts.responses, code, &[], NoArguments)
            .await?;
        let Some(found) = found else { return Ok(None) };
        let mut records = found
            .iter()
            .map(|packed| records::unpack(packed))
            .collect::<Result<Vec<_>, _>>()?;
        records.sort_by_key(|record| record.seq);
        Ok(Some(
            records
                .into_iter()
                .filter(|record| record.made_by(caller))
                .filter_map(|record| record.response)
                .collect(),
        ))
    }

    async fn pending_count(&self, code: &SessionCode) -> Result<Option<usize>, StoreError> {
        self.run(&self.scripts.pending, code, &[], NoArguments)
            .await
    }

    async fn lease_builtin(
        &self,
        code: &SessionCode,
        id: &str,
        holder: &str,
        _now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<RequestRecord>, StoreError> {
        let found: Option<String> = self
            .run(
                &self.scripts.lease_builtin,
                code,
                &[],
                LeaseBuiltin {
                    id,
                    holder,
                    until_ms: &until.0.to_string(),
                },
            )
            .await?;
        found.map(|packed| records::unpack(&packed)).transpose()
    }

    async fn claim(
        &self,
        code: &SessionCode,
        claim: &Claim,
    ) -> Result<Vec<RequestRecord>, StoreError> {
        let found: Vec<String> = self
            .run(
                &self.scripts.claim,
                code,
                &[],
                ClaimCalls {
                    connection: &claim.connection_id,
                    lease_until: &claim.lease_until.0.to_string(),
                    limit: &claim.limit.min(1_000_000).to_string(),
                    again: if claim.redeliver { "1" } else { "0" },
                },
            )
            .await?;
        found.iter().map(|packed| records::unpack(packed)).collect()
    }

    async fn finish(
        &self,
        code: &SessionCode,
        id: &str,
        status: RequestStatus,
        response: ToolResponse,
        answerer: Answerer<'_>,
        _now: Timestamp, // the scripts take `now` from the clock, as every script does
        until: Timestamp,
    ) -> Result<Finished, StoreError> {
        let cost = rules::answer_cost(&response);
        let response = records::stored_answer(&response)?;
        let (answerer, connection) = match answerer {
            Answerer::Relay => ("relay", ""),
            Answerer::Connection(connection) => ("connection", connection),
            Answerer::Provider => ("provider", ""),
        };
        let (cost, until_ms) = (cost.to_string(), until.0.to_string());
        let share = self.limits.session_answer_budget.to_string();
        // A routed call whose waiter is on this replica is told here, not announced.
        let held = self
            .router
            .as_ref()
            .map(|router| (router, format!("{}{id}", self.base(code))))
            .filter(|(router, key)| router.holds(key));
        // Both scripts take the same arguments.
        let arguments = || Finish {
            id,
            status: status.as_str(),
            response: &response,
            cost: &cost,
            until_ms: &until_ms,
            answerer,
            connection,
            share: &share,
            quiet: if held.is_some() { "1" } else { "" },
        };
        // The common path first, flat; anything else the library's script decides.
        let flat: redis::Value = self
            .run(&self.scripts.flat_finish, code, &[], arguments())
            .await?;
        let answer = if is_slow(&flat) {
            self.run(&self.scripts.finish, code, &[], arguments())
                .await?
        } else {
            flat
        };
        let (outcome, items) = outcome(answer)?;
        let record = || -> Result<RequestRecord, StoreError> {
            call_in(items.clone().into_iter().next())?.ok_or_else(|| missing("call"))
        };
        Ok(match outcome.as_str() {
            "finished" => {
                self.answered(code);
                let record = record()?;
                let announced = !matches!(items.get(1), Some(redis::Value::Int(0)));
                if let Some((router, key)) = held.filter(|_| !announced) {
                    router.release(&key);
                    self.told_here(code, &record);
                }
                Finished::Finished(record)
            }
            "already" => {
                let record = record()?;
                // A routed call answered again (the tab sends an answer until it is
                // acknowledged): the first finish may have stored it and failed after (a
                // `WAIT` not met), its waiter here never told.
                if let Some((router, key)) = held {
                    router.release(&key);
                    self.told_here(code, &record);
                }
                Finished::AlreadyFinished(record)
            }
            "norequest" => Finished::NoRequest,
            "notdelivered" => Finished::NotDelivered,
            "nosession" => Finished::NoSession,
            other => return Err(unexpected(other)),
        })
    }

    async fn subscribe(&self, code: &SessionCode) -> Result<Option<EventStream>, StoreError> {
        // Subscribed before the session is read, so nothing between the two is missed.
        let stream = self.events.subscribe(&self.base(code)).await;
        Ok(self.session(code).await?.map(|_| stream))
    }

    async fn listen(&self, code: &SessionCode) -> Result<EventStream, StoreError> {
        Ok(self.events.subscribe(&self.base(code)).await)
    }

    async fn listen_for_answer(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<EventStream, StoreError> {
        Ok(self.events.wait_for(&self.base(code), id).await)
    }

    async fn accept_routed(
        &self,
        code: &SessionCode,
        call: String,
    ) -> Result<RoutedAnswer, StoreError> {
        let Some(router) = &self.router else {
            return Err(StoreError(
                "this replica takes no routed calls: set REPLICA_URL on it".into(),
            ));
        };
        let record = records::unpack(&call)?;
        let base = self.base(code);
        let held = router.hold(format!("{base}{}", record.id), record.deadline);
        let waiter = self.events.wait_for(&base, &record.id).await;
        self.handed_here(&base, record);
        router.counted(Route::Accepted);
        Ok(Box::pin(futures::stream::unfold(
            Some((waiter, held)),
            |state| async move {
                let (mut waiter, _held) = state?;
                loop {
                    match waiter.next().await? {
                        SessionEvent::ResponseReady {
                            record: Some(record),
                            ..
                        } => return Some((records::pack(&record), None)),
                        // Announced on Redis (too large to tell whole), or gone: the caller's
                        // replica hears of it there.
                        SessionEvent::ResponseReady { record: None, .. }
                        | SessionEvent::SessionEnded => return Some((String::new(), None)),
                        _ => {}
                    }
                }
            },
        )))
    }

    async fn usage(&self) -> Result<StoreUsage, StoreError> {
        // A round of the answer budget's trim first: what it reports is what is kept after.
        let answer_bytes = self.trim().await?;
        let now = self.clock.now().0;
        let (forgot, sessions, ticket_bytes): (u64, usize, Option<usize>) = redis::pipe()
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.key("sessions"))
            .arg("-inf")
            .arg(now)
            .cmd("ZCARD")
            .arg(self.key("sessions"))
            .cmd("GET")
            .arg(self.key("{tickets}:bytes"))
            .query_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        self.metrics.sessions_expired(forgot);
        Ok(StoreUsage {
            answer_bytes,
            ticket_bytes: ticket_bytes.unwrap_or(0),
            sessions,
        })
    }
}

/// A manifest's content hash: its key in `m:{<hash>}`, shared by every session that
/// registered the same JSON.
fn manifest_hash(json: &str) -> String {
    use sha2::{Digest, Sha256};
    data_encoding::HEXLOWER.encode(&Sha256::digest(json.as_bytes()))
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}
