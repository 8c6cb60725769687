//! The relay reached over gRPC: [`RemoteRelay`] runs the relay's operations for a process
//! that does not hold the relay itself (the gateway in a split deployment). A unary operation
//! is sent by `RemoteRelay::unary`, generic over the [`Operation`] unit, which names its
//! RPC, its retry rule and its wire form; what a front end checks first is the unit's
//! [`send`](Operation::send).
//!
//! Results come back as the same domain types; errors as [`ErrorInfo`], rebuilt from the gRPC
//! status, its `x-error` name and `retry-after`. Provider connections become a `Connect`
//! stream whose messages are translated to and from [`Downlink`] and [`Uplink`], so a
//! transport serving a tab cannot tell a remote relay from a local one.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Status};
use tonic_prost::ProstCodec;
use toolrelay::proto::v1 as pb;
use toolrelay::proto::v1::relay_client::RelayClient;

use crate::access::{GATEWAY_PROOF_METADATA, GatewaySecrets};
use crate::api::Outcome;
use crate::caller::{CLIENT_IDENTITY_METADATA, CLIENT_LABEL_METADATA};
use crate::channel::channel;
use crate::code::SessionCode;
use crate::config::ENV_GATEWAY_SECRET;
use crate::drain::{Drain, Hold};
use crate::error::{ErrorCode, ErrorInfo, RelayError};
use crate::grpc::{
    ERROR_METADATA, PROVIDER_TOKEN_METADATA, REQUEST_ID_METADATA, RETRY_AFTER_METADATA,
    SESSION_CODE_METADATA, TRANSPORT_METADATA,
};
use crate::limits::{CLIENT_ADDRESS_METADATA, CORRELATION_ID_METADATA, Caller};
use crate::operation::{Credential, Operation};
use crate::pool::{RelayPool, Retry};
use crate::provider::{Delivered, Downlink, ProviderLink, Uplink};
use crate::store::Transport;

/// Messages buffered between a remote `Connect` stream and its transport.
const LINK_BUFFER: usize = 64;
/// How long a closed link waits for the relay to take its last frames.
const LINGER: Duration = Duration::from_secs(5);

/// A relay in another process — one or several replicas — reached over gRPC. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RemoteRelay {
    pool: RelayPool,
    options: RemoteOptions,
    /// The gateway secret every request carries, when there is one.
    proof: Option<Proof>,
}

/// The gateway secret as a metadata value (kept out of `Debug`).
#[derive(Clone)]
struct Proof(MetadataValue<tonic::metadata::Ascii>);

impl std::fmt::Debug for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Proof(…)")
    }
}

/// What a front end in front of a remote relay enforces itself.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// Deepest JSON nesting sent to the relay: JSON travels as `google.protobuf.Struct`,
    /// which the relay could not decode past about 48 levels, so deeper JSON is refused here
    /// with a clear error rather than failing as "relay unavailable".
    pub max_json_depth: usize,
    /// This process's drain: while it runs, new calls, sessions and attaches are refused; a
    /// waiting caller holds it open and, when it ends, is told to ask for its answer again.
    pub drain: Drain,
    /// The secrets this front end proves itself with (it sends the first), so that the relay
    /// believes the client addresses it names and leaves alone what it checked itself (API
    /// keys, budgets of sessions and tool calls). Without, the relay counts every client
    /// against this process's address.
    pub gateway_secrets: Option<Arc<GatewaySecrets>>,
}

impl RemoteRelay {
    /// A client of the relay replicas at `urls` (`http://host:port`, several
    /// comma-separated; see [`RelayPool`]). Connects lazily, so the gateway starts even while
    /// the relay is still coming up; a malformed URL is an error now. Must be called within a
    /// Tokio runtime.
    pub fn connect_lazy(urls: &str, options: RemoteOptions) -> Result<Self, String> {
        let proof = match &options.gateway_secrets {
            None => None,
            // Checked at start to be printable ASCII.
            Some(secrets) => Some(Proof(
                MetadataValue::try_from(secrets.current())
                    .map_err(|_| format!("{ENV_GATEWAY_SECRET} must be printable ASCII"))?,
            )),
        };
        Ok(Self {
            pool: RelayPool::new(urls)?,
            options,
            proof,
        })
    }

