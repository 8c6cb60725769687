//! Assembling and serving the gateway: the route table, middleware, the OpenAPI documents, and
//! the one way to serve it, [`run`], of a [`Server`] in front of the relay in this process
//! (which then serves the relay's gRPC service beside it and shares its metrics) or of one
//! in front of a relay elsewhere.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use poem::http::Method;
use poem::http::uri::Scheme;
use poem::web::Data;
use poem::web::{LocalAddr, RemoteAddr};
use poem::{Endpoint, EndpointExt, Request, Response, Route, get, handler};
use poem_openapi::OpenApiService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use toolrelay_relay::front::Clock;
use toolrelay_relay::front::serve::Connection;
use toolrelay_relay::front::serve::Observed;
use toolrelay_relay::front::serve::Relay;
use toolrelay_relay::front::serve::StoreLimits;
use toolrelay_relay::front::serve::{Connections, Protocol, serve_connections};
use toolrelay_relay::front::serve::{RemoteOptions, RemoteRelay};
use toolrelay_relay::front::serve::{local, start_store};
use toolrelay_relay::front::store::{BudgetStore, FrontStore};
use toolrelay_relay::front::{Drain, Metrics, RelayApi};

use crate::api::discovery::DiscoveryApi;
use crate::api::legacy::LegacyApi;
use crate::api::llm::{CallRoute, LlmApi};
use crate::api::tab::TabApi;
use crate::api::tools::ToolsApi;
use crate::api::{Gateway, State};
use crate::config::GatewayConfig;
use crate::limits::Limiters;
use crate::middleware::observe::{HttpMetrics, Routes};
use crate::{mcp, plugin, websocket};

/// Title of the API in its spec.
const TITLE: &str = "toolrelay";
/// How long connections may take to close once the drain has ended.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The gateway's state over `relay`, stopping with `drain`, keeping what it shares with other
/// gateways (rate limits, MCP client sessions) in `store`, reporting to `metrics`.
pub fn gateway(
    relay: RelayApi,
    config: GatewayConfig,
    drain: Drain,
    store: Arc<dyn FrontStore>,
    metrics: Metrics,
) -> State {
    Arc::new(Gateway {
        limits: Limiters::new(
            config.limits,
            config.trusted_proxies.clone(),
            Arc::clone(&store) as Arc<dyn BudgetStore>,
            Clock::new(),
            metrics.clone(),
        )
        .identifying(config.shared_egress.clone(), config.api_keys.is_some()),
        store,
        relay,
        config,
        shutdown: tokio_util::sync::CancellationToken::new(),
        drain,
        metrics,
    })
}

/// Routes served besides the OpenAPI operations (the plugin's files are labelled apart).
const OTHER_ROUTES: [&str; 7] = [
    "/",
    "/mcp",
    "/mcp/s/{handle}",
    "/api/sessions/{code}/ws",
    "/openapi.json",
    "/openapi.yaml",
    "/openapi/actions.json",
];

/// The route templates of the gateway's paths: the OpenAPI document's, and [`OTHER_ROUTES`].
fn routes(openapi_json: &str) -> Routes {
    let spec: serde_json::Value = serde_json::from_str(openapi_json).unwrap_or_default();
    let documented = spec["paths"]
        .as_object()
        .map(|paths| paths.keys().map(String::as_str).collect::<Vec<_>>())
        .unwrap_or_default();
    Routes::new(documented.into_iter().chain(OTHER_ROUTES))
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
    // No `summary`: poem-openapi writes OpenAPI 3.0, where `info.summary` does not exist.
    OpenApiService::new(apis, TITLE, env!("CARGO_PKG_VERSION"))
        .description(
            "Lets an LLM call tools that live in a browser tab, paired by a short code. \
             An LLM calls tools that run in the user's browser tab (a CODAP plugin) or in a backend. \
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
             (like ABCD-EFGH). First getMetadata to learn the tools, then readTool (functions marked \
             readOnly) or callTool with functionName and args. A 404 means the code expired: ask for \
             the new one.",
        )
        .server(state.config.public_base_url.clone())
}

