//! One operation in one place: the [`Operation`] unit every unary RPC of `toolrelay.v1.Relay`
//! is written as.
//!
//! An operation is a struct holding its request (a session code, a provider token, …) and an
//! `impl Operation`, in its family's file under [`crate::ops`] (`sessions.rs`, `manifests.rs`,
//! `calls.rs`, `waiting.rs`, `answers.rs`, `polling.rs`, `builtin.rs`, `claims.rs`,
//! `approvals.rs`), over its domain step: a [`Relay`] method in the family's file under
//! [`crate::relay`], which names no wire type. The unit owns everything about it:
//! * [`CHECKS`](Operation::CHECKS) — the checks its caller passes (its budgets, the
//!   brute-force guard), declared, and [`step`](Operation::step), its domain step: [`run`]
//!   applies the one to the other in this process, the only way a unit runs there;
//! * [`RETRY`](Operation::RETRY) — whether a front end may ask another replica again;
//! * its wire form: [`into_message`](Operation::into_message) and
//!   [`from_message`](Operation::from_message) for the request,
//!   [`reply`](Operation::reply) and [`output`](Operation::output) for the answer;
//! * [`send`](Operation::send) — what a front end in front of a remote relay does before it
//!   sends the request (refusing while it drains, checking nesting, naming the call).
//!
//! The transports are generic over it and name no operation: the gRPC server routes
//! [`PATH`](Operation::PATH) to `from_message` → [`serve`](Operation::serve) → `reply`
//! ([`crate::grpc`]); [`RemoteRelay`] sends `into_message` and reads `output`; the gateway
//! calls [`RelayApi::run`](crate::api::RelayApi::run), which is [`run`] in one process and
//! `send` in a split deployment.
//!
//! # Adding an operation
//! 1. Its RPC and messages in `proto/toolrelay/v1/relay.proto`.
//! 2. Its domain step, a [`Relay`] method in the family file of [`crate::relay`] it belongs
//!    to (plain Rust: no protobuf, gRPC or remote type there).
//! 3. Its struct and `impl Operation` in the same family's file of [`crate::ops`], listed in
//!    that file's `operations` function (a new family: its files in both folders, their `mod`
//!    and `pub use` lines, and its `operations` in `ops/mod.rs`'s `each_operation`).
//! 4. Its HTTP route in the gateway (`services/gateway/src/api/`), which calls
//!    `state.relay.run(caller, TheOperation { … })`.
//!
//! The streaming RPCs (`Connect`, `WatchManifest`) and readiness are not units: they are
//! [`RelayApi`](crate::api::RelayApi)'s own methods.

use std::future::Future;

use tonic::Status;
use tonic::metadata::MetadataMap;
use toolrelay::convert::Malformed;

use crate::api::Outcome;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::pool::Retry;
use crate::relay::Relay;
use crate::remote::RemoteRelay;

/// A unary operation of the relay; see the [module](self).
pub trait Operation: Sized + Send + Sync + 'static {
    /// Its RPC: `/toolrelay.v1.Relay/{Method}`.
    const PATH: &'static str;
    /// Whether a front end may ask another replica again when the one it asked did not answer.
    const RETRY: Retry;
    /// The request on the wire.
    type Message: prost::Message + Default + Clone + Send + Sync + 'static;
    /// The answer on the wire.
    type Reply: prost::Message + Default + Send + 'static;
    /// The answer.
    type Output: Send + 'static;

    /// The checks its caller passes before its step ([`run`] applies them).
    const CHECKS: Checks;

    /// What the guard counts: the session the request names and the provider token it
    /// carries (for [`Guard::Named`], [`Guard::Provider`] and [`Guard::TokenOrNamed`]).
    fn guarded(&self) -> Guarded {
        Guarded::default()
    }

    /// The operation's work once its checks passed: the domain step, in this process.
    fn step(
        self,
        relay: &Relay,
        caller: &Caller,
    ) -> impl Future<Output = Result<Self::Output, RelayError>> + Send;

    /// The request as sent: its message and the credential it carries.
    fn into_message(self) -> (Self::Message, Credential);

    /// The operation a request asks for.
    fn from_message(message: Self::Message, credentials: Credentials) -> Result<Self, Status>;

    /// The answer as sent.
    fn reply(output: Self::Output) -> Self::Reply;

    /// The answer as received.
    fn output(reply: Self::Reply) -> Result<Self::Output, Malformed>;

    /// Serves a request in this process: [`run`], then [`reply`](Self::reply). An operation
    /// whose reply says more than its output overrides it (and still runs through [`run`]).
    fn serve(
        self,
        relay: &Relay,
        caller: &Caller,
    ) -> impl Future<Output = Result<Self::Reply, RelayError>> + Send {
        async move { run(self, relay, caller).await.map(Self::reply) }
    }

    /// Runs the operation on a relay in another process. By default the request is sent as
    /// it is; an operation overrides this with what the front end checks first.
    fn send(
        self,
        remote: &RemoteRelay,
        caller: &Caller,
    ) -> impl Future<Output = Outcome<Self::Output>> + Send {
        remote.unary(caller, self)
    }
}

