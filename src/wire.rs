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
    /// Held until the person approves its caller in the tab (a caller the tab has not
    /// allowed yet, using the session's code); then queued, or failed when declined.
    AwaitingApproval,
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
            Self::AwaitingApproval => "awaiting_approval",
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

impl ToolRequest {
    /// Its `tool-request` frame, borrowing it.
    pub fn frame(&self) -> ToolRequestFrame<'_> {
        ToolRequestFrame {
            request_id: &self.request_id,
            tool_id: self.tool_id.as_deref(),
            function_name: &self.function_name,
            args: &self.args,
        }
    }
}

/// A `tool-request` frame written from a call held elsewhere (borrowed, not copied): the same
/// JSON as [`RelayFrame::ToolRequest`] of the [`ToolRequest`] it borrows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "type", rename = "tool-request", rename_all = "camelCase")]
pub struct ToolRequestFrame<'a> {
    /// The call's id.
    pub request_id: &'a str,
    /// The group of the function, when the caller named one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_id: Option<&'a str>,
    /// The function to run.
    pub function_name: &'a str,
    /// Its arguments.
    pub args: &'a Value,
}

impl ToolRequestFrame<'_> {
    /// The call, copied.
    pub fn to_request(&self) -> ToolRequest {
        ToolRequest {
            request_id: self.request_id.to_owned(),
            tool_id: self.tool_id.map(str::to_owned),
            function_name: self.function_name.to_owned(),
            args: self.args.clone(),
        }
    }
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
    /// MCP content items (text, image, audio, resource links, embedded resources), checked
    /// where the answer entered the relay; beside or instead of `result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<Value>>,
    /// MCP structured content: a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
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
    /// MCP content items, beside or instead of `result` (see [`ToolResponse::content`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<Value>>,
    /// MCP structured content: a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
}

/// What a function does to data, for hosts that ask the person before a change (SPEC §4).
/// Each is optional; an unmarked function is taken to change data ([`ToolHints::destructive_hint`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolHints {
    /// A short name for people, e.g. "Create graph".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Only reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Changes or deletes what is there (`false`: only adds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    /// Calling it again with the same arguments changes nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// Its results may hold content from outside the user's document (WebMCP's
    /// `untrustedContentHint`): MCP's `openWorldHint`, and a mark on each result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untrusted_content: Option<bool>,
}

impl ToolHints {
    /// Whether the function is marked read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only == Some(true)
    }

    /// Whether it may change or delete data: unless marked read-only or `destructive: false`.
    pub fn destructive_hint(&self) -> bool {
        !self.is_read_only() && self.destructive != Some(false)
    }

    /// Whether calling it again changes nothing more: marked so, or read-only.
    pub fn idempotent_hint(&self) -> bool {
        self.idempotent.unwrap_or_else(|| self.is_read_only())
    }

    /// Whether its results may hold untrusted content (so it reaches an open world).
    pub fn is_untrusted(&self) -> bool {
        self.untrusted_content == Some(true)
    }

    /// Its title, or one made from `name` ([`title_from_name`]).
    pub fn title_or(&self, name: &str) -> String {
        self.title.clone().unwrap_or_else(|| title_from_name(name))
    }
}

/// A title made from a function's name: `createGraph` → "Create graph",
/// `get_mip_solution` → "Get mip solution", `encodePlantUML` → "Encode plant UML".
pub fn title_from_name(name: &str) -> String {
    let mut words: Vec<String> = Vec::new();
    let chars: Vec<char> = name.chars().collect();
    let mut word = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if c == '_' || c == '-' || c == ' ' {
            words.extend((!word.is_empty()).then(|| std::mem::take(&mut word)));
            continue;
        }
        let previous = i.checked_sub(1).map(|p| chars[p]);
        let next = chars.get(i + 1);
        // A word starts at an upper-case letter after a lower-case one or a digit, and at the
        // last capital of a run followed by a lower-case letter ("UMLFile" → "UML", "File").
        let starts = c.is_uppercase()
            && previous.is_some_and(|p| {
                p.is_lowercase()
                    || p.is_ascii_digit()
                    || (p.is_uppercase() && next.is_some_and(|n| n.is_lowercase()))
            });
        if starts && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        word.push(c);
    }
    words.extend((!word.is_empty()).then_some(word));
    let words: Vec<String> = words
        .into_iter()
        .enumerate()
        .map(|(i, word)| {
            let acronym = word.chars().count() > 1 && word.chars().all(|c| !c.is_lowercase());
            if acronym {
                word
            } else if i == 0 {
                let mut chars = word.chars();
                chars.next().map_or_else(String::new, |first| {
                    first
                        .to_uppercase()
                        .chain(chars.flat_map(char::to_lowercase))
                        .collect()
                })
            } else {
                word.to_lowercase()
            }
        })
        .collect();
    words.join(" ")
}