/// The generated documents, each path once with all its methods.
pub struct Documents {
    /// `/openapi.json`: the whole API.
    pub openapi_json: String,
    /// `/openapi.yaml`: the same, as YAML.
    pub openapi_yaml: String,
    /// `/openapi/actions.json`: the LLM-side operations, for GPT Actions.
    pub actions_json: String,
}

impl Documents {
    /// The documents of the gateway `state`.
    pub fn of(state: &State) -> Self {
        let keyed = state.config.api_keys.is_some();
        let mut openapi = merged_paths(&api_service(state).spec());
        let mut actions = merged_paths(&actions_service(state).spec());
        declare_authorization(&mut openapi, keyed);
        declare_authorization(&mut actions, keyed);
        declare_consequences(&mut actions);
        let pretty = |value: &serde_json::Value| {
            serde_json::to_string_pretty(value).unwrap_or_else(|_| "{}".to_owned())
        };
        Self {
            openapi_json: pretty(&openapi),
            openapi_yaml: serde_yaml::to_string(&openapi).unwrap_or_default(),
            actions_json: pretty(&actions),
        }
    }
}

/// Says in a document how the LLM side is authorised: with API keys, a bearer scheme on every
/// LLM-side operation (so GPT Actions sends the key) and 401 meaning a missing or wrong key;
/// without, no 401/403 on those operations, which only the tab's provider token can cause.
fn declare_authorization(spec: &mut serde_json::Value, keyed: bool) {
    use serde_json::{Value, json};
    let Some(paths) = spec.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in operations.iter_mut() {
            let Ok(method) = method.to_ascii_uppercase().parse::<Method>() else {
                continue;
            };
            // Path templates such as `{code}` are segments like any other here.
            if !crate::middleware::auth::is_llm_route(&method, path) {
                continue;
            }
            let Some(responses) = operation
                .get_mut("responses")
                .and_then(Value::as_object_mut)
            else {
                continue;
            };
            if path.ends_with("/read") {
                // A read of a function not marked read-only: 403 not_read_only.
                responses.insert(
                    "403".into(),
                    json!({"description": "The function is not marked read-only (not_read_only): call it with callTool instead."}),
                );
            } else {
                responses.remove("403");
            }
            if keyed {
                responses.insert(
                    "401".into(),
                    json!({"description": "The API key is missing or wrong: send Authorization: Bearer <key>."}),
                );
                operation["security"] = json!([{"apiKey": []}]);
            } else {
                responses.remove("401");
            }
        }
    }
    if keyed {
        let components = spec
            .as_object_mut()
            .map(|spec| spec.entry("components").or_insert_with(|| json!({})));
        if let Some(Value::Object(components)) = components {
            components.insert(
                "securitySchemes".into(),
                json!({"apiKey": {"type": "http", "scheme": "bearer",
                    "description": "An API key from the relay's operator."}}),
            );
        }
    }
}

/// Marks for GPT Actions which operations change nothing (`x-openai-isConsequential: false`,
/// so ChatGPT need not ask the person first): every GET, and `readTool` (read-only functions
/// only). The calls that may change the user's data are marked consequential.
fn declare_consequences(spec: &mut serde_json::Value) {
    use serde_json::Value;
    let Some(paths) = spec.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for operations in paths.values_mut().filter_map(Value::as_object_mut) {
        for (method, operation) in operations.iter_mut() {
            let reads = method == "get" || operation["operationId"] == "readTool";
            if let Some(operation) = operation.as_object_mut() {
                operation.insert("x-openai-isConsequential".into(), Value::Bool(!reads));
            }
        }
    }
}

