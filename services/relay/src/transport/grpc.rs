//! The gRPC transport (tonic): the `toolrelay.v1.Relay` service over the relay's operations,
//! plus the standard health and reflection services.
//!
//! [`RelayService`] routes each unary RPC by its path to its [`Operation`] unit, generically:
//! the request's metadata becomes its [`Caller`] (who the peer is, or — with a gateway's
//! proof — the client the gateway names; see [`crate::access`]) and its [`Credentials`], the
//! message becomes the operation ([`Operation::from_message`]), and the outcome its reply or
//! a status. No operation is named here but the two streaming ones (`Connect`,
//! `WatchManifest`). Every check (API keys, budgets, the brute-force guard) is the
//! operation's; the one mapping from an error to a gRPC status lives here.

use std::collections::HashMap;
use std::convert::Infallible;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::server::{NamedService, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;
use toolrelay::proto::v1 as pb;

use crate::access::{GATEWAY_PROOF_METADATA, Gateways};
use crate::caller::{
    Admission, CLIENT_IDENTITY_METADATA, CLIENT_LABEL_METADATA, CallerId, IdentityKind,
};
use crate::error::{ErrorInfo, ErrorKind, RelayError};
use crate::limits::{CLIENT_ADDRESS_METADATA, CORRELATION_ID_METADATA, Caller};
use crate::operation::{self, Credentials, Operation, Visitor};
use crate::provider::{ProviderLink, Uplink};
use crate::relay::Relay;
use crate::store::{Routed, Transport};

/// The service's name.
pub const SERVICE: &str = "toolrelay.v1.Relay";
/// Metadata entry with the session code on `Connect`.
pub const SESSION_CODE_METADATA: &str = "x-session-code";
/// Metadata entry naming the transport a `Connect` stands for (`grpc` by default).
pub const TRANSPORT_METADATA: &str = "x-provider-transport";
/// Metadata entry with the provider token on `GetSession`, when the session's own provider
/// asks (`authorization` carries an API key there): the guard never refuses it.
pub const PROVIDER_TOKEN_METADATA: &str = "x-provider-token";
/// Trailer with the stable snake_case error name.
pub const ERROR_METADATA: &str = "x-error";
/// Trailer with the seconds after which a retry makes sense.
pub const RETRY_AFTER_METADATA: &str = "retry-after";
/// Trailer naming the call an error leaves unfinished, whose answer the caller can ask for
/// later (a caller cut off by the drain).
pub const REQUEST_ID_METADATA: &str = "x-call-id";
/// Largest message the service accepts (a provider's response may be up to 1 MiB of JSON).
const MAX_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

/// The `Relay` gRPC service over the relay's operations.
#[derive(Clone)]
pub struct RelayService {
    relay: Relay,
    /// Whose word about a client is believed.
    gateways: Arc<Gateways>,
    routes: Arc<Routes>,
}

impl RelayService {
    /// The service over `relay`, ready to add to a tonic server.
    pub fn server(relay: Relay) -> Self {
        let gateways = Gateways::new(
            relay.config().gateway_secrets.clone(),
            relay.metrics().clone(),
        );
        Self {
            relay,
            gateways: Arc::new(gateways),
            routes: Arc::new(Routes::new()),
        }
    }

    /// Who makes `request`: the client a proven gateway names, or the peer itself.
    fn caller<T>(&self, request: &Request<T>) -> Caller {
        let metadata = request.metadata();
        let peer = request
            .remote_addr()
            .map_or(IpAddr::from([0, 0, 0, 0]), |address| address.ip());
        let caller = self.gateways.caller_named(
            peer,
            metadata_str(metadata, CLIENT_ADDRESS_METADATA).as_deref(),
            metadata_str(metadata, CLIENT_IDENTITY_METADATA).as_deref(),
            metadata_str(metadata, GATEWAY_PROOF_METADATA).as_deref(),
            bearer(metadata),
        );
        // A client that reached the relay itself is known by its API key — one the operator
        // gave out, so a made-up bearer buys no budget of its own.
        let caller = match (&caller.admission, &self.relay.config().api_keys) {
            (Admission::Direct { bearer: Some(key) }, Some(keys)) if keys.accepts(key) => {
                let identity = CallerId::of(IdentityKind::ApiKey, key);
                caller.clone().with_identity(Some(identity))
            }
            _ => caller,
        };
        let caller = caller.with_label(metadata_str(metadata, CLIENT_LABEL_METADATA).as_deref());
        match metadata_str(metadata, CORRELATION_ID_METADATA) {
            Some(id) => caller.with_correlation_id(id),
            None => caller,
        }
    }
}

/// The gRPC status for an error: its message, the `x-error` name, `retry-after` and the
/// unfinished call's `x-request-id`.
impl From<ErrorInfo> for Status {
    fn from(error: ErrorInfo) -> Self {
        let code = match error.kind {
            ErrorKind::BadRequest => Code::InvalidArgument,
            ErrorKind::Unauthenticated => Code::Unauthenticated,
            ErrorKind::Forbidden => Code::PermissionDenied,
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::Conflict => Code::AlreadyExists,
            ErrorKind::Gone => Code::FailedPrecondition,
            ErrorKind::TooLarge | ErrorKind::TooManyRequests => Code::ResourceExhausted,
            ErrorKind::Unavailable => Code::Unavailable,
        };
        let mut metadata = MetadataMap::new();
        metadata.insert(
            ERROR_METADATA,
            MetadataValue::from_static(error.code.as_str()),
        );
        if let Some(retry_after) = error.retry_after
            && let Ok(value) = retry_after.as_secs().max(1).to_string().parse()
        {
            metadata.insert(RETRY_AFTER_METADATA, value);
        }
        if let Some(value) = error
            .request_id
            .as_deref()
            .and_then(|id| MetadataValue::try_from(id).ok())
        {
            metadata.insert(REQUEST_ID_METADATA, value);
        }
        Self::with_metadata(code, error.message, metadata)
    }
}

/// An error of this process as a gRPC status ([`ErrorInfo`]'s).
impl From<RelayError> for Status {
    fn from(error: RelayError) -> Self {
        ErrorInfo::from(error).into()
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// A route: serves one RPC's HTTP/2 request.
type Route = fn(&RelayService, http::Request<Body>) -> BoxFuture<http::Response<Body>, Infallible>;

/// Every RPC's route, by path.
struct Routes(HashMap<&'static str, Route>);

impl Visitor for Routes {
    fn visit<O: Operation>(&mut self) {
        self.0.insert(O::PATH, RelayService::unary::<O>);
    }
}

impl Routes {
    fn new() -> Self {
        let mut routes = Self(HashMap::new());
        operation::each(&mut routes);
        routes.0.insert(CONNECT, RelayService::connect_route);
        routes
            .0
            .insert(WATCH_MANIFEST, RelayService::watch_manifest_route);
        routes.0.insert(FORWARD, RelayService::forward_route);
        routes
    }
}

/// The `Connect` RPC: a provider's connection.
const CONNECT: &str = "/toolrelay.v1.Relay/Connect";
/// The `WatchManifest` RPC: a session's manifest changes.
const WATCH_MANIFEST: &str = "/toolrelay.v1.Relay/WatchManifest";
/// The `Forward` RPC: a call routed here by another replica.
const FORWARD: &str = "/toolrelay.v1.Relay/Forward";

impl RelayService {
    /// The gRPC machinery for one RPC: the codec and the message size limits.
    fn grpc<M: prost::Message + Default + Send + 'static, R: prost::Message + Send + 'static>()
    -> tonic::server::Grpc<ProstCodec<R, M>> {
        tonic::server::Grpc::new(ProstCodec::default())
            .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES))
    }

    /// Serves a unary operation: its request converted, the operation served, its reply
    /// converted (or its error as a status).
    fn unary<O: Operation>(
        &self,
        request: http::Request<Body>,
    ) -> BoxFuture<http::Response<Body>, Infallible> {
        let service = Unary::<O>(self.clone(), PhantomData);
        Box::pin(async move {
            Ok(Self::grpc::<O::Message, O::Reply>()
                .unary(service, request)
                .await)
        })
    }

    fn connect_route(
        &self,
        request: http::Request<Body>,
    ) -> BoxFuture<http::Response<Body>, Infallible> {
        let service = Connect(self.clone());
        Box::pin(async move {
            Ok(Self::grpc::<pb::ProviderMessage, pb::RelayMessage>()
                .streaming(service, request)
                .await)
        })
    }

    fn watch_manifest_route(
        &self,
        request: http::Request<Body>,
    ) -> BoxFuture<http::Response<Body>, Infallible> {
        let service = WatchManifest(self.clone());
        Box::pin(async move {
            Ok(Self::grpc::<pb::GetManifestRequest, pb::ManifestChanged>()
                .server_streaming(service, request)
                .await)
        })
    }

    fn forward_route(
        &self,
        request: http::Request<Body>,
    ) -> BoxFuture<http::Response<Body>, Infallible> {
        let service = Forward(self.clone());
        Box::pin(async move {
            Ok(Self::grpc::<pb::ForwardRequest, pb::ForwardEvent>()
                .server_streaming(service, request)
                .await)
        })
    }

    /// Takes a call routed here by another replica, which proves itself with the gateway
    /// secret: its answer on the stream.
    async fn forward(&self, request: Request<pb::ForwardRequest>) -> Reply<ForwardStream> {
        let proof = metadata_str(request.metadata(), GATEWAY_PROOF_METADATA);
        if !self.gateways.proven(proof.as_deref()) {
            return Err(Status::permission_denied(
                "Forward is for replicas of this relay, proving themselves with GATEWAY_SECRET",
            ));
        }
        let pb::ForwardRequest { code, call, news } = request.into_inner();
        let answers = self.relay.accept_routed(&code, call, news).await?;
        Ok(Response::new(Box::pin(answers.map(|routed| {
            Ok(match routed {
                Routed::Answer(answer) => pb::ForwardEvent {
                    answer,
                    news: String::new(),
                },
                Routed::News(news) => pb::ForwardEvent {
                    answer: String::new(),
                    news: serde_json::to_string(&news).unwrap_or_default(),
                },
            })
        }))))
    }

    /// Attaches a provider: the `Connect` stream both ways.
    async fn connect(
        &self,
        request: Request<Streaming<pb::ProviderMessage>>,
    ) -> Reply<ConnectStream> {
        let metadata = request.metadata();
        let code = metadata_str(metadata, SESSION_CODE_METADATA).ok_or_else(|| {
            Status::invalid_argument(format!(
                "Connect needs the session code in the {SESSION_CODE_METADATA} metadata entry"
            ))
        })?;
        let transport = match metadata_str(metadata, TRANSPORT_METADATA) {
            None => Transport::Grpc,
            Some(name) => Transport::parse(&name).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{TRANSPORT_METADATA} must be one of grpc, websocket, sse or polling"
                ))
            })?,
        };
        let token = bearer(metadata);
        let caller = self.caller(&request);
        let mut link = self
            .relay
            .attach_for(&caller, &code, token.as_deref(), transport)
            .await?;
        link.spawn_driver();
        let ProviderLink {
            downlink, uplink, ..
        } = link;

        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            // Ends when the provider closes its side or the stream breaks (dropping `uplink`
            // then tells the driver the provider went away), or when the driver has ended the
            // connection (dropping `inbound` then releases the HTTP/2 stream).
            loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    () = uplink.closed() => break,
                };
                let Ok(Some(message)) = message else { break };
                let Ok(up) = Uplink::try_from(message) else {
                    continue;
                };
                if uplink.send(up).await.is_err() {
                    break;
                }
            }
        });
        let outbound = downlink.map(|message| Ok(message.into()));
        Ok(Response::new(Box::pin(outbound)))
    }

    /// A session's manifest changes.
    async fn watch_manifest(
        &self,
        request: Request<pb::GetManifestRequest>,
    ) -> Reply<WatchManifestStream> {
        let caller = self.caller(&request);
        let changes = self
            .relay
            .manifest_changes_for(&caller, &request.get_ref().code)
            .await?;
        Ok(Response::new(Box::pin(
            changes.map(|()| Ok(pb::ManifestChanged {})),
        )))
    }
}

