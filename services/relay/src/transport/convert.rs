//! `From`/`TryFrom` between the relay's own types and their protobuf messages, both ways: the
//! gRPC server (`grpc.rs`) converts one way and a remote relay's client (`remote.rs`) the
//! other. The wire types ([`toolrelay::wire`]) convert in the shared crate
//! ([`toolrelay::convert`], beside both types); the tests below hold every pair, of both
//! places, to a round trip.

use serde_json::Value;
use std::time::Duration;
use toolrelay::convert::{Malformed, non_empty};

use toolrelay::json::{from_struct, from_value, to_value};
use toolrelay::proto::v1 as pb;
use toolrelay::wire::FlatTool;

use crate::builtin::{BUILTIN_GROUP, FailureCode, FailureKind, Scope, ToolFailure, ToolInfo};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::{ErrorCode, RelayError};
use crate::provider::{Downlink, Refusal, Uplink};
use crate::relay::{CallInput, NewSession, RequestView, SessionStatus};
use crate::store::{CallProgress, Transport};

/// A count as protobuf's `u32` (saturating).
pub(crate) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl From<Timestamp> for prost_types::Timestamp {
    fn from(at: Timestamp) -> Self {
        let (seconds, nanos) = at.seconds_and_nanos();
        Self { seconds, nanos }
    }
}

/// A protobuf time, to the millisecond; not set is 0.
impl From<Option<prost_types::Timestamp>> for Timestamp {
    fn from(at: Option<prost_types::Timestamp>) -> Self {
        at.map_or(Self(0), |at| {
            Self(at.seconds.saturating_mul(1000) + i64::from(at.nanos / 1_000_000))
        })
    }
}

impl From<SessionStatus> for pb::SessionInfo {
    fn from(status: SessionStatus) -> Self {
        Self {
            code: status.code.as_str().to_owned(),
            created_at: Some(status.created_at.into()),
            expires_at: Some(status.expires_at.into()),
            max_expires_at: Some(status.max_expires_at.into()),
            provider_connected: status.transport.is_some(),
            transport: status
                .transport
                .map(Transport::as_str)
                .unwrap_or_default()
                .to_owned(),
            tool_count: count(status.tool_count),
            pending_requests: count(status.pending_requests),
            mcp_handle: status.mcp_handle,
        }
    }
}

impl TryFrom<pb::SessionInfo> for SessionStatus {
    type Error = Malformed;

    fn try_from(info: pb::SessionInfo) -> Result<Self, Malformed> {
        Ok(Self {
            code: SessionCode::parse(&info.code).map_err(|_| Malformed("a session code"))?,
            created_at: info.created_at.into(),
            expires_at: info.expires_at.into(),
            max_expires_at: info.max_expires_at.into(),
            transport: Transport::parse(&info.transport),
            tool_count: info.tool_count as usize,
            pending_requests: info.pending_requests as usize,
            mcp_handle: info.mcp_handle,
        })
    }
}

impl From<FailureKind> for pb::FailureKind {
    fn from(kind: FailureKind) -> Self {
        match kind {
            FailureKind::BadInput => Self::BadInput,
            FailureKind::TooLarge => Self::TooLarge,
            FailureKind::NotFound => Self::NotFound,
            FailureKind::Busy => Self::Busy,
            FailureKind::Internal => Self::Internal,
            FailureKind::Unavailable => Self::Unavailable,
        }
    }
}

impl From<pb::FailureKind> for FailureKind {
    fn from(kind: pb::FailureKind) -> Self {
        match kind {
            pb::FailureKind::BadInput => Self::BadInput,
            pb::FailureKind::TooLarge => Self::TooLarge,
            pb::FailureKind::NotFound => Self::NotFound,
            pb::FailureKind::Busy => Self::Busy,
            pb::FailureKind::Internal | pb::FailureKind::Unspecified => Self::Internal,
            pb::FailureKind::Unavailable => Self::Unavailable,
        }
    }
}