/// A generated document with the operations of a path that several API groups share (the LLM
/// and the tab both use `/api/sessions/{code}/response`, say) under that path once: poem-openapi
/// writes the path once per group, and a JSON parser would keep only the last.
fn merged_paths(spec: &str) -> serde_json::Value {
    use serde::de::{Deserializer, MapAccess, Visitor};
    use serde_json::{Map, Value};

    /// A JSON object whose repeated keys have their object values merged.
    struct Merging(Map<String, Value>);
    impl<'de> serde::Deserialize<'de> for Merging {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Entries;
            impl<'de> Visitor<'de> for Entries {
                type Value = Merging;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Merging, A::Error> {
                    let mut merged = Map::new();
                    while let Some((key, value)) = map.next_entry::<String, Value>()? {
                        match (merged.get_mut(&key), value) {
                            (Some(Value::Object(existing)), Value::Object(more)) => {
                                existing.extend(more);
                            }
                            (_, value) => {
                                merged.insert(key, value);
                            }
                        }
                    }
                    Ok(Merging(merged))
                }
            }
            deserializer.deserialize_map(Entries)
        }
    }

    #[derive(serde::Deserialize)]
    struct Spec {
        paths: Merging,
        #[serde(flatten)]
        rest: Map<String, Value>,
    }
    // poem-openapi's own output: it parses.
    let Ok(spec) = serde_json::from_str::<Spec>(spec) else {
        return Value::Null;
    };
    let mut rest = spec.rest;
    // Keep the field order of the original document: "paths" goes before "components".
    let mut ordered = Map::new();
    for (key, value) in std::mem::take(&mut rest) {
        if key == "components" {
            ordered.insert("paths".to_owned(), Value::Object(spec.paths.0.clone()));
        }
        ordered.insert(key, value);
    }
    ordered
        .entry("paths")
        .or_insert_with(|| Value::Object(spec.paths.0));
    Value::Object(ordered)
}

/// The HTTP application: routes and middleware.
pub fn app(state: State) -> poem::endpoint::BoxEndpoint<'static, Response> {
    let (routes, http) = route_table(&state);
    crate::middleware::layers(routes, &state, http)
}

/// The routes of [`app`], without the middleware, and the metrics' view of them.
pub fn route_table(state: &State) -> (Route, Arc<HttpMetrics>) {
    let Documents {
        openapi_json: spec_json,
        openapi_yaml: spec_yaml,
        actions_json,
    } = Documents::of(state);
    let api = api_service(state);
    let http = Arc::new(HttpMetrics {
        metrics: state.metrics.clone(),
        routes: routes(&spec_json),
    });
    let (mcp_root, mcp_session) = mcp::endpoints(state);
    // The gateway's state is attached to the routes whose handlers read it (`Data<&State>`,
    // `Client`), not to all: callTool and readTool hold it, and meet one layer fewer.
    let routes = Route::new()
        .at("/mcp", mcp_root)
        .at("/mcp/s/:handle", mcp_session)
        .at("/api/sessions/:code/call", CallRoute::call(state))
        .at("/api/sessions/:code/read", CallRoute::read(state))
        .at(
            "/api/sessions/:code/ws",
            get(websocket::provider_socket).data(State::clone(state)),
        )
        .at("/codap", get(plugin::plugin_root))
        .at(
            "/codap/",
            get(plugin::plugin_index).data(State::clone(state)),
        )
        .at(
            "/codap/:file",
            get(plugin::plugin_file).data(State::clone(state)),
        )
        .at("/sdk/:file", get(plugin::sdk_file))
        .at("/demo", get(plugin::demo_root))
        .at("/demo/", get(plugin::demo_index))
        .at("/demo/:file", get(plugin::demo_file))
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
        .nest("/", api.data(State::clone(state)));
    (routes, http)
}

/// A gateway ready to [`run`], and what it stands in front of: the relay in this process
/// ([`Server::with_relay`]) or a relay elsewhere over gRPC ([`Server::in_front_of`]).
pub struct Server {
    state: State,
    relaying: Relaying,
    /// What its "listening" log line begins with.
    name: String,
}