/// A function of the grouped manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionSpec {
    /// Function name, unique in the session.
    pub name: String,
    /// What the function does, for the LLM.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
    /// What it does to data.
    #[serde(flatten)]
    pub hints: ToolHints,
    /// JSON Schema of its results (the built-in tools give one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
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
                        hints: function.hints.clone(),
                        output_schema: function.output_schema.clone(),
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
    /// What it does to data.
    #[serde(flatten)]
    pub hints: ToolHints,
    /// JSON Schema of its results (the built-in tools give one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
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
        /// Whether the person approves each new caller in the tab (absent: no).
        #[serde(default)]
        approves: bool,
    },
    /// The person's answer to an `approval-request`.
    Approval(Box<ApprovalAnswer>),
    /// The person disconnects a caller it allowed: its handle stops working, and its next
    /// use of the code asks again.
    DisconnectCaller(Box<CallerRef>),
    /// Answers a call (boxed: the other frames are small, and every provider's channel holds
    /// a block of frames from the start).
    Response(Box<ProviderResponse>),
    /// How far a delivered call has come, while it runs.
    Progress(Box<ProgressFrame>),
    /// A message for the callers' logs (MCP `notifications/message`).
    Log(Box<LogFrame>),
    /// Keeps the session alive; answered with a `heartbeat`.
    Ping,
}

impl ProviderFrame {
    /// A frame from its JSON text. An answer (the frame a tab sends most) is read straight
    /// into its type; serde reads a frame tagged by a field of its own into a buffer first,
    /// every key and value copied. Any other frame, or an answer that does not read so, is
    /// read the tagged way, whose error is the one given.
    pub fn from_json(text: &str) -> Result<Self, crate::json::ReadError> {
        #[derive(Deserialize)]
        struct Kind<'a> {
            #[serde(rename = "type", borrow)]
            kind: std::borrow::Cow<'a, str>,
        }
        if let Ok(Kind { kind }) = serde_json::from_str::<Kind>(text)
            && kind == "response"
            && let Ok(response) = crate::json::from_str::<ProviderResponse>(text)
        {
            return Ok(Self::Response(Box::new(response)));
        }
        crate::json::from_str(text)
    }
}

/// How far a delivered call has come: `progress` of `total` (when known), with a message for
/// people. Progress increases; a value not above the last one is dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressFrame {
    /// The call's id.
    pub request_id: String,
    /// Work done so far, in any unit that grows (items, seconds, percent).
    pub progress: f64,
    /// The work there is, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// What is happening, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A log message from the tab, for the callers whose calls it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogFrame {
    /// The call it is about; without one, it is about every call the tab runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// How much it matters (the syslog levels MCP uses).
    pub level: LogLevel,
    /// The message: any JSON.
    #[serde(default)]
    pub data: Value,
    /// Who logged it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<String>,
}

/// The syslog severities MCP logging uses, least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Detail for debugging.
    Debug,
    /// Information.
    Info,
    /// Normal but significant.
    Notice,
    /// A warning.
    Warning,
    /// An error.
    Error,
    /// Critical.
    Critical,
    /// Action must be taken at once.
    Alert,
    /// The system is unusable.
    Emergency,
}

impl LogLevel {
    /// The level's name, as MCP writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Notice => "notice",
            Self::Warning => "warning",
            Self::Error => "error",
            Self::Critical => "critical",
            Self::Alert => "alert",
            Self::Emergency => "emergency",
        }
    }
}

/// The person's answer to an approval request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalAnswer {
    /// The caller asked about (`approval-request`'s `callerId`).
    pub caller_id: String,
    /// Allow, or deny.
    pub allow: bool,
}

/// A caller, by the id an `approval-request` named it with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallerRef {
    /// Its id.
    pub caller_id: String,
}

