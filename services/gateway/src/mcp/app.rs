//! "CODAP in the conversation": the MCP App (the `io.modelcontextprotocol/ui` extension) of
//! `/mcp`'s `open_codap`.
//!
//! `open_codap` creates a session with a one-time claim ([`CreateClaimedSession`]) and names
//! the resource `ui://toolrelay/codap`; a host that renders apps shows that page in a sandboxed
//! frame inside the conversation, and the page frames CODAP with the relay's plugin and the
//! claim in the plugin's URL (the result's `link`). The plugin redeems the claim
//! (`POST /api/sessions/claim`) instead of showing a code, so the model's next calls with the
//! returned handle reach that CODAP. A host without apps shows the model the same `link` to
//! open in a new tab. The MCP client session remembers the session it opened: the pairing
//! tools' `session` may then be left out.

use std::sync::Arc;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use rmcp::RoleServer;
use rmcp::model::{
    CallToolResult, ListResourcesResult, MetaObject, ReadResourceResult, Resource, ResourceContents,
};
use rmcp::service::RequestContext;
use serde_json::{Value, json};
use toolrelay_relay::front::Timestamp;
use toolrelay_relay::front::ops::{CreateClaimedSession, DescribeClaim, GetSession};
use toolrelay_relay::front::{Caller, ErrorCode};

use super::tools::{failure, from_error, success};
use super::{RelayMcp, caller_of, mcp_session_of};

/// The app's resource.
pub(super) const CODAP_APP: &str = "ui://toolrelay/codap";
/// The MIME type of an MCP App's page.
const APP_MIME_TYPE: &str = "text/html;profile=mcp-app";
/// The page, embedded in the binary (no build step).
const APP_PAGE: &str = include_str!("codap-app.html");
/// The ticket scope under which an MCP client session's opened session is remembered.
const OPENED_SCOPE: &str = "mcp-opened-session";

/// The `_meta` of `open_codap`: its app under the extension's key (`ui.resourceUri`, what the
/// stable spec names), and the flat `ui/resourceUri` it deprecates, kept for older hosts.
pub(super) fn open_codap_meta() -> MetaObject {
    let mut meta = MetaObject::new();
    meta.insert(
        "ui".to_owned(),
        json!({"resourceUri": CODAP_APP, "visibility": ["model", "app"]}),
    );
    meta.insert("ui/resourceUri".to_owned(), json!(CODAP_APP));
    meta
}

/// The `_meta` of a tool only the app calls (through its host): hosts do not offer it to the
/// model.
pub(super) fn app_only_meta() -> MetaObject {
    let mut meta = MetaObject::new();
    meta.insert("ui".to_owned(), json!({"visibility": ["app"]}));
    meta
}

/// Whether cloud assistants (Claude, ChatGPT: their servers call the relay) can reach a relay
/// at `base`: only over HTTPS, at a name that is not this machine's.
fn cloud_reachable(base: &str) -> bool {
    let Some(rest) = base.strip_prefix("https://") else {
        return false;
    };
    let host = crate::config::bare_host(rest.split('/').next().unwrap_or_default());
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host.ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    !loopback
}

impl RelayMcp {
    /// The app's page as `resources/list` shows it.
    pub(super) fn list_app(&self) -> ListResourcesResult {
        let resource = Resource::new(CODAP_APP, "codap")
            .with_title("CODAP in the conversation")
            .with_description(
                "A CODAP document with the toolrelay plugin, paired with this conversation (the app of open_codap).",
            )
            .with_mime_type(APP_MIME_TYPE)
            .with_meta(self.app_meta());
        ListResourcesResult::with_all_items(vec![resource])
    }

    /// The app's page as `resources/read` gives it: the HTML, and the origin its page may frame
    /// (CODAP's). The page reaches nothing itself: it asks the relay through its host
    /// (`codap_status`), and the plugin inside CODAP reaches the relay from CODAP's frame.
    pub(super) fn read_app(&self, uri: &str) -> Option<ReadResourceResult> {
        (uri == CODAP_APP).then(|| {
            let contents = ResourceContents::TextResourceContents {
                uri: CODAP_APP.to_owned(),
                mime_type: Some(APP_MIME_TYPE.to_owned()),
                text: APP_PAGE.to_owned(),
                meta: Some(self.app_meta()),
            };
            ReadResourceResult::new(vec![contents])
        })
    }

    /// The `_meta.ui` of the app's resource, on its `resources/list` entry and its
    /// `resources/read` content alike (hosts read either; the content wins).
    fn app_meta(&self) -> MetaObject {
        let config = &self.state.config;
        let mut meta = MetaObject::new();
        meta.insert(
            "ui".to_owned(),
            json!({
                "csp": {"frameDomains": [config.codap_origin()]},
                "prefersBorder": false,
            }),
        );
        meta
    }