/// The checks a unit's caller passes, declared by the unit ([`Operation::CHECKS`]) and
/// applied by [`run`] in this order: the admission, then the guard around the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    /// What the caller's budgets must admit first.
    pub admit: Admit,
    /// The brute-force guard around the step.
    pub guard: Guard,
}

/// What the caller's budgets admit before a unit's step ([`crate::limits::Limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Nothing here: the guard is all, or the step spends its own charge (a call's, in the
    /// same round trip as its queueing).
    Nothing,
    /// A unit of the caller's request budget.
    Request,
    /// The caller's budget of new sessions.
    Session,
    /// A unit of the request budget, then the budget of new sessions.
    RequestAndSession,
    /// The caller's budget of built-in tool calls.
    ToolCall,
    /// A unit of the request budget, unless the request carries a provider token (the tab
    /// asking about its own session).
    RequestWithoutToken,
}

/// The brute-force guard around a unit's step ([`Relay`]'s `guarded`, `guarded_provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// None: the step names no session.
    Nothing,
    /// The session the request names — a code, or a handle or claim, which only the caller's
    /// own guessing blocks ([`Guarded::session`]).
    Named,
    /// The provider token the request carries, which the guard never refuses when valid; a
    /// request without one is guarded as its caller's ([`Guarded::token`]).
    Provider,
    /// The provider token when the request carries one, else the session it names.
    TokenOrNamed,
}

/// What the guard counts for one request ([`Operation::guarded`]).
#[derive(Debug, Clone, Default)]
pub struct Guarded {
    /// The session the request names: a code, a handle or a claim.
    pub session: String,
    /// The provider token it carries.
    pub token: Option<String>,
}

/// Runs `unit` in this process for `caller`: the checks it declares ([`Operation::CHECKS`]),
/// then its step. The one way a unit runs in process: the gRPC server's routes and the
/// gateway in one process ([`RelayApi::run`](crate::api::RelayApi::run)) both come here.
pub async fn run<O: Operation>(
    unit: O,
    relay: &Relay,
    caller: &Caller,
) -> Result<O::Output, RelayError> {
    let Checks { admit, guard } = O::CHECKS;
    let guarded = match guard {
        Guard::Nothing => Guarded::default(),
        _ => unit.guarded(),
    };
    let limits = relay.limits();
    match admit {
        Admit::Nothing => {}
        Admit::Request => limits.admit(caller)?,
        Admit::Session => limits.admit_session(caller).await?,
        Admit::RequestAndSession => {
            limits.admit(caller)?;
            limits.admit_session(caller).await?;
        }
        Admit::ToolCall => limits.admit_tool_call(caller).await?,
        Admit::RequestWithoutToken if guarded.token.is_none() => limits.admit(caller)?,
        Admit::RequestWithoutToken => {}
    }
    // Boxed: a step's future is large (a call's is ~30 KB, its wait's state beside its
    // queueing's), and every future that holds it by value is at least as large and copied
    // whole as it is built and moved — into the guard's future, into the HTTP handler's,
    // into the box the web framework puts a request's future in. One allocation instead
    // (BENCHMARKS.md, issue 44).
    let step = Box::pin(unit.step(relay, caller));
    match (guard, guarded.token) {
        (Guard::Nothing, _) => step.await,
        (Guard::Provider, token) => relay.guarded_provider(caller, token.as_deref(), step).await,
        (Guard::TokenOrNamed, Some(token)) => {
            relay.guarded_provider(caller, Some(&token), step).await
        }
        (Guard::Named, _) | (Guard::TokenOrNamed, None) => {
            relay.guarded(caller, &guarded.session, step).await
        }
    }
}

