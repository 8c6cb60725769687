//! The Redis [`Store`](crate::store::Store): state shared by every relay replica (`REDIS_URL`).
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
//! [`SessionEvent::Missed`](crate::store::SessionEvent::Missed) and looks again; the relay's upkeep of the tabs it serves
//! ([`SessionStore::refresh`]) catches anything else, at the latest when it next slides the session.

mod calls;
mod hub;
mod keyed;
mod link;
mod presence;
mod records;
mod route;
mod run;
mod scripts;
mod trim;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use toolrelay::wire::{RequestStatus, ToolResponse};

use self::hub::EventHub;
pub use self::link::install_tls_provider;
use self::link::{Connection, Link};
use self::records::{call_in, outcome, unexpected};
use self::route::Router;
use self::scripts::{
    ChangeApprovals, ClaimCalls, ClearProvider, Insert, LeaseBuiltin, NoArguments, Request,
    Scripts, SetManifest, SetProvider, SetToken, Touch,
};
use super::memory::StoreLimits;
use super::{
    Answerer, ApprovalChange, ApprovalState, CallNews, CallProgress, Claim, EnqueueChecks,
    Enqueued, EventStream, Finished, Inserted, NewRequest, ProviderInfo, Reachable, Release,
    RequestRecord, RoutedAnswer, SessionEvent, SessionRecord, SessionStore, StoreUsage, TabState,
};
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::config::{RedisSettings, Topology, WaitReplicas};
use crate::error::StoreError;
use crate::metrics::Metrics;

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
        request: NewRequest,
        max_pending: usize,
        until: Timestamp,
        checks: EnqueueChecks,
    ) -> Result<(Enqueued, Option<SessionRecord>), StoreError> {
        self.enqueue_call(code, request, max_pending, until, checks)
            .await
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
        self.finish_call(code, id, status, response, answerer, until)
            .await
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

    async fn tell(&self, code: &SessionCode, id: &str, news: CallNews) -> Result<bool, StoreError> {
        let base = self.base(code);
        let channel = format!("{base}ev");
        // A routed call's waiter (or the stream back to it) is on this replica: told here.
        let here = self
            .router
            .as_ref()
            .is_some_and(|router| router.holds(&format!("{base}{id}")));
        let kept = match &news {
            CallNews::Progress(progress) => progress.progress.to_string(),
            CallNews::Log(_) => String::new(),
        };
        let written = serde_json::to_string(&news)
            .map_err(|error| StoreError(format!("news of a call cannot be written: {error}")))?;
        let running: i64 = self
            .scripts
            .news
            .key(format!("{base}s"))
            .arg(id)
            .arg(&written)
            .arg(&kept)
            .arg(if here { "" } else { channel.as_str() })
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        if running == 1 && here {
            self.events.announce(
                &channel,
                SessionEvent::News {
                    id: id.to_owned(),
                    news: Box::new(news),
                },
            );
        }
        Ok(running == 1)
    }

    async fn progress(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<CallProgress>, StoreError> {
        let kept: Option<String> = self
            .connection()
            .hget(format!("{}s", self.base(code)), format!("g:{id}"))
            .await
            .map_err(store_error)?;
        Ok(match kept.map(|kept| serde_json::from_str(&kept)) {
            Some(Ok(CallNews::Progress(progress))) => Some(progress),
            _ => None,
        })
    }

    async fn accept_routed(
        &self,
        code: &SessionCode,
        call: String,
        news: bool,
    ) -> Result<RoutedAnswer, StoreError> {
        self.accept_call(code, call, news).await
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