impl From<ToolFailure> for pb::ToolFailure {
    fn from(failure: ToolFailure) -> Self {
        Self {
            kind: pb::FailureKind::from(failure.kind).into(),
            code: failure.code.to_string(),
            message: failure.message,
            retry_after_seconds: failure
                .retry_after
                .map_or(0, |wait| u32::try_from(wait.as_secs()).unwrap_or(u32::MAX)),
        }
    }
}

impl From<pb::ToolFailure> for ToolFailure {
    fn from(failure: pb::ToolFailure) -> Self {
        Self {
            kind: failure.kind().into(),
            retry_after: (failure.retry_after_seconds > 0)
                .then(|| Duration::from_secs(u64::from(failure.retry_after_seconds))),
            // A code a newer relay named that this build does not know: as the relay's failure.
            code: FailureCode::parse(&failure.code)
                .unwrap_or(FailureCode::Refused(ErrorCode::InternalError)),
            message: failure.message,
        }
    }
}

/// A built-in tool as a protobuf `Tool` (in the built-in group).
impl From<ToolInfo> for pb::Tool {
    fn from(tool: ToolInfo) -> Self {
        FlatTool {
            name: tool.name,
            description: tool.description,
            input_schema: tool.input_schema,
            tool_id: Some(BUILTIN_GROUP.to_owned()),
            hints: tool.hints,
            output_schema: tool.output_schema,
        }
        .into()
    }
}

impl From<pb::Tool> for ToolInfo {
    fn from(tool: pb::Tool) -> Self {
        Self {
            hints: toolrelay::convert::hints_of(&tool),
            output_schema: tool.output_schema.as_ref().map(from_struct),
            name: tool.name,
            description: tool.description,
            input_schema: tool.input_schema.as_ref().map_or(Value::Null, from_struct),
        }
    }
}

impl CallInput {
    /// A call as the gRPC `Submit` and `Call` messages carry it.
    pub(crate) fn from_message(
        request_id: String,
        tool_id: String,
        function_name: String,
        args: Option<prost_types::Struct>,
        read_only: bool,
    ) -> Self {
        Self {
            request_id: toolrelay::convert::non_empty(request_id),
            tool_id: toolrelay::convert::non_empty(tool_id),
            function_name,
            args: args.map_or(Value::Null, |args| from_struct(&args)),
            correlation_id: None,
            read_only,
            // Who makes the call is the relay's to say, from the request's caller.
            caller: None,
            approval: crate::store::ApprovalCheck::Exempt,
            asker: None,
        }
    }
}

impl From<NewSession> for pb::CreateSessionResponse {
    fn from(session: NewSession) -> Self {
        Self {
            code: session.code.as_str().to_owned(),
            provider_token: session.provider_token,
            ttl_seconds: u32::try_from(session.ttl.as_secs()).unwrap_or(u32::MAX),
            expires_at: Some(session.expires_at.into()),
            mcp_handle: session.mcp_handle,
            max_expires_at: Some(session.max_expires_at.into()),
        }
    }
}

impl TryFrom<pb::CreateSessionResponse> for NewSession {
    type Error = Malformed;

    fn try_from(created: pb::CreateSessionResponse) -> Result<Self, Malformed> {
        Ok(Self {
            code: SessionCode::parse(&created.code).map_err(|_| Malformed("a session code"))?,
            provider_token: created.provider_token,
            ttl: Duration::from_secs(u64::from(created.ttl_seconds)),
            expires_at: created.expires_at.into(),
            max_expires_at: created.max_expires_at.into(),
            mcp_handle: created.mcp_handle,
        })
    }
}

impl From<Scope> for Option<pb::call_tool_request::Scope> {
    fn from(scope: Scope) -> Self {
        use pb::call_tool_request::Scope as PbScope;
        match scope {
            Scope::Session(code) => Some(PbScope::SessionCode(code.as_str().to_owned())),
            Scope::Mcp(id) => Some(PbScope::McpSession(id)),
            Scope::Caller(id) => Some(PbScope::CallerScope(id)),
            Scope::None => None,
        }
    }
}

/// A tool call's scope; a malformed session code is the caller's error.
impl TryFrom<Option<pb::call_tool_request::Scope>> for Scope {
    type Error = RelayError;

