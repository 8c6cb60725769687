//! Assembling and serving the gateway: the route table, middleware, the OpenAPI documents, and
//! `run(state, listener, shutdown)` (the one-process server also starts the relay's gRPC
//! service next to it; see [`run_all`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use poem::http::{Method, StatusCode, header};
use poem::listener::TcpAcceptor;
use poem::middleware::Cors;
use poem::web::Data;
use poem::{Endpoint, EndpointExt, IntoResponse, Request, Response, Route, Server, get, handler};
use poem_openapi::OpenApiService;
use tokio::net::TcpListener;
use toolrelay_relay::remote::RemoteRelay;
use toolrelay_relay::server::local;
use toolrelay_relay::{Relay, RelayApi};

use crate::api::discovery::DiscoveryApi;
use crate::api::legacy::LegacyApi;
use crate::api::llm::LlmApi;
use crate::api::tab::TabApi;
use crate::api::tools::ToolsApi;
use crate::api::{Gateway, State};
use crate::config::{GatewayConfig, MAX_CALL_BODY, MAX_PROVIDER_BODY};
use crate::error::{REQUEST_ID_HEADER, normalise_errors, open_cors};
use crate::limits::Limiters;
use crate::{mcp, plugin, websocket};

/// Title of the API in its spec.
const TITLE: &str = "toolrelay";
/// How long connections may take to finish after a shutdown signal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often rate-limit state of idle clients is dropped.
const SHRINK_INTERVAL: Duration = Duration::from_secs(60);

/// The gateway's state over `relay`.
pub fn gateway(relay: Arc<dyn RelayApi>, config: GatewayConfig) -> State {
    Arc::new(Gateway {
        limits: Limiters::new(&config.limits, config.trusted_proxies.clone()),
        relay,
        config,
        shutdown: tokio_util::sync::CancellationToken::new(),
    })
}

/// The whole API: every operation, for `/openapi.json`.
pub fn api_service(
    state: &State,
) -> OpenApiService<(LlmApi, TabApi, ToolsApi, LegacyApi, DiscoveryApi), ()> {
    let apis = (
        LlmApi {
            state: state.clone(),
        },
        TabApi {
            state: state.clone(),
        },
        ToolsApi {
            state: state.clone(),
        },
        LegacyApi {
            state: state.clone(),
        },
        DiscoveryApi {
            state: state.clone(),
        },
    );
    OpenApiService::new(apis, TITLE, env!("CARGO_PKG_VERSION"))
        .summary("Lets an LLM call tools that live in a browser tab, paired by a short code.")
        .description(
            "An LLM calls tools that run in the user's browser tab (a CODAP plugin) or in a backend. \
             Ask the user for the pairing code shown in the tab, GET /api/sessions/{code}/metadata for \
             the tools, then POST /api/sessions/{code}/call.",
        )
        .server(state.config.public_base_url.clone())
}

/// The LLM-side operations only: the file to import as GPT Actions.
pub fn actions_service(state: &State) -> OpenApiService<LlmApi, ()> {
    OpenApiService::new(LlmApi { state: state.clone() }, TITLE, env!("CARGO_PKG_VERSION"))
        .description(
            "Call tools in the user's browser tab. Ask the user for the pairing code shown in the tab \
             (like ABCD-EFGH). First getMetadata to learn the tools, then callTool with functionName \
             and args. A 404 means the code expired: ask for the new one.",
        )
        .server(state.config.public_base_url.clone())
}

/// The HTTP application: routes and middleware.
pub fn app(state: State) -> impl Endpoint<Output = Response> {
    let api = api_service(&state);
    let spec_json = api.spec();
    let spec_yaml = api.spec_yaml();
    let actions_json = actions_service(&state).spec();
    let cors = Cors::new()
        .allow_origins(state.config.cors_origins.iter().map(String::as_str))
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::OPTIONS,
        ])
        .allow_headers([
            header::CONTENT_TYPE.as_str(),
            header::AUTHORIZATION.as_str(),
            REQUEST_ID_HEADER,
            "last-event-id",
        ])
        .expose_headers([REQUEST_ID_HEADER, header::RETRY_AFTER.as_str()])
        .max_age(3600);
    let (mcp_root, mcp_session) = mcp::endpoints(&state);
    Route::new()
        .at("/mcp", mcp_root)
        .at("/mcp/s/:handle", mcp_session)
        .at("/api/sessions/:code/ws", get(websocket::provider_socket))
        .at("/codap", get(plugin::plugin_root))
        .at("/codap/", get(plugin::plugin_index))
        .at("/codap/:file", get(plugin::plugin_file))
        .at(
            "/openapi.json",
            get(document.data(Document::json(spec_json))),
        )
        .at(
            "/openapi.yaml",
            get(document.data(Document::yaml(spec_yaml))),
        )
        .at(
            "/openapi/actions.json",
            get(document.data(Document::json(actions_json))),
        )
        .nest("/", api)
        .data(state)
        .around(limit_body)
        .with(cors)
        .around(normalise_errors)
        .around(open_cors)
        .map_to_response()
}

