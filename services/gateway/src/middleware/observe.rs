//! The gateway's HTTP metrics (`toolrelay_http_requests_total`,
//! `toolrelay_http_request_duration_seconds`, `toolrelay_http_errors_total`): the outermost
//! middleware times every request until its response head, and counts it by route template,
//! method and status — and an error answer by its name, which the response carries in its
//! extensions from where it was made ([`ErrorCode`], or a tool API's [`FailureCode`]).
//!
//! The route label is the template of the route a path matches (`/api/sessions/{code}/call`),
//! found in a table made once from the route table — never the path, which carries codes and
//! handles. A request refused before routing (an API key missing, a body too large) is
//! counted under its route all the same; a path matching no route is `other`.

use std::collections::HashMap;
use std::time::Instant;

use poem::http::Method;
use poem::{Request, Response};
use toolrelay_relay::front::FailureCode;
use toolrelay_relay::front::RouteLabel;
use toolrelay_relay::front::{ErrorCode, Metrics};

/// The route templates of the paths the gateway serves.
pub struct Routes {
    /// By number of `/`-separated segments.
    by_length: HashMap<usize, Vec<Template>>,
    /// The CODAP plugin's files: `/codap`, `/codap/`, `/codap/{file}`.
    plugin: RouteLabel,
    other: RouteLabel,
}

struct Template {
    /// `None` for a parameter.
    segments: Vec<Option<String>>,
    literals: usize,
    label: RouteLabel,
}

/// The plugin's files, under one label.
const PLUGIN: &str = "/codap/*";

impl Routes {
    /// A table of `templates` (`{name}` marks a parameter segment), plus the plugin's files.
    pub fn new<'a>(templates: impl IntoIterator<Item = &'a str>) -> Self {
        let mut by_length: HashMap<usize, Vec<Template>> = HashMap::new();
        for template in templates {
            let segments: Vec<Option<String>> = template
                .split('/')
                .map(|segment| {
                    let parameter = segment.starts_with('{') && segment.ends_with('}');
                    (!parameter).then(|| segment.to_owned())
                })
                .collect();
            let literals = segments.iter().filter(|segment| segment.is_some()).count();
            by_length.entry(segments.len()).or_default().push(Template {
                segments,
                literals,
                label: RouteLabel::new(template),
            });
        }
        // The most specific template first: `/x/{a}/call` before `/x/{a}/{b}`.
        for templates in by_length.values_mut() {
            templates.sort_by_key(|template| std::cmp::Reverse(template.literals));
        }
        Self {
            by_length,
            plugin: RouteLabel::new(PLUGIN),
            other: RouteLabel::other(),
        }
    }

    /// The label of the route `path` matches: its template, or `other`.
    pub fn label(&self, path: &str) -> &RouteLabel {
        if path == "/codap" || path.starts_with("/codap/") {
            return &self.plugin;
        }
        let length = path.split('/').count();
        self.by_length
            .get(&length)
            .and_then(|templates| {
                templates.iter().find(|template| {
                    template
                        .segments
                        .iter()
                        .zip(path.split('/'))
                        .all(|(wanted, segment)| {
                            wanted.as_deref().is_none_or(|literal| literal == segment)
                                && (wanted.is_some() || !segment.is_empty())
                        })
                })
            })
            .map_or(&self.other, |template| &template.label)
    }
}

/// What the middleware needs: where to count, and the route table.
pub struct HttpMetrics {
    /// The process's metrics.
    pub metrics: Metrics,
    /// The route templates.
    pub routes: Routes,
}

/// A request being counted and timed (see the module's documentation): taken as it comes in,
/// counted with its answer.
pub struct Observation<'a> {
    http: &'a HttpMetrics,
    started: Instant,
    route: &'a RouteLabel,
    method: Method,
}

impl<'a> Observation<'a> {
    /// Starts timing `request`.
    pub fn start(http: &'a HttpMetrics, request: &Request) -> Self {
        Self {
            http,
            started: Instant::now(),
            route: http.routes.label(request.uri().path()),
            method: request.method().clone(),
        }
    }

    /// Counts the request with its answer.
    pub fn end(self, response: Response) -> Response {
        let status = response.status();
        let Self {
            http,
            started,
            route,
            method,
        } = self;
        http.metrics
            .http_request(route, method.as_str(), status.as_u16(), started.elapsed());
        if status.is_client_error() || status.is_server_error() {
            let error = error_name(&response);
            http.metrics.http_error(route, error);
        }
        response
    }
}

/// The `error` label of an error answer, from the code it carries in its extensions: an
/// [`ErrorCode`] name (a tool API's code counts when it spells one), `tool_error` for another
/// built-in tool code, `other` for an answer that names none.
fn error_name(response: &Response) -> &'static str {
    let extensions = response.extensions();
    if let Some(code) = extensions.get::<ErrorCode>() {
        return code.as_str();
    }
    extensions.get::<FailureCode>().map_or("other", |code| {
        code.error_code().unwrap_or(ErrorCode::ToolError).as_str()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_labelled_with_their_route_template() {
        let routes = Routes::new([
            "/",
            "/api/sessions",
            "/api/sessions/{code}",
            "/api/sessions/{code}/call",
            "/api/sessions/{code}/requests/{requestId}",
            "/mcp",
            "/mcp/s/{handle}",
            "/healthz",
        ]);
        for (path, label) in [
            ("/", "/"),
            ("/api/sessions", "/api/sessions"),
            ("/api/sessions/ABCD-EFGH", "/api/sessions/{code}"),
            ("/api/sessions/ABCD-EFGH/call", "/api/sessions/{code}/call"),
            (
                "/api/sessions/ABCD-EFGH/requests/r1",
                "/api/sessions/{code}/requests/{requestId}",
            ),
            ("/mcp/s/secret-handle", "/mcp/s/{handle}"),
            ("/codap", "/codap/*"),
            ("/codap/index.html", "/codap/*"),
            ("/healthz", "/healthz"),
            ("/api/sessions/ABCD-EFGH/nope", "other"),
            ("/api/sessions//call", "other"),
            ("/secret-token", "other"),
        ] {
            assert_eq!(routes.label(path).as_str(), label, "{path}");
        }
    }

    #[test]
    fn errors_are_named_by_the_code_their_response_carries() {
        use toolrelay_relay::front::ToolCode;
        // The body is never read: an answer that carries no code is `other`.
        let refusal = || {
            Response::builder()
                .status(poem::http::StatusCode::BAD_REQUEST)
                .body(r#"{"error": "rate_limited"}"#)
        };
        assert_eq!(error_name(&refusal()), "other");
        let mut response = refusal();
        response.extensions_mut().insert(ErrorCode::SessionNotFound);
        assert_eq!(error_name(&response), "session_not_found");
        for (code, name) in [
            (FailureCode::Tool(ToolCode::EmptyCode), "tool_error"),
            (FailureCode::Tool(ToolCode::NotFound), "not_found"),
            (FailureCode::Refused(ErrorCode::RateLimited), "rate_limited"),
        ] {
            let mut response = refusal();
            response.extensions_mut().insert(code);
            assert_eq!(error_name(&response), name, "{code}");
        }
    }
}
