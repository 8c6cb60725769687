//! JSON shapes shared by every transport that is not gRPC.
//!
//! Field names are camelCase on the wire, as the browser and the LLM see them. The provider
//! protocol's frames ([`ProviderFrame`] up, [`RelayFrame`] down) are the same over WebSocket
//! and, as separate events and POSTs, over the SSE and polling fallbacks.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::errors::ErrorCode;

/// Where a call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestStatus {
    /// Waiting for a provider.
    Queued,
    /// Sent to the provider, not answered yet.
    Delivered,
    /// Answered with success.
    Completed,
    /// Answered with failure, or rejected.
    Failed,
    /// Not answered in time.
    Expired,
    /// Cancelled by its caller before it had an answer.
    Cancelled,
}

impl RequestStatus {
    /// True once the call has its final response.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Expired | Self::Cancelled
        )
    }

    /// The lowercase name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Delivered => "delivered",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A call as the provider receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRequest {
    /// The call's id; responses must carry it.
    pub request_id: String,
    /// The group of the function, when the caller named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_id: Option<String>,
    /// The function to run.
    pub function_name: String,
    /// Arguments, already validated against the function's schema.
    pub args: Value,
}

/// Why a call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolError {
    /// Stable snake_case name, for example `tool_error` or `request_expired`.
    pub code: String,
    /// What happened, for the caller.
    pub message: String,
}

/// The final answer to a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResponse {
    /// The call's id.
    pub request_id: String,
    /// Whether the tool succeeded.
    pub success: bool,
    /// The tool's result, when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The failure, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolError>,
}

/// A response as a provider sends it: `error` may be a string or an object with a `message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderResponse {
    /// The call's id.
    pub request_id: String,
    /// Whether the tool succeeded; when absent, success means "no error given".
    #[serde(default)]
    pub success: Option<bool>,
    /// The tool's result.
    #[serde(default)]
    pub result: Option<Value>,
    /// The failure: a string, or an object with `message` (and optionally `code`).
    #[serde(default)]
    pub error: Option<Value>,
}

/// A function of the grouped manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionSpec {
    /// Function name, unique in the session.
    pub name: String,
    /// What the function does, for the LLM.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

/// A tool of the grouped manifest: a named group of functions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolGroup {
    /// Group id.
    pub id: String,
    /// What the group is for.
    #[serde(default)]
    pub description: String,
    /// The group's functions.
    pub functions: Vec<FunctionSpec>,
}

/// The grouped manifest: `{version, tools:[{id, description, functions:[…]}]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupedManifest {
    /// Manifest version.
    pub version: String,
    /// The groups.
    pub tools: Vec<ToolGroup>,
}

impl GroupedManifest {
    /// The flat form: each function with its group's id as `toolId`.
    pub fn flat(&self) -> FlatManifest {
        FlatManifest {
            version: self.version.clone(),
            tools: self
                .tools
                .iter()
                .flat_map(|group| {
                    group.functions.iter().map(|function| FlatTool {
                        name: function.name.clone(),
                        description: function.description.clone(),
                        input_schema: function.parameters.clone(),
                        tool_id: Some(group.id.clone()),
                    })
                })
                .collect(),
        }
    }
}

/// A function of the flat manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlatTool {
    /// Function name, unique in the session.
    pub name: String,
    /// What the function does, for the LLM.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
    /// The group the function belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_id: Option<String>,
}

/// The flat manifest: `{version, tools:[{name, description, inputSchema}]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlatManifest {
    /// Manifest version.
    pub version: String,
    /// The functions.
    pub tools: Vec<FlatTool>,
}

/// A frame from the provider (the browser tab) to the relay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ProviderFrame {
    /// Replaces the session's manifest; `tools` is grouped or flat.
    Register {
        /// The tools, grouped (`[{id, functions}]`) or flat (`[{name, inputSchema}]`)
        /// (boxed, as the answer is).
        tools: Box<Value>,
    },
    /// Answers a call (boxed: the other frames are small, and every provider's channel holds
    /// a block of frames from the start).
    Response(Box<ProviderResponse>),
    /// Keeps the session alive; answered with a `heartbeat`.
    Ping,
}

