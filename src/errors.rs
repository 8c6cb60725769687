//! Every error name that crosses a seam, as one type: the `error` of HTTP error bodies, the
//! gRPC `x-error` trailer, the browser WebSocket's `error` frames, and the browser SDK's
//! `errors.js` (checked against [`ErrorCode::ALL`] by a test). The relay, the gateway and a
//! remote relay's client name and compare errors only through it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// The class of an error: which status each transport answers it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The input is malformed (HTTP 400).
    BadRequest,
    /// A provider token is needed and missing (HTTP 401).
    Unauthenticated,
    /// The provider token is wrong (HTTP 403).
    Forbidden,
    /// The session, request or function does not exist (HTTP 404).
    NotFound,
    /// The input contradicts earlier input (HTTP 409).
    Conflict,
    /// The input is too large (HTTP 413).
    TooLarge,
    /// What was asked for existed but is no longer kept (HTTP 410).
    Gone,
    /// Too much at once; retry later (HTTP 429).
    TooManyRequests,
    /// The relay cannot serve right now; retry later (HTTP 503).
    Unavailable,
}

/// An enum of stable names: each variant's name on the wire, every variant in order, the
/// variant a name spells, and serde through the name.
macro_rules! named_codes {
    ($(#[$meta:meta])* $name:ident { $($(#[$doc:meta])* $variant:ident = $wire:literal;)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$doc])* $variant,)*
        }

        impl $name {
            /// Every code, in declaration order.
            pub const ALL: &[$name] = &[$($name::$variant,)*];

            /// The name on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)*
                }
            }

            /// The code named `name`; `None` for a name this build does not know (a newer
            /// peer's).
            pub fn parse(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|code| code.as_str() == name)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        /// On the wire, a code is its name.
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        /// A name this build does not know is refused (a newer peer's code needs a newer
        /// reader).
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Self::parse(&name).ok_or_else(|| de::Error::unknown_variant(&name, &[]))
            }
        }
    };
}

macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal, $kind:ident;)*) => {
        named_codes! {
            /// A stable error name (`snake_case` on the wire).
            ErrorCode {
                $($(#[$doc])* $variant = $name;)*
            }
        }

        impl ErrorCode {
            /// The class of the error.
            pub const fn kind(self) -> ErrorKind {
                match self {
                    $(ErrorCode::$variant => ErrorKind::$kind,)*
                }
            }
        }
    };
}

error_codes! {
    /// The session code is not 8 Base32 characters.
    InvalidCode = "invalid_code", BadRequest;
    /// No live session has this code.
    SessionNotFound = "session_not_found", NotFound;
    /// A provider token is needed.
    TokenRequired = "token_required", Unauthenticated;
    /// The provider token is wrong.
    InvalidToken = "invalid_token", Forbidden;
    /// No session has this MCP connector handle.
    UnknownHandle = "unknown_handle", NotFound;
    /// No claim (the one-time secret an MCP App's plugin pairs with) is this one.
    UnknownClaim = "unknown_claim", NotFound;
    /// The claim was redeemed already.
    ClaimUsed = "claim_used", Gone;
    /// The claim was not redeemed in time.
    ClaimExpired = "claim_expired", Gone;
    /// The session offers no such function.
    UnknownFunction = "unknown_function", NotFound;
    /// A read (`…/read`, `read_session_tool`) asked for a function not marked read-only.
    NotReadOnly = "not_read_only", Forbidden;
    /// The arguments do not match the function's schema.
    InvalidArguments = "invalid_arguments", BadRequest;
    /// The request id is malformed.
    InvalidRequestId = "invalid_request_id", BadRequest;
    /// The request id was used for another call.
    RequestIdConflict = "request_id_conflict", Conflict;
    /// The session has no call with this id.
    RequestNotFound = "request_not_found", NotFound;
    /// The session holds as many unanswered calls as it may.
    QueueFull = "queue_full", TooManyRequests;
    /// A built-in tool is saturated.
    ToolBusy = "tool_busy", TooManyRequests;
    /// The manifest is malformed or over a limit.
    InvalidManifest = "invalid_manifest", BadRequest;
    /// The manifest is too large.
    ManifestTooLarge = "manifest_too_large", TooLarge;
    /// A provider's answer is malformed.
    InvalidResponse = "invalid_response", BadRequest;
    /// The store cannot be reached.
    StoreUnavailable = "store_unavailable", Unavailable;
    /// The store is at its memory limit and refuses writes.
    StoreFull = "store_full", Unavailable;
    /// The relay holds as many of something (live sessions) as its operator allows.
    AtCapacity = "at_capacity", Unavailable;
    /// The relay (or gateway) is shutting down.
    ShuttingDown = "shutting_down", Unavailable;
    /// Too many requests from this client.
    RateLimited = "rate_limited", TooManyRequests;
    /// JSON nested deeper than the relay reads.
    NestedTooDeeply = "nested_too_deeply", BadRequest;
    /// A provider's answer is too large.
    ResponseTooLarge = "response_too_large", TooLarge;
    /// The call's answer is no longer kept.
    ResponseEvicted = "response_evicted", Gone;
    /// The gateway cannot reach the relay.
    RelayUnavailable = "relay_unavailable", Unavailable;
    /// Another connection took over the session (a WebSocket `error` frame).
    Replaced = "replaced", Conflict;
    /// A WebSocket frame could not be read.
    InvalidFrame = "invalid_frame", BadRequest;
    /// The provider WebSocket was asked for without a WebSocket handshake.
    WebsocketRequired = "websocket_required", BadRequest;
    /// No such endpoint.
    NotFound = "not_found", NotFound;
    /// The endpoint does not take that method.
    MethodNotAllowed = "method_not_allowed", BadRequest;
    /// A browser on this origin may not call the relay.
    OriginNotAllowed = "origin_not_allowed", Forbidden;
    /// The request body is too large.
    BodyTooLarge = "body_too_large", TooLarge;
    /// The request could not be read.
    InvalidRequest = "invalid_request", BadRequest;
    /// The relay needs an API key for this route.
    ApiKeyRequired = "api_key_required", Unauthenticated;
    /// The API key is not one the relay accepts.
    InvalidApiKey = "invalid_api_key", Unauthenticated;
    /// The server failed (HTTP 500 where the gateway answers it itself; over gRPC, an error
    /// a newer relay named in a way this build does not know).
    InternalError = "internal_error", Unavailable;
    /// A browser was made to send a request it should not have (a cross-site subresource, or
    /// a page on an origin the route does not allow, without the provider token): refused
    /// before any look-up (the Fetch Metadata policy).
    CrossSiteRequest = "cross_site_request", Forbidden;
    /// The request's `Host` is not a name the relay answers to (DNS rebinding): HTTP 421.
    HostNotAllowed = "host_not_allowed", BadRequest;
    /// The tool failed without naming why: the code of a failed answer (and of an MCP tool
    /// result), never of an HTTP refusal.
    ToolError = "tool_error", BadRequest;
    /// The caller cancelled the call: the code of its answer, never of an HTTP refusal.
    Cancelled = "cancelled", Conflict;
    /// The person denied this caller in the tab (the tool never ran).
    ApprovalDeclined = "approval_declined", Forbidden;
    /// The person did not answer the tab's question about this caller in time.
    ApprovalTimeout = "approval_timeout", Forbidden;
    /// The person denied three callers: the session takes no new ones (a new code does).
    ApprovalRefused = "approval_refused", Forbidden;
    /// The person disconnected this caller in the tab: its handle no longer works.
    CallerDisconnected = "caller_disconnected", Forbidden;
    /// The tab answered a question about a caller that is not being asked about.
    ApprovalNotPending = "approval_not_pending", Conflict;
    /// A new caller needs the person's approval, and the session's tab is not open.
    TabNotConnected = "tab_not_connected", Conflict;
}

named_codes! {
    /// The code of a built-in tool's own failure (`SCREAMING_SNAKE_CASE` on the wire): the
    /// tool API's `error.code`, gRPC's `ToolFailure.code`, and a session call's failed answer.
    ToolCode {
        /// The diagram code is missing or blank.
        EmptyCode = "EMPTY_CODE";
        /// The diagram code (or a request body of the tool API) is too large.
        CodeTooLarge = "CODE_TOO_LARGE";
        /// The encoded diagram cannot be decoded.
        InvalidEncoding = "INVALID_ENCODING";
        /// The diagram could not be encoded.
        EncodingFailed = "ENCODING_FAILED";
        /// The PlantUML server's URL is not one the tool uses.
        InvalidServerUrl = "INVALID_SERVER_URL";
        /// No built-in tool has this name.
        ToolNotFound = "TOOL_NOT_FOUND";
        /// The tool API's path names no tool.
        ToolNameRequired = "TOOL_NAME_REQUIRED";
        /// The arguments do not match the tool's schema.
        InvalidArguments = "INVALID_ARGUMENTS";
        /// The tool API's body is not JSON.
        InvalidJson = "INVALID_JSON";
        /// The tool API's route does not take that method.
        MethodNotAllowed = "METHOD_NOT_ALLOWED";
        /// The tool API could not handle the request.
        InternalError = "INTERNAL_ERROR";
        /// The claim-check store cannot be reached.
        StoreUnavailable = "STORE_UNAVAILABLE";
        /// The claim-check store is at its memory limit and refuses writes.
        StoreFull = "STORE_FULL";
        /// The arguments nest deeper than the relay reads.
        NestedTooDeeply = "NESTED_TOO_DEEPLY";
        /// Every slot is taken, or the caller has a run under way.
        Busy = "BUSY";
        /// A stateful tool outside a session needs a scope.
        ScopeRequired = "SCOPE_REQUIRED";
        /// No problem or solution with this id in this scope.
        NotFound = "NOT_FOUND";
        /// The sandboxed run was stopped (time, memory or output over its limit).
        RunStopped = "RUN_STOPPED";
        /// The sandbox cannot be started on this relay.
        SandboxUnavailable = "SANDBOX_UNAVAILABLE";
        /// The sandbox failed.
        SandboxFailed = "SANDBOX_FAILED";
        /// The caller's Python code raised.
        PythonError = "PYTHON_ERROR";
        /// The code did not make one readable model.
        InvalidModel = "INVALID_MODEL";
        /// The model is over the size the relay solves.
        ModelTooLarge = "MODEL_TOO_LARGE";
        /// The solver stopped unexpectedly.
        SolverFailed = "SOLVER_FAILED";
    }
}

/// Why a built-in tool's call failed: the tool's own [`ToolCode`], or the relay's refusal of
/// the call (its [`ErrorCode`], written in capitals on the tool API: `RATE_LIMITED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureCode {
    /// The tool failed.
    Tool(ToolCode),
    /// The call was refused before the tool ran.
    Refused(ErrorCode),
}

