//! Label values: the closed sets a label may take (the enums, the store's operations, route
//! templates, methods, error names), so that nothing a client sends becomes a label.

use std::fmt::Write as _;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use toolrelay::wire::RequestStatus;

use crate::store::Transport;

/// The transports of provider connections (polling holds no connection).
pub(super) const CONNECTIONS: [Transport; 3] =
    [Transport::WebSocket, Transport::Sse, Transport::Grpc];

pub(super) fn connection_index(transport: Transport) -> Option<usize> {
    CONNECTIONS.iter().position(|known| *known == transport)
}

pub(super) fn status_index(status: RequestStatus) -> Option<usize> {
    match status {
        RequestStatus::Completed => Some(0),
        RequestStatus::Failed => Some(1),
        RequestStatus::Expired => Some(2),
        RequestStatus::Cancelled => Some(3),
        _ => None,
    }
}

/// What gave a call its final answer: `toolrelay_calls_total{transport}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredBy {
    /// A provider over this transport.
    Provider(Transport),
    /// A tool built into the relay.
    Builtin,
    /// Nothing: the call expired unanswered (or an answer came with no provider attached).
    Nobody,
}

impl AnsweredBy {
    pub(super) const COUNT: usize = 6;
    pub(super) const ALL: [Self; Self::COUNT] = [
        Self::Provider(Transport::WebSocket),
        Self::Provider(Transport::Sse),
        Self::Provider(Transport::Polling),
        Self::Provider(Transport::Grpc),
        Self::Builtin,
        Self::Nobody,
    ];

    pub(super) fn index(self) -> usize {
        match self {
            Self::Provider(Transport::WebSocket) => 0,
            Self::Provider(Transport::Sse) => 1,
            Self::Provider(Transport::Polling) => 2,
            Self::Provider(Transport::Grpc) => 3,
            Self::Builtin => 4,
            Self::Nobody => 5,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider(transport) => transport.as_str(),
            Self::Builtin => "builtin",
            Self::Nobody => "none",
        }
    }
}

/// A rate limit: `toolrelay_rate_limited_total{limit}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimit {
    /// Sessions created per address (gateway).
    Sessions,
    /// Calls per address and session (relay).
    Calls,
    /// Built-in tool calls per address (gateway).
    Tools,
    /// Look-ups of unknown codes per address: the brute-force guard (relay).
    Lookups,
}

impl RateLimit {
    pub(super) const ALL: [Self; 4] = [Self::Sessions, Self::Calls, Self::Tools, Self::Lookups];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sessions => "sessions",
            Self::Calls => "calls",
            Self::Tools => "tools",
            Self::Lookups => "lookups",
        }
    }
}

/// Why a protection refused a connection or request: `toolrelay_refused_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A connection over the cap of connections from one client address.
    ConnectionsPerAddress,
    /// A connection over the cap of connections in total.
    ConnectionsTotal,
    /// A connection that did not send its request head in time.
    HeaderTimeout,
    /// A connection whose request head was larger than allowed.
    HeaderTooLarge,
    /// An MCP `initialize` over the cap of live MCP sessions from one client address.
    McpSessionsPerAddress,
    /// An MCP `initialize` over the cap of live MCP sessions in total.
    McpSessionsTotal,
    /// A cross-site request refused by the Fetch Metadata policy before any code look-up.
    FetchMetadata,
    /// A request whose `Host` is neither the public host nor an allowed name.
    Host,
    /// A gRPC request naming a client address without a valid gateway secret.
    GatewayProof,
    /// A new session over the ceiling of live sessions (`MAX_SESSIONS`).
    SessionsTotal,
    /// A new claim over the ceiling of claims out (`MAX_CLAIMS`).
    ClaimsTotal,
    /// A new manifest over the ceiling of distinct manifests (`MAX_MANIFESTS`).
    ManifestsTotal,
}

impl Refusal {
    pub(super) const ALL: [Self; 12] = [
        Self::ConnectionsPerAddress,
        Self::ConnectionsTotal,
        Self::HeaderTimeout,
        Self::HeaderTooLarge,
        Self::McpSessionsPerAddress,
        Self::McpSessionsTotal,
        Self::FetchMetadata,
        Self::Host,
        Self::GatewayProof,
        Self::SessionsTotal,
        Self::ClaimsTotal,
        Self::ManifestsTotal,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConnectionsPerAddress => "connections_per_address",
            Self::ConnectionsTotal => "connections_total",
            Self::HeaderTimeout => "header_timeout",
            Self::HeaderTooLarge => "header_too_large",
            Self::McpSessionsPerAddress => "mcp_sessions_per_address",
            Self::McpSessionsTotal => "mcp_sessions_total",
            Self::FetchMetadata => "fetch_metadata",
            Self::Host => "host",
            Self::GatewayProof => "gateway_proof",
            Self::SessionsTotal => "sessions_total",
            Self::ClaimsTotal => "claims_total",
            Self::ManifestsTotal => "manifests_total",
        }
    }
}

