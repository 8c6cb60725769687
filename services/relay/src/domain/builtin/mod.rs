//! Tools built into the relay: one [`Registry`], used everywhere a tool is listed or called —
//! `GET /api/tools`, `POST /api/tools/{name}`, every session's manifest (as the group
//! [`BUILTIN_GROUP`]), calls through a session, gRPC and MCP.
//!
//! This module holds what every relay needs to run tools: the [`Tool`] trait, the
//! [`Registry`], scopes, claim checks and failures. The tools themselves (PlantUML, MIP) live
//! in the `toolrelay-builtin` crate, whose `standard` registry the binaries that run tools
//! hand to the relay; the split-mode gateway links none of them. Adding a tool is one file
//! there implementing [`Tool`] plus one line in its `standard`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
pub use toolrelay::errors::{FailureCode, ToolCode};
use toolrelay::wire::FunctionSpec;
pub use toolrelay::wire::ToolHints;

use crate::clock::Clock;
use crate::code::{SessionCode, random_id};
use crate::manifest::describe_violations;
use crate::store::Store;

/// Group id of the built-in tools in a session's manifest (reserved for them).
pub const BUILTIN_GROUP: &str = "relay";
/// Description of that group.
pub const BUILTIN_GROUP_DESCRIPTION: &str = "Tools built into the relay: they run without the tab.";

/// Who a call is made for: stateful tools keep what they store apart per scope.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A call through a pairing session.
    Session(SessionCode),
    /// An MCP session.
    Mcp(String),
    /// A scope the caller named (`?scope=` or a `scope` argument).
    Caller(String),
    /// No scope: only stateless tools work.
    None,
}

impl Scope {
    /// The namespace of what a stateful tool stores for this scope; `None` without a scope.
    pub fn key(&self) -> Option<String> {
        match self {
            Self::Session(code) => Some(format!("session:{code}")),
            Self::Mcp(id) => Some(format!("mcp:{id}")),
            Self::Caller(id) => Some(format!("caller:{id}")),
            Self::None => None,
        }
    }
}

/// How long claim checks live.
pub const TICKET_TTL: Duration = Duration::from_secs(3600);

/// Claim-check storage for stateful tools: values kept in the relay's store under a random
/// id of 128 bits, namespaced by scope, for [`TICKET_TTL`]. An id used from another scope is
/// simply not found.
#[derive(Clone)]
pub struct Tickets {
    store: Arc<dyn Store>,
    clock: Clock,
}

impl Tickets {
    /// Tickets in `store`.
    pub fn new(store: Arc<dyn Store>, clock: Clock) -> Self {
        Self { store, clock }
    }

    /// Keeps `value`; returns its new id, `{prefix}_{32 hex digits}`.
    pub async fn put(
        &self,
        scope: &str,
        prefix: &str,
        value: Value,
    ) -> Result<String, ToolFailure> {
        let id = format!("{prefix}_{}", random_id());
        let expires_at = self.clock.now().plus(TICKET_TTL);
        self.store
            .put_ticket(scope, &id, Arc::new(value), expires_at)
            .await
            .map_err(store_failure)?;
        Ok(id)
    }

    /// The value of a ticket of this scope.
    pub async fn get(&self, scope: &str, id: &str) -> Result<Option<Arc<Value>>, ToolFailure> {
        self.store.ticket(scope, id).await.map_err(store_failure)
    }