/// A frame from the relay to the provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum RelayFrame {
    /// First frame of a connection.
    Welcome {
        /// The session code.
        code: String,
        /// RFC 3339 time at which the session expires unless there is activity.
        expires_at: String,
        /// Version of this protocol.
        protocol_version: String,
    },
    /// A call to run; answer with a `response` frame carrying the same `requestId`.
    ToolRequest(ToolRequest),
    /// The caller cancelled a call this connection was given: stop running it; its answer
    /// would be refused.
    Cancel {
        /// The call.
        request_id: String,
    },
    /// Sent every 25 s and in answer to `ping`.
    Heartbeat {
        /// RFC 3339 time at which the session expires unless there is activity.
        expires_at: String,
    },
    /// The manifest was accepted.
    Registered {
        /// Number of functions the provider registered.
        tools: usize,
    },
    /// Something the provider sent was refused, or the connection is being replaced. With a
    /// `requestId`: that call's answer could not be stored now; send it again.
    Error {
        /// Stable snake_case name.
        error: ErrorCode,
        /// What to do about it.
        message: String,
        /// The call whose answer could not be stored, when that is what failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
    },
    /// The relay is done with an answer (a `response` frame): it is stored, or it is refused
    /// for good (`error` and `message` then say why). Either way, do not send it again.
    Ack {
        /// The call the answer was for.
        request_id: String,
        /// Why the answer was refused for good, when it was (the call already had its
        /// answer, or was not delivered to this connection).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorCode>,
        /// What the refusal means, when there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The session has ended; the connection closes after this frame.
    Expired {
        /// What to do next.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn relay_frames_use_the_documented_shapes() {
        let frame = RelayFrame::Welcome {
            code: "ABCDEFGH".into(),
            expires_at: "2026-01-01T00:00:00.000Z".into(),
            protocol_version: "1".into(),
        };
        assert_eq!(
            serde_json::to_value(&frame).unwrap(),
            json!({"type": "welcome", "code": "ABCDEFGH", "expiresAt": "2026-01-01T00:00:00.000Z", "protocolVersion": "1"})
        );
        let request = RelayFrame::ToolRequest(ToolRequest {
            request_id: "r1".into(),
            tool_id: None,
            function_name: "add".into(),
            args: json!({"a": 1}),
        });
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"type": "tool-request", "requestId": "r1", "functionName": "add", "args": {"a": 1}})
        );
        let cancel = RelayFrame::Cancel {
            request_id: "r1".into(),
        };
        assert_eq!(
            serde_json::to_value(&cancel).unwrap(),
            json!({"type": "cancel", "requestId": "r1"})
        );
        assert_eq!(
            serde_json::to_value(RequestStatus::Cancelled).unwrap(),
            json!("cancelled")
        );
        assert!(RequestStatus::Cancelled.is_terminal());
        let ack = RelayFrame::Ack {
            request_id: "r1".into(),
            error: None,
            message: None,
        };
        assert_eq!(
            serde_json::to_value(&ack).unwrap(),
            json!({"type": "ack", "requestId": "r1"})
        );
        let not_stored = RelayFrame::Error {
            error: ErrorCode::StoreUnavailable,
            message: "Try again.".into(),
            request_id: Some("r1".into()),
        };
        assert_eq!(
            serde_json::to_value(&not_stored).unwrap(),
            json!({"type": "error", "error": "store_unavailable", "message": "Try again.", "requestId": "r1"})
        );
        let text = serde_json::to_string(&not_stored).unwrap();
        assert_eq!(
            serde_json::from_str::<RelayFrame>(&text).unwrap(),
            not_stored
        );
        let unknown = json!({"type": "error", "error": "no_such_error", "message": "?"});
        assert!(serde_json::from_value::<RelayFrame>(unknown).is_err());
    }

    #[test]
    fn provider_frames_parse_from_the_documented_shapes() {
        let frame: ProviderFrame = serde_json::from_value(
            json!({"type": "response", "requestId": "r1", "success": false, "error": "no such case"}),
        )
        .unwrap();
        assert_eq!(
            frame,
            ProviderFrame::Response(Box::new(ProviderResponse {
                request_id: "r1".into(),
                success: Some(false),
                result: None,
                error: Some(json!("no such case")),
            }))
        );
        let ping: ProviderFrame = serde_json::from_str(r#"{"type":"ping"}"#).unwrap();
        assert_eq!(ping, ProviderFrame::Ping);
    }
}
