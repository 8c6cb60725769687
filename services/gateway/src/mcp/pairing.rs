//! The pairing tools of `/mcp`: how a client that knows no session opens a CODAP paired with
//! the conversation (`open_codap`, see [`super::app`]) or pairs with the user's tab from the
//! code shown in the plugin, lists the session's tools and calls one by name (for
//! clients that ignore tool-list changes): `read_session_tool` for the functions marked
//! read-only (hosts need not ask the person first), `call_session_tool` for any. Each tool is a variant of [`Pairing`], which owns
//! its name, its definition and its call; `/mcp` dispatches on the variant.

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, Tool};
use rmcp::service::RequestContext;
use serde_json::{Value, json};
use toolrelay_relay::front::Caller;
use toolrelay_relay::front::ops::Connect;

use toolrelay::wire::ToolHints;

use super::app::{app_only_meta, open_codap_meta};
use super::tools::{failure, from_error, relay_icon, success, tool};
use super::{RelayMcp, caller_of};

/// A pairing tool of `/mcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pairing {
    /// `open_codap`: opens a CODAP paired with this conversation (an MCP App; a link where
    /// the host shows no apps), with no code to copy.
    OpenCodap,
    /// `connect_session`: pairs with the user's tab from its pairing code.
    Connect,
    /// `list_session_tools`: a paired session's tools with their argument schemas.
    ListTools,
    /// `call_session_tool`: calls a paired session's tool by name.
    CallTool,
    /// `read_session_tool`: calls a paired session's read-only tool by name.
    ReadTool,
    /// `codap_status`: for `open_codap`'s app only (`visibility: ["app"]`), whether its
    /// claim was redeemed and its CODAP's plugin is paired.
    CodapStatus,
}

impl Pairing {
    /// The pairing tools, in the order `/mcp` lists them.
    const ALL: [Self; 6] = [
        Self::OpenCodap,
        Self::Connect,
        Self::ListTools,
        Self::CallTool,
        Self::ReadTool,
        Self::CodapStatus,
    ];

    /// The tool's name, as clients call it.
    fn name(self) -> &'static str {
        match self {
            Self::OpenCodap => "open_codap",
            Self::Connect => "connect_session",
            Self::ListTools => "list_session_tools",
            Self::CallTool => "call_session_tool",
            Self::ReadTool => "read_session_tool",
            Self::CodapStatus => "codap_status",
        }
    }

    /// What the tool does to data: opening, pairing and listing only read (opening creates a
    /// new session each time: not idempotent); a call may change anything the session's tools
    /// change; a read runs only read-only functions.
    fn hints(self) -> ToolHints {
        let (title, read_only, idempotent) = match self {
            Self::OpenCodap => ("Open CODAP in the conversation", true, false),
            Self::Connect => ("Connect to the user's tab", true, true),
            Self::ListTools => ("List the tab's tools", true, true),
            Self::CallTool => ("Call a tool of the tab", false, false),
            Self::ReadTool => ("Read with a tool of the tab", true, true),
            Self::CodapStatus => (
                "Whether the CODAP in the conversation is paired",
                true,
                true,
            ),
        };
        ToolHints {
            title: Some(title.to_owned()),
            read_only: Some(read_only),
            destructive: Some(!read_only),
            idempotent: Some(idempotent),
            untrusted_content: None,
        }
    }

    /// The pairing tool a client calls by `name`, if it is one.
    pub(super) fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|tool| tool.name() == name)
    }

    /// The pairing tools, as `/mcp` lists them.
    pub(super) fn tools() -> Vec<Tool> {
        Self::ALL.into_iter().map(Self::tool).collect()
    }

    /// The tool's definition: its description, the JSON Schema of its arguments, its title
    /// and annotations, and the relay's icon.
    fn tool(self) -> Tool {
        let tool = self.definition().with_icons(vec![relay_icon()]);
        match self {
            Self::OpenCodap => tool.with_meta(open_codap_meta()),
            Self::CodapStatus => tool.with_meta(app_only_meta()),
            _ => tool,
        }
    }

    fn definition(self) -> Tool {
        let session = json!({"type": "string", "description": "The session: its handle (from open_codap or connect_session) or the pairing code the user gave you. Leave it out to use the session open_codap or connect_session gave in this conversation."});
        let hints = &self.hints();
        let call_arguments = json!({"type": "object", "properties": {
            "session": session,
            "name": {"type": "string", "description": "The tool's name, from list_session_tools."},
            "arguments": {"type": "object", "description": "The tool's arguments."}
        }, "required": ["name"]});
        match self {
            Self::OpenCodap => tool(
                self.name(),
                "Opens CODAP (a data analysis tool: tables, graphs, maps) for the user inside this conversation, already paired: no code to copy. Then build data sets, tables and graphs in it with call_session_tool. Where the conversation shows no apps, the answer has a link for the user to open it in a new tab.",
                json!({"type": "object", "properties": {}}),
                hints,
            ),
            Self::Connect => tool(
                self.name(),
                "Pairs with the user's tab. Ask the user for the pairing code shown in the plugin (like ABCD-EFGH). Returns the session handle, a connector URL for this session, and its tools.",
                json!({"type": "object", "properties": {"code": {"type": "string", "description": "The pairing code, e.g. ABCD-EFGH."}}, "required": ["code"]}),
                hints,
            ),
            Self::ListTools => tool(
                self.name(),
                "Lists the tools of a paired session with the JSON Schema of their arguments.",
                json!({"type": "object", "properties": {"session": session}}),
                hints,
            ),
            Self::CallTool => tool(
                self.name(),
                "Calls a tool of a paired session by name, e.g. {\"session\": \"<handle>\", \"name\": \"createGraph\", \"arguments\": {...}}. For tools marked read-only, read_session_tool does the same without changing anything.",
                call_arguments,
                hints,
            ),
            Self::ReadTool => tool(
                self.name(),
                "Calls a read-only tool of a paired session by name (one whose annotations say readOnlyHint: true in list_session_tools), e.g. to count or look up data. Other tools are refused: call them with call_session_tool.",
                call_arguments,
                hints,
            ),
            Self::CodapStatus => tool(
                self.name(),
                "For the app of open_codap only (hosts do not show it to the model): whether the CODAP it opened has taken its link (claim: open, used, expired or unknown) and whether its plugin is connected.",
                json!({"type": "object", "properties": {
                    "session": {"type": "string", "description": "The handle open_codap answered."},
                    "claim": {"type": "string", "description": "The claim in open_codap's link."}
                }}),
                hints,
            ),
        }
    }
}