    fn try_from(scope: Option<pb::call_tool_request::Scope>) -> Result<Self, RelayError> {
        use pb::call_tool_request::Scope as PbScope;
        Ok(match scope {
            Some(PbScope::SessionCode(code)) => Self::Session(SessionCode::parse(&code)?),
            Some(PbScope::McpSession(id)) => Self::Mcp(id),
            Some(PbScope::CallerScope(id)) => Self::Caller(id),
            None => Self::None,
        })
    }
}

/// A built-in tool's run: its result, or its failure.
pub(crate) fn tool_run_message(ran: Result<Value, ToolFailure>) -> pb::CallToolResponse {
    match ran {
        Ok(result) => pb::CallToolResponse {
            success: true,
            result: Some(to_value(&result)),
            failure: None,
        },
        Err(failure) => pb::CallToolResponse {
            success: false,
            result: None,
            failure: Some(failure.into()),
        },
    }
}

/// A built-in tool's run from its protobuf form (the inverse of [`tool_run_message`]).
pub(crate) fn tool_run(reply: pb::CallToolResponse) -> Result<Value, ToolFailure> {
    if reply.success {
        Ok(reply.result.as_ref().map_or(Value::Null, from_value))
    } else {
        Err(reply.failure.unwrap_or_default().into())
    }
}

impl From<RequestView> for pb::RequestState {
    fn from(view: RequestView) -> Self {
        Self {
            request_id: view.request_id,
            status: pb::RequestStatus::from(view.status).into(),
            response: view.response.map(Into::into),
            provider_connected: view.provider_connected,
            untrusted_content: view.untrusted,
            progress: view.progress.map(|progress| pb::CallProgress {
                progress: progress.progress,
                total: progress.total,
                message: progress.message.unwrap_or_default(),
                at: Some(progress.at.into()),
            }),
            news: view
                .news
                .iter()
                .filter_map(|news| serde_json::to_string(news).ok())
                .collect(),
        }
    }
}

impl From<pb::RequestState> for RequestView {
    fn from(state: pb::RequestState) -> Self {
        Self {
            provider_connected: state.provider_connected,
            untrusted: state.untrusted_content,
            status: state.status().into(),
            progress: state.progress.map(|progress| CallProgress {
                progress: progress.progress,
                total: progress.total,
                message: non_empty(progress.message),
                at: progress.at.into(),
            }),
            // News a relay wrote and this one cannot read is left out: news is a hint.
            news: state
                .news
                .iter()
                .filter_map(|news| serde_json::from_str(news).ok())
                .collect(),
            request_id: state.request_id,
            response: state.response.map(Into::into),
        }
    }
}

impl From<Downlink> for pb::RelayMessage {
    fn from(message: Downlink) -> Self {
        use pb::relay_message::Kind;
        let kind = match message {
            Downlink::Welcome { code, expires_at } => Kind::Welcome(pb::Welcome {
                code: code.as_str().to_owned(),
                expires_at: Some(expires_at.into()),
                protocol_version: toolrelay::PROTOCOL_VERSION.to_owned(),
            }),
            Downlink::ToolRequest { request, seq } => Kind::ToolRequest(pb::ToolRequest {
                seq,
                ..request.into_request().into()
            }),
            Downlink::Heartbeat {
                expires_at,
                answers_ping,
            } => Kind::Heartbeat(pb::Heartbeat {
                expires_at: Some(expires_at.into()),
                answers_ping,
            }),
            Downlink::Registered { tools } => Kind::Registered(pb::Registered {
                tool_count: count(tools),
            }),
            Downlink::Expired { message } => Kind::Expired(pb::Expired { message }),
            Downlink::Cancel { request_id } => Kind::Cancel(pb::Cancel { request_id }),
            Downlink::ApprovalRequest(card) => Kind::ApprovalRequest(card_message(*card)),
            Downlink::ApprovalClosed(closed) => {
                let (caller_id, outcome) = *closed;
                Kind::ApprovalClosed(pb::ApprovalClosed { caller_id, outcome })
            }
            Downlink::Callers(callers) => {
                let (allowed, refused) = *callers;
                Kind::Callers(pb::Callers {
                    allowed: allowed.into_iter().map(card_message).collect(),
                    refused,
                })
            }
            other @ (Downlink::Error { .. } | Downlink::Replaced | Downlink::Restarting) => {
                let (error, message) = other
                    .error()
                    .unwrap_or((ErrorCode::InternalError, String::new()));
                Kind::Error(pb::RelayError {
                    error: error.as_str().to_owned(),
                    message,
                    request_id: String::new(),
                })
            }
            Downlink::Ack {
                request_id,
                refusal,
            } => {
                let (error, message) = refusal.map_or_else(Default::default, |refusal| {
                    (refusal.error.as_str().to_owned(), refusal.message)
                });
                Kind::Ack(pb::Ack {
                    request_id,
                    error,
                    message,
                })
            }
            Downlink::NotStored {
                request_id,
                refusal,
            } => Kind::Error(pb::RelayError {
                error: refusal.error.as_str().to_owned(),
                message: refusal.message,
                request_id,
            }),
        };
        Self { kind: Some(kind) }
    }
}