/// The credential a request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// None.
    None,
    /// The session's provider token, as `authorization: Bearer …`.
    Token(String),
    /// The session's provider token where `authorization` carries an API key
    /// ([`PROVIDER_TOKEN_METADATA`](crate::grpc::PROVIDER_TOKEN_METADATA)): the brute-force
    /// guard never refuses it.
    ProviderToken(String),
}

impl Credential {
    /// A provider token, when there is one, as `authorization: Bearer …`.
    pub fn token(token: Option<String>) -> Self {
        token.map_or(Self::None, Self::Token)
    }
}

/// The credentials a request arrived with.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// `authorization: Bearer …`: a provider token, or an API key.
    pub bearer: Option<String>,
    /// [`PROVIDER_TOKEN_METADATA`](crate::grpc::PROVIDER_TOKEN_METADATA).
    pub provider_token: Option<String>,
}

impl Credentials {
    /// What `metadata` carries.
    pub fn of(metadata: &MetadataMap) -> Self {
        Self {
            bearer: crate::grpc::bearer(metadata),
            provider_token: crate::grpc::metadata_str(
                metadata,
                crate::grpc::PROVIDER_TOKEN_METADATA,
            ),
        }
    }
}

/// Something that takes every operation type in turn ([`each`]).
pub trait Visitor {
    /// Takes `O`.
    fn visit<O: Operation>(&mut self);
}

/// Shows `visitor` every operation: the gRPC server's routes are built this way. Each family
/// file of [`crate::ops`] lists its own (its `operations` function).
pub fn each(visitor: &mut impl Visitor) {
    crate::ops::each_operation(visitor);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prost::Message as _;

    use super::*;

    /// The last segment of a type's or a message's full name.
    fn short(name: &str) -> &str {
        name.rsplit([':', '.']).next().unwrap_or(name)
    }

    /// Every unit by its path: its request and reply messages' names; and how many were shown.
    #[derive(Default)]
    struct Units {
        by_path: BTreeMap<&'static str, (&'static str, &'static str)>,
        shown: usize,
    }

    impl Visitor for Units {
        fn visit<O: Operation>(&mut self) {
            self.shown += 1;
            let messages = (
                short(std::any::type_name::<O::Message>()),
                short(std::any::type_name::<O::Reply>()),
            );
            self.by_path.insert(O::PATH, messages);
        }
    }

    /// The list of RPCs is `relay.proto`'s: every unary method of `toolrelay.v1.Relay` has
    /// exactly one unit, with the method's request and reply messages, and no unit serves a
    /// path the proto does not have; the streaming methods are the ones `grpc.rs` serves itself.
    #[test]
    fn every_unary_rpc_of_the_proto_has_exactly_one_unit_with_its_messages() {
        let set = prost_types::FileDescriptorSet::decode(toolrelay::proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set decodes");
        let service = set
            .file
            .iter()
            .flat_map(|file| &file.service)
            .find(|service| service.name() == "Relay")
            .expect("relay.proto has the Relay service");
        let mut units = Units::default();
        each(&mut units);
        assert_eq!(units.by_path.len(), units.shown, "a unit is listed twice");
        let mut streaming = Vec::new();
        let mut unary = BTreeMap::new();
        for method in &service.method {
            if method.client_streaming() || method.server_streaming() {
                streaming.push(method.name());
                continue;
            }
            let path = format!("/toolrelay.v1.Relay/{}", method.name());
            unary.insert(
                path,
                (short(method.input_type()), short(method.output_type())),
            );
        }
        streaming.sort_unstable();
        assert_eq!(streaming, ["Connect", "Forward", "WatchManifest"]);
        for (path, messages) in &unary {
            let unit = units
                .by_path
                .get(path.as_str())
                .unwrap_or_else(|| panic!("{path} has no unit (crate::ops's `operations` lists)"));
            assert_eq!(
                unit, messages,
                "{path}: the unit's messages are not the proto's"
            );
        }
        let extra: Vec<_> = units
            .by_path
            .keys()
            .filter(|path| !unary.contains_key(**path))
            .collect();
        assert!(
            extra.is_empty(),
            "units for RPCs relay.proto does not have: {extra:?}"
        );
    }
}