    /// Takes the lock `key`, shared by every replica on the store: `None` while someone else
    /// holds it. The lock is held for [`SHARED_LOCK_TTL`] at a time and renewed while the
    /// returned guard lives, so a replica that dies frees it within that; dropping the guard
    /// releases it.
    pub async fn lock(&self, key: &str) -> Result<Option<SharedLock>, ToolFailure> {
        let holder = random_id();
        let until = self.clock.now().plus(SHARED_LOCK_TTL);
        if !self
            .store
            .lock(key, &holder, until)
            .await
            .map_err(store_failure)?
        {
            return Ok(None);
        }
        // Made first, so that a failure below still releases the lock.
        let mut lock = SharedLock {
            store: Arc::clone(&self.store),
            key: key.to_owned(),
            holder: holder.clone(),
            renewing: None,
        };
        let (store, clock, key) = (Arc::clone(&self.store), self.clock.clone(), key.to_owned());
        let renewing = tokio::spawn(async move {
            let mut every = tokio::time::interval(SHARED_LOCK_TTL / 3);
            every.reset();
            loop {
                every.tick().await;
                let until = clock.now().plus(SHARED_LOCK_TTL);
                match store.lock(&key, &holder, until).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(%key, "a shared lock was lost while held");
                        return;
                    }
                    Err(error) => tracing::warn!(%key, %error, "a shared lock was not renewed"),
                }
            }
        });
        lock.renewing = Some(renewing);
        Ok(Some(lock))
    }
}

/// How long a shared lock lasts unless renewed (a third of the way through). Shorter than a
/// built-in call's lease ([`crate::store::BUILTIN_LEASE`]): when a replica dies, its locks
/// are free before another replica takes its calls over.
pub const SHARED_LOCK_TTL: Duration = Duration::from_secs(5);

/// A lock taken with [`Tickets::lock`]; released when dropped.
pub struct SharedLock {
    store: Arc<dyn Store>,
    key: String,
    holder: String,
    /// Renews the lock while it is held.
    renewing: Option<tokio::task::JoinHandle<()>>,
}

impl SharedLock {
    /// Releases the lock now, rather than in the background as dropping it does.
    pub async fn release(mut self) {
        if let Some(renewing) = self.renewing.take() {
            renewing.abort();
        }
        let key = std::mem::take(&mut self.key);
        if let Err(error) = self.store.unlock(&key, &self.holder).await {
            tracing::warn!(%key, %error, "a shared lock was not released");
        }
    }
}

impl Drop for SharedLock {
    fn drop(&mut self) {
        if let Some(renewing) = self.renewing.take() {
            renewing.abort();
        }
        if self.key.is_empty() {
            return; // released already
        }
        let (store, key, holder) = (
            Arc::clone(&self.store),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.holder),
        );
        // Released in the background; if that fails, the lock runs out on its own.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = store.unlock(&key, &holder).await {
                    tracing::warn!(%key, %error, "a shared lock was not released");
                }
            });
        }
    }
}

/// A claim-check store failure as the caller sees it: a store at its memory limit (which the
/// operator must fix, so later) apart from one that did not answer (in a few seconds).
fn store_failure(error: crate::error::StoreError) -> ToolFailure {
    tracing::error!(%error, "claim-check store failed");
    let (code, message, retry_after) = match error {
        crate::error::StoreError::Full(_) => (
            ToolCode::StoreFull,
            "The relay's store is full and refuses new results right now. Try again later; if it lasts, tell the relay's operator.",
            Duration::from_secs(10),
        ),
        crate::error::StoreError::Unavailable(_) => (
            ToolCode::StoreUnavailable,
            "The relay cannot reach its store right now. Try again in a few seconds.",
            Duration::from_secs(2),
        ),
    };
    ToolFailure {
        kind: FailureKind::Busy,
        code: code.into(),
        message: message.into(),
        retry_after: Some(retry_after),
    }
}

/// What a tool sees of the call besides its arguments.
#[derive(Clone)]
pub struct Context {
    /// Who the call is for.
    pub scope: Scope,
    /// The address of the client that made the call, when it was made outside a session and
    /// the relay knows it: what the MIP tools share their slots fairly by.
    pub client: Option<std::net::IpAddr>,
    /// Where stateful tools keep what they return ids for.
    pub tickets: Tickets,
    /// Where tools count their runs.
    pub metrics: crate::metrics::Metrics,
}

