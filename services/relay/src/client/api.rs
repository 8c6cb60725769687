//! [`RelayApi`]: the relay's operations, on whichever side of a process boundary the relay is.
//!
//! The gateway depends on this type only. [`RelayApi::Local`] runs an operation in this
//! process (the default, one-process deployment); [`RelayApi::Remote`] sends it over gRPC to a
//! relay elsewhere (split deployment). Errors are [`ErrorInfo`] in both cases.
//!
//! The unary operations are units ([`crate::operation`]), run with [`RelayApi::run`]; the
//! streaming ones (a provider's connection, a manifest's changes) and readiness are methods
//! here. Every operation names its [`Caller`], so the relay applies its checks on every path —
//! the gateway's HTTP and MCP routes, the browser WebSocket, the gRPC port — in one place,
//! the operation ([`crate::limits`]): the brute-force guard on codes and handles, the budget
//! of calls per session, and for a client that reached the gRPC port directly (not through a
//! gateway that did it) its API key and budgets of sessions and tool calls. Transports only
//! convert.

use futures::stream::BoxStream;

use crate::error::{ErrorInfo, RelayError};
use crate::limits::Caller;
use crate::operation::Operation;
use crate::provider::ProviderLink;
use crate::relay::Relay;
use crate::remote::RemoteRelay;
use crate::store::Transport;

/// The result of a relay operation.
pub type Outcome<T> = Result<T, ErrorInfo>;

/// The relay as a front end (the gateway) reaches it. Cheap to clone.
#[derive(Clone)]
pub enum RelayApi {
    /// The relay in this process.
    Local(Relay),
    /// Relay replicas in other processes, over gRPC.
    Remote(RemoteRelay),
}

impl RelayApi {
    /// Runs `operation` for `caller`.
    pub async fn run<O: Operation>(&self, caller: &Caller, operation: O) -> Outcome<O::Output> {
        match self {
            Self::Local(relay) => Ok(crate::operation::run(operation, relay, caller).await?),
            // Boxed: a gRPC call's future is several KB, which the caller's future would
            // otherwise hold (and copy) in one process too ([`crate::operation::run`]).
            Self::Remote(remote) => Box::pin(operation.send(remote, caller)).await,
        }
    }

    /// Whether the relay can serve (its store answers, it is not draining).
    pub async fn ready(&self) -> Outcome<()> {
        match self {
            Self::Local(relay) => Ok(relay.serving().await?),
            Self::Remote(remote) => remote.ready().await,
        }
    }

    /// Attaches a provider connection (provider token).
    pub async fn attach(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Outcome<ProviderLink> {
        match self {
            Self::Local(relay) => Ok(relay.attach_for(caller, code, token, transport).await?),
            Self::Remote(remote) => remote.attach(caller, code, token, transport).await,
        }
    }

    /// An item each time the session's manifest changes; ends with the session.
    pub async fn manifest_changes(
        &self,
        caller: &Caller,
        code: &str,
    ) -> Outcome<BoxStream<'static, ()>> {
        match self {
            Self::Local(relay) => Ok(relay.manifest_changes_for(caller, code).await?),
            Self::Remote(remote) => remote.manifest_changes(caller, code).await,
        }
    }
}

impl std::fmt::Debug for RelayApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(_) => f.write_str("RelayApi::Local"),
            Self::Remote(remote) => f.debug_tuple("RelayApi::Remote").field(remote).finish(),
        }
    }
}

impl Relay {
    /// Whether this relay serves: its store answers and it is not draining.
    pub async fn serving(&self) -> Result<(), RelayError> {
        if self.drain().is_draining() {
            return Err(RelayError::ShuttingDown);
        }
        self.ready().await
    }

    /// Attaches a provider connection for `caller` (provider token), under the brute-force
    /// guard: every transport's attach goes through it.
    pub async fn attach_for(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Result<ProviderLink, RelayError> {
        self.guarded_provider(caller, token, self.attach(code, token, transport))
            .await
    }

    /// `Relay::manifest_changes` for `caller`, under the brute-force guard.
    pub async fn manifest_changes_for(
        &self,
        caller: &Caller,
        code: &str,
    ) -> Result<BoxStream<'static, ()>, RelayError> {
        self.limits().admit(caller)?;
        self.guarded(caller, code, self.manifest_changes(code))
            .await
    }

    /// Runs an operation on `session` — a pairing code, or a connector handle (which every
    /// consumer operation takes in its place) or a claim — for `caller` under the brute-force guard
    /// ([`crate::limits::Limits::guarded_as`]): a code is refused to a caller, or an address,
    /// that guessed too much; a handle only to a caller that did. Every transport goes through
    /// it.
    pub async fn guarded<T>(
        &self,
        caller: &Caller,
        session: &str,
        operation: impl Future<Output = Result<T, RelayError>>,
    ) -> Result<T, RelayError> {
        // A handle or claim is 32 hex digits; anything else is looked at as a code. A caller
        // that named the session by a handle is never told its code.
        if crate::code::is_handle(session) {
            let reference = crate::limits::Reference::Secret;
            let outcome = self.limits().guarded_as(caller, reference, operation).await;
            return outcome.map_err(RelayError::named_by_handle);
        }
        let reference = crate::limits::Reference::Code;
        self.limits().guarded_as(caller, reference, operation).await
    }

    /// Runs a provider's operation (provider token) under the brute-force guard, which never
    /// refuses a valid token ([`crate::limits::Limits::guarded_provider`]).
    pub async fn guarded_provider<T>(
        &self,
        caller: &Caller,
        token: Option<&str>,
        operation: impl Future<Output = Result<T, RelayError>>,
    ) -> Result<T, RelayError> {
        self.limits()
            .guarded_provider(caller, token, operation)
            .await
    }
}
