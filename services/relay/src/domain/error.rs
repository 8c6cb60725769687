//! The relay's one error type, mapped once per transport (gRPC status, WebSocket `error`
//! frame, HTTP error body).
//!
//! Every message tells the caller what to do next; internal causes (a store failure) stay in
//! the logs.

use std::time::Duration;

use thiserror::Error;

/// A store operation failed.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The store did not answer, or answered something unreadable (connection lost, timeout,
    /// corrupt data).
    #[error("store error: {0}")]
    Unavailable(String),
    /// The store refused a write because it is at its memory limit (a Redis at `maxmemory`
    /// with the `noeviction` policy answers `OOM`).
    #[error(
        "the store is full and refuses writes ({0}): raise Redis's maxmemory, or free memory (fewer or shorter-lived sessions, a smaller RESPONSE_BUDGET_MB)"
    )]
    Full(String),
}

/// A [`StoreError::Unavailable`] saying `message`. Written like the tuple struct the error
/// used to be, which the store implementations construct in many places.
#[allow(non_snake_case)] // it stands in for a tuple struct's constructor
pub fn StoreError(message: String) -> StoreError {
    StoreError::Unavailable(message)
}

pub use toolrelay::errors::{ErrorCode, ErrorKind};

/// Why the relay refused or could not complete an operation.
#[derive(Debug, Error)]
pub enum RelayError {
    /// The session code is not 8 Base32 characters.
    #[error(
        "A session code is 8 characters of A-Z and 2-7, like ABCD-EFGH. Ask the user to copy the code from the plugin again."
    )]
    InvalidCode,
    /// No live session has this code.
    #[error(
        "No active session {code}: it has expired or never existed. Ask the user for the current code shown in the plugin."
    )]
    SessionNotFound {
        /// The code, as people see it.
        code: String,
    },
    /// A provider operation came without the provider token.
    #[error(
        "This needs the session's provider token (Authorization: Bearer <token>, or ?token=). The pairing code alone only lets you call tools."
    )]
    TokenRequired,
    /// The provider token does not match the session.
    #[error("The provider token does not belong to session {code}.")]
    InvalidToken {
        /// The code, as people see it.
        code: String,
    },
    /// No live session has this MCP connector handle.
    #[error(
        "This connector URL belongs to no active session: the session has expired or ended. Ask the user for the plugin's current connector URL or pairing code."
    )]
    UnknownHandle,
    /// No claim is this one (or it was never minted here).
    #[error(
        "This claim is not one the relay minted. Open CODAP again from the assistant (open_codap), or pair with the code shown in the plugin."
    )]
    UnknownClaim,
    /// The claim was redeemed already: it pairs one tab, once.
    #[error(
        "This claim was used already: a claim pairs one tab, once. Ask the assistant to open CODAP again (open_codap), or pair with the code shown in the plugin."
    )]
    ClaimUsed,
    /// The claim was not redeemed before its expiry, or its session has ended.
    #[error(
        "This claim has expired (a claim is good for {minutes} minutes) or its session has ended. Ask the assistant to open CODAP again (open_codap), or pair with the code shown in the plugin."
    )]
    ClaimExpired {
        /// How long a claim is good for, in minutes.
        minutes: u64,
    },
    /// The session's manifest has no such function.
    #[error(
        "Session {code} has no function {name}{in_tool}. Available functions: {available}. GET the session's metadata for their parameters."
    )]
    UnknownFunction {
        /// The code, as people see it.
        code: String,
        /// The function asked for.
        name: String,
        /// ` in tool X` when the caller named a tool id.
        in_tool: String,
        /// Comma-separated names of the functions there are.
        available: String,
    },
    /// A read asked for a function not marked read-only.
    #[error(
        "{function} is not marked read-only: it may change the user's data, so it does not run as a read. Call it as a change instead (MCP: call_session_tool; REST: POST /api/sessions/{{code}}/call), which the host may confirm with the user."
    )]
    NotReadOnly {
        /// The function asked for.
        function: String,
    },
    /// The arguments break the function's JSON Schema.
    #[error(
        "The arguments for {function} do not match its schema: {problems}. Correct them and call again."
    )]
    InvalidArguments {
        /// The function called.
        function: String,
        /// Each problem with where it is, e.g. `/age: "x" is not of type "integer"`.
        problems: String,
    },
    /// A client-chosen request id is malformed.
    #[error("requestId must be 1 to 128 characters: letters, digits, '.', '_', ':' or '-'.")]
    InvalidRequestId,
    /// The request id was used before with a different body.
    #[error(
        "requestId {request_id} was already used for a different call in this session. Use a new requestId, or repeat the original call exactly."
    )]
    RequestIdConflict {
        /// The id.
        request_id: String,
    },
    /// No request with this id in the session.
    #[error("Session {code} has no request {request_id}; responses are kept for one hour.")]
    RequestNotFound {
        /// The code, as people see it.
        code: String,
        /// The id.
        request_id: String,
    },
    /// A provider's answer to a call it may not answer: the relay's own (built-in), or one not
    /// delivered to it. Named `request_not_found`: to the provider, no such call of its own.
    #[error(
        "Session {code} has no call {request_id} waiting for this tab's answer: a tab answers only the calls it received (tool-request), never the relay's built-in ones. The answer was not kept."
    )]
    NotDelivered {
        /// The code, as people see it.
        code: String,
        /// The id the answer named.
        request_id: String,
    },
    /// The session already has the maximum of unanswered calls.
    #[error(
        "Session {code} already has {limit} calls waiting for the tab. Wait for some to finish, then try again."
    )]
    QueueFull {
        /// The code, as people see it.
        code: String,
        /// `MAX_PENDING_PER_SESSION`.
        limit: usize,
        /// When trying again makes sense.
        retry_after: Duration,
    },
    /// A built-in tool is running as much as it may at once.
    #[error("{message}")]
    ToolBusy {
        /// The tool's own message.
        message: String,
        /// When trying again makes sense.
        retry_after: Duration,
    },
    /// The manifest is malformed; the previous one stays.
    #[error("The manifest was refused: {reason}. The previous manifest stays in use.")]
    InvalidManifest {
        /// What is wrong, and where.
        reason: String,
    },
    /// The manifest is over the size limit; the previous one stays.
    #[error(
        "The manifest is {size} bytes, over the limit of {limit}. Shorten descriptions or register fewer functions; the previous manifest stays in use."
    )]
    ManifestTooLarge {
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// A provider's response is malformed.
    #[error("The response was refused: {reason}.")]
    InvalidResponse {
        /// What is wrong.
        reason: String,
    },
    /// The store cannot be reached.
    #[error("The relay cannot reach its store right now. Try again in a few seconds.")]
    StoreUnavailable(StoreError),
    /// The store is full: it refuses writes until its operator gives it room.
    #[error(
        "The relay's store is full and refuses new work right now. Try again in a minute; if it lasts, tell the relay's operator (its store is at its memory limit)."
    )]
    StoreFull(StoreError),
    /// The relay holds as many of something as its operator allows (a global ceiling).
    #[error(
        "The relay holds as many {what} as it may ({limit} = {value}). Try again in a minute; if it lasts, tell the relay's operator."
    )]
    AtCapacity {
        /// What is at its ceiling, e.g. "live sessions".
        what: &'static str,
        /// The setting that names the ceiling, e.g. `MAX_SESSIONS`.
        limit: &'static str,
        /// Its value.
        value: usize,
    },
    /// The person did not allow the caller (declined, did not answer in time, or the session
    /// takes no new callers).
    #[error("{message}")]
    Approval {
        /// Which: `approval_declined`, `approval_timeout` or `approval_refused`.
        code: ErrorCode,
        /// What it means and what to do.
        message: String,
    },
    /// A caller handle the person disconnected.
    #[error(
        "The person disconnected you from this session in their tab, so this handle no longer works. Ask them for the pairing code again if they want you back."
    )]
    CallerDisconnected,
    /// The tab answered about a caller nobody asks about.
    #[error(
        "No question about this caller is open (it was answered, in this tab or another, or it lapsed)."
    )]
    ApprovalNotPending,
    /// A new caller needs the person's approval and the tab is closed.
    #[error(
        "The person's CODAP (or the page serving session {code}) is not open, and they must allow you in it the first time. Ask them to open it, then call again."
    )]
    TabNotConnected {
        /// The code, as people see it.
        code: String,
    },
    /// The relay is stopping.
    #[error("The relay is restarting. Reconnect in a moment.")]
    ShuttingDown,
    /// The relay stopped before the call was answered; the call may still be answered.
    #[error(
        "The relay is restarting and call {request_id} of session {code} has no answer yet. In a few seconds, GET /api/sessions/{code}/requests/{request_id} for its answer (do not call again: it may still run)."
    )]
    Drained {
        /// The code, as people see it.
        code: String,
        /// The call's id, to ask for its answer later.
        request_id: String,
    },
    /// A consumer reached the relay directly without an API key, and the operator set some.
    #[error(
        "This relay needs an API key: send it as authorization: Bearer <key> (its operator gives them out)."
    )]
    ApiKeyRequired,
    /// The API key is not one the relay accepts.
    #[error("The API key is not one this relay accepts. Check the key its operator gave you.")]
    InvalidApiKey,
    /// Too many requests of one kind from one address.
    #[error("Too many {what} from your address. Wait {} s, then try again.", retry_after.as_secs().max(1))]
    RateLimited {
        /// What was counted, e.g. "look-ups of unknown session codes".
        what: &'static str,
        /// When trying again makes sense.
        retry_after: Duration,
    },
    /// The call ran, but its answer is no longer kept (the answer budget evicted it).
    #[error(
        "Call {request_id} ran, but its answer is no longer kept: the relay keeps answers within a memory budget, oldest first. Do not call again to learn what happened unless you need the answer; then call again with a new requestId."
    )]
    ResponseEvicted {
        /// The call's id.
        request_id: String,
    },
    /// JSON nested deeper than the relay accepts.
    #[error(
        "{what} nested more than {limit} levels deep, which the relay does not accept. Send flatter JSON."
    )]
    NestedTooDeeply {
        /// What was too deep, as the subject of the message: "The arguments are".
        what: &'static str,
        /// The limit, in levels.
        limit: usize,
    },
    /// A provider's response is over the size limit.
    #[error(
        "The response is {size} bytes, over the limit of {limit}. Return less data; the caller was told the answer was too large."
    )]
    ResponseTooLarge {
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
}