    /// A request proving this front end a gateway, naming the client (for the relay's limits)
    /// and carrying the provider token as `authorization: Bearer …`, when there is one.
    fn request<T>(&self, message: T, caller: &Caller, credential: &Credential) -> Request<T> {
        let mut request = Request::new(message);
        let metadata = request.metadata_mut();
        if let Some(Proof(proof)) = &self.proof {
            metadata.insert(GATEWAY_PROOF_METADATA, proof.clone());
        }
        if let Ok(address) = MetadataValue::try_from(caller.address.to_string()) {
            metadata.insert(CLIENT_ADDRESS_METADATA, address);
        }
        if let Some(identity) = caller
            .identity
            .as_ref()
            .and_then(|identity| MetadataValue::try_from(identity.as_str()).ok())
        {
            metadata.insert(CLIENT_IDENTITY_METADATA, identity);
        }
        // What the client says it is, for the person asked to allow it (ASCII: metadata).
        if let Some(label) = caller.label.as_deref().and_then(|label| {
            let ascii: String = label
                .chars()
                .map(|c| {
                    if c.is_ascii_graphic() || c == ' ' {
                        c
                    } else {
                        '?'
                    }
                })
                .collect();
            MetadataValue::try_from(ascii).ok()
        }) {
            metadata.insert(CLIENT_LABEL_METADATA, label);
        }
        // The relay's log lines for this call carry the gateway's correlation id.
        if let Some(id) = caller
            .correlation_id
            .as_deref()
            .and_then(|id| MetadataValue::try_from(id).ok())
        {
            metadata.insert(CORRELATION_ID_METADATA, id);
        }
        match credential {
            Credential::None => {}
            Credential::Token(token) => {
                if let Ok(value) = MetadataValue::try_from(format!("Bearer {token}")) {
                    metadata.insert("authorization", value);
                }
            }
            Credential::ProviderToken(token) => {
                if let Ok(value) = MetadataValue::try_from(token) {
                    metadata.insert(PROVIDER_TOKEN_METADATA, value);
                }
            }
        }
        request
    }

    /// Sends `operation` to a replica, and again to another when this one did not answer
    /// and the operation's [`RETRY`](Operation::RETRY) allows it.
    pub(crate) async fn unary<O: Operation>(
        &self,
        caller: &Caller,
        operation: O,
    ) -> Outcome<O::Output> {
        let (message, credential) = operation.into_message();
        let reply = self
            .pool
            .run(O::RETRY, |channel| {
                let request = self.request(message.clone(), caller, &credential);
                async move {
                    let mut client = tonic::client::Grpc::new(channel);
                    client.ready().await.map_err(|error| {
                        // The cause kept: whether the call was sent depends on it.
                        let mut status =
                            Status::unavailable(format!("the relay is not ready: {error}"));
                        status.set_source(Arc::new(error));
                        status
                    })?;
                    let path = PathAndQuery::from_static(O::PATH);
                    client.unary(request, path, ProstCodec::default()).await
                }
            })
            .await
            .map_err(error_info)?;
        O::output(reply.into_inner()).map_err(|_| unavailable("the relay sent a malformed reply"))
    }