impl TryFrom<pb::RelayMessage> for Downlink {
    type Error = Malformed;

    fn try_from(message: pb::RelayMessage) -> Result<Self, Malformed> {
        use pb::relay_message::Kind;
        Ok(
            match message
                .kind
                .ok_or(Malformed("a relay message with no kind"))?
            {
                Kind::Welcome(welcome) => Self::Welcome {
                    code: SessionCode::parse(&welcome.code)
                        .map_err(|_| Malformed("a session code"))?,
                    expires_at: welcome.expires_at.into(),
                },
                Kind::ToolRequest(request) => Self::ToolRequest {
                    seq: request.seq,
                    request: toolrelay::wire::ToolRequest::from(request).into(),
                },
                Kind::Heartbeat(heartbeat) => Self::Heartbeat {
                    expires_at: heartbeat.expires_at.into(),
                    answers_ping: heartbeat.answers_ping,
                },
                Kind::Registered(registered) => Self::Registered {
                    tools: registered.tool_count as usize,
                },
                Kind::Error(error) => match ErrorCode::parse(&error.error) {
                    code if !error.request_id.is_empty() => Self::NotStored {
                        request_id: error.request_id,
                        refusal: Box::new(Refusal {
                            error: code.unwrap_or(ErrorCode::InternalError),
                            message: error.message,
                        }),
                    },
                    Some(ErrorCode::Replaced) => Self::Replaced,
                    Some(ErrorCode::ShuttingDown) => Self::Restarting,
                    code => Self::Error {
                        error: code.unwrap_or(ErrorCode::InternalError),
                        message: error.message,
                    },
                },
                Kind::Ack(ack) => Self::Ack {
                    request_id: ack.request_id,
                    refusal: (!ack.error.is_empty()).then(|| {
                        Box::new(Refusal {
                            error: ErrorCode::parse(&ack.error).unwrap_or(ErrorCode::InternalError),
                            message: ack.message,
                        })
                    }),
                },
                Kind::Expired(expired) => Self::Expired {
                    message: expired.message,
                },
                Kind::Cancel(cancel) => Self::Cancel {
                    request_id: cancel.request_id,
                },
                Kind::ApprovalRequest(card) => Self::ApprovalRequest(Box::new(card_of(card))),
                Kind::ApprovalClosed(closed) => {
                    Self::ApprovalClosed(Box::new((closed.caller_id, closed.outcome)))
                }
                Kind::Callers(callers) => Self::Callers(Box::new((
                    callers.allowed.into_iter().map(card_of).collect(),
                    callers.refused,
                ))),
            },
        )
    }
}

pub(crate) fn card_message(card: toolrelay::wire::CallerCard) -> pb::CallerCard {
    pb::CallerCard {
        caller_id: card.caller_id,
        label: card.label,
        via: card.via,
        address: card.address,
        shared_address: card.shared_address,
        at: card.at,
    }
}

