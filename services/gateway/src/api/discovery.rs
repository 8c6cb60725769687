//! Discovery, health, readiness and metrics.

use poem_openapi::payload::{Html, Json, PlainText};
use poem_openapi::{ApiResponse, OpenApi};

use super::{State, Tag};
use crate::error::ApiError;
use crate::types::Discovery;

/// The discovery operations.
pub struct DiscoveryApi {
    /// Shared state.
    pub state: State,
}

/// The metrics.
#[derive(ApiResponse)]
pub enum MetricsText {
    /// The metrics, in the Prometheus text format (version 0.0.4).
    #[oai(
        status = 200,
        content_type = "text/plain; version=0.0.4; charset=utf-8"
    )]
    Metrics(PlainText<String>),
}

/// The relay is ready.
#[derive(ApiResponse)]
pub enum Ready {
    /// The relay and its store answer.
    #[oai(status = 200)]
    Ready(PlainText<&'static str>),
}

#[OpenApi(tag = "Tag::Discovery")]
impl DiscoveryApi {
    /// Describe this relay's endpoints
    ///
    /// Absolute URLs of the endpoints; `{code}` stands for the pairing code.
    #[oai(
        path = "/.well-known/codap-mcp.json",
        method = "get",
        operation_id = "discover"
    )]
    async fn discover(&self) -> Json<Discovery> {
        let state = &self.state;
        let session = |rest: &str| state.url(&format!("/api/sessions/{{code}}{rest}"));
        let ws_base = state
            .config
            .public_base_url
            .replacen("https://", "wss://", 1)
            .replacen("http://", "ws://", 1);
        Json(Discovery {
            protocol_version: toolrelay::PROTOCOL_VERSION.to_owned(),
            manifest_endpoint: session("/metadata"),
            request_endpoint: session("/request"),
            response_endpoint: session("/response"),
            event_stream_endpoint: session("/stream"),
            call_endpoint: session("/call"),
            web_socket_endpoint: format!("{ws_base}/api/sessions/{{code}}/ws"),
            mcp_endpoint: state.url("/mcp"),
            openapi: state.url("/openapi.json"),
            app_hosts: state.config.app_hosts.clone(),
        })
    }

    /// What this server is (a page for people)
    ///
    /// A short page for whoever opens the relay's address, linking the plugin, the connector
    /// URL, the GPT Actions file and these documents.
    #[oai(path = "/", method = "get", operation_id = "landingPage", hidden)]
    async fn landing(&self) -> Html<String> {
        Html(crate::plugin::landing_page(
            &self.state.config.public_base_url,
        ))
    }

    /// Liveness
    ///
    /// Answers ok while the process runs.
    #[oai(path = "/healthz", method = "get", operation_id = "healthz")]
    async fn healthz(&self) -> PlainText<&'static str> {
        PlainText("ok")
    }

    /// Readiness
    ///
    /// Answers ok when the relay and its store answer, and the store the gateway shares with
    /// other gateways (rate limits, MCP sessions) does; 503 otherwise.
    #[oai(path = "/readyz", method = "get", operation_id = "readyz")]
    async fn readyz(&self) -> Result<Ready, ApiError> {
        self.state.relay.ready().await?;
        if let Err(error) = self.state.store.ping().await {
            let error = toolrelay_relay::front::RelayError::from(error);
            return Err(toolrelay_relay::front::ErrorInfo::from(error).into());
        }
        Ok(Ready::Ready(PlainText("ready")))
    }

    /// Metrics
    ///
    /// This process's metrics, for Prometheus: HTTP requests by route, sessions, calls by
    /// status and transport, queue depth, rate-limit refusals, the store, the MIP tools. Open
    /// like the health checks; label values never carry codes, handles or tokens.
    #[oai(path = "/metrics", method = "get", operation_id = "metrics")]
    async fn metrics(&self) -> MetricsText {
        MetricsText::Metrics(PlainText(self.state.metrics.render().await))
    }
}