    /// `open_codap`: a session with a claim for the plugin the app frames; the answer names
    /// the handle to call the session with and the link to the same flow in a new tab.
    pub(super) async fn open_codap(&self, context: &RequestContext<RoleServer>) -> CallToolResult {
        let caller = &caller_of(context);
        let state = &self.state;
        if let Err(limited) = state.limits.create_session(caller).await {
            return failure(limited.code.as_str(), &limited.message);
        }
        let opened = match state.relay.run(caller, CreateClaimedSession).await {
            Ok(opened) => opened,
            Err(error) => return from_error(&error),
        };
        let handle = opened.session.mcp_handle.clone();
        self.remember(context, &handle, opened.session.max_expires_at)
            .await;
        let config = &state.config;
        let plugin = state.url(&format!("/codap/?claim={}", opened.claim));
        let separator = if config.codap_url.contains('?') {
            '&'
        } else {
            '?'
        };
        let link = format!(
            "{}{separator}di={}",
            config.codap_url,
            utf8_percent_encode(&plugin, NON_ALPHANUMERIC)
        );
        let mut answer = json!({
            "handle": handle,
            "connectorUrl": state.url(&format!("/mcp/s/{handle}")),
            "expiresAt": opened.claim_expires_at.rfc3339(),
            "link": link,
            "instructions": "CODAP is opening for the user inside the conversation (or, where the host shows no apps, give the user the link to open it in a new tab). Once its plugin has connected, call call_session_tool (or read_session_tool for reads) with this handle as session — or without session — e.g. name createDataContext, createItems, createGraph; list_session_tools shows them all. Until the plugin connects, calls answer that no tab is connected: wait a moment and try again. The link works once, before expiresAt.",
        });
        if !cloud_reachable(&config.public_base_url) {
            answer["note"] = Value::String(format!(
                "This relay is at {}, which cloud assistants (Claude, ChatGPT) cannot reach: they need it at a public https:// address. An assistant on this machine (a desktop client, an editor) can use it.",
                config.public_base_url
            ));
        }
        success(answer)
    }

    /// `codap_status`, which only the app calls: whether its claim was taken (`open`, `used`,
    /// `expired`, `unknown`) and whether its session's tab is connected, with its tools — so
    /// the app knows when CODAP has paired without reaching the relay itself.
    pub(super) async fn codap_status(
        &self,
        caller: &Caller,
        arguments: &Value,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let relay = &self.state.relay;
        let claim = match arguments.get("claim").and_then(Value::as_str) {
            None => Value::Null,
            Some(claim) => {
                let described = relay.run(
                    caller,
                    DescribeClaim {
                        claim: claim.to_owned(),
                    },
                );
                match described.await {
                    Ok(_) => json!("open"),
                    Err(error) => match error.code {
                        ErrorCode::ClaimUsed => json!("used"),
                        ErrorCode::ClaimExpired => json!("expired"),
                        ErrorCode::UnknownClaim => json!("unknown"),
                        _ => return from_error(&error),
                    },
                }
            }
        };
        let session = match arguments.get("session").and_then(Value::as_str) {
            Some(session) => Some(session.to_owned()),
            None => self.remembered(context).await,
        };
        let Some(session) = session else {
            return failure(
                "invalid_arguments",
                "codap_status needs {\"session\": \"<handle from open_codap>\"}.",
            );
        };
        let status = GetSession {
            code: session,
            token: None,
        };
        match relay.run(caller, status).await {
            Ok(status) => success(json!({
                "claim": claim,
                "session": "live",
                "paired": status.transport.is_some(),
                "transport": status.transport.map(|transport| transport.as_str()),
                "toolCount": status.tool_count,
            })),
            Err(error)
                if error.code == ErrorCode::SessionNotFound
                    || error.code == ErrorCode::UnknownHandle =>
            {
                success(
                    json!({"claim": claim, "session": "ended", "paired": false, "toolCount": 0}),
                )
            }
            Err(error) => from_error(&error),
        }
    }

    /// Remembers, for the MCP client session of `context` (if it has one), the session it
    /// opened, until `until`; any gateway sharing the store finds it.
    pub(super) async fn remember(
        &self,
        context: &RequestContext<RoleServer>,
        handle: &str,
        until: Timestamp,
    ) {
        let Some(id) = mcp_session_of(context) else {
            return;
        };
        let scope = format!("{OPENED_SCOPE}/{id}");
        let value = Arc::new(Value::String(handle.to_owned()));
        if let Err(error) = self.state.store.put_ticket(&scope, "", value, until).await {
            tracing::warn!(error = %error, "the session an MCP client opened could not be remembered");
        }
    }

    /// The handle of the session the MCP client session of `context` opened last, if any.
    pub(super) async fn remembered(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        let id = mcp_session_of(context)?;
        let scope = format!("{OPENED_SCOPE}/{id}");
        let ticket = self.state.store.ticket(&scope, "").await.ok()??;
        ticket.as_str().map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_https_relays_are_reachable_from_the_cloud() {
        assert!(cloud_reachable("https://relay.example.org"));
        assert!(cloud_reachable("https://relay.example.org:8443/base"));
        assert!(!cloud_reachable("http://relay.example.org"));
        assert!(!cloud_reachable("https://127.0.0.1:8080"));
        assert!(!cloud_reachable("https://localhost"));
        assert!(!cloud_reachable("https://[::1]:8443"));
    }
}
