//! `From`/`TryFrom` between the wire types ([`crate::wire`]) and their protobuf messages
//! ([`crate::proto::v1`]), both ways. They live here, beside both types (the orphan rule); the
//! relay's own types convert in the relay crate (`services/relay/src/convert.rs`), which
//! holds the round-trip tests of both.

use std::fmt;

use serde_json::{Map, Value, json};

use crate::json::{from_struct, from_value, to_struct, to_value};
use crate::proto::v1 as pb;
use crate::wire::{
    ApprovalAnswer, CallerRef, FlatTool, FunctionSpec, GroupedManifest, LogFrame, ProgressFrame,
    ProviderFrame, ProviderResponse, RequestStatus, ToolError, ToolGroup, ToolHints, ToolRequest,
    ToolResponse,
};

/// A protobuf message that cannot stand for the domain value: a required part is missing or
/// malformed (what, in words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed message: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// `None` for an empty string (protobuf's "not set").
pub fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

impl From<RequestStatus> for pb::RequestStatus {
    fn from(status: RequestStatus) -> Self {
        match status {
            RequestStatus::Queued => Self::Queued,
            RequestStatus::Delivered => Self::Delivered,
            RequestStatus::Completed => Self::Completed,
            RequestStatus::Failed => Self::Failed,
            RequestStatus::Expired => Self::Expired,
            RequestStatus::Cancelled => Self::Cancelled,
            RequestStatus::AwaitingApproval => Self::AwaitingApproval,
        }
    }
}

impl From<pb::RequestStatus> for RequestStatus {
    fn from(status: pb::RequestStatus) -> Self {
        match status {
            pb::RequestStatus::Queued | pb::RequestStatus::Unspecified => Self::Queued,
            pb::RequestStatus::Delivered => Self::Delivered,
            pb::RequestStatus::Completed => Self::Completed,
            pb::RequestStatus::Failed => Self::Failed,
            pb::RequestStatus::Expired => Self::Expired,
            pb::RequestStatus::Cancelled => Self::Cancelled,
            pb::RequestStatus::AwaitingApproval => Self::AwaitingApproval,
        }
    }
}

impl From<ToolResponse> for pb::ToolResponse {
    fn from(response: ToolResponse) -> Self {
        Self {
            request_id: response.request_id,
            success: response.success,
            result: response.result.as_ref().map(to_value),
            error: response.error.map(|error| pb::ToolError {
                code: error.code,
                message: error.message,
            }),
            content: response.content.iter().flatten().map(to_value).collect(),
            structured_content: response.structured_content.as_ref().map(to_value),
        }
    }
}

impl From<pb::ToolResponse> for ToolResponse {
    fn from(response: pb::ToolResponse) -> Self {
        Self {
            request_id: response.request_id,
            success: response.success,
            result: response.result.as_ref().map(from_value),
            error: response.error.map(|error| ToolError {
                code: error.code,
                message: error.message,
            }),
            content: contents(&response.content),
            structured_content: response.structured_content.as_ref().map(from_value),
        }
    }
}

/// A provider's answer as a remote relay's client sends it.
impl From<ProviderResponse> for pb::ToolResponse {
    fn from(response: ProviderResponse) -> Self {
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
        Self {
            request_id: response.request_id,
            success,
            result: response.result.as_ref().map(to_value),
            error: if success { None } else { error },
            content: response.content.iter().flatten().map(to_value).collect(),
            structured_content: response.structured_content.as_ref().map(to_value),
        }
    }
}

/// A provider's answer as the relay's server reads it.
impl From<pb::ToolResponse> for ProviderResponse {
    fn from(response: pb::ToolResponse) -> Self {
        Self {
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
            content: contents(&response.content),
            structured_content: response.structured_content.as_ref().map(from_value),
        }
    }
}

/// Content items as JSON: none when the list is empty (an answer with a result only).
fn contents(items: &[prost_types::Value]) -> Option<Vec<Value>> {
    (!items.is_empty()).then(|| items.iter().map(from_value).collect())
}

impl From<pb::ToolRequest> for ToolRequest {
    fn from(request: pb::ToolRequest) -> Self {
        Self {
            request_id: request.request_id,
            tool_id: non_empty(request.tool_id),
            function_name: request.function_name,
            args: request.args.as_ref().map_or(Value::Null, from_struct),
        }
    }
}

/// A call as a protobuf message, with no queue position (`seq` 0).
impl From<ToolRequest> for pb::ToolRequest {
    fn from(request: ToolRequest) -> Self {
        Self {
            request_id: request.request_id,
            tool_id: request.tool_id.unwrap_or_default(),
            function_name: request.function_name,
            args: Some(to_struct(&request.args)),
            seq: 0,
        }
    }
}

impl From<&GroupedManifest> for pb::Manifest {
    fn from(grouped: &GroupedManifest) -> Self {
        let groups = grouped
            .tools
            .iter()
            .map(|group| pb::ToolGroup {
                id: group.id.clone(),
                description: group.description.clone(),
            })
            .collect();
        let flat = grouped.flat();
        Self {
            version: flat.version,
            tools: flat.tools.into_iter().map(pb::Tool::from).collect(),
            groups,
        }
    }
}

