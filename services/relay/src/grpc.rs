//! The gRPC transport (tonic): the `toolrelay.v1.Relay` service over the domain, plus the
//! standard health and reflection services.
//!
//! Conversions between protobuf and domain types, and the one mapping from [`RelayError`] to
//! a gRPC status, live here and nowhere else.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request, Response, Status, Streaming};
use toolrelay::json::{from_struct, to_struct, to_value};
use toolrelay::proto::v1 as pb;
use toolrelay::proto::v1::relay_server::{Relay as RelayRpc, RelayServer};

use crate::builtin::Scope;
use crate::code::SessionCode;
use crate::convert::{
    call_input, count, failure_kind, manifest_message, non_empty, provider_frame,
    provider_response, registered_tools, relay_message, request_state, response_message,
    session_info, status_enum, timestamp_message, tool_message,
};
use crate::error::{ErrorKind, RelayError};
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

/// The `Relay` gRPC service over a [`Relay`].
#[derive(Clone)]
pub struct RelayService {
    relay: Relay,
}

impl RelayService {
    /// The service, ready to add to a tonic server.
    pub fn server(relay: Relay) -> RelayServer<Self> {
        RelayServer::new(Self { relay })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

impl RelayService {
    /// Who makes `request`: the client a trusted gateway names, or the peer itself.
    fn caller<T>(&self, request: &Request<T>) -> Caller {
        let caller = Caller::behind(
            request.remote_addr().map(|address| address.ip()),
            metadata_str(request.metadata(), CLIENT_ADDRESS_METADATA).as_deref(),
            &self.relay.config().trusted_gateways,
        );
        match metadata_str(request.metadata(), CORRELATION_ID_METADATA) {
            Some(id) => caller.with_correlation_id(id),
            None => caller,
        }
    }
}

/// The gRPC status for a relay error: its message, the `x-error` name and `retry-after`.
pub fn status(error: RelayError) -> Status {
    let code = match error.kind() {
        ErrorKind::BadRequest => Code::InvalidArgument,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::Forbidden => Code::PermissionDenied,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Conflict => Code::AlreadyExists,
        ErrorKind::Gone => Code::FailedPrecondition,
        ErrorKind::TooLarge | ErrorKind::TooManyRequests => Code::ResourceExhausted,
        ErrorKind::Unavailable => Code::Unavailable,
    };
    if let RelayError::StoreUnavailable(cause) = &error {
        tracing::error!(%cause, "store unavailable");
    }
    let mut metadata = MetadataMap::new();
    metadata.insert(
        ERROR_METADATA,
        MetadataValue::from_static(error.code().as_str()),
    );
    if let Some(retry_after) = error.retry_after()
        && let Ok(value) = retry_after.as_secs().max(1).to_string().parse()
    {
        metadata.insert(RETRY_AFTER_METADATA, value);
    }
    Status::with_metadata(code, error.to_string(), metadata)
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl RelayRpc for RelayService {
    async fn create_session(
        &self,
        _: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        let session = self.relay.create_session().await.map_err(status)?;
        Ok(Response::new(pb::CreateSessionResponse {
            code: session.code.as_str().to_owned(),
            provider_token: session.provider_token,
            ttl_seconds: u32::try_from(session.ttl.as_secs()).unwrap_or(u32::MAX),
            expires_at: Some(timestamp_message(session.expires_at)),
            mcp_handle: session.mcp_handle,
            max_expires_at: Some(timestamp_message(session.max_expires_at)),
        }))
    }

    async fn get_session(&self, request: Request<pb::GetSessionRequest>) -> Reply<pb::SessionInfo> {
        let caller = self.caller(&request);
        let code = &request.get_ref().code;
        // The session's own provider, with its token, is never refused by the guard.
        let status_of = match metadata_str(request.metadata(), PROVIDER_TOKEN_METADATA) {
            Some(token) => {
                let proven = async {
                    self.relay.authorized(code, Some(&token)).await?;
                    self.relay.session_status(code).await
                };
                self.relay
                    .guarded_provider(&caller, Some(&token), proven)
                    .await
            }
            None => {
                self.relay
                    .guarded(&caller, self.relay.session_status(code))
                    .await
            }
        }
        .map_err(status)?;
        Ok(Response::new(session_info(status_of)))
    }

    async fn resolve_handle(
        &self,
        request: Request<pb::ResolveHandleRequest>,
    ) -> Reply<pb::SessionInfo> {
        let caller = self.caller(&request);
        let code = self
            .relay
            .guarded(
                &caller,
                self.relay.resolve_handle(&request.get_ref().handle),
            )
            .await
            .map_err(status)?;
        let status_of = self
            .relay
            .session_status(code.as_str())
            .await
            .map_err(status)?;
        Ok(Response::new(session_info(status_of)))
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        let caller = self.caller(&request);
        let token = bearer(request.metadata());
        self.relay
            .guarded_provider(
                &caller,
                token.as_deref(),
                self.relay
                    .end_session(&request.get_ref().code, token.as_deref()),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(pb::DeleteSessionResponse {}))
    }

    async fn get_manifest(&self, request: Request<pb::GetManifestRequest>) -> Reply<pb::Manifest> {
        let caller = self.caller(&request);
        let manifest = self
            .relay
            .guarded(&caller, self.relay.manifest(&request.get_ref().code))
            .await
            .map_err(status)?;
        Ok(Response::new(manifest_message(&manifest)))
    }

    type WatchManifestStream =
        Pin<Box<dyn Stream<Item = Result<pb::ManifestChanged, Status>> + Send>>;

    async fn watch_manifest(
        &self,
        request: Request<pb::GetManifestRequest>,
    ) -> Reply<Self::WatchManifestStream> {
        let caller = self.caller(&request);
        let changes = self
            .relay
            .guarded(
                &caller,
                self.relay.manifest_changes(&request.get_ref().code),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(Box::pin(
            changes.map(|()| Ok(pb::ManifestChanged {})),
        )))
    }

    async fn submit(&self, request: Request<pb::SubmitRequest>) -> Reply<pb::RequestState> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let call = CallInput {
            correlation_id: caller.correlation_id.clone(),
            ..call_input(
                request.request_id,
                request.tool_id,
                request.function_name,
                request.args,
            )
        };
        // The caller's budget is spent as the call is queued: one round trip to the store.
        let charge = self.relay.limits().call_charge(&caller, &request.code);
        let submitted = self.relay.submit_charged(&request.code, call, Some(charge));
        let view = self
            .relay
            .guarded(&caller, submitted)
            .await
            .map_err(status)?;
        Ok(Response::new(request_state(view)))
    }

    async fn await_response(
        &self,
        request: Request<pb::AwaitResponseRequest>,
    ) -> Reply<pb::RequestState> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let wait = Duration::from_millis(u64::from(request.wait_ms));
        let view = self
            .relay
            .guarded(
                &caller,
                self.relay
                    .await_response(&request.code, &request.request_id, wait),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(request_state(view)))
    }

    async fn call(&self, request: Request<pb::CallRequest>) -> Reply<pb::RequestState> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let wait =
            (request.timeout_ms > 0).then(|| Duration::from_millis(u64::from(request.timeout_ms)));
        let call = CallInput {
            correlation_id: caller.correlation_id.clone(),
            ..call_input(
                request.request_id,
                request.tool_id,
                request.function_name,
                request.args,
            )
        };
        let charge = self.relay.limits().call_charge(&caller, &request.code);
        let called = self
            .relay
            .call_charged(&request.code, call, wait, Some(charge));
        let view = self.relay.guarded(&caller, called).await.map_err(status)?;
        Ok(Response::new(request_state(view)))
    }