/// Where a gateway's relay runs.
enum Relaying {
    /// In this process, serving its gRPC on `grpc` beside the gateway; the relay runs the
    /// drain.
    Here { relay: Relay, grpc: TcpListener },
    /// In another process, at `url`: the gateway keeps its own store (`connection` fails if it
    /// cannot be made) and runs its own drain of up to `drain_timeout`.
    Elsewhere {
        url: String,
        connection: Connection,
        drain_timeout: Duration,
    },
}

impl Server {
    /// The one-process system: the gateway in front of `relay`, whose gRPC service it serves on
    /// `grpc`, sharing the relay's drain, store and metrics.
    pub fn with_relay(relay: Relay, config: GatewayConfig, grpc: TcpListener) -> Self {
        let state = gateway(
            RelayApi::Local(relay.clone()),
            config,
            relay.drain().clone(),
            Arc::clone(relay.store()) as Arc<dyn FrontStore>,
            relay.metrics().clone(),
        );
        Self {
            state,
            relaying: Relaying::Here { relay, grpc },
            name: "toolrelay".to_owned(),
        }
    }

    /// The gateway alone, in front of the relay at `relay_url` (gRPC), with metrics of its own
    /// (`metrics`: the relay serves its own) and a store of its own for rate budgets and MCP
    /// sessions, made in the background (`/healthz` answers at once, `/readyz` once it is).
    pub fn in_front_of(
        relay_url: &str,
        config: GatewayConfig,
        metrics: Metrics,
    ) -> Result<Self, String> {
        let drain = Drain::new();
        let options = RemoteOptions {
            max_json_depth: config.max_json_depth,
            drain: drain.clone(),
            gateway_secrets: config.gateway_secrets.clone(),
        };
        if config.gateway_secrets.is_none() {
            tracing::warn!(
                "{} is not set: the relay will not believe the client addresses this gateway names, and will count every client against this gateway's address (set the same secret on the relay and its gateways)",
                crate::config::ENV_GATEWAY_SECRET
            );
        }
        let relay = RemoteRelay::connect_lazy(relay_url, options)
            .map_err(|error| format!("{}: {error}", crate::config::ENV_RELAY_URL))?;
        let (store, connection) = start_store(
            &config.store,
            &Clock::new(),
            StoreLimits::keeping(Duration::from_secs(60)),
            &metrics,
        );
        let store: Arc<dyn FrontStore> = Observed::wrap(store, metrics.clone());
        observe_gateway(&metrics, &drain, &store);
        let state = gateway(RelayApi::Remote(relay), config, drain, store, metrics);
        Ok(Self {
            state,
            relaying: Relaying::Elsewhere {
                url: relay_url.to_owned(),
                connection,
                drain_timeout: Duration::from_secs(
                    toolrelay_relay::front::config::DEFAULT_DRAIN_SECONDS,
                ),
            },
            name: "toolrelay-gateway".to_owned(),
        })
    }

    /// Names the server in its "listening" log line.
    #[must_use]
    pub fn named(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    /// How long a gateway alone drains (one in front of the relay in this process drains with
    /// it, for as long as the relay's settings say).
    #[must_use]
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        if let Relaying::Elsewhere { drain_timeout, .. } = &mut self.relaying {
            *drain_timeout = timeout;
        }
        self
    }
}