/// A function of the flat manifest as a protobuf `Tool`, with what it does to data.
impl From<FlatTool> for pb::Tool {
    fn from(tool: FlatTool) -> Self {
        Self {
            name: tool.name,
            description: tool.description,
            input_schema: Some(to_struct(&tool.input_schema)),
            tool_id: tool.tool_id.unwrap_or_default(),
            title: tool.hints.title.unwrap_or_default(),
            read_only: tool.hints.read_only,
            destructive: tool.hints.destructive,
            idempotent: tool.hints.idempotent,
            untrusted_content: tool.hints.untrusted_content,
            output_schema: tool.output_schema.as_ref().map(to_struct),
        }
    }
}

/// A session's manifest from its protobuf form: the groups, each with its functions.
impl From<pb::Manifest> for GroupedManifest {
    fn from(manifest: pb::Manifest) -> Self {
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
                hints: hints_of(&tool),
                output_schema: tool.output_schema.as_ref().map(from_struct),
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
        Self {
            version: manifest.version,
            tools,
        }
    }
}

/// What a protobuf `Tool` says it does to data.
pub fn hints_of(tool: &pb::Tool) -> ToolHints {
    ToolHints {
        title: non_empty(tool.title.clone()),
        read_only: tool.read_only,
        destructive: tool.destructive,
        idempotent: tool.idempotent,
        untrusted_content: tool.untrusted_content,
    }
}

/// What a provider registered: `tools_json` when set (malformed JSON becomes a value the
/// manifest parser refuses with a clear message), otherwise the protobuf tools.
pub fn registered_tools(tools: &[pb::Tool], tools_json: &str) -> Value {
    if tools_json.is_empty() {
        return tools_value(tools);
    }
    serde_json::from_str(tools_json)
        .unwrap_or_else(|error| Value::String(format!("tools_json is not valid JSON: {error}")))
}

/// Tools in protobuf form as the flat JSON the manifest parser reads.
fn tools_value(tools: &[pb::Tool]) -> Value {
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
                if let (Value::Object(entry), Ok(Value::Object(hints))) =
                    (&mut entry, serde_json::to_value(hints_of(tool)))
                {
                    entry.extend(hints);
                }
                entry
            })
            .collect(),
    )
}

impl From<ProviderFrame> for pb::ProviderMessage {
    fn from(frame: ProviderFrame) -> Self {
        use pb::provider_message::Kind;
        let kind = match frame {
            ProviderFrame::Register { tools, approves } => Kind::Register(pb::Register {
                tools: Vec::new(),
                tools_json: tools.to_string(),
                approves,
            }),
            ProviderFrame::Response(response) => Kind::Response((*response).into()),
            ProviderFrame::Ping => Kind::Ping(pb::Ping {}),
            ProviderFrame::Progress(progress) => Kind::Progress(pb::Progress {
                request_id: progress.request_id,
                progress: progress.progress,
                total: progress.total,
                message: progress.message.unwrap_or_default(),
            }),
            ProviderFrame::Log(log) => Kind::Log(pb::Log {
                request_id: log.request_id.unwrap_or_default(),
                level: log.level.as_str().to_owned(),
                data: Some(to_value(&log.data)),
                logger: log.logger.unwrap_or_default(),
            }),
            ProviderFrame::Approval(answer) => Kind::Approval(pb::ApprovalAnswer {
                caller_id: answer.caller_id,
                allow: answer.allow,
            }),
            ProviderFrame::DisconnectCaller(caller) => {
                Kind::DisconnectCaller(pb::DisconnectCaller {
                    caller_id: caller.caller_id,
                })
            }
        };
        Self { kind: Some(kind) }
    }
}

impl TryFrom<pb::ProviderMessage> for ProviderFrame {
    type Error = Malformed;

    fn try_from(message: pb::ProviderMessage) -> Result<Self, Malformed> {
        use pb::provider_message::Kind;
        Ok(
            match message
                .kind
                .ok_or(Malformed("a provider message with no kind"))?
            {
                Kind::Register(register) => Self::Register {
                    tools: Box::new(registered_tools(&register.tools, &register.tools_json)),
                    approves: register.approves,
                },
                Kind::Response(response) => Self::Response(Box::new(response.into())),
                Kind::Ping(_) => Self::Ping,
                Kind::Progress(progress) => Self::Progress(Box::new(ProgressFrame {
                    request_id: progress.request_id,
                    progress: progress.progress,
                    total: progress.total,
                    message: non_empty(progress.message),
                })),
                Kind::Log(log) => Self::Log(Box::new(LogFrame {
                    request_id: non_empty(log.request_id),
                    level: serde_json::from_value(Value::String(log.level))
                        .map_err(|_| Malformed("a log message's level is none of MCP's"))?,
                    data: log.data.as_ref().map_or(Value::Null, from_value),
                    logger: non_empty(log.logger),
                })),
                Kind::Approval(answer) => Self::Approval(Box::new(ApprovalAnswer {
                    caller_id: answer.caller_id,
                    allow: answer.allow,
                })),
                Kind::DisconnectCaller(caller) => Self::DisconnectCaller(Box::new(CallerRef {
                    caller_id: caller.caller_id,
                })),
                Kind::Heard(_) => {
                    return Err(Malformed(
                        "`heard` comes from a front end relaying a tab, not from a provider",
                    ));
                }
            },
        )
    }
}