impl FailureCode {
    /// The code named `name` (a tool's code first); `None` for a name this build does not
    /// know.
    pub fn parse(name: &str) -> Option<Self> {
        if let Some(code) = ToolCode::parse(name) {
            return Some(Self::Tool(code));
        }
        // A refusal is written in capitals only.
        if name.bytes().any(|byte| byte.is_ascii_lowercase()) {
            return None;
        }
        ErrorCode::parse(&name.to_ascii_lowercase()).map(Self::Refused)
    }

    /// The [`ErrorCode`] this code spells, when it spells one (`NOT_FOUND` is `not_found`).
    pub fn error_code(self) -> Option<ErrorCode> {
        match self {
            Self::Tool(code) => ErrorCode::parse(&code.as_str().to_ascii_lowercase()),
            Self::Refused(code) => Some(code),
        }
    }
}

/// On the wire, a code is its name.
impl Serialize for FailureCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl From<ToolCode> for FailureCode {
    fn from(code: ToolCode) -> Self {
        Self::Tool(code)
    }
}

impl From<ErrorCode> for FailureCode {
    fn from(code: ErrorCode) -> Self {
        Self::Refused(code)
    }
}

impl PartialEq<ToolCode> for FailureCode {
    fn eq(&self, other: &ToolCode) -> bool {
        *self == Self::Tool(*other)
    }
}

/// The name on the wire: a tool's code as it is, a refusal's in capitals.
impl fmt::Display for FailureCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tool(code) => f.write_str(code.as_str()),
            Self::Refused(code) => f.write_str(&code.as_str().to_ascii_uppercase()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for &code in ErrorCode::ALL {
            let name = code.as_str();
            assert!(seen.insert(name), "{name} twice");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
            assert_eq!(ErrorCode::parse(name), Some(code));
        }
        assert_eq!(ErrorCode::parse("no_such_error"), None);
    }

    #[test]
    fn tool_codes_are_unique_screaming_snake_case_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for &code in ToolCode::ALL {
            let name = code.as_str();
            assert!(seen.insert(name), "{name} twice");
            assert!(
                name.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{name}"
            );
            assert_eq!(FailureCode::parse(name), Some(FailureCode::Tool(code)));
        }
        let refused = FailureCode::from(ErrorCode::RateLimited);
        assert_eq!(refused.to_string(), "RATE_LIMITED");
        assert_eq!(FailureCode::parse("RATE_LIMITED"), Some(refused));
        assert_eq!(FailureCode::parse("rate_limited"), None);
        assert_eq!(
            FailureCode::from(ToolCode::NotFound).error_code(),
            Some(ErrorCode::NotFound)
        );
        assert_eq!(FailureCode::from(ToolCode::EmptyCode).error_code(), None);
    }
}
