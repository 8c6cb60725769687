//! [`Connecting`]: a store a replica serves with before its connection is made, so that its
//! probes tell the truth while Redis is away or full.
//!
//! A replica binds its ports and answers `/healthz` at once; its store connects in the
//! background ([`Connecting::start`]). Until the connection is made every operation fails with
//! a [`StoreError`] (callers get 503 `store_unavailable` with `Retry-After`, `/readyz` is red),
//! then each forwards to the connected store. A connect that fails for good (a `REDIS_URL`
//! that cannot work) is reported through [`Connection::failed`], which the binaries race
//! against serving so that the process ends with the message.
//!
//! A Redis at its `maxmemory` with `noeviction` refuses writes but still answers `PING`: once
//! an operation was refused as [`StoreError::Full`], each readiness check ([`Reachable::ping`])
//! also tries a small write (a lock that expires in a second) and stays red until one succeeds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::watch;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::{
    Answerer, ApprovalChange, ApprovalState, BudgetStore, CallNews, CallProgress, Claim,
    EnqueueChecks, Enqueued, EventStream, Finished, Inserted, McpSessionCaps, McpSessionStore,
    McpSessionsFull, NewRequest, ProviderInfo, RateBudget, Reachable, RequestRecord, RoutedAnswer,
    SessionRecord, SessionStore, Store, StoreUsage, TabState, TicketStore,
};
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::error::StoreError;

/// The lock a readiness check takes to learn whether the store accepts writes again.
const WRITE_PROBE: &str = "readiness-write-probe";
/// How long that lock lasts if its release is lost.
const WRITE_PROBE_LEASE: Duration = Duration::from_secs(1);

/// Where a store's connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Still being made.
    Connecting,
    /// Made: operations reach the store.
    Connected,
    /// Failed for good, with the message to end the process with.
    Failed(String),
}

/// A store that answers [`StoreError`] until its connection is made, then forwards to it.
pub struct Connecting {
    store: OnceLock<Arc<dyn Store>>,
    /// What the store is, for the error operations get meanwhile (e.g. `Redis (REDIS_URL)`).
    what: String,
    /// Whether an operation was refused because the store is full, and no write has
    /// succeeded since.
    full: AtomicBool,
    clock: Clock,
    /// This replica's name as the holder of the write probe's lock.
    holder: String,
}

/// The outcome of a store's connection, for whoever started it.
#[derive(Debug, Clone)]
pub struct Connection(watch::Receiver<State>);

impl Connection {
    /// A connection made already (a store in memory).
    pub fn made() -> Self {
        Self(watch::channel(State::Connected).1)
    }

    /// Waits until the connection is made; the error when it failed for good.
    pub async fn ready(&mut self) -> Result<(), String> {
        let state = self
            .0
            .wait_for(|state| *state != State::Connecting)
            .await
            .map(|state| state.clone());
        match state {
            Ok(State::Failed(message)) => Err(message),
            Ok(_) => Ok(()),
            Err(_) => Err("the store's connection task ended without a result".to_owned()),
        }
    }

    /// Completes only if the connection failed for good, with the message saying why; pends
    /// for ever otherwise.
    pub async fn failed(mut self) -> String {
        match self.ready().await {
            Err(message) => message,
            Ok(()) => std::future::pending().await,
        }
    }
}

impl Connecting {
    /// A store, named `what` in its errors, that `connect` makes in the background; serving
    /// can start at once.
    pub fn start(
        what: impl Into<String>,
        clock: Clock,
        connect: impl Future<Output = Result<Arc<dyn Store>, String>> + Send + 'static,
    ) -> (Arc<Self>, Connection) {
        let store = Arc::new(Self {
            store: OnceLock::new(),
            what: what.into(),
            full: AtomicBool::new(false),
            clock,
            holder: crate::code::random_id(),
        });
        let (state, connection) = watch::channel(State::Connecting);
        let connected = Arc::clone(&store);
        tokio::spawn(async move {
            match connect.await {
                Ok(inner) => {
                    let _ = connected.store.set(inner);
                    let _ = state.send(State::Connected);
                }
                Err(message) => {
                    let _ = state.send(State::Failed(message));
                }
            }
        });
        (store, Connection(connection))
    }