    async fn list_responses(
        &self,
        request: Request<pb::ListResponsesRequest>,
    ) -> Reply<pb::ListResponsesResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let filter = non_empty(request.request_id);
        let responses = self
            .relay
            .guarded(
                &caller,
                self.relay.responses(&request.code, filter.as_deref()),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ListResponsesResponse {
            responses: responses.into_iter().map(response_message).collect(),
        }))
    }

    async fn get_request_status(
        &self,
        request: Request<pb::GetRequestStatusRequest>,
    ) -> Reply<pb::RequestState> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        let view = self
            .relay
            .guarded(
                &caller,
                self.relay
                    .request_status(&request.code, &request.request_id),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(request_state(view)))
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
        let ProviderLink {
            downlink, uplink, ..
        } = self
            .relay
            .guarded_provider(
                &caller,
                token.as_deref(),
                self.relay.attach(&code, token.as_deref(), transport),
            )
            .await
            .map_err(status)?;

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
                let Some(frame) = provider_frame(message) else {
                    continue;
                };
                if uplink.send(frame).await.is_err() {
                    break;
                }
            }
        });
        let outbound = ReceiverStream::new(downlink).map(|message| Ok(relay_message(message)));
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
            .relay
            .guarded_provider(
                &caller,
                token.as_deref(),
                self.relay.poll(&request.code, token.as_deref(), max),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(pb::PollRequestsResponse {
            requests: requests
                .into_iter()
                .map(|request| pb::ToolRequest {
                    request_id: request.request_id,
                    tool_id: request.tool_id.unwrap_or_default(),
                    function_name: request.function_name,
                    args: Some(to_struct(&request.args)),
                    seq: 0,
                })
                .collect(),
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
            .relay
            .guarded_provider(
                &caller,
                token.as_deref(),
                self.relay.post_response(
                    &request.code,
                    token.as_deref(),
                    provider_response(response),
                ),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(pb::PostResponseResponse {
            request_id: outcome.request_id,
            status: status_enum(outcome.status).into(),
            accepted: outcome.accepted,
        }))
    }

    async fn list_tools(&self, _: Request<pb::ListToolsRequest>) -> Reply<pb::ListToolsResponse> {
        Ok(Response::new(pb::ListToolsResponse {
            tools: self.relay.tools().into_iter().map(tool_message).collect(),
        }))
    }

    async fn call_tool(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Reply<pb::CallToolResponse> {
        let request = request.into_inner();
        let scope = match request.scope {
            Some(pb::call_tool_request::Scope::SessionCode(code)) => {
                Scope::Session(SessionCode::parse(&code).map_err(status)?)
            }
            Some(pb::call_tool_request::Scope::McpSession(id)) => Scope::Mcp(id),
            Some(pb::call_tool_request::Scope::CallerScope(id)) => Scope::Caller(id),
            None => Scope::None,
        };
        let args = request.args.as_ref().map_or(Value::Null, from_struct);
        let reply = match self.relay.call_tool(&request.name, args, scope).await {
            Ok(result) => pb::CallToolResponse {
                success: true,
                result: Some(to_value(&result)),
                failure: None,
            },
            Err(failure) => pb::CallToolResponse {
                success: false,
                result: None,
                failure: Some(pb::ToolFailure {
                    kind: failure_kind(failure.kind).into(),
                    code: failure.code,
                    message: failure.message,
                    retry_after_seconds: failure
                        .retry_after
                        .map_or(0, |wait| u32::try_from(wait.as_secs()).unwrap_or(u32::MAX)),
                }),
            },
        };
        Ok(Response::new(reply))
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
            .relay
            .guarded_provider(
                &caller,
                token.as_deref(),
                self.relay
                    .register_manifest(&request.code, token.as_deref(), &tools),
            )
            .await
            .map_err(status)?;
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

/// The provider token from `authorization: Bearer <token>`.
pub(crate) fn bearer(metadata: &MetadataMap) -> Option<String> {
    let value = metadata_str(metadata, "authorization")?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}
