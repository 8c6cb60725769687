//! The gateway's middleware, each layer in its own file, and their order in one function
//! ([`layers`]).
//!
//! * [`observe`] — the HTTP metrics and the request's span and log line;
//! * [`cors`] — CORS: the allow-list, and the routes open to any origin;
//! * [`checks`] — the `Host` check and the Fetch Metadata policy, before any look-up;
//! * [`auth`] — API keys on the LLM side;
//! * the body limit (here), and error bodies ([`crate::error::normalise_errors`]).

pub mod auth;
pub mod checks;
pub mod cors;
pub mod observe;

use std::sync::Arc;

use poem::http::{Method, StatusCode, header};
use poem::{Endpoint, EndpointExt, IntoResponse, Request, Response};

use crate::api::State;
use crate::config::{MAX_CALL_BODY, MAX_PROVIDER_BODY};
use crate::error::{normalise_errors, note_too_deep};
use checks::{Checks, check_host, fetch_metadata};
use observe::HttpMetrics;

/// `routes` (the handlers, with the gateway's state attached) inside the middleware, outermost
/// last in this list, so a request meets them from the bottom up:
/// 1. the metrics and the request's span see every request, refused or not;
/// 2. routes open to any origin (the tab's, with `OPEN_PROVIDER_ROUTES`) answer CORS there;
/// 3. every refusal below gets the JSON error body;
/// 4. the `Host` check, then the Fetch Metadata policy, refuse before any look-up;
/// 5. CORS for the allow-listed origins;
/// 6. API keys on the LLM side;
/// 7. the body limit, before any handler buffers a body.
pub fn layers<E>(
    routes: E,
    state: &State,
    http: Arc<HttpMetrics>,
) -> poem::endpoint::BoxEndpoint<'static, Response>
where
    E: Endpoint + 'static,
{
    let cors = cors::allow_list(&state.config.cors_origins);
    let keys = state.config.api_keys.clone();
    let open_providers = state.config.open_provider_routes;
    let (site, host) = (Checks::of(state), Checks::of(state));
    routes
        .around(limit_body)
        .around(move |next, request| auth::require_api_key(keys.clone(), next, request))
        .with(cors)
        .around(move |next, request| fetch_metadata(Arc::clone(&site), next, request))
        .around(move |next, request| check_host(Arc::clone(&host), next, request))
        .around(normalise_errors)
        .around(move |next, request| cors::open_cors(open_providers, next, request))
        .around(move |next, request| observe::observe(Arc::clone(&http), next, request))
        .map_to_response()
        // Boxed: the middleware stack's type is deep enough to overflow the compiler's query
        // depth where the connection service wraps it in async blocks.
        .boxed()
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

/// Middleware: refuses a request body over its limit with 413, whether or not it declares
/// its length, before any handler buffers it.
async fn limit_body<E: Endpoint>(next: E, mut request: Request) -> poem::Result<Response> {
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
        let body = match request.take_body().into_bytes_limit(limit).await {
            Ok(bytes) => bytes,
            Err(poem::error::ReadBodyError::PayloadTooLarge) => {
                return Err(poem::Error::from_status(StatusCode::PAYLOAD_TOO_LARGE));
            }
            Err(error) => {
                return Err(poem::Error::from_string(
                    error.to_string(),
                    StatusCode::BAD_REQUEST,
                ));
            }
        };
        request.set_body(body.clone());
        return next
            .call(request)
            .await
            .map(IntoResponse::into_response)
            .map_err(|error| note_too_deep(error, &body));
    }
    next.call(request).await.map(IntoResponse::into_response)
}
