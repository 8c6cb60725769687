//! The gRPC transport (tonic): the `toolrelay.v1.Relay` service over the relay's operations
//! ([`RelayApi`]), plus the standard health and reflection services.
//!
//! Each handler converts: the request's metadata into its [`Caller`] (who the peer is, or —
//! with a gateway's proof — the client the gateway names; see [`crate::access`]), the message
//! into the operation's arguments, the outcome into a reply or a status. Every check (API
//! keys, budgets, the brute-force guard) is the operation's. Conversions between protobuf and
//! domain types, and the one mapping from an error to a gRPC status, live here and nowhere
//! else.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde_json::Value;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request, Response, Status, Streaming};
use toolrelay::convert::{non_empty, registered_tools};
use toolrelay::json::from_struct;
use toolrelay::proto::v1 as pb;
use toolrelay::proto::v1::relay_server::{Relay as RelayRpc, RelayServer};
use toolrelay::wire::ProviderFrame;

use crate::access::{GATEWAY_PROOF_METADATA, Gateways};
use crate::api::RelayApi;
use crate::builtin::Scope;
use crate::convert::{count, tool_run_message};
use crate::error::{ErrorInfo, ErrorKind, RelayError};
use crate::limits::{CLIENT_ADDRESS_METADATA, CORRELATION_ID_METADATA, Caller};
use crate::provider::ProviderLink;
use crate::relay::{CallInput, Relay};
use crate::store::Transport;

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
/// Largest message the service accepts (a provider's response may be up to 1 MiB of JSON).
const MAX_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

/// The `Relay` gRPC service over the relay's operations.
#[derive(Clone)]
pub struct RelayService {
    api: Arc<dyn RelayApi>,
    /// Whose word about a client is believed.
    gateways: Arc<Gateways>,
}

impl RelayService {
    /// The service over `relay`, ready to add to a tonic server.
    pub fn server(relay: Relay) -> RelayServer<Self> {
        let gateways = Gateways::new(
            relay.config().gateway_secrets.clone(),
            relay.metrics().clone(),
        );
        let service = Self {
            api: Arc::new(relay),
            gateways: Arc::new(gateways),
        };
        RelayServer::new(service)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Who makes `request`: the client a proven gateway names, or the peer itself.
    fn caller<T>(&self, request: &Request<T>) -> Caller {
        let metadata = request.metadata();
        let peer = request
            .remote_addr()
            .map_or(IpAddr::from([0, 0, 0, 0]), |address| address.ip());
        let caller = self.gateways.caller(
            peer,
            metadata_str(metadata, CLIENT_ADDRESS_METADATA).as_deref(),
            metadata_str(metadata, GATEWAY_PROOF_METADATA).as_deref(),
            bearer(metadata),
        );
        match metadata_str(metadata, CORRELATION_ID_METADATA) {
            Some(id) => caller.with_correlation_id(id),
            None => caller,
        }
    }
}

/// The gRPC status for an error: its message, the `x-error` name and `retry-after`.
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

#[tonic::async_trait]
impl RelayRpc for RelayService {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        let caller = self.caller(&request);
        let session = self.api.create_session(&caller).await?;
        Ok(Response::new(session.into()))
    }

    async fn get_session(&self, request: Request<pb::GetSessionRequest>) -> Reply<pb::SessionInfo> {
        let caller = self.caller(&request);
        let code = &request.get_ref().code;
        // The session's own provider, with its token, is never refused by the guard.
        let status_of = match metadata_str(request.metadata(), PROVIDER_TOKEN_METADATA) {
            Some(token) => {
                self.api
                    .provider_session_status(&caller, code, &token)
                    .await
            }
            None => self.api.session_status(&caller, code).await,
        }?;
        Ok(Response::new(status_of.into()))
    }

    async fn resolve_handle(
        &self,
        request: Request<pb::ResolveHandleRequest>,
    ) -> Reply<pb::SessionInfo> {
        let caller = self.caller(&request);
        let code = self
            .api
            .resolve_handle(&caller, &request.get_ref().handle)
            .await?;
        let status_of = self.api.session_status(&caller, &code).await?;
        Ok(Response::new(status_of.into()))
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        let caller = self.caller(&request);
        let token = bearer(request.metadata());
        self.api
            .end_session(&caller, &request.get_ref().code, token.as_deref())
            .await?;
        Ok(Response::new(pb::DeleteSessionResponse {}))
    }

    async fn get_manifest(&self, request: Request<pb::GetManifestRequest>) -> Reply<pb::Manifest> {
        let caller = self.caller(&request);
        let manifest = self.api.manifest(&caller, &request.get_ref().code).await?;
        Ok(Response::new((&manifest).into()))
    }

    type WatchManifestStream =
        Pin<Box<dyn Stream<Item = Result<pb::ManifestChanged, Status>> + Send>>;

