//! Every conversion between the domain types and their protobuf messages, both ways, in one
//! place: the gRPC server (`grpc.rs`) converts one way and a remote relay's client
//! (`remote.rs`) the other, and the tests below hold each pair to a round trip.

use serde_json::{Map, Value, json};
use toolrelay::json::{from_struct, from_value, to_struct, to_value};
use toolrelay::proto::v1 as pb;
use toolrelay::wire::{
    FunctionSpec, GroupedManifest, ProviderFrame, ProviderResponse, RequestStatus, ToolError,
    ToolGroup, ToolRequest, ToolResponse,
};

use crate::builtin::{BUILTIN_GROUP, FailureKind, ToolInfo};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::ErrorCode;
use crate::provider::{Downlink, Refusal};
use crate::relay::{CallInput, RequestView, SessionStatus};
use crate::store::Transport;

pub(crate) fn session_info(status_of: crate::relay::SessionStatus) -> pb::SessionInfo {
    pb::SessionInfo {
        code: status_of.code.as_str().to_owned(),
        created_at: Some(timestamp_message(status_of.created_at)),
        expires_at: Some(timestamp_message(status_of.expires_at)),
        max_expires_at: Some(timestamp_message(status_of.max_expires_at)),
        provider_connected: status_of.transport.is_some(),
        transport: status_of
            .transport
            .map(Transport::as_str)
            .unwrap_or_default()
            .to_owned(),
        tool_count: count(status_of.tool_count),
        pending_requests: count(status_of.pending_requests),
        mcp_handle: status_of.mcp_handle,
    }
}

/// The protobuf kind of a tool failure.
pub(crate) fn failure_kind(kind: FailureKind) -> pb::FailureKind {
    match kind {
        FailureKind::BadInput => pb::FailureKind::BadInput,
        FailureKind::TooLarge => pb::FailureKind::TooLarge,
        FailureKind::NotFound => pb::FailureKind::NotFound,
        FailureKind::Busy => pb::FailureKind::Busy,
        FailureKind::Internal => pb::FailureKind::Internal,
        FailureKind::Unavailable => pb::FailureKind::Unavailable,
    }
}

/// A built-in tool as a protobuf `Tool`.
pub(crate) fn tool_message(tool: ToolInfo) -> pb::Tool {
    pb::Tool {
        name: tool.name,
        description: tool.description,
        input_schema: Some(to_struct(&tool.input_schema)),
        tool_id: BUILTIN_GROUP.to_owned(),
    }
}

pub(crate) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

pub(crate) fn timestamp_message(at: Timestamp) -> prost_types::Timestamp {
    let (seconds, nanos) = at.seconds_and_nanos();
    prost_types::Timestamp { seconds, nanos }
}

pub(crate) fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

pub(crate) fn call_input(
    request_id: String,
    tool_id: String,
    function_name: String,
    args: Option<prost_types::Struct>,
) -> CallInput {
    CallInput {
        request_id: non_empty(request_id),
        tool_id: non_empty(tool_id),
        function_name,
        args: args.map_or(Value::Null, |args| from_struct(&args)),
        correlation_id: None,
    }
}

pub(crate) fn status_enum(status: RequestStatus) -> pb::RequestStatus {
    match status {
        RequestStatus::Queued => pb::RequestStatus::Queued,
        RequestStatus::Delivered => pb::RequestStatus::Delivered,
        RequestStatus::Completed => pb::RequestStatus::Completed,
        RequestStatus::Failed => pb::RequestStatus::Failed,
        RequestStatus::Expired => pb::RequestStatus::Expired,
    }
}

pub(crate) fn request_state(view: RequestView) -> pb::RequestState {
    pb::RequestState {
        request_id: view.request_id,
        status: status_enum(view.status).into(),
        response: view.response.map(response_message),
        provider_connected: view.provider_connected,
    }
}

pub(crate) fn response_message(response: ToolResponse) -> pb::ToolResponse {
    pb::ToolResponse {
        request_id: response.request_id,
        success: response.success,
        result: response.result.as_ref().map(to_value),
        error: response.error.map(|error| pb::ToolError {
            code: error.code,
            message: error.message,
        }),
    }
}

pub(crate) fn provider_response(response: pb::ToolResponse) -> ProviderResponse {
    ProviderResponse {
        request_id: response.request_id,
        success: Some(response.success),
        result: response.result.as_ref().map(from_value),
        error: response.error.map(|error| {
            let mut object = Map::new();
            if !error.code.is_empty() {
                object.insert("code".into(), Value::String(error.code));
            }
            object.insert("message".into(), Value::String(error.message));
            Value::Object(object)
        }),
    }
}