/// Serves the gateway on `listener` until `shutdown` completes, then drains connections.
pub async fn run(
    state: State,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let shrink = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(SHRINK_INTERVAL);
            loop {
                ticks.tick().await;
                state.limits.shrink();
            }
        })
    };
    let acceptor = TcpAcceptor::from_tokio(listener)?;
    let stopping = state.shutdown.clone();
    let shutdown = async move {
        shutdown.await;
        // Long-lived MCP streams end now rather than at the drain timeout.
        stopping.cancel();
    };
    let served = Server::new_with_acceptor(acceptor)
        .run_with_graceful_shutdown(app(state), shutdown, Some(DRAIN_TIMEOUT))
        .await;
    shrink.abort();
    served
}

/// The gateway alone on `public`, in front of the relay at `relay_url` (gRPC), until
/// `shutdown` completes; `name` opens its "listening" log line.
pub async fn run_split(
    name: &str,
    relay_url: &str,
    config: GatewayConfig,
    public: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let relay = RemoteRelay::connect_lazy(relay_url)?;
    tracing::info!(listen = %local(&public), relay = %relay_url, "{name} listening");
    run(gateway(Arc::new(relay), config), public, shutdown)
        .await
        .map_err(|error| error.to_string())
}

/// The one-process system: the gateway on `public` and the relay's gRPC service on `grpc`,
/// sharing one in-process relay, until `shutdown` completes.
pub async fn run_all(
    relay: Relay,
    config: GatewayConfig,
    public: TcpListener,
    grpc: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let relay_listeners = toolrelay_relay::server::Listeners {
        grpc,
        websocket: None,
    };
    let relay_task = {
        let relay = relay.clone();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let signal = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            toolrelay_relay::server::run(relay, relay_listeners, signal).await
        })
    };
    let state = gateway(Arc::new(relay.clone()), config);
    let mut gateway_stopped = stopped;
    let gateway_signal = async move {
        let _ = gateway_stopped.wait_for(|stop| *stop).await;
    };
    let gateway_task = tokio::spawn(run(state, public, gateway_signal));
    shutdown.await;
    tracing::info!("shutting down");
    // Tabs first: they are told to reconnect before their connections are drained.
    relay.shutdown();
    let _ = stop.send(true);
    let gateway_result = gateway_task.await;
    let relay_result = relay_task.await;
    match (gateway_result, relay_result) {
        (Ok(Ok(())), Ok(Ok(()))) => Ok(()),
        (Ok(Err(error)), _) => Err(format!("the gateway failed: {error}")),
        (_, Ok(Err(error))) => Err(format!("the relay failed: {error}")),
        _ => Err("a server task panicked".into()),
    }
}

/// A generated document served as is.
#[derive(Clone)]
struct Document {
    content_type: &'static str,
    body: Arc<String>,
}

impl Document {
    fn json(body: String) -> Self {
        Self {
            content_type: "application/json; charset=utf-8",
            body: Arc::new(body),
        }
    }

    fn yaml(body: String) -> Self {
        Self {
            content_type: "application/yaml; charset=utf-8",
            body: Arc::new(body),
        }
    }
}

#[handler]
fn document(Data(document): Data<&Document>) -> Response {
    Response::builder()
        .content_type(document.content_type)
        .body(document.body.as_str().to_owned())
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
        match request.take_body().into_bytes_limit(limit).await {
            Ok(bytes) => request.set_body(bytes),
            Err(poem::error::ReadBodyError::PayloadTooLarge) => {
                return Err(poem::Error::from_status(StatusCode::PAYLOAD_TOO_LARGE));
            }
            Err(error) => {
                return Err(poem::Error::from_string(
                    error.to_string(),
                    StatusCode::BAD_REQUEST,
                ));
            }
        }
    }
    next.call(request).await.map(IntoResponse::into_response)
}