impl RelayMcp {
    /// Calls the pairing tool `pairing` with `arguments`.
    pub(super) async fn call_pairing(
        &self,
        pairing: Pairing,
        arguments: &Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = &caller_of(context);
        match pairing {
            Pairing::OpenCodap => self.open_codap(context).await,
            Pairing::Connect => self.connect_session(caller, arguments, context).await,
            Pairing::ListTools => self.list_session_tools(caller, arguments, context).await,
            Pairing::CallTool => self.call_session_tool(arguments, false, context).await,
            Pairing::ReadTool => self.call_session_tool(arguments, true, context).await,
            Pairing::CodapStatus => self.codap_status(caller, arguments, context).await,
        }
    }

    async fn connect_session(
        &self,
        caller: &Caller,
        arguments: &Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let Some(code) = text(arguments, "code") else {
            return failure(
                "invalid_arguments",
                "connect_session needs {\"code\": \"<pairing code>\"}: ask the user for the code shown in the plugin.",
            );
        };
        let status = match self
            .state
            .relay
            .run(caller, Connect { code: code.clone() })
            .await
        {
            Ok(status) => status,
            Err(error) => return from_error(&error),
        };
        // The handle it was given: once the person allowed it, its own.
        let tools = match self.session_tools(caller, &status.mcp_handle).await {
            Ok(tools) => tools,
            Err(error) => return from_error(&error),
        };
        self.remember(context, &status.mcp_handle, status.max_expires_at)
            .await;
        let mut answer = json!({
            "handle": status.mcp_handle,
            "connectorUrl": self.state.url(&format!("/mcp/s/{}", status.mcp_handle)),
            "expiresAt": status.expires_at.rfc3339(),
            "tools": tools.iter().map(|t| json!({"name": t.name, "title": t.title, "description": t.description,
                "readOnly": t.annotations.as_ref().and_then(|a| a.read_only_hint)})).collect::<Vec<_>>(),
        });
        // A caller that came with the code gets it back, the plain form for programs and the
        // hyphenated one to show people; one that came with a handle is never told it.
        if !toolrelay_relay::front::is_handle(&code) {
            answer["code"] = json!(status.code.as_str());
            answer["displayCode"] = json!(status.code.display());
        }
        success(answer)
    }

    async fn list_session_tools(
        &self,
        caller: &Caller,
        arguments: &Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let Some(session) = self.session_argument(arguments, context).await else {
            return failure(
                "invalid_arguments",
                "list_session_tools needs {\"session\": \"<handle or code>\"} (no session was opened in this conversation: call open_codap, or connect_session with the user's code).",
            );
        };
        // A handle or a code: the relay takes either.
        let tools = self.session_tools(caller, &session).await;
        match tools {
            Ok(tools) => success(json!({"tools": tools.iter().map(|t| json!({
                "name": t.name, "title": t.title, "description": t.description,
                "inputSchema": &*t.input_schema, "annotations": t.annotations
            })).collect::<Vec<_>>()})),
            Err(error) => from_error(&error),
        }
    }

    /// `call_session_tool`, or `read_session_tool` when `read_only` (the relay refuses a
    /// function not marked read-only, pointing to `call_session_tool`).
    async fn call_session_tool(
        &self,
        arguments: &Value,
        read_only: bool,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (Some(session), Some(tool_name)) = (
            self.session_argument(arguments, context).await,
            text(arguments, "name"),
        ) else {
            let name = if read_only {
                Pairing::ReadTool.name()
            } else {
                Pairing::CallTool.name()
            };
            return failure(
                "invalid_arguments",
                &format!(
                    "{name} needs {{\"session\": \"<handle or code>\", \"name\": \"<tool>\", \"arguments\": {{...}}}} (session may be left out once open_codap or connect_session opened one in this conversation)."
                ),
            );
        };
        let arguments = arguments.get("arguments").cloned().unwrap_or(Value::Null);
        self.call_in_session(&session, &tool_name, arguments, read_only, context)
            .await
            .inside_a_tool()
    }
}

impl RelayMcp {
    /// The `session` argument, or else the session this MCP client session opened.
    async fn session_argument(
        &self,
        arguments: &Value,
        context: &RequestContext<RoleServer>,
    ) -> Option<String> {
        match text(arguments, "session") {
            Some(session) => Some(session),
            None => self.remembered(context).await,
        }
    }
}

/// The string argument `key`, if there is one.
fn text(arguments: &Value, key: &str) -> Option<String> {
    arguments
        .get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pairing_tool_is_found_by_the_name_it_is_listed_under() {
        let tools = Pairing::tools();
        assert_eq!(tools.len(), Pairing::ALL.len());
        for (tool, pairing) in tools.iter().zip(Pairing::ALL) {
            assert_eq!(Pairing::named(&tool.name), Some(pairing));
        }
        assert_eq!(Pairing::named("connect_sessions"), None);
    }
}
