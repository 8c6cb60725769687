//! What every request passes before any route looks anything up (SPEC §10):
//!
//! * the `Host` check ([`check_host`]): a gateway listening on loopback answers only to its
//!   public host, loopback names and `ALLOWED_HOSTS` — a DNS-rebinding page names its own
//!   host, and gets 421 (MCP makes the same check with the same names in rmcp);
//! * the Fetch Metadata policy ([`fetch_metadata`]) on every route that takes a session code
//!   or connector handle: a request a browser sent for another site's page — a cross-site
//!   subresource (`<img>`, a no-cors `fetch()`, an iframe), or any request from an origin the
//!   route does not allow — is refused with 403 before the brute-force guard sees it, so a web
//!   page cannot spend its visitors' budget of unknown codes (and block everyone behind
//!   their NAT). A tab's own requests carry its provider token and pass.
//!
//! Both refusals are counted in `toolrelay_refused_total{reason}`.

use poem::http::{Method, StatusCode, header};
use poem::{Request, Response};
use toolrelay_relay::front::Refusal;
use toolrelay_relay::front::{ErrorCode, Metrics};

use crate::api::State;
use crate::config::{ENV_ALLOWED_HOSTS, ENV_PUBLIC_BASE_URL, bare_host};
use crate::error::error_response;
use crate::middleware::cors::{SentOrigin, names_host};

/// What the checks need from the gateway's settings.
pub struct Checks {
    /// The names a `Host` may give, when the gateway checks it.
    hosts: Option<Vec<String>>,
    /// The public base URL, for the 421's message.
    public_base_url: String,
    /// Origins allowed to call the LLM-side routes.
    cors_origins: Vec<String>,
    metrics: Metrics,
}

impl Checks {
    /// The checks of the gateway `state`.
    pub fn of(state: &State) -> Self {
        let config = &state.config;
        Self {
            hosts: config.check_host.then(|| config.host_names()),
            public_base_url: config.public_base_url.clone(),
            cors_origins: config.cors_origins.clone(),
            metrics: state.metrics.clone(),
        }
    }
}

/// When the gateway listens on loopback, a request whose `Host` is not one of its names is
/// answered 421: the refusal, if it is refused. MCP's endpoints check it themselves (rmcp, the
/// same names).
pub fn check_host(checks: &Checks, request: &Request) -> Option<Response> {
    let path = request.uri().path();
    let is_mcp = path == "/mcp" || path.starts_with("/mcp/");
    if let Some(hosts) = checks.hosts.as_ref().filter(|_| !is_mcp) {
        let named = request.uri().host().or_else(|| {
            request
                .headers()
                .get(header::HOST)
                .and_then(|value| value.to_str().ok())
        });
        // A request without any `Host` (HTTP/1.0) is not a browser's: rebinding always names one.
        if let Some(named) = named {
            // The names allowed are lower case ([`crate::config::GatewayConfig::host_names`]).
            let host = bare_host(named);
            if !hosts
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(host))
            {
                checks.metrics.refused(Refusal::Host);
                return Some(error_response(
                    StatusCode::MISDIRECTED_REQUEST,
                    ErrorCode::HostNotAllowed,
                    format!(
                        "This relay answers to {} ({ENV_PUBLIC_BASE_URL}) and to loopback names, not to the host this request named. Use that address, or have the operator set {ENV_PUBLIC_BASE_URL} to the address you use or add the name to {ENV_ALLOWED_HOSTS}.",
                        checks.public_base_url
                    ),
                ));
            }
        }
    }
    None
}

/// Whether a path takes a session code or a connector handle: the session routes, the
/// legacy aliases and connector URLs.
fn looks_up_code(path: &str) -> bool {
    path.strip_prefix("/api/sessions/")
        .is_some_and(|rest| !rest.is_empty())
        || path.starts_with("/mcp/s/")
        || matches!(path, "/request" | "/response" | "/stream" | "/metadata")
}

/// The Fetch Metadata resource-isolation policy on the routes that look up a code: the
/// refusal, if it is refused. Refused with 403, before any look-up and without counting
/// against the guard:
///
/// * a cross-site request a browser did not make as `cors` or `websocket` (`Sec-Fetch-Site:
///   cross-site` with `Sec-Fetch-Mode: no-cors` or `navigate`), unless it carries an
///   `Authorization` header — which a browser never adds to such a request, while a page can
///   write `?token=` into an `<img>` URL;
/// * a request from an `Origin` the route's CORS list does not name, unless it carries the
///   provider token (a tab on any origin attaches with it; without it, only the LLM side's
///   origins may look codes up).
pub fn fetch_metadata(checks: &Checks, request: &Request) -> Option<Response> {
    if request.method() == Method::OPTIONS || !looks_up_code(request.uri().path()) {
        return None;
    }
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let authorized = headers.contains_key(header::AUTHORIZATION);
    let token = authorized || has_query_token(request.uri().query());
    let cross_site_subresource = text("sec-fetch-site")
        .is_some_and(|site| site.eq_ignore_ascii_case("cross-site"))
        && !text("sec-fetch-mode").is_some_and(|mode| {
            mode.eq_ignore_ascii_case("cors") || mode.eq_ignore_ascii_case("websocket")
        });
    let origin = headers
        .get(header::ORIGIN)
        .or_else(|| request.extensions().get::<SentOrigin>().map(|sent| &sent.0));
    let foreign_origin = origin
        .and_then(|value| value.to_str().ok())
        .is_some_and(|origin| {
            !checks
                .cors_origins
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(origin))
                && !names_host(origin, request)
        });
    if (cross_site_subresource && !authorized) || (foreign_origin && !token) {
        checks.metrics.refused(Refusal::FetchMetadata);
        return Some(error_response(
            StatusCode::FORBIDDEN,
            ErrorCode::CrossSiteRequest,
            "A browser sent this request for a page on another site, without the session's provider token: it is refused before any session is looked up. Call the relay from your own server, from an allowed origin (CORS_ORIGIN), or from the tab that holds the provider token.".to_owned(),
        ));
    }
    None
}

/// Whether a query string carries a non-empty `token`.
fn has_query_token(query: Option<&str>) -> bool {
    query.is_some_and(|query| {
        query.split('&').any(|pair| {
            pair.split_once('=')
                .is_some_and(|(key, value)| key == "token" && !value.is_empty())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routes_that_take_a_code_are_told_apart() {
        for path in [
            "/api/sessions/ABCD2345",
            "/api/sessions/ABCD2345/metadata",
            "/api/sessions/ABCD2345/ws",
            "/mcp/s/0123",
            "/metadata",
            "/stream",
            "/request",
            "/response",
        ] {
            assert!(looks_up_code(path), "{path}");
        }
        for path in [
            "/api/sessions",
            "/api/sessions/",
            "/mcp",
            "/api/tools/x",
            "/healthz",
        ] {
            assert!(!looks_up_code(path), "{path}");
        }
        assert!(has_query_token(Some("code=A&token=t")));
        assert!(!has_query_token(Some("token=")));
        assert!(!has_query_token(None));
    }
}