    /// Opens one of the streaming RPCs on a replica (see [`RemoteRelay::unary`]); `make`
    /// builds the request for each attempt.
    async fn streaming<M, R, Fut>(
        &self,
        make: impl Fn() -> Request<M>,
        rpc: impl Fn(RelayClient<Channel>, Request<M>) -> Fut,
    ) -> Outcome<R>
    where
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        // Opening a stream again elsewhere is safe: a watch is a read, and the newest
        // connection of a session wins.
        self.pool
            .run(Retry::Safe, |channel| {
                rpc(RelayClient::new(channel), make())
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(error_info)
    }

    /// The deepest JSON this front end sends the relay.
    pub(crate) fn max_json_depth(&self) -> usize {
        self.options.max_json_depth
    }

    /// Refuses new work while this process drains.
    pub(crate) fn accepting(&self) -> Outcome<()> {
        if self.options.drain.is_draining() {
            Err(RelayError::ShuttingDown.into())
        } else {
            Ok(())
        }
    }

    /// Refuses JSON nested deeper than the relay could decode.
    pub(crate) fn check_depth(&self, value: &Value, what: &'static str) -> Outcome<()> {
        let limit = self.options.max_json_depth;
        if toolrelay::json::depth(value) > limit {
            return Err(RelayError::NestedTooDeeply { what, limit }.into());
        }
        Ok(())
    }

    /// Waits for `reply` while holding the drain open; when the drain ends first, the caller
    /// is told to ask for call `request_id`'s answer again.
    pub(crate) async fn waiting<T>(
        &self,
        code: &str,
        request_id: &str,
        reply: impl Future<Output = Outcome<T>>,
    ) -> Outcome<T> {
        let _hold = self.options.drain.hold();
        tokio::select! {
            reply = reply => reply,
            () = self.options.drain.ended() => Err(RelayError::Drained {
                // A handle is a secret: the caller's own, but no part of an error message.
                code: SessionCode::parse(code).map_or_else(
                    |_| crate::error::BY_HANDLE.to_owned(),
                    |code| code.display(),
                ),
                request_id: request_id.to_owned(),
            }
            .into()),
        }
    }
}

impl RemoteRelay {
    /// Whether a replica serves.
    pub(crate) async fn ready(&self) -> Outcome<()> {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        self.accepting()?;
        // Ready when a replica serves: the calls that reach a dead one move on.
        let reply = self
            .pool
            .run(Retry::Safe, |channel| async move {
                let request = HealthCheckRequest {
                    service: crate::grpc::SERVICE.into(),
                };
                HealthClient::new(channel).check(request).await
            })
            .await
            .map_err(error_info)?;
        if reply.into_inner().status() == ServingStatus::Serving {
            Ok(())
        } else {
            Err(unavailable("the relay is not serving"))
        }
    }

    /// An item each time the session's manifest changes; ends with the session or the stream.
    pub(crate) async fn manifest_changes(
        &self,
        caller: &Caller,
        code: &str,
    ) -> Outcome<futures::stream::BoxStream<'static, ()>> {
        let message = pb::GetManifestRequest { code: code.into() };
        let changes = self
            .streaming(
                || self.request(message.clone(), caller, &Credential::None),
                |mut client, request| async move { client.watch_manifest(request).await },
            )
            .await?;
        // A broken stream ends like an ended session: the watcher stops.
        Ok(changes
            .take_while(|change| std::future::ready(change.is_ok()))
            .map(|_| ())
            .boxed())
    }