/// A caller asking to use the session, as the tab shows it to the person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallerCard {
    /// The caller's id in this session (not a secret).
    pub caller_id: String,
    /// What it says it is (an MCP client's name, a User-Agent), as it says it: not proof.
    pub label: String,
    /// How it came: `MCP`, `GPT Actions`, `HTTP API`, `gRPC`.
    pub via: String,
    /// The address it came from.
    pub address: String,
    /// Known by its address alone: allowing it allows everyone at that address.
    pub shared_address: bool,
    /// RFC 3339: when it was allowed (`callers`) or when the question lapses
    /// (`approval-request`).
    pub at: String,
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
    /// A caller the person has not allowed uses the session's code: ask the person, and
    /// answer with an `approval` frame (or `POST …/approvals/{callerId}`).
    ApprovalRequest(CallerCard),
    /// The question about this caller is closed (answered, here or in another tab of the
    /// session, or lapsed).
    ApprovalClosed {
        /// The caller.
        caller_id: String,
        /// `allowed`, `declined` or `timeout`.
        outcome: String,
    },
    /// The callers the person allowed, and whether the session refuses new ones (after three
    /// denials: offer a new code).
    Callers {
        /// Allowed callers.
        allowed: Vec<CallerCard>,
        /// New callers are refused without asking.
        refused: bool,
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
    fn a_borrowed_call_is_written_as_the_frame_of_the_call() {
        for tool_id in [None, Some("codap".to_owned())] {
            let request = ToolRequest {
                request_id: "r\"1".into(),
                tool_id,
                function_name: "create_table".into(),
                args: json!({"name": "heights", "rows": [[1, 2.5]], "é": null}),
            };
            let frame = request.frame();
            assert_eq!(
                serde_json::to_string(&frame).unwrap(),
                serde_json::to_string(&RelayFrame::ToolRequest(request.clone())).unwrap()
            );
            assert_eq!(frame.to_request(), request);
        }
    }

    #[test]
    fn frames_read_as_the_tagged_enum_reads_them() {
        let tagged =
            |text: &str| serde_json::from_str::<ProviderFrame>(text).map_err(|e| e.to_string());
        for text in [
            r#"{"type":"response","requestId":"r1","success":true,"result":{"n":1,"big":18446744073709551615,"x":0.1}}"#,
            r#"{"requestId":"r2","type":"response","success":false,"error":{"code":"E","message":"m"},"extra":[1]}"#,
            r#"{"type":"response","requestId":"r3","result":null,"content":[{"type":"text","text":"é"}],"structuredContent":{"a":[]}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"progress","requestId":"r4","progress":1,"total":2}"#,
            r#"{"type":"register","tools":[{"name":"f"}],"approves":true}"#,
        ] {
            let read = ProviderFrame::from_json(text).map_err(|e| e.to_string());
            assert_eq!(read.as_ref().ok(), tagged(text).as_ref().ok(), "{text}");
            assert!(read.is_ok(), "{text}: {read:?}");
        }
        // An answer that does not read as one fails as the tagged enum says.
        for text in [
            r#"{"type":"response","success":true}"#,
            r#"{"type":"response","requestId":7}"#,
            r#"{"type":"nonsense"}"#,
            r#"[1]"#,
        ] {
            let error = ProviderFrame::from_json(text).unwrap_err().to_string();
            assert_eq!(error, tagged(text).unwrap_err(), "{text}");
        }
    }

    #[test]
    fn untitled_functions_get_a_title_from_their_name() {
        for (name, title) in [
            ("createGraph", "Create graph"),
            ("get_mip_solution", "Get mip solution"),
            ("encodePlantUML", "Encode plant UML"),
            ("getUMLFile2", "Get UML file2"),
            ("codapRequest", "Codap request"),
            ("x", "X"),
        ] {
            assert_eq!(title_from_name(name), title, "{name}");
        }
    }

    #[test]
    fn unmarked_functions_are_taken_to_change_data() {
        let unmarked = ToolHints::default();
        assert!(!unmarked.is_read_only() && unmarked.destructive_hint());
        assert!(!unmarked.idempotent_hint());
        let create = ToolHints {
            destructive: Some(false),
            ..ToolHints::default()
        };
        assert!(!create.destructive_hint());
        let read = ToolHints {
            read_only: Some(true),
            ..ToolHints::default()
        };
        assert!(read.is_read_only() && !read.destructive_hint() && read.idempotent_hint());
        let spec: FunctionSpec = serde_json::from_value(json!({"name": "f", "parameters": {},
            "title": "F", "readOnly": true}))
        .unwrap();
        assert_eq!(spec.hints.title.as_deref(), Some("F"));
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({"name": "f", "description": "", "parameters": {}, "title": "F", "readOnly": true})
        );
    }

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
                content: None,
                structured_content: None,
            }))
        );
        let image = json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"});
        let frame: ProviderFrame = serde_json::from_value(json!({
            "type": "response", "requestId": "r2", "content": [image], "structuredContent": {"n": 1}
        }))
        .unwrap();
        let ProviderFrame::Response(response) = frame else {
            panic!("a response: {frame:?}");
        };
        assert_eq!(response.content, Some(vec![image]));
        assert_eq!(response.structured_content, Some(json!({"n": 1})));
        let progress: ProviderFrame = serde_json::from_value(json!({
            "type": "progress", "requestId": "r2", "progress": 40, "total": 100, "message": "40 of 100"
        }))
        .unwrap();
        assert_eq!(
            progress,
            ProviderFrame::Progress(Box::new(ProgressFrame {
                request_id: "r2".into(),
                progress: 40.0,
                total: Some(100.0),
                message: Some("40 of 100".into()),
            }))
        );
        let log: ProviderFrame = serde_json::from_value(
            json!({"type": "log", "level": "warning", "data": {"rows": 3}, "logger": "codap"}),
        )
        .unwrap();
        assert_eq!(
            log,
            ProviderFrame::Log(Box::new(LogFrame {
                request_id: None,
                level: LogLevel::Warning,
                data: json!({"rows": 3}),
                logger: Some("codap".into()),
            }))
        );
        let unknown_level = json!({"type": "log", "level": "loud", "data": 1});
        assert!(serde_json::from_value::<ProviderFrame>(unknown_level).is_err());
        let ping: ProviderFrame = serde_json::from_str(r#"{"type":"ping"}"#).unwrap();
        assert_eq!(ping, ProviderFrame::Ping);
    }
}