/// What a provider registered: `tools_json` when set (malformed JSON becomes a value the
/// manifest parser refuses with a clear message), otherwise the protobuf tools.
pub(crate) fn registered_tools(tools: &[pb::Tool], tools_json: &str) -> Value {
    if tools_json.is_empty() {
        return tools_value(tools);
    }
    serde_json::from_str(tools_json)
        .unwrap_or_else(|error| Value::String(format!("tools_json is not valid JSON: {error}")))
}

/// Tools in protobuf form as the flat JSON the manifest parser reads.
pub(crate) fn tools_value(tools: &[pb::Tool]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|tool| {
                let mut entry = json!({"name": tool.name, "description": tool.description});
                if let Some(schema) = &tool.input_schema {
                    entry["inputSchema"] = from_struct(schema);
                }
                if !tool.tool_id.is_empty() {
                    entry["toolId"] = Value::String(tool.tool_id.clone());
                }
                entry
            })
            .collect(),
    )
}

pub(crate) fn manifest_message(grouped: &GroupedManifest) -> pb::Manifest {
    let groups = grouped
        .tools
        .iter()
        .map(|group| pb::ToolGroup {
            id: group.id.clone(),
            description: group.description.clone(),
        })
        .collect();
    let flat = grouped.flat();
    pb::Manifest {
        version: flat.version,
        tools: flat
            .tools
            .into_iter()
            .map(|tool| pb::Tool {
                name: tool.name,
                description: tool.description,
                input_schema: Some(to_struct(&tool.input_schema)),
                tool_id: tool.tool_id.unwrap_or_default(),
            })
            .collect(),
        groups,
    }
}

pub(crate) fn provider_frame(message: pb::ProviderMessage) -> Option<ProviderFrame> {
    Some(match message.kind? {
        pb::provider_message::Kind::Register(register) => ProviderFrame::Register {
            tools: Box::new(registered_tools(&register.tools, &register.tools_json)),
        },
        pb::provider_message::Kind::Response(response) => {
            ProviderFrame::Response(Box::new(provider_response(response)))
        }
        pb::provider_message::Kind::Ping(_) => ProviderFrame::Ping,
    })
}

pub(crate) fn relay_message(message: Downlink) -> pb::RelayMessage {
    use pb::relay_message::Kind;
    let kind = match message {
        Downlink::Welcome { code, expires_at } => Kind::Welcome(pb::Welcome {
            code: code.as_str().to_owned(),
            expires_at: Some(timestamp_message(expires_at)),
            protocol_version: toolrelay::PROTOCOL_VERSION.to_owned(),
        }),
        Downlink::ToolRequest { request, seq } => Kind::ToolRequest(pb::ToolRequest {
            request_id: request.request_id,
            tool_id: request.tool_id.unwrap_or_default(),
            function_name: request.function_name,
            args: Some(to_struct(&request.args)),
            seq,
        }),
        Downlink::Heartbeat {
            expires_at,
            answers_ping,
        } => Kind::Heartbeat(pb::Heartbeat {
            expires_at: Some(timestamp_message(expires_at)),
            answers_ping,
        }),
        Downlink::Registered { tools } => Kind::Registered(pb::Registered {
            tool_count: count(tools),
        }),
        Downlink::Expired { message } => Kind::Expired(pb::Expired { message }),
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
    pb::RelayMessage { kind: Some(kind) }
}

/// A session's state from a `SessionInfo`; `None` when its code is malformed.
pub(crate) fn session_status(info: pb::SessionInfo) -> Option<SessionStatus> {
    Some(SessionStatus {
        code: SessionCode::parse(&info.code).ok()?,
        created_at: timestamp(info.created_at),
        expires_at: timestamp(info.expires_at),
        max_expires_at: timestamp(info.max_expires_at),
        transport: Transport::parse(&info.transport),
        tool_count: info.tool_count as usize,
        pending_requests: info.pending_requests as usize,
        mcp_handle: info.mcp_handle,
    })
}

pub(crate) fn timestamp(at: Option<prost_types::Timestamp>) -> Timestamp {
    at.map_or(Timestamp(0), |at| {
        Timestamp(at.seconds.saturating_mul(1000) + i64::from(at.nanos / 1_000_000))
    })
}

pub(crate) fn status_of(status: pb::RequestStatus) -> RequestStatus {
    match status {
        pb::RequestStatus::Queued | pb::RequestStatus::Unspecified => RequestStatus::Queued,
        pb::RequestStatus::Delivered => RequestStatus::Delivered,
        pb::RequestStatus::Completed => RequestStatus::Completed,
        pb::RequestStatus::Failed => RequestStatus::Failed,
        pb::RequestStatus::Expired => RequestStatus::Expired,
    }
}

pub(crate) fn request_view(state: pb::RequestState) -> RequestView {
    RequestView {
        provider_connected: state.provider_connected,
        status: status_of(state.status()),
        request_id: state.request_id,
        response: state.response.map(tool_response),
    }
}

pub(crate) fn tool_response(response: pb::ToolResponse) -> ToolResponse {
    ToolResponse {
        request_id: response.request_id,
        success: response.success,
        result: response.result.as_ref().map(from_value),
        error: response.error.map(|error| ToolError {
            code: error.code,
            message: error.message,
        }),
    }
}

pub(crate) fn tool_request(request: pb::ToolRequest) -> ToolRequest {
    ToolRequest {
        request_id: request.request_id,
        tool_id: non_empty(request.tool_id),
        function_name: request.function_name,
        args: request.args.as_ref().map_or(Value::Null, from_struct),
    }
}

/// A provider's response as the protobuf message (the inverse of the server's conversion).
pub(crate) fn provider_message_response(response: ProviderResponse) -> pb::ToolResponse {
    let success = response.success.unwrap_or(response.error.is_none());
    let error = response.error.map(|error| match error {
        Value::String(message) => pb::ToolError {
            code: String::new(),
            message,
        },
        Value::Object(object) => pb::ToolError {
            code: object
                .get("code")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            message: object
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| Value::Object(object.clone()).to_string(), str::to_owned),
        },
        other => pb::ToolError {
            code: String::new(),
            message: other.to_string(),
        },
    });
    pb::ToolResponse {
        request_id: response.request_id,
        success,
        result: response.result.as_ref().map(to_value),
        error: if success { None } else { error },
    }
}