    /// The connected store, or the error every operation gets until it is.
    fn connected(&self) -> Result<&Arc<dyn Store>, StoreError> {
        self.store.get().ok_or_else(|| {
            StoreError(format!(
                "not connected yet: waiting for {} to answer",
                self.what
            ))
        })
    }

    /// Notes an operation's outcome: a refusal because the store is full turns the readiness
    /// check's write probe on.
    fn noted<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Full(_)) = &result {
            self.full.store(true, Ordering::Relaxed);
        }
        result
    }

    /// Whether the store accepts a write: a lock taken and released.
    async fn write_probe(&self, store: &Arc<dyn Store>) -> Result<(), StoreError> {
        let until = self.clock.now().plus(WRITE_PROBE_LEASE);
        self.noted(store.lock(WRITE_PROBE, &self.holder, until).await)?;
        self.noted(store.unlock(WRITE_PROBE, &self.holder).await)?;
        self.full.store(false, Ordering::Relaxed);
        tracing::info!("the store accepts writes again");
        Ok(())
    }
}

#[async_trait]
impl Reachable for Connecting {
    async fn ping(&self) -> Result<(), StoreError> {
        let store = self.connected()?;
        store.ping().await?;
        if self.full.load(Ordering::Relaxed) {
            self.write_probe(store).await?;
        }
        Ok(())
    }
}

/// Writes `impl $part for Connecting` for each part of the store's interface: each method forwards to the connected store, noting a
/// refusal because it is full. `Reachable` is written by hand above.
macro_rules! forwarded {
    ($(#[$part_meta:meta])* Reachable [$($bound:tt)*] { $($ignored:tt)* } $($rest:tt)*) => {
        forwarded! { $($rest)* }
    };
    () => {};
    ($(#[$part_meta:meta])* $part:ident [$($bound:tt)*] {
        $(
            $(#[$meta:meta])*
            fn $method:ident(&self $(, $arg:ident: $type:ty)* $(,)?)
                -> $output:ty => $operation:ident $body:tt
        )*
    } $($rest:tt)*) => {
        #[async_trait]
        impl $part for Connecting {
            $(
                $(#[$meta])*
                async fn $method(&self $(, $arg: $type)*) -> Result<$output, StoreError> {
                    self.noted(self.connected()?.$method($($arg),*).await)
                }
            )*
        }
        forwarded! { $($rest)* }
    };
}

crate::store_methods!(forwarded);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn memory(clock: &Clock) -> Arc<dyn Store> {
        MemoryStore::new(clock.clone(), Duration::from_secs(60))
    }

    #[tokio::test]
    async fn answers_errors_until_connected_then_forwards() {
        let clock = Clock::new();
        let (made, wait) = tokio::sync::oneshot::channel::<()>();
        let inner = memory(&clock);
        let (store, mut connection) = Connecting::start("the test store", clock, async move {
            let _ = wait.await;
            Ok(inner)
        });
        let error = store.ping().await.unwrap_err();
        assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
        assert!(error.to_string().contains("the test store"), "{error}");
        assert!(store.lock("k", "me", Timestamp(i64::MAX)).await.is_err());
        made.send(()).unwrap();
        connection.ready().await.unwrap();
        store.ping().await.unwrap();
        assert!(store.lock("k", "me", Timestamp(i64::MAX)).await.unwrap());
    }

    #[tokio::test]
    async fn a_failed_connect_is_reported() {
        let (store, connection) = Connecting::start("the test store", Clock::new(), async {
            Err("REDIS_URL is wrong".to_owned())
        });
        assert_eq!(connection.failed().await, "REDIS_URL is wrong");
        assert!(store.ping().await.is_err());
    }
}