/// When to try again after the store refused a write for being full.
const STORE_FULL_RETRY: Duration = Duration::from_secs(10);
/// When to try again after a global ceiling refused something new (things expire by the
/// minute).
const AT_CAPACITY_RETRY: Duration = Duration::from_secs(60);

/// A store failure, by its kind: full, or unavailable.
impl From<StoreError> for RelayError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Full(_) => Self::StoreFull(error),
            StoreError::Unavailable(_) => Self::StoreUnavailable(error),
        }
    }
}

/// What an error says in place of the session's code to a caller that named the session by a
/// connector or caller handle: the handle is a secret (the caller's own, but no part of a
/// message), and the code is one the caller was never given.
pub const BY_HANDLE: &str = "(by its handle)";

impl RelayError {
    /// The same error, for a caller that named the session by a handle: no session code in
    /// it ([`BY_HANDLE`] in its place).
    #[must_use]
    pub fn named_by_handle(mut self) -> Self {
        match &mut self {
            Self::SessionNotFound { code }
            | Self::InvalidToken { code }
            | Self::UnknownFunction { code, .. }
            | Self::RequestNotFound { code, .. }
            | Self::NotDelivered { code, .. }
            | Self::QueueFull { code, .. }
            | Self::TabNotConnected { code }
            | Self::Drained { code, .. } => BY_HANDLE.clone_into(code),
            _ => {}
        }
        self
    }