/// Serves `server` on `public` until `shutdown` completes and the drain has run (see
/// [`toolrelay_relay::front::Drain`]): during the drain it keeps accepting connections, because tabs
/// still poll and answer over them, and the relay operations refuse new work; then it closes
/// its connections. With the relay in this process its gRPC service is served beside it, and
/// both listeners share one budget of connections (and of file descriptors).
pub async fn run(
    server: Server,
    public: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let Server {
        state,
        relaying,
        name,
    } = server;
    let connections = Connections::new(state.config.connections.clone(), state.metrics.clone());
    match relaying {
        Relaying::Here { relay, grpc } => {
            tracing::info!(
                listen = %local(&public),
                grpc = %local(&grpc),
                public_base_url = %state.config.public_base_url,
                "{name} listening"
            );
            let listeners = toolrelay_relay::front::serve::Listeners {
                grpc,
                websocket: None,
            };
            // The relay's server runs the drain when `shutdown` completes; the gateway stops
            // when it has ended.
            let relay_task = tokio::spawn(toolrelay_relay::front::serve::run_sharing(
                relay.clone(),
                listeners,
                Arc::clone(&connections),
                shutdown,
            ));
            let gateway_task = tokio::spawn(serve(state, public, connections));
            let relay_result = relay_task.await;
            // The relay stopped: on a signal after its drain, or on its own after an error.
            relay.shutdown();
            let gateway_result = gateway_task.await;
            match (gateway_result, relay_result) {
                (Ok(()), Ok(Ok(()))) => Ok(()),
                (_, Ok(Err(error))) => Err(format!("the relay failed: {error}")),
                _ => Err("a server task panicked".into()),
            }
        }
        Relaying::Elsewhere {
            url,
            connection,
            drain_timeout,
        } => {
            tracing::info!(listen = %local(&public), relay = %url, "{name} listening");
            let drain = state.drain.clone();
            let serving = tokio::spawn(serve(state, public, connections));
            tokio::select! {
                () = shutdown => {}
                message = connection.failed() => return Err(message),
            }
            tracing::info!(
                "draining: refusing new work, waiting for delivered calls to be answered"
            );
            let unanswered = drain.run(drain_timeout).await;
            tracing::info!(unanswered, "drained: closing connections");
            serving
                .await
                .map_err(|_| "the gateway task panicked".to_owned())
        }
    }
}

/// Serves the gateway `state` on `listener` until its drain ends, then closes its
/// connections, which count in `connections` (see [`toolrelay_relay::front::serve::Connections`]: caps,
/// header-read and idle timeouts), and waits for its tabs' sockets to close.
async fn serve(state: State, listener: TcpListener, connections: Arc<Connections>) {
    let stop = CancellationToken::new();
    let stopping = state.shutdown.clone();
    let drain = state.drain.clone();
    let ended = drain.ended();
    let endpoint = Arc::new(app(state));
    let serving = serve_connections(
        listener,
        connections,
        Protocol::Http,
        move |peer, local| {
            let endpoint = Arc::clone(&endpoint);
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let endpoint = Arc::clone(&endpoint);
                async move {
                    let request = Request::from((
                        request,
                        LocalAddr(local.into()),
                        RemoteAddr(peer.into()),
                        Scheme::HTTP,
                    ));
                    let response: hyper::Response<BoxBody<hyper::body::Bytes, std::io::Error>> =
                        endpoint.get_response(request).await.into();
                    Ok::<_, Infallible>(response)
                }
            })
        },
        stop.clone(),
        CLOSE_TIMEOUT,
    );
    let stop_after_drain = async move {
        ended.await;
        // Long-lived MCP streams end now rather than at the close timeout.
        stopping.cancel();
        stop.cancel();
    };
    tokio::join!(serving, stop_after_drain);
    // An upgraded WebSocket outlives its HTTP connection: its tab hears `restarting` and a
    // close before the process exits.
    if !drain.sockets_closed(CLOSE_TIMEOUT).await {
        tracing::warn!("some tabs' WebSockets did not close in time");
    }
}

/// What a gateway alone reports when scraped: whether it drains, and whether its own store
/// (rate limits, MCP sessions) answers. (In one process the relay reports both.)
fn observe_gateway(metrics: &Metrics, drain: &Drain, store: &Arc<dyn FrontStore>) {
    let (handle, drain, store) = (metrics.clone(), drain.clone(), Arc::downgrade(store));
    metrics.on_scrape(move || {
        let (metrics, draining, store) = (handle.clone(), drain.is_draining(), store.upgrade());
        Box::pin(async move {
            metrics.draining(draining);
            if let Some(store) = store {
                // Sets `toolrelay_store_up`.
                let _ = store.ping().await;
            }
        })
    });
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
