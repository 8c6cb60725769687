//! API keys (`API_KEYS`, SPEC §10): when an operator sets them, the LLM-facing routes — calls,
//! metadata, session status, answers, the built-in tools, MCP and the legacy LLM aliases —
//! need `Authorization: Bearer <key>`, and answer 401 otherwise. The tab's routes keep the
//! provider token; discovery, health, the landing page, the plugin and the OpenAPI documents
//! stay open. Keys are kept only as SHA-256 hashes and never logged ([`ApiKeys`]; the relay
//! checks the same keys on its gRPC port).

use poem::http::{Method, StatusCode, header};
use poem::{Request, Response};
pub use toolrelay_relay::front::ApiKeys;
use toolrelay_relay::front::ErrorCode;
use toolrelay_relay::front::FailureCode;

use crate::error::error_response;

/// Whether a request is on the LLM side (calls, metadata, status, answers, built-in tools,
/// MCP, the legacy LLM aliases): the routes an API key guards.
pub fn is_llm_route(method: &Method, path: &str) -> bool {
    if *method == Method::OPTIONS {
        return false;
    }
    // HEAD runs the GET handler (without the body): it is guarded like GET.
    let method = if *method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    if path == "/mcp" || path.starts_with("/mcp/") {
        return true;
    }
    if path == "/api/tools" || path.starts_with("/api/tools/") {
        return true;
    }
    if let Some(rest) = path.strip_prefix("/api/sessions/") {
        let mut parts = rest.split('/');
        let _code = parts.next();
        return match (parts.next(), parts.next(), parts.next()) {
            (None, None, None) => *method == Method::GET,
            (Some("metadata"), None, None) => *method == Method::GET,
            (Some("call" | "read"), None, None) => *method == Method::POST,
            (Some("request"), None, None) => *method == Method::POST,
            (Some("response"), None, None) => *method == Method::GET,
            // Reading a call's status, and cancelling it.
            (Some("requests"), Some(_), None) => {
                *method == Method::GET || *method == Method::DELETE
            }
            _ => false,
        };
    }
    (path == "/request" && *method == Method::POST)
        || (path == "/metadata" && *method == Method::GET)
}

/// Whether a request reads a session's status (`GET /api/sessions/{code}`), which the session's
/// provider may also do with its token instead of an API key.
pub fn is_session_status(method: &Method, path: &str) -> bool {
    matches!(*method, Method::GET | Method::HEAD)
        && path
            .strip_prefix("/api/sessions/")
            .is_some_and(|code| !code.is_empty() && !code.contains('/'))
}

/// With keys configured, an LLM-side request without a valid `Authorization: Bearer <key>` is
/// answered 401 (in the tool API's shape on its routes): the refusal, if it is refused.
pub fn require_api_key(keys: Option<&ApiKeys>, request: &Request) -> Option<Response> {
    let refusal = match keys {
        Some(keys) if is_llm_route(request.method(), request.uri().path()) => {
            let status_route = is_session_status(request.method(), request.uri().path());
            let key = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, key)| key.trim());
            match key {
                Some(key) if keys.accepts(key) => None,
                // The tab checking its own session sends its provider token instead: the
                // handler checks it ([`crate::api::llm`]'s getSession).
                Some(_) if status_route => None,
                Some(_) => Some((
                    ErrorCode::InvalidApiKey,
                    "The API key is not one this relay accepts. Check the key its operator gave you.",
                )),
                None => Some((
                    ErrorCode::ApiKeyRequired,
                    "This relay needs an API key: send it as Authorization: Bearer <key> (its operator gives them out).",
                )),
            }
        }
        _ => None,
    };
    let (name, message) = refusal?;
    let path = request.uri().path();
    let mut response = if path == "/api/tools" || path.starts_with("/api/tools/") {
        let code = FailureCode::Refused(name);
        let body = serde_json::json!({"success": false, "error": {
            "code": code, "message": message}});
        let mut response = Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .content_type("application/json; charset=utf-8")
            .body(body.to_string());
        response.extensions_mut().insert(code);
        response
    } else {
        error_response(StatusCode::UNAUTHORIZED, name, message.to_owned())
    };
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llm_routes_are_told_apart_from_the_tabs() {
        let llm = [
            (Method::GET, "/api/sessions/ABCD2345"),
            (Method::GET, "/api/sessions/ABCD2345/metadata"),
            (Method::POST, "/api/sessions/ABCD2345/call"),
            (Method::POST, "/api/sessions/ABCD2345/read"),
            (Method::POST, "/api/sessions/ABCD2345/request"),
            (Method::GET, "/api/sessions/ABCD2345/response"),
            (Method::GET, "/api/sessions/ABCD2345/requests/r1"),
            (Method::DELETE, "/api/sessions/ABCD2345/requests/r1"),
            (Method::POST, "/api/tools/encodePlantUML"),
            (Method::GET, "/api/tools"),
            (Method::POST, "/mcp"),
            (Method::GET, "/mcp/s/0123"),
            (Method::POST, "/request"),
            (Method::GET, "/metadata"),
            (Method::HEAD, "/api/sessions/ABCD2345/metadata"),
            (Method::HEAD, "/api/sessions/ABCD2345"),
            (Method::HEAD, "/metadata"),
        ];
        for (method, path) in llm {
            assert!(is_llm_route(&method, path), "{method} {path}");
        }
        let open = [
            (Method::POST, "/api/sessions"),
            (Method::POST, "/api/sessions/claim"),
            (Method::DELETE, "/api/sessions/ABCD2345"),
            (Method::GET, "/api/sessions/ABCD2345/request"),
            (Method::POST, "/api/sessions/ABCD2345/response"),
            (Method::PUT, "/api/sessions/ABCD2345/manifest"),
            (Method::GET, "/api/sessions/ABCD2345/stream"),
            (Method::GET, "/api/sessions/ABCD2345/ws"),
            (Method::POST, "/response"),
            (Method::GET, "/stream"),
            (Method::GET, "/healthz"),
            (Method::GET, "/.well-known/codap-mcp.json"),
            (Method::GET, "/openapi/actions.json"),
            (Method::GET, "/codap/"),
            (Method::GET, "/"),
            (Method::OPTIONS, "/mcp"),
        ];
        for (method, path) in open {
            assert!(!is_llm_route(&method, path), "{method} {path}");
        }
    }
}