    /// What went wrong, by name: for error bodies, frames and the gRPC `x-error` trailer.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidCode => ErrorCode::InvalidCode,
            Self::SessionNotFound { .. } => ErrorCode::SessionNotFound,
            Self::TokenRequired => ErrorCode::TokenRequired,
            Self::InvalidToken { .. } => ErrorCode::InvalidToken,
            Self::UnknownHandle => ErrorCode::UnknownHandle,
            Self::UnknownClaim => ErrorCode::UnknownClaim,
            Self::ClaimUsed => ErrorCode::ClaimUsed,
            Self::ClaimExpired { .. } => ErrorCode::ClaimExpired,
            Self::UnknownFunction { .. } => ErrorCode::UnknownFunction,
            Self::NotReadOnly { .. } => ErrorCode::NotReadOnly,
            Self::InvalidArguments { .. } => ErrorCode::InvalidArguments,
            Self::InvalidRequestId => ErrorCode::InvalidRequestId,
            Self::RequestIdConflict { .. } => ErrorCode::RequestIdConflict,
            Self::RequestNotFound { .. } | Self::NotDelivered { .. } => ErrorCode::RequestNotFound,
            Self::QueueFull { .. } => ErrorCode::QueueFull,
            Self::ToolBusy { .. } => ErrorCode::ToolBusy,
            Self::InvalidManifest { .. } => ErrorCode::InvalidManifest,
            Self::ManifestTooLarge { .. } => ErrorCode::ManifestTooLarge,
            Self::InvalidResponse { .. } => ErrorCode::InvalidResponse,
            Self::StoreUnavailable(_) => ErrorCode::StoreUnavailable,
            Self::StoreFull(_) => ErrorCode::StoreFull,
            Self::AtCapacity { .. } => ErrorCode::AtCapacity,
            Self::Approval { code, .. } => *code,
            Self::CallerDisconnected => ErrorCode::CallerDisconnected,
            Self::ApprovalNotPending => ErrorCode::ApprovalNotPending,
            Self::TabNotConnected { .. } => ErrorCode::TabNotConnected,
            Self::ShuttingDown => ErrorCode::ShuttingDown,
            Self::Drained { .. } => ErrorCode::ShuttingDown,
            Self::ApiKeyRequired => ErrorCode::ApiKeyRequired,
            Self::InvalidApiKey => ErrorCode::InvalidApiKey,
            Self::RateLimited { .. } => ErrorCode::RateLimited,
            Self::NestedTooDeeply { .. } => ErrorCode::NestedTooDeeply,
            Self::ResponseTooLarge { .. } => ErrorCode::ResponseTooLarge,
            Self::ResponseEvicted { .. } => ErrorCode::ResponseEvicted,
        }
    }

    /// The error's name on the wire.
    pub fn name(&self) -> &'static str {
        self.code().as_str()
    }

    /// The class of error, for transports to pick a status.
    pub fn kind(&self) -> ErrorKind {
        self.code().kind()
    }

    /// When a retry makes sense, for errors that have one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::QueueFull { retry_after, .. }
            | Self::ToolBusy { retry_after, .. }
            | Self::RateLimited { retry_after, .. } => Some(*retry_after),
            Self::StoreUnavailable(_) | Self::ShuttingDown | Self::Drained { .. } => {
                Some(Duration::from_secs(2))
            }
            // Room comes back when an operator acts or sessions expire, not in a moment.
            Self::StoreFull(_) => Some(STORE_FULL_RETRY),
            Self::AtCapacity { .. } => Some(AT_CAPACITY_RETRY),
            _ => None,
        }
    }
}

