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

macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal, $kind:ident;)*) => {
        /// A stable error name (`snake_case` on the wire).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The name on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)*
                }
            }

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
    /// The session offers no such function.
    UnknownFunction = "unknown_function", NotFound;
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
}

impl ErrorCode {
    /// The code named `name`; `None` for a name this build does not know (a newer peer's).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|code| code.as_str() == name)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// On the wire, a code is its name.
impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A name this build does not know is refused (a newer peer's code needs a newer reader).
impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&name).ok_or_else(|| de::Error::unknown_variant(&name, &[]))
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
}