pub(crate) fn provider_message(frame: ProviderFrame) -> pb::ProviderMessage {
    use pb::provider_message::Kind;
    let kind = match frame {
        ProviderFrame::Register { tools } => Kind::Register(pb::Register {
            tools: Vec::new(),
            tools_json: tools.to_string(),
        }),
        ProviderFrame::Response(response) => Kind::Response(provider_message_response(*response)),
        ProviderFrame::Ping => Kind::Ping(pb::Ping {}),
    };
    pb::ProviderMessage { kind: Some(kind) }
}

pub(crate) fn downlink_message(message: pb::RelayMessage) -> Option<Downlink> {
    use pb::relay_message::Kind;
    Some(match message.kind? {
        Kind::Welcome(welcome) => Downlink::Welcome {
            code: SessionCode::parse(&welcome.code).ok()?,
            expires_at: timestamp(welcome.expires_at),
        },
        Kind::ToolRequest(request) => Downlink::ToolRequest {
            seq: request.seq,
            request: Box::new(tool_request(request)),
        },
        Kind::Heartbeat(heartbeat) => Downlink::Heartbeat {
            expires_at: timestamp(heartbeat.expires_at),
            answers_ping: heartbeat.answers_ping,
        },
        Kind::Registered(registered) => Downlink::Registered {
            tools: registered.tool_count as usize,
        },
        Kind::Error(error) => match ErrorCode::parse(&error.error) {
            code if !error.request_id.is_empty() => Downlink::NotStored {
                request_id: error.request_id,
                refusal: Box::new(Refusal {
                    error: code.unwrap_or(ErrorCode::InternalError),
                    message: error.message,
                }),
            },
            Some(ErrorCode::Replaced) => Downlink::Replaced,
            Some(ErrorCode::ShuttingDown) => Downlink::Restarting,
            code => Downlink::Error {
                error: code.unwrap_or(ErrorCode::InternalError),
                message: error.message,
            },
        },
        Kind::Ack(ack) => Downlink::Ack {
            request_id: ack.request_id,
            refusal: (!ack.error.is_empty()).then(|| {
                Box::new(Refusal {
                    error: ErrorCode::parse(&ack.error).unwrap_or(ErrorCode::InternalError),
                    message: ack.message,
                })
            }),
        },
        Kind::Expired(expired) => Downlink::Expired {
            message: expired.message,
        },
    })
}

