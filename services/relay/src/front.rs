//! All a front end may use of the relay crate: the gateway names nothing else (a test in the
//! gateway's `lib.rs` checks it). The relay reached in process or over gRPC ([`RelayApi`]) and
//! the units it runs ([`ops`]); who a request's caller is and the budgets it spends
//! ([`limits`]); the errors it answers with; the part of the store a front end keeps its own
//! state in ([`store`]: claim checks, MCP client sessions, rate budgets); and what serving it
//! takes ([`serve`]). Sessions, calls and answers it reaches only through the units.

pub use crate::access::{ApiKeys, GatewaySecrets};
pub use crate::builtin::{FailureCode, FailureKind, Scope, ToolCode, ToolFailure};
pub use crate::caller::{ASSISTANT_USER_HEADERS, CallerId, IdentityKind};
pub use crate::clock::{Clock, Timestamp};
pub use crate::code::{is_handle, random_id, unique_id};
pub use crate::drain::Drain;
pub use crate::metrics::{Metrics, Refusal, RouteLabel};
pub use crate::ops;
pub use crate::relay::{Polled, millis, too_deep_response};
pub use crate::store::{CallNews, CallProgress};
pub use crate::telemetry::{RequestContext, redacted_path};
pub use crate::{
    AnswerLimits, CallInput, Caller, Downlink, ErrorCode, ErrorInfo, ErrorKind, NewSession,
    ProviderLink, RelayApi, RelayError, RequestView, ResponseOutcome, SessionStatus, Transport,
};

/// The settings a front end shares with the relay.
pub mod config {
    pub use crate::config::{
        DEFAULT_DRAIN_SECONDS, DEFAULT_MAX_JSON_DEPTH, ENV_API_KEYS, ENV_API_KEYS_FILE,
        ENV_GATEWAY_SECRET, ENV_GATEWAY_SECRET_FILE, ENV_RATE_LIMIT_SESSION, ENV_RATE_LIMIT_TOOL,
        ServiceArgs, StoreConfig, check_json_depth,
    };
}

/// Callers' budgets and the address ranges they are counted in.
pub mod limits {
    pub use crate::limits::{
        ClientBudgets, DEFAULT_IPV6_PREFIX, RateLimits, client_key, is_within, parse_network,
    };
}

/// The store's face for a front end: what it keeps there itself.
pub mod store {
    pub use crate::store::{
        BudgetStore, FrontStore, McpSessionCaps, McpSessionStore, McpSessionsFull,
    };
}

/// What serving a front end takes: the relay itself, in one process; its connections and their caps, the
/// relay's gRPC server beside it in one process or its client to a relay elsewhere, a store
/// of its own, and a tab's WebSocket.
pub mod serve {
    pub use crate::Relay;
    pub use crate::listen::{ConnectionLimits, Connections, Protocol, serve as serve_connections};
    pub use crate::remote::{RemoteOptions, RemoteRelay};
    pub use crate::server::{Listeners, local, run_sharing, start_store};
    pub use crate::store::connecting::Connection;
    pub use crate::store::memory::{MemoryStore, StoreLimits};
    pub use crate::store::observed::Observed;
    pub use crate::ws::{SocketSettings, serve_upgraded, websocket_config};
}