type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::RelayMessage, Status>> + Send>>;
type WatchManifestStream = Pin<Box<dyn Stream<Item = Result<pb::ManifestChanged, Status>> + Send>>;
type ForwardStream = Pin<Box<dyn Stream<Item = Result<pb::ForwardEvent, Status>> + Send>>;

/// A unary operation's service.
struct Unary<O>(RelayService, PhantomData<fn() -> O>);

impl<O: Operation> UnaryService<O::Message> for Unary<O> {
    type Response = O::Reply;
    type Future = BoxFuture<Response<O::Reply>, Status>;

    fn call(&mut self, request: Request<O::Message>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let caller = service.caller(&request);
            let credentials = Credentials::of(request.metadata());
            let operation = O::from_message(request.into_inner(), credentials)?;
            let reply = operation.serve(&service.relay, &caller).await?;
            Ok(Response::new(reply))
        })
    }
}

/// `Connect`'s service.
struct Connect(RelayService);

impl StreamingService<pb::ProviderMessage> for Connect {
    type Response = pb::RelayMessage;
    type ResponseStream = ConnectStream;
    type Future = BoxFuture<Response<ConnectStream>, Status>;

    fn call(&mut self, request: Request<Streaming<pb::ProviderMessage>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.connect(request).await })
    }
}

