//! The gateway's middleware, each layer in its own file, and their order in one function
//! ([`layers`]).
//!
//! * [`observe`] — the HTTP metrics;
//! * [`cors`] — CORS: the allow-list, and the routes open to any origin;
//! * [`checks`] — the `Host` check and the Fetch Metadata policy, before any look-up;
//! * [`auth`] — API keys on the LLM side;
//! * the body limit (here), and error bodies ([`crate::error::Correlated`]).

pub mod auth;
pub mod checks;
pub mod cors;
pub mod observe;

use std::sync::Arc;

use http_body_util::BodyExt;
use poem::http::{Method, StatusCode, header};
use poem::{Endpoint, EndpointExt, IntoResponse, Request, Response};

use crate::api::State;
use crate::config::{MAX_CALL_BODY, MAX_PROVIDER_BODY};
use crate::error::{Correlated, note_too_deep};
use auth::ApiKeys;
use checks::{Checks, check_host, fetch_metadata};
use observe::HttpMetrics;

/// `routes` (the handlers, with the gateway's state attached) inside the middleware, which a
/// request meets in this order:
/// 1. the metrics see every request, refused or not ([`observe`]);
/// 2. routes open to any origin (the tab's, with `OPEN_PROVIDER_ROUTES`) answer CORS there
///    ([`cors::open_cors`]);
/// 3. the request's correlation id and its context for the logs; every refusal below gets
///    the JSON error body ([`Correlated`]);
/// 4. the `Host` check, then the Fetch Metadata policy, refuse before any look-up
///    ([`checks`]);
/// 5. CORS for the allow-listed origins (poem's [`poem::middleware::Cors`]);
/// 6. API keys on the LLM side ([`auth`]);
/// 7. the body limit, before any handler buffers a body.
///
/// Each is a step of one endpoint ([`Front`], and [`Guarded`] inside the allow-list's CORS),
/// not an endpoint of its own: a request's future held every layer's future and its copy of
/// the request (~23 KB), and was copied whole as it was built and boxed.
pub fn layers<E>(
    routes: E,
    state: &State,
    http: Arc<HttpMetrics>,
) -> poem::endpoint::BoxEndpoint<'static, Response>
where
    E: Endpoint + 'static,
{
    around(routes, state, http).boxed()
}

/// [`layers`], not boxed: the size of its future is the size of what is boxed (and copied)
/// for each request.
pub fn around<E: Endpoint>(
    routes: E,
    state: &State,
    http: Arc<HttpMetrics>,
) -> impl Endpoint<Output = Response> + use<E> {
    let guarded = Guarded {
        routes,
        keys: state.config.api_keys.clone(),
    };
    Front {
        inner: guarded.with(cors::allow_list(&state.config.cors_origins)),
        http,
        checks: Checks::of(state),
        open_providers: state.config.open_provider_routes,
    }
}

/// Steps 1 to 5 of [`layers`].
struct Front<E> {
    /// The allow-list's CORS around [`Guarded`].
    inner: E,
    http: Arc<HttpMetrics>,
    checks: Checks,
    open_providers: bool,
}

impl<E: Endpoint> Endpoint for Front<E> {
    type Output = Response;

    async fn call(&self, mut request: Request) -> poem::Result<Response> {
        let observation = observe::Observation::start(&self.http, &request);
        // Nothing below answers an error: `Correlated` turns each into its response.
        let answered = match cors::open_cors(self.open_providers, &mut request) {
            cors::OpenCors::Preflight(response) => response,
            open => {
                let correlated = Correlated::of(&request);
                open.answered(correlated.answer(|| self.checked(request)).await)
            }
        };
        Ok(observation.end(answered))
    }
}

impl<E: Endpoint> Front<E> {
    /// Steps 4 and 5.
    async fn checked(&self, request: Request) -> poem::Result<Response> {
        if let Some(refusal) =
            check_host(&self.checks, &request).or_else(|| fetch_metadata(&self.checks, &request))
        {
            return Ok(refusal);
        }
        self.inner
            .call(request)
            .await
            .map(IntoResponse::into_response)
    }
}

/// Steps 6 and 7 of [`layers`].
struct Guarded<E> {
    routes: E,
    keys: Option<Arc<ApiKeys>>,
}

impl<E: Endpoint> Endpoint for Guarded<E> {
    type Output = Response;

    async fn call(&self, request: Request) -> poem::Result<Response> {
        if let Some(refusal) = auth::require_api_key(self.keys.as_deref(), &request) {
            return Ok(refusal);
        }
        limit_body(&self.routes, request).await
    }
}

/// Bodies the tab sends (answers, manifests) may be larger than an LLM's calls.
fn body_limit(method: &Method, path: &str) -> usize {
    let from_tab = (*method == Method::POST && path.ends_with("/response"))
        || (*method == Method::PUT && path.ends_with("/manifest"));
    if from_tab {
        MAX_PROVIDER_BODY
    } else {
        MAX_CALL_BODY
    }
}

/// A request's body, read whole unless it grows past `limit` bytes (413). The same as poem's
/// `Body::into_bytes_limit`, refusing the same bodies in the same words, without what that
/// costs every request: a 4 KB buffer zeroed in its future (which made this middleware's
/// future 5.2 KB, copied as it is made), each chunk copied twice, and a reader around the
/// body. A body that came in one piece is kept as it came (BENCHMARKS.md, issue 44).
async fn read_limited(body: poem::Body, limit: usize) -> poem::Result<hyper::body::Bytes> {
    let body: http_body_util::combinators::BoxBody<hyper::body::Bytes, std::io::Error> =
        body.into();
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(poem::Error::from_status(StatusCode::PAYLOAD_TOO_LARGE))
        }
        Err(error) => {
            let error = match error.downcast::<std::io::Error>() {
                Ok(error) => *error,
                Err(other) => std::io::Error::other(other),
            };
            Err(poem::Error::from_string(
                poem::error::ReadBodyError::Io(error).to_string(),
                StatusCode::BAD_REQUEST,
            ))
        }
    }
}

/// Middleware: refuses a request body over its limit with 413, whether or not it declares
/// its length, before any handler buffers it.
async fn limit_body<E: Endpoint>(next: &E, mut request: Request) -> poem::Result<Response> {
    if matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    ) {
        let limit = body_limit(request.method(), request.uri().path());
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<usize>().ok());
        if declared.is_some_and(|length| length > limit) {
            return Err(poem::Error::from_status(StatusCode::PAYLOAD_TOO_LARGE));
        }
        let body = read_limited(request.take_body(), limit).await?;
        request.set_body(body.clone());
        return next
            .call(request)
            .await
            .map(IntoResponse::into_response)
            .map_err(|error| note_too_deep(error, &body));
    }
    next.call(request).await.map(IntoResponse::into_response)
}