/// An error as data, the same whether it arose in this process or came back over gRPC: what
/// the gateway and the browser WebSocket need to answer a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorInfo {
    /// The class of error.
    pub kind: ErrorKind,
    /// What went wrong, by name.
    pub code: ErrorCode,
    /// What the caller should do.
    pub message: String,
    /// When a retry makes sense.
    pub retry_after: Option<Duration>,
    /// The call the error leaves unfinished, whose answer the caller can ask for later.
    pub request_id: Option<String>,
}

impl ErrorInfo {
    /// An error `code`, of its kind.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            kind: code.kind(),
            code,
            message: message.into(),
            retry_after: None,
            request_id: None,
        }
    }
}

impl From<RelayError> for ErrorInfo {
    fn from(error: RelayError) -> Self {
        match &error {
            RelayError::StoreUnavailable(cause) => tracing::error!(%cause, "store unavailable"),
            RelayError::StoreFull(cause) => tracing::error!(%cause, "store full"),
            _ => {}
        }
        let request_id = match &error {
            RelayError::Drained { request_id, .. } | RelayError::ResponseEvicted { request_id } => {
                Some(request_id.clone())
            }
            _ => None,
        };
        Self {
            kind: error.kind(),
            code: error.code(),
            message: error.to_string(),
            retry_after: error.retry_after(),
            request_id,
        }
    }
}

impl std::fmt::Display for ErrorInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}