/// A session's manifest from its protobuf form: the groups, each with its functions.
pub(crate) fn grouped_manifest(manifest: pb::Manifest) -> GroupedManifest {
    let mut tools: Vec<ToolGroup> = manifest
        .groups
        .into_iter()
        .map(|group| ToolGroup {
            id: group.id,
            description: group.description,
            functions: Vec::new(),
        })
        .collect();
    for tool in manifest.tools {
        let spec = FunctionSpec {
            name: tool.name,
            description: tool.description,
            parameters: tool.input_schema.as_ref().map_or(Value::Null, from_struct),
        };
        match tools.iter_mut().find(|group| group.id == tool.tool_id) {
            Some(group) => group.functions.push(spec),
            None => tools.push(ToolGroup {
                id: tool.tool_id,
                description: spec.description.clone(),
                functions: vec![spec],
            }),
        }
    }
    GroupedManifest {
        version: manifest.version,
        tools,
    }
}

/// A tool failure's kind from its protobuf form.
pub(crate) fn failure_kind_of(kind: pb::FailureKind) -> FailureKind {
    match kind {
        pb::FailureKind::BadInput => FailureKind::BadInput,
        pb::FailureKind::TooLarge => FailureKind::TooLarge,
        pb::FailureKind::NotFound => FailureKind::NotFound,
        pb::FailureKind::Busy => FailureKind::Busy,
        pb::FailureKind::Internal | pb::FailureKind::Unspecified => FailureKind::Internal,
        pb::FailureKind::Unavailable => FailureKind::Unavailable,
    }
}

/// A built-in tool from its protobuf form.
pub(crate) fn tool_info(tool: pb::Tool) -> ToolInfo {
    ToolInfo {
        name: tool.name,
        description: tool.description,
        input_schema: tool.input_schema.as_ref().map_or(Value::Null, from_struct),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(session_status(session_info(status.clone())), Some(status));
        let malformed = pb::SessionInfo {
            code: "nope".into(),
            ..pb::SessionInfo::default()
        };
        assert_eq!(session_status(malformed), None);
    }

    #[test]
    fn calls_and_answers_survive_the_round_trip() {
        for status in [
            RequestStatus::Queued,
            RequestStatus::Delivered,
            RequestStatus::Completed,
            RequestStatus::Failed,
            RequestStatus::Expired,
        ] {
            assert_eq!(status_of(status_enum(status)), status);
        }
        let answered = RequestView {
            provider_connected: true,
            status: RequestStatus::Completed,
            request_id: "r1".into(),
            response: Some(ToolResponse {
                request_id: "r1".into(),
                success: true,
                result: Some(json!({"rows": [1, 2.5, "x"], "nested": {"ok": true}})),
                error: None,
            }),
        };
        assert_eq!(request_view(request_state(answered.clone())), answered);
        let failed = ToolResponse {
            request_id: "r2".into(),
            success: false,
            result: None,
            error: Some(ToolError {
                code: "codap_error".into(),
                message: "CODAP said no".into(),
            }),
        };
        assert_eq!(tool_response(response_message(failed.clone())), failed);
        // A provider's answer, as a remote relay's client sends it and the server reads it.
        let answer = ProviderResponse {
            request_id: "r3".into(),
            success: Some(false),
            result: None,
            error: Some(json!({"code": "declined_by_user", "message": "No."})),
        };
        assert_eq!(
            provider_response(provider_message_response(answer.clone())),
            answer
        );
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
                request: Box::new(request),
                seq: 9,
            },
            Downlink::Heartbeat {
                expires_at: at(1_700_000_001_000),
                answers_ping: true,
            },
            Downlink::Registered { tools: 3 },
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
                downlink_message(relay_message(downlink.clone())),
                Some(downlink)
            );
        }
        let frames = [
            ProviderFrame::Register {
                tools: Box::new(
                    json!([{"name": "f", "description": "d", "inputSchema": {"type": "object"}}]),
                ),
            },
            ProviderFrame::Response(Box::new(ProviderResponse {
                request_id: "r1".into(),
                success: Some(true),
                result: Some(json!({"n": 1})),
                error: None,
            })),
            ProviderFrame::Ping,
        ];
        for frame in frames {
            assert_eq!(provider_frame(provider_message(frame.clone())), Some(frame));
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
                }],
            }],
        };
        assert_eq!(grouped_manifest(manifest_message(&grouped)), grouped);
        let tool = ToolInfo {
            name: "encodePlantUML".into(),
            description: "Encodes".into(),
            input_schema: json!({"type": "object"}),
        };
        assert_eq!(tool_info(tool_message(tool.clone())), tool);
        for kind in [
            FailureKind::BadInput,
            FailureKind::TooLarge,
            FailureKind::NotFound,
            FailureKind::Busy,
            FailureKind::Internal,
            FailureKind::Unavailable,
        ] {
            assert_eq!(failure_kind_of(failure_kind(kind)), kind);
        }
    }
}