/// What became of a call that could be routed to its tab's replica (`REPLICA_URL`):
/// `toolrelay_routed_calls_total{way}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Its tab is on the replica that queued it: handed over in the process.
    Local,
    /// Sent to the replica holding its tab, its answer back on the same stream.
    Forwarded,
    /// Taken in from another replica and handed to a tab here (counted by the receiver).
    Accepted,
    /// The tab's replica was gone, draining or unreachable: announced on Redis instead.
    Fallback,
}

impl Route {
    pub(super) const ALL: [Self; 4] =
        [Self::Local, Self::Forwarded, Self::Accepted, Self::Fallback];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Forwarded => "forwarded",
            Self::Accepted => "accepted",
            Self::Fallback => "fallback",
        }
    }
}

/// A MIP tool: `toolrelay_mip_runs_total{tool}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MipTool {
    /// `generate_mip_problem`: a sandbox run building a model.
    Generate,
    /// `solve_mip_problem`: a solve.
    Solve,
    /// `validate_mip_solution`: a sandbox run checking a solution.
    Validate,
}

impl MipTool {
    pub(super) const ALL: [Self; 3] = [Self::Generate, Self::Solve, Self::Validate];

    /// The MIP tool called `name`, as the metrics name it (`None` for any other tool).
    pub fn of_tool(name: &str) -> Option<Self> {
        match name {
            "generate_mip_problem" => Some(Self::Generate),
            "solve_mip_problem" => Some(Self::Solve),
            "validate_mip_solution" => Some(Self::Validate),
            _ => None,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Generate => "generate",
            Self::Solve => "solve",
            Self::Validate => "validate",
        }
    }
}

/// How a MIP run ended: `toolrelay_mip_runs_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MipOutcome {
    /// It ran and answered (a solve: optimal, infeasible, unbounded, …).
    Ok,
    /// A solve reached its time limit (it answers with the best solution so far).
    Timeout,
    /// The solver or the sandbox failed.
    Error,
    /// The input was refused: the code raised, the model is unreadable or too large, an id
    /// is unknown.
    Invalid,
    /// The sandbox stopped the run at a limit (wall clock, CPU, memory, processes).
    Stopped,
    /// Refused because as much was running as may (429).
    Busy,
    /// The sandbox or the store cannot be used here now.
    Unavailable,
}

impl MipOutcome {
    pub(super) const ALL: [Self; 7] = [
        Self::Ok,
        Self::Timeout,
        Self::Error,
        Self::Invalid,
        Self::Stopped,
        Self::Busy,
        Self::Unavailable,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Timeout => "timeout",
            Self::Error => "error",
            Self::Invalid => "invalid",
            Self::Stopped => "stopped",
            Self::Busy => "busy",
            Self::Unavailable => "unavailable",
        }
    }
}

/// Writes [`StoreOperation`] from the store's list of methods ([`crate::store_methods`]): one
/// variant per method (its name after `=>`), labelled with the method's name.
macro_rules! store_operations {
    ($(
        $(#[$part_meta:meta])*
        $part:ident [$($bound:tt)*] {
            $(
                $(#[$meta:meta])*
                fn $method:ident(&self $(, $arg:ident: $type:ty)* $(,)?)
                    -> $output:ty => $operation:ident $body:tt
            )*
        }
    )*) => {
        /// A [`Store`](crate::store::Store) operation:
        /// `toolrelay_store_operation_duration_seconds{operation}`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[allow(missing_docs)] // each is the store method of that name
        pub enum StoreOperation { $($($operation,)*)* }

        impl StoreOperation {
            /// Every operation, in the list's order.
            pub const ALL: &[StoreOperation] = &[$($(StoreOperation::$operation,)*)*];

            /// The label value: the store method's name.
            pub const fn as_str(self) -> &'static str {
                match self { $($(StoreOperation::$operation => stringify!($method),)*)* }
            }
        }
    };
}

crate::store_methods!(store_operations);

/// A route template as a label value (`/api/sessions/{code}/call`, `other`): cheap to clone,
/// so counting a request allocates nothing. Made from the route table, never from a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteLabel(Arc<str>);

impl RouteLabel {
    /// The label of the route template `template`.
    pub fn new(template: &str) -> Self {
        Self(template.into())
    }

    /// The label of requests that match no route.
    pub fn other() -> Self {
        Self::new("other")
    }

    /// The template.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl EncodeLabelValue for RouteLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct HttpLabels {
    pub(super) route: RouteLabel,
    pub(super) method: &'static str,
    pub(super) status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RouteLabels {
    pub(super) route: RouteLabel,
    pub(super) method: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ErrorLabels {
    pub(super) route: RouteLabel,
    pub(super) error: &'static str,
}

/// The method label: the standard methods, else `other`.
pub(super) fn method_label(method: &str) -> &'static str {
    const METHODS: [&str; 7] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];
    METHODS
        .into_iter()
        .find(|known| *known == method)
        .unwrap_or("other")
}