/// The class of a tool failure, for transports to pick a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The input is wrong (HTTP 400).
    BadInput,
    /// The input is too large (HTTP 413).
    TooLarge,
    /// No such tool (HTTP 404).
    NotFound,
    /// Too much at once; retry later (HTTP 429).
    Busy,
    /// The tool itself failed (HTTP 500).
    Internal,
    /// The tool cannot run right now, e.g. the relay cannot be reached; retry later (HTTP 503).
    Unavailable,
}

/// Why a built-in tool did not produce a result: the `{code, message}` of the tool API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailure {
    /// Its class.
    pub kind: FailureKind,
    /// Its stable code, e.g. `EMPTY_CODE`.
    pub code: FailureCode,
    /// What went wrong and what to do.
    pub message: String,
    /// When a retry makes sense ([`FailureKind::Busy`]).
    pub retry_after: Option<Duration>,
}

impl ToolFailure {
    /// A failure of `kind` with `code`.
    pub fn new(
        kind: FailureKind,
        code: impl Into<FailureCode>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            code: code.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// `TOOL_NOT_FOUND`.
    pub fn not_found(name: &str, available: &[&str]) -> Self {
        Self::new(
            FailureKind::NotFound,
            ToolCode::ToolNotFound,
            format!(
                "There is no tool {name:?}. Available tools: {}. GET /api/tools lists them with their inputs.",
                available.join(", ")
            ),
        )
    }
}

/// A tool built into the relay.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Its name: unique, `^[A-Za-z0-9_]{1,64}$`.
    fn name(&self) -> &'static str;
    /// What it does, written for an LLM.
    fn description(&self) -> &'static str;
    /// JSON Schema of its arguments (an object schema).
    fn input_schema(&self) -> Value;
    /// JSON Schema of its results (an object schema every successful result matches).
    fn output_schema(&self) -> Value;
    /// Its title and what it does to data (MCP's annotations).
    fn hints(&self) -> ToolHints;
    /// Runs it. The arguments have been checked against the schema.
    async fn call(&self, args: Value, context: &Context) -> Result<Value, ToolFailure>;
    /// Whether a call for this context would be taken now: a cheap look that reserves
    /// nothing, so callers that queue work (session calls) can answer "busy" before queueing.
    fn ready(&self, _context: &Context) -> Result<(), ToolFailure> {
        Ok(())
    }
}

/// A built-in tool as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub input_schema: Value,
    /// JSON Schema of its results.
    pub output_schema: Option<Value>,
    /// Its title and what it does to data.
    pub hints: ToolHints,
}

impl From<ToolInfo> for FunctionSpec {
    fn from(tool: ToolInfo) -> Self {
        Self {
            name: tool.name,
            description: tool.description,
            parameters: tool.input_schema,
            hints: tool.hints,
            output_schema: tool.output_schema,
        }
    }
}

struct Entry {
    tool: Arc<dyn Tool>,
    schema: Value,
    validator: jsonschema::Validator,
}

/// The built-in tools, with their compiled argument schemas.
pub struct Registry {
    entries: Vec<Entry>,
    by_name: HashMap<&'static str, usize>,
}

impl Registry {
    /// A registry of `tools`.
    ///
    /// # Panics
    /// When a tool's schema is not a valid JSON Schema or two tools share a name: both are
    /// programming errors the test suite catches.
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> Self {
        let mut by_name = HashMap::new();
        let entries: Vec<Entry> = tools
            .into_iter()
            .enumerate()
            .map(|(index, tool)| {
                let schema = tool.input_schema();
                let validator = jsonschema::validator_for(&schema).unwrap_or_else(|error| {
                    panic!("the schema of {} is invalid: {error}", tool.name())
                });
                assert!(
                    by_name.insert(tool.name(), index).is_none(),
                    "two tools are called {}",
                    tool.name()
                );
                Entry {
                    tool,
                    schema,
                    validator,
                }
            })
            .collect();
        Self { entries, by_name }
    }

