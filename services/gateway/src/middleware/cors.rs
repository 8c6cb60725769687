//! CORS, in one place: the allow-list (`CORS_ORIGIN`) for the routes a browser reaches with
//! its origin's credentials, and CORS `*` without credentials on the open routes (the public
//! tool API, the documents, the SDK's files and, unless `CORS_ORIGIN` narrowed them, the
//! provider routes), whose preflight is answered here. Both allow the same methods and headers.

use poem::http::{Method, StatusCode, header};
use poem::middleware::Cors;
use poem::{Request, Response};

use crate::error::{REQUEST_ID_HEADER, is_tool_route};

/// The methods a browser may use on the relay.
const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::OPTIONS,
];
/// The request headers a browser may send.
const HEADERS: [&str; 4] = [
    "Content-Type",
    "Authorization",
    "X-Request-Id",
    "Last-Event-ID",
];
/// The response headers a page may read.
const EXPOSED: &str = "x-request-id, retry-after";

/// Names as one header value.
fn listed<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    names
        .into_iter()
        .map(|name| name.as_ref().to_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

/// CORS for the routes outside the open ones: the origins `CORS_ORIGIN` lists.
pub fn allow_list(origins: &[String]) -> Cors {
    Cors::new()
        .allow_origins(origins.iter().map(String::as_str))
        .allow_methods(METHODS)
        .allow_headers(HEADERS)
        .expose_headers([REQUEST_ID_HEADER, header::RETRY_AFTER.as_str()])
        .max_age(3600)
}

/// Routes open to every origin (SPEC §10): the public tool API, the documents and the
/// browser SDK's files.
fn is_open_route(path: &str) -> bool {
    is_tool_route(path)
        || path.starts_with("/openapi")
        || path.starts_with("/.well-known/")
        || path.starts_with("/sdk/")
}

/// Whether the request's `Origin` names the host it was sent to.
fn is_same_origin(request: &Request) -> bool {
    request
        .headers()
        .get(header::ORIGIN)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|origin| names_host(origin, request))
}

/// Whether `origin` names the host `request` was sent to.
pub fn names_host(origin: &str, request: &Request) -> bool {
    request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|host| {
            origin
                .split_once("://")
                .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
        })
}

/// The routes a page serving tools uses (SPEC §6): create a session (or redeem a claim for
/// one), see or end it, attach (WebSocket, SSE, polling), register its manifest, answer. The
/// provider token (or the one-time claim), never a cookie, guards them, so a page on any origin
/// may use them (the browser SDK's point).
fn is_provider_route(method: &str, path: &str) -> bool {
    if path == "/api/sessions" || path == "/api/sessions/claim" {
        return method == "POST";
    }
    let Some(rest) = path.strip_prefix("/api/sessions/") else {
        return false;
    };
    match rest.split_once('/') {
        None => matches!(method, "GET" | "DELETE"),
        Some((_, "ws" | "stream" | "request")) => method == "GET",
        Some((_, "manifest")) => method == "PUT",
        Some((_, "response")) => method == "POST",
        Some(_) => false,
    }
}

/// The `Origin` a request came with, kept when [`open_cors`] takes it off a request to an open
/// route.
#[derive(Debug, Clone)]
pub struct SentOrigin(pub header::HeaderValue);

/// CORS `*` without credentials on the open routes — the public tool API, the documents, the
/// SDK's files, and (unless `CORS_ORIGIN` narrowed them) the provider routes — whose preflight
/// is answered here; other routes are left to the allow-list, except same-origin requests,
/// which need none. What [`open_cors`] decided for a request.
pub enum OpenCors {
    /// A preflight on an open route, answered here.
    Preflight(Response),
    /// An open route: its answer gets CORS `*` ([`OpenCors::answered`]).
    Open,
    /// Another route: the allow-list decides.
    Listed,
}

/// Looks at `request` before anything else does (see [`OpenCors`]): on an open route its
/// `Origin` is taken off (kept as [`SentOrigin`]), and so is a same-origin request's.
pub fn open_cors(open_providers: bool, request: &mut Request) -> OpenCors {
    use poem::http::Method;
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    // A preflight asks for the method the real request will use.
    let method = if preflight {
        request
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_METHOD)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
    } else {
        request.method().as_str()
    };
    let path = request.uri().path();
    let open = is_open_route(path) || (open_providers && is_provider_route(method, path));
    if !open {
        // A same-origin request (the plugin calling the relay that serves it) needs no CORS,
        // whatever name the relay is reached by.
        if is_same_origin(request) {
            request.headers_mut().remove(header::ORIGIN);
        }
        return OpenCors::Listed;
    }
    if preflight {
        return OpenCors::Preflight(
            Response::builder()
                .status(StatusCode::NO_CONTENT)
                .header(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")
                .header(
                    header::ACCESS_CONTROL_ALLOW_METHODS,
                    listed(METHODS.map(|method| method.to_string())),
                )
                .header(header::ACCESS_CONTROL_ALLOW_HEADERS, listed(HEADERS))
                .header(header::ACCESS_CONTROL_MAX_AGE, "86400")
                .finish(),
        );
    }
    // The allow-list does not apply here: the origin is not checked by CORS. The Fetch
    // Metadata policy still reads it ([`crate::middleware::checks::fetch_metadata`]).
    if let Some(origin) = request.headers_mut().remove(header::ORIGIN) {
        request.extensions_mut().insert(SentOrigin(origin));
    }
    OpenCors::Open
}

impl OpenCors {
    /// The answer to a request not answered by [`open_cors`] itself, with CORS `*` on an open
    /// route.
    pub fn answered(self, mut response: Response) -> Response {
        use poem::http::HeaderValue;
        let Self::Open = self else {
            return response;
        };
        let headers = response.headers_mut();
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED),
        );
        response
    }
}