pub(crate) fn card_of(card: pb::CallerCard) -> toolrelay::wire::CallerCard {
    toolrelay::wire::CallerCard {
        caller_id: card.caller_id,
        label: card.label,
        via: card.via,
        address: card.address,
        shared_address: card.shared_address,
        at: card.at,
    }
}

impl From<Uplink> for pb::ProviderMessage {
    fn from(up: Uplink) -> Self {
        match up {
            Uplink::Frame(frame) => frame.into(),
            Uplink::Heard => Self {
                kind: Some(pb::provider_message::Kind::Heard(pb::Heard {})),
            },
        }
    }
}

impl TryFrom<pb::ProviderMessage> for Uplink {
    type Error = Malformed;

    fn try_from(message: pb::ProviderMessage) -> Result<Self, Malformed> {
        match message.kind {
            Some(pb::provider_message::Kind::Heard(_)) => Ok(Self::Heard),
            _ => toolrelay::wire::ProviderFrame::try_from(message).map(Self::Frame),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolrelay::wire::{
        FunctionSpec, GroupedManifest, ProviderFrame, ProviderResponse, RequestStatus, ToolError,
        ToolGroup, ToolHints, ToolRequest, ToolResponse,
    };

    use super::*;
    use crate::builtin::ToolCode;
    use crate::store::CallNews;

    /// `value` to `M` and back.
    fn round_trip<T, M>(value: T) -> T
    where
        T: Into<M>,
        M: Into<T>,
    {
        value.into().into()
    }

    fn at(millis: i64) -> Timestamp {
        Timestamp(millis)
    }

    #[test]
    fn a_session_survives_the_round_trip() {
        let status = SessionStatus {
            code: SessionCode::parse("ABCD2345").unwrap(),
            created_at: at(1_700_000_000_123),
            expires_at: at(1_700_000_600_456),
            max_expires_at: at(1_700_003_600_789),
            transport: Some(Transport::Sse),
            tool_count: 7,
            pending_requests: 2,
            mcp_handle: "handle".into(),
        };
        assert_eq!(
            SessionStatus::try_from(pb::SessionInfo::from(status.clone())),
            Ok(status)
        );
        let malformed = pb::SessionInfo {
            code: "nope".into(),
            ..pb::SessionInfo::default()
        };
        assert!(SessionStatus::try_from(malformed).is_err());
    }

    #[test]
    fn a_new_session_and_a_tool_call_s_scope_and_run_survive_the_round_trip() {
        let created = NewSession {
            code: SessionCode::parse("ABCD2345").unwrap(),
            provider_token: "token".into(),
            ttl: std::time::Duration::from_secs(600),
            expires_at: at(1_700_000_600_000),
            max_expires_at: at(1_700_003_600_000),
            mcp_handle: "handle".into(),
        };
        let back = NewSession::try_from(pb::CreateSessionResponse::from(created.clone())).unwrap();
        assert_eq!(
            (
                back.code,
                back.provider_token,
                back.ttl,
                back.expires_at,
                back.max_expires_at,
                back.mcp_handle
            ),
            (
                created.code,
                created.provider_token,
                created.ttl,
                created.expires_at,
                created.max_expires_at,
                created.mcp_handle
            )
        );
        for scope in [
            Scope::Session(SessionCode::parse("ABCD2345").unwrap()),
            Scope::Mcp("m".into()),
            Scope::Caller("c".into()),
            Scope::None,
        ] {
            let message: Option<pb::call_tool_request::Scope> = scope.clone().into();
            assert_eq!(Scope::try_from(message).unwrap(), scope);
        }
        let malformed = Some(pb::call_tool_request::Scope::SessionCode("nope".into()));
        assert!(Scope::try_from(malformed).is_err());
        let ran = Ok(json!({"encoded": "SoWkIImgAStDuNBAJrBGjLDmpCbCJbMmKiX8pSd9vt98pKi1IW80"}));
        assert_eq!(tool_run(tool_run_message(ran.clone())), ran);
        let failed = Err(ToolFailure {
            kind: FailureKind::Busy,
            code: ToolCode::Busy.into(),
            message: "Try again.".into(),
            retry_after: Some(std::time::Duration::from_secs(2)),
        });
        assert_eq!(tool_run(tool_run_message(failed.clone())), failed);
    }

    #[test]
    fn calls_and_answers_survive_the_round_trip() {
        for status in [
            RequestStatus::Queued,
            RequestStatus::Delivered,
            RequestStatus::Completed,
            RequestStatus::Failed,
            RequestStatus::Expired,
            RequestStatus::Cancelled,
        ] {
            assert_eq!(round_trip::<_, pb::RequestStatus>(status), status);
        }
        let answered = RequestView {
            provider_connected: true,
            untrusted: true,
            progress: Some(CallProgress {
                progress: 3.0,
                total: Some(10.0),
                message: Some("3 of 10".into()),
                at: Timestamp(1_700_000_000_000),
            }),
            news: vec![CallNews::Log(toolrelay::wire::LogFrame {
                request_id: Some("r1".into()),
                level: toolrelay::wire::LogLevel::Info,
                data: json!({"rows": 3}),
                logger: None,
            })],
            status: RequestStatus::Completed,
            request_id: "r1".into(),
            response: Some(ToolResponse {
                request_id: "r1".into(),
                success: true,
                result: Some(json!({"rows": [1, 2.5, "x"], "nested": {"ok": true}})),
                error: None,
                content: None,
                structured_content: None,
            }),
        };
        assert_eq!(
            round_trip::<_, pb::RequestState>(answered.clone()),
            answered
        );
        let failed = ToolResponse {
            request_id: "r2".into(),
            success: false,
            result: None,
            error: Some(ToolError {
                code: "codap_error".into(),
                message: "CODAP said no".into(),
            }),
            content: None,
            structured_content: None,
        };
        assert_eq!(round_trip::<_, pb::ToolResponse>(failed.clone()), failed);
        // A provider's answer, as a remote relay's client sends it and the server reads it.
        let answer = ProviderResponse {
            request_id: "r3".into(),
            success: Some(false),
            result: None,
            error: Some(json!({"code": "declined_by_user", "message": "No."})),
            content: None,
            structured_content: None,
        };
        assert_eq!(round_trip::<_, pb::ToolResponse>(answer.clone()), answer);
    }

    #[test]
    fn frames_both_ways_survive_the_round_trip() {
        let request = ToolRequest {
            request_id: "r1".into(),
            tool_id: Some("codap".into()),
            function_name: "create_table".into(),
            args: json!({"name": "heights", "rows": [[1, 2]]}),
        };
        let downlinks = [
            Downlink::Welcome {
                code: SessionCode::parse("ABCD2345").unwrap(),
                expires_at: at(1_700_000_000_000),
            },
            Downlink::ToolRequest {
                request: request.into(),
                seq: 9,
            },
            Downlink::Heartbeat {
                expires_at: at(1_700_000_001_000),
                answers_ping: true,
            },
            Downlink::Registered { tools: 3 },
            Downlink::Cancel {
                request_id: "r0".into(),
            },
            Downlink::ApprovalRequest(Box::new(card())),
            Downlink::ApprovalClosed(Box::new(("c1".into(), "declined".into()))),
            Downlink::Callers(Box::new((vec![card()], true))),
            Downlink::Error {
                error: ErrorCode::InvalidResponse,
                message: "Say it again.".into(),
            },
            Downlink::Replaced,
            Downlink::Restarting,
            Downlink::Expired {
                message: "Gone.".into(),
            },
            Downlink::Ack {
                request_id: "r1".into(),
                refusal: None,
            },
            Downlink::Ack {
                request_id: "r2".into(),
                refusal: Some(Box::new(Refusal {
                    error: ErrorCode::RequestNotFound,
                    message: "Not yours.".into(),
                })),
            },
            Downlink::NotStored {
                request_id: "r3".into(),
                refusal: Box::new(Refusal {
                    error: ErrorCode::StoreUnavailable,
                    message: "Again.".into(),
                }),
            },
        ];
        for downlink in downlinks {
            assert_eq!(
                Downlink::try_from(pb::RelayMessage::from(downlink.clone())),
                Ok(downlink)
            );
        }
        let frames = [
            ProviderFrame::Register {
                tools: Box::new(
                    json!([{"name": "f", "description": "d", "inputSchema": {"type": "object"}}]),
                ),
                approves: true,
            },
            ProviderFrame::Approval(Box::new(toolrelay::wire::ApprovalAnswer {
                caller_id: "0123456789abcdef01234567".into(),
                allow: true,
            })),
            ProviderFrame::DisconnectCaller(Box::new(toolrelay::wire::CallerRef {
                caller_id: "0123456789abcdef01234567".into(),
            })),
            ProviderFrame::Response(Box::new(ProviderResponse {
                request_id: "r1".into(),
                success: Some(true),
                result: Some(json!({"n": 1})),
                error: None,
                content: None,
                structured_content: None,
            })),
            ProviderFrame::Ping,
        ];
        for frame in frames {
            assert_eq!(
                ProviderFrame::try_from(pb::ProviderMessage::from(frame.clone())),
                Ok(frame.clone())
            );
            let up = Uplink::Frame(frame);
            assert_eq!(
                Uplink::try_from(pb::ProviderMessage::from(up.clone())),
                Ok(up)
            );
        }
        // What a front end says of a tab it relays is no provider frame.
        let heard = pb::ProviderMessage::from(Uplink::Heard);
        assert_eq!(Uplink::try_from(heard.clone()), Ok(Uplink::Heard));
        assert!(ProviderFrame::try_from(heard).is_err());
    }

    fn card() -> toolrelay::wire::CallerCard {
        toolrelay::wire::CallerCard {
            caller_id: "c1".into(),
            label: "Claude".into(),
            via: "MCP".into(),
            address: "203.0.113.7".into(),
            shared_address: false,
            at: "2026-11-28T23:00:00Z".into(),
        }
    }

    #[test]
    fn a_manifest_and_tools_survive_the_round_trip() {
        let grouped = GroupedManifest {
            version: "3".into(),
            tools: vec![ToolGroup {
                id: "codap".into(),
                description: "CODAP".into(),
                functions: vec![FunctionSpec {
                    name: "create_table".into(),
                    description: "Makes a table".into(),
                    parameters: json!({"type": "object", "properties": {"name": {"type": "string"}}}),
                    hints: ToolHints {
                        title: Some("Create table".into()),
                        read_only: Some(false),
                        destructive: Some(false),
                        idempotent: None,
                        untrusted_content: None,
                    },
                    output_schema: None,
                }],
            }],
        };
        assert_eq!(GroupedManifest::from(pb::Manifest::from(&grouped)), grouped);
        let tool = ToolInfo {
            name: "encodePlantUML".into(),
            description: "Encodes".into(),
            input_schema: json!({"type": "object"}),
            output_schema: Some(json!({"type": "object", "required": ["url"]})),
            hints: ToolHints {
                title: Some("Encode PlantUML".into()),
                read_only: Some(true),
                destructive: None,
                idempotent: Some(true),
                untrusted_content: Some(false),
            },
        };
        assert_eq!(round_trip::<_, pb::Tool>(tool.clone()), tool);
        for kind in [
            FailureKind::BadInput,
            FailureKind::TooLarge,
            FailureKind::NotFound,
            FailureKind::Busy,
            FailureKind::Internal,
            FailureKind::Unavailable,
        ] {
            assert_eq!(round_trip::<_, pb::FailureKind>(kind), kind);
            let failure = ToolFailure {
                kind,
                code: ToolCode::Busy.into(),
                message: "Try again.".into(),
                retry_after: (kind == FailureKind::Busy).then(|| std::time::Duration::from_secs(3)),
            };
            let back: ToolFailure = pb::ToolFailure::from(failure.clone()).into();
            assert_eq!(
                (back.kind, back.code, back.message, back.retry_after),
                (
                    failure.kind,
                    failure.code,
                    failure.message,
                    failure.retry_after
                )
            );
        }
        let at = at(1_700_000_000_123);
        assert_eq!(Timestamp::from(Some(prost_types::Timestamp::from(at))), at);
        assert_eq!(Timestamp::from(None), Timestamp(0));
    }
}