    /// The tools, in registration order.
    pub fn list(&self) -> Vec<ToolInfo> {
        self.entries
            .iter()
            .map(|entry| ToolInfo {
                name: entry.tool.name().to_owned(),
                description: entry.tool.description().to_owned(),
                input_schema: entry.schema.clone(),
                output_schema: Some(result_or_failure(entry.tool.output_schema())),
                hints: entry.tool.hints(),
            })
            .collect()
    }

    /// What the tool `name` does to data, if there is one.
    pub fn hints(&self, name: &str) -> Option<ToolHints> {
        self.entry(name).ok().map(|entry| entry.tool.hints())
    }

    /// Whether a tool has this name.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The tool names.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|entry| entry.tool.name()).collect()
    }

    /// How arguments break the schema of the tool `name` (`None` when they do not, or when
    /// there is no such tool).
    pub fn violations(&self, name: &str, args: &Value) -> Option<String> {
        let entry = self.entry(name).ok()?;
        describe_violations(&entry.validator, args)
    }

    /// Checks arguments against the tool's schema (`TOOL_NOT_FOUND`, `INVALID_ARGUMENTS`).
    pub fn check(&self, name: &str, args: &Value) -> Result<(), ToolFailure> {
        let entry = self.entry(name)?;
        match describe_violations(&entry.validator, args) {
            None => Ok(()),
            Some(problems) => Err(ToolFailure::new(
                FailureKind::BadInput,
                ToolCode::InvalidArguments,
                format!(
                    "The arguments for {name} do not match its input schema: {problems}. Correct them and call again."
                ),
            )),
        }
    }

    /// Checks the arguments, then runs the tool.
    pub async fn call(
        &self,
        name: &str,
        args: Value,
        context: &Context,
    ) -> Result<Value, ToolFailure> {
        let args = match args {
            Value::Null => Value::Object(Default::default()),
            args => args,
        };
        self.check(name, &args)?;
        let entry = self.entry(name)?;
        entry.tool.call(args, context).await
    }

    /// Whether the tool would take a call for `context` now ([`Tool::ready`]).
    pub fn ready(&self, name: &str, context: &Context) -> Result<(), ToolFailure> {
        self.entry(name)?.tool.ready(context)
    }

    fn entry(&self, name: &str) -> Result<&Entry, ToolFailure> {
        self.by_name
            .get(name)
            .map(|index| &self.entries[*index])
            .ok_or_else(|| ToolFailure::not_found(name, &self.names()))
    }
}

/// A tool's output schema as listed: its result, or the failure MCP answers with in the same
/// field (`{error: {code, message}}`, with `isError`), since clients check every structured
/// content against the schema, a failure's included.
fn result_or_failure(result: Value) -> Value {
    let Value::Object(mut schema) = result else {
        return result;
    };
    let required = schema
        .remove("required")
        .unwrap_or_else(|| Value::Array(Vec::new()));
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.insert(
            "error".into(),
            serde_json::json!({
                "type": "object",
                "description": "Why the call failed (only on failure).",
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                "required": ["code", "message"]
            }),
        );
    }
    schema.insert(
        "anyOf".into(),
        serde_json::json!([{"required": required}, {"required": ["error"]}]),
    );
    Value::Object(schema)
}

/// No tools: a relay that runs none (its sessions list only their tabs' tools).
impl Default for Registry {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tools", &self.names())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;

    #[test]
    fn a_full_store_is_told_apart_from_an_unreachable_one() {
        let full = store_failure(StoreError::Full("OOM".into()));
        assert_eq!(full.code, FailureCode::from(ToolCode::StoreFull));
        assert_eq!(full.retry_after, Some(Duration::from_secs(10)));
        assert!(full.message.contains("operator"), "{}", full.message);
        let away = store_failure(StoreError::Unavailable("timeout".into()));
        assert_eq!(away.code, FailureCode::from(ToolCode::StoreUnavailable));
        assert_eq!(away.retry_after, Some(Duration::from_secs(2)));
    }
}