    /// Attaches a provider connection: a `Connect` stream to a replica.
    pub(crate) async fn attach(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Outcome<ProviderLink> {
        self.accepting()?;
        let code_value = MetadataValue::try_from(code)
            .map_err(|_| ErrorInfo::from(crate::RelayError::InvalidCode))?;
        let credential = Credential::token(token.map(str::to_owned));
        // Each attempt has its own uplink: a failed attempt drops the stream it was given.
        let (uplink, mut inbound) = self
            .streaming(
                || {
                    let (uplink, from_provider) = channel::<Uplink>(LINK_BUFFER);
                    let outbound = from_provider.map(pb::ProviderMessage::from);
                    let mut request = self.request((uplink, outbound), caller, &credential);
                    let metadata = request.metadata_mut();
                    metadata.insert(SESSION_CODE_METADATA, code_value.clone());
                    metadata.insert(
                        TRANSPORT_METADATA,
                        MetadataValue::from_static(transport.as_str()),
                    );
                    request
                },
                |mut client, request| async move {
                    let (metadata, extensions, (uplink, outbound)) = request.into_parts();
                    let request = Request::from_parts(metadata, extensions, outbound);
                    let inbound = client.connect(request).await?;
                    Ok(inbound.map(|inbound| (uplink, inbound)))
                },
            )
            .await?;
        let code = SessionCode::parse(code).map_err(ErrorInfo::from)?;

        let (to_transport, downlink) = channel(LINK_BUFFER);
        let drain = self.options.drain.clone();
        tokio::spawn(async move {
            let mut ended_by_relay = false;
            // The calls the relay gave this tab, until it is done with their answers: each
            // holds this process's drain open (the connection's own record is the relay's).
            let mut delivered = Delivered::<Hold>::default();
            loop {
                let message = tokio::select! {
                    message = inbound.next() => message,
                    () = to_transport.closed() => break,
                };
                let Some(Ok(message)) = message else {
                    // The stream broke, or ended without a final message: the relay went away
                    // (a crash, a lost network). The tab should reconnect, as after a restart.
                    if !ended_by_relay {
                        let _ = to_transport.send(Downlink::Restarting).await;
                    }
                    return;
                };
                let Ok(message) = Downlink::try_from(message) else {
                    continue;
                };
                ended_by_relay = message.is_final();
                match &message {
                    Downlink::ToolRequest { request, .. } => {
                        delivered.deliver(request.request_id().to_owned(), drain.hold());
                    }
                    Downlink::Ack { request_id, .. } => {
                        delivered.settle(request_id);
                    }
                    _ => {}
                }
                if to_transport.send(message).await.is_err() {
                    break;
                }
            }
            // The transport went away, and with it the sender of `from_provider`: the request
            // stream ends once what it holds is sent. Reading on until the relay ends its side
            // lets those last frames (answers above all) arrive instead of cancelling the call.
            let drained = async { while inbound.next().await.is_some() {} };
            let _ = tokio::time::timeout(LINGER, drained).await;
        });
        Ok(ProviderLink {
            code,
            connection_id: String::new(),
            downlink,
            uplink,
            // It runs at the relay that holds the session, at the other end of the stream.
            driver: None,
        })
    }
}

/// The relay's answer as an error: its `x-error` code and message when the relay gave them,
/// otherwise a transport failure.
fn error_info(status: Status) -> ErrorInfo {
    let metadata = status.metadata();
    let name = metadata
        .get(ERROR_METADATA)
        .and_then(|value| value.to_str().ok());
    let Some(name) = name else {
        tracing::error!(code = ?status.code(), detail = status.message(), "relay call failed");
        return unavailable("the relay did not answer");
    };
    // A name this build does not know comes from a newer relay (a rolling deploy): its
    // message still says what to do.
    let code = ErrorCode::parse(name).unwrap_or_else(|| {
        tracing::warn!(name, "the relay sent an error this gateway does not know");
        ErrorCode::InternalError
    });
    let retry_after = metadata
        .get(RETRY_AFTER_METADATA)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .map(Duration::from_secs);
    // A caller cut off by the relay's drain is told which call to ask for, as in one process.
    let request_id = metadata
        .get(REQUEST_ID_METADATA)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    ErrorInfo {
        kind: code.kind(),
        code,
        message: status.message().to_owned(),
        retry_after,
        request_id,
    }
}

fn unavailable(cause: &str) -> ErrorInfo {
    tracing::warn!(cause, "relay unavailable");
    ErrorInfo {
        retry_after: Some(Duration::from_secs(2)),
        ..ErrorInfo::new(
            ErrorCode::RelayUnavailable,
            "The relay cannot be reached right now. Try again in a few seconds.",
        )
    }
}