    async fn watch_manifest(
        &self,
        request: Request<pb::GetManifestRequest>,
    ) -> Reply<Self::WatchManifestStream> {
        let caller = self.caller(&request);
        let changes = self
            .api
            .manifest_changes(&caller, &request.get_ref().code)
            .await?;
        Ok(Response::new(Box::pin(
            changes.map(|()| Ok(pb::ManifestChanged {})),
        )))
    }

    async fn submit(&self, request: Request<pb::SubmitRequest>) -> Reply<pb::RequestState> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let call = CallInput::from_message(
            request.request_id,
            request.tool_id,
            request.function_name,
            request.args,
        );
        let view = self.api.submit(&caller, &request.code, call).await?;
        Ok(Response::new(view.into()))
    }

    async fn await_response(
        &self,
        request: Request<pb::AwaitResponseRequest>,
    ) -> Reply<pb::RequestState> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let wait = Duration::from_millis(u64::from(request.wait_ms));
        let view = self
            .api
            .await_response(&caller, &request.code, &request.request_id, wait)
            .await?;
        Ok(Response::new(view.into()))
    }

    async fn call(&self, request: Request<pb::CallRequest>) -> Reply<pb::RequestState> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let wait =
            (request.timeout_ms > 0).then(|| Duration::from_millis(u64::from(request.timeout_ms)));
        let call = CallInput::from_message(
            request.request_id,
            request.tool_id,
            request.function_name,
            request.args,
        );
        let view = self.api.call(&caller, &request.code, call, wait).await?;
        Ok(Response::new(view.into()))
    }

    async fn list_responses(
        &self,
        request: Request<pb::ListResponsesRequest>,
    ) -> Reply<pb::ListResponsesResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let filter = non_empty(request.request_id);
        let responses = self
            .api
            .responses(&caller, &request.code, filter.as_deref())
            .await?;
        Ok(Response::new(pb::ListResponsesResponse {
            responses: responses.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_request_status(
        &self,
        request: Request<pb::GetRequestStatusRequest>,
    ) -> Reply<pb::RequestState> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let view = self
            .api
            .request_status(&caller, &request.code, &request.request_id)
            .await?;
        Ok(Response::new(view.into()))
    }

    type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::RelayMessage, Status>> + Send>>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::ProviderMessage>>,
    ) -> Reply<Self::ConnectStream> {
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
            .api
            .attach(&caller, &code, token.as_deref(), transport)
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
                let Ok(frame) = ProviderFrame::try_from(message) else {
                    continue;
                };
                if uplink.send(frame).await.is_err() {
                    break;
                }
            }
        });
        let outbound = downlink.map(|message| Ok(message.into()));
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn poll_requests(
        &self,
        request: Request<pb::PollRequestsRequest>,
    ) -> Reply<pb::PollRequestsResponse> {
        let caller = self.caller(&request);
        let token = bearer(request.metadata());
        let request = request.into_inner();
        let max = (request.max > 0).then(|| usize::try_from(request.max).unwrap_or(usize::MAX));
        let requests = self
            .api
            .poll(&caller, &request.code, token.as_deref(), max)
            .await?;
        Ok(Response::new(pb::PollRequestsResponse {
            requests: requests.into_iter().map(Into::into).collect(),
        }))
    }

    async fn post_response(
        &self,
        request: Request<pb::PostResponseRequest>,
    ) -> Reply<pb::PostResponseResponse> {
        let caller = self.caller(&request);
        let token = bearer(request.metadata());
        let request = request.into_inner();
        let response = request
            .response
            .ok_or_else(|| Status::invalid_argument("PostResponse needs a response"))?;
        let outcome = self
            .api
            .post_response(&caller, &request.code, token.as_deref(), response.into())
            .await?;
        Ok(Response::new(pb::PostResponseResponse {
            request_id: outcome.request_id,
            status: pb::RequestStatus::from(outcome.status).into(),
            accepted: outcome.accepted,
        }))
    }

    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Reply<pb::ListToolsResponse> {
        let caller = self.caller(&request);
        let tools = self.api.tools(&caller).await?;
        Ok(Response::new(pb::ListToolsResponse {
            tools: tools.into_iter().map(Into::into).collect(),
        }))
    }

    async fn call_tool(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Reply<pb::CallToolResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let scope = Scope::try_from(request.scope)?;
        let args = request.args.as_ref().map_or(Value::Null, from_struct);
        let ran = self
            .api
            .call_tool(&caller, &request.name, args, scope)
            .await?;
        Ok(Response::new(tool_run_message(ran)))
    }

    async fn register_manifest(
        &self,
        request: Request<pb::RegisterManifestRequest>,
    ) -> Reply<pb::RegisterManifestResponse> {
        let caller = self.caller(&request);
        let token = bearer(request.metadata());
        let request = request.into_inner();
        let tools = registered_tools(&request.tools, &request.tools_json);
        let count = self
            .api
            .register_manifest(&caller, &request.code, token.as_deref(), &tools)
            .await?;
        Ok(Response::new(pb::RegisterManifestResponse {
            tool_count: self::count(count),
        }))
    }
}

fn metadata_str(metadata: &MetadataMap, key: &str) -> Option<String> {
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