/// `WatchManifest`'s service.
struct WatchManifest(RelayService);

impl ServerStreamingService<pb::GetManifestRequest> for WatchManifest {
    type Response = pb::ManifestChanged;
    type ResponseStream = WatchManifestStream;
    type Future = BoxFuture<Response<WatchManifestStream>, Status>;

    fn call(&mut self, request: Request<pb::GetManifestRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.watch_manifest(request).await })
    }
}

/// `Forward`'s service.
struct Forward(RelayService);

impl ServerStreamingService<pb::ForwardRequest> for Forward {
    type Response = pb::ForwardEvent;
    type ResponseStream = ForwardStream;
    type Future = BoxFuture<Response<ForwardStream>, Status>;

    fn call(&mut self, request: Request<pb::ForwardRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.forward(request).await })
    }
}

impl Service<http::Request<Body>> for RelayService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match self.routes.0.get(request.uri().path()) {
            Some(route) => route(self, request),
            None => Box::pin(async { Ok(Status::unimplemented("no such RPC").into_http()) }),
        }
    }
}

impl NamedService for RelayService {
    const NAME: &'static str = SERVICE;
}

pub(crate) fn metadata_str(metadata: &MetadataMap, key: &str) -> Option<String> {
    metadata
        .get(key)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// The credential of `authorization: Bearer <credential>`: a provider token, or an API key.
pub(crate) fn bearer(metadata: &MetadataMap) -> Option<String> {
    let value = metadata_str(metadata, "authorization")?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}
