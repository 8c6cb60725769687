//! The relay reached over gRPC: [`RemoteRelay`] offers the operations of [`Relay`] to a
//! process that does not hold the relay itself (the gateway in a split deployment).
//!
//! Results come back as the same domain types; errors as [`ErrorInfo`], rebuilt from the gRPC
//! status, its `x-error` name and `retry-after`. Provider connections become a `Connect`
//! stream whose messages are translated to and from [`Downlink`] and [`ProviderFrame`], so a
//! transport serving a tab cannot tell a remote relay from a local one.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Status};
use toolrelay::json::to_struct;
use toolrelay::proto::v1 as pb;
use toolrelay::proto::v1::relay_client::RelayClient;
use toolrelay::wire::{
    GroupedManifest, ProviderFrame, ProviderResponse, ToolRequest, ToolResponse,
};

use async_trait::async_trait;

use crate::access::{GATEWAY_PROOF_METADATA, GatewaySecrets};
use crate::api::{Outcome, RelayApi};
use crate::builtin::{FailureKind, Scope, ToolCode, ToolFailure, ToolInfo};
use crate::channel::channel;
use crate::code::SessionCode;
use crate::config::ENV_GATEWAY_SECRET;
use crate::convert::tool_run;
use crate::drain::Drain;
use crate::error::RelayError;
use crate::error::{ErrorCode, ErrorInfo};
use crate::grpc::{
    ERROR_METADATA, PROVIDER_TOKEN_METADATA, RETRY_AFTER_METADATA, SESSION_CODE_METADATA,
    TRANSPORT_METADATA,
};
use crate::limits::{CLIENT_ADDRESS_METADATA, CORRELATION_ID_METADATA, Caller};
use crate::pool::{RelayPool, Retry};
use crate::provider::{Downlink, ProviderLink};
use crate::relay::{AnswerLimits, contain_response};
use crate::relay::{CallInput, NewSession, RequestView, ResponseOutcome, SessionStatus};
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
    fn request<T>(&self, message: T, caller: &Caller, token: Option<&str>) -> Request<T> {
        let mut request = Request::new(message);
        let metadata = request.metadata_mut();
        if let Some(Proof(proof)) = &self.proof {
            metadata.insert(GATEWAY_PROOF_METADATA, proof.clone());
        }
        if let Ok(address) = MetadataValue::try_from(caller.address.to_string()) {
            metadata.insert(CLIENT_ADDRESS_METADATA, address);
        }
        // The relay's log lines for this call carry the gateway's correlation id.
        if let Some(id) = caller
            .correlation_id
            .as_deref()
            .and_then(|id| MetadataValue::try_from(id).ok())
        {
            metadata.insert(CORRELATION_ID_METADATA, id);
        }
        if let Some(value) =
            token.and_then(|token| MetadataValue::try_from(format!("Bearer {token}")).ok())
        {
            metadata.insert("authorization", value);
        }
        request
    }

    /// Runs one unary RPC on a replica, and again on another when this one did not answer
    /// and `retry` allows it. `make` builds the request for each attempt.
    async fn rpc<M, R, Fut>(
        &self,
        retry: Retry,
        make: impl Fn() -> Request<M>,
        rpc: impl Fn(RelayClient<Channel>, Request<M>) -> Fut,
    ) -> Outcome<R>
    where
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        self.pool
            .run(retry, |channel| rpc(RelayClient::new(channel), make()))
            .await
            .map(tonic::Response::into_inner)
            .map_err(error_info)
    }

    /// Refuses new work while this process drains.
    fn accepting(&self) -> Outcome<()> {
        if self.options.drain.is_draining() {
            Err(RelayError::ShuttingDown.into())
        } else {
            Ok(())
        }
    }

    fn check_depth(&self, value: &Value, what: &'static str) -> Outcome<()> {
        let limit = self.options.max_json_depth;
        if toolrelay::json::depth(value) > limit {
            return Err(RelayError::NestedTooDeeply { what, limit }.into());
        }
        Ok(())
    }

    /// Waits for `reply` while holding the drain open; when the drain ends first, the caller
    /// is told to ask for call `request_id`'s answer again.
    async fn waiting<T>(
        &self,
        code: &str,
        request_id: &str,
        reply: impl Future<Output = Outcome<T>>,
    ) -> Outcome<T> {
        let _hold = self.options.drain.hold();
        tokio::select! {
            reply = reply => reply,
            () = self.options.drain.ended() => Err(RelayError::Drained {
                code: SessionCode::parse(code).map_or_else(|_| code.to_owned(), |code| code.display()),
                request_id: request_id.to_owned(),
            }
            .into()),
        }
    }
}

#[async_trait]
impl RelayApi for RemoteRelay {
    async fn ready(&self) -> Outcome<()> {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        self.accepting()?;
        // Ready when a replica serves: the calls that reach a dead one move on.
        let reply = self
            .pool
            .run(Retry::Safe, |channel| async move {
                let request = HealthCheckRequest {
                    service: "toolrelay.v1.Relay".into(),
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

    async fn create_session(&self, caller: &Caller) -> Outcome<NewSession> {
        self.accepting()?;
        // Asking again at worst leaves a session nobody uses, which expires.
        let created = self
            .rpc(
                Retry::Safe,
                || self.request(pb::CreateSessionRequest {}, caller, None),
                |mut client, request| async move { client.create_session(request).await },
            )
            .await?;
        NewSession::try_from(created).map_err(|_| unavailable("the relay sent a malformed code"))
    }

    async fn session_status(&self, caller: &Caller, code: &str) -> Outcome<SessionStatus> {
        let message = pb::GetSessionRequest { code: code.into() };
        let info = self
            .rpc(
                Retry::Safe,
                || self.request(message.clone(), caller, None),
                |mut client, request| async move { client.get_session(request).await },
            )
            .await?;
        SessionStatus::try_from(info).map_err(|_| unavailable("the relay sent a malformed code"))
    }

    async fn provider_session_status(
        &self,
        caller: &Caller,
        code: &str,
        token: &str,
    ) -> Outcome<SessionStatus> {
        let message = pb::GetSessionRequest { code: code.into() };
        let info = self
            .rpc(
                Retry::Safe,
                || {
                    let mut request = self.request(message.clone(), caller, None);
                    if let Ok(token) = MetadataValue::try_from(token) {
                        request
                            .metadata_mut()
                            .insert(PROVIDER_TOKEN_METADATA, token);
                    }
                    request
                },
                |mut client, request| async move { client.get_session(request).await },
            )
            .await?;
        SessionStatus::try_from(info).map_err(|_| unavailable("the relay sent a malformed code"))
    }

    async fn resolve_handle(&self, caller: &Caller, handle: &str) -> Outcome<String> {
        let message = pb::ResolveHandleRequest {
            handle: handle.into(),
        };
        let info = self
            .rpc(
                Retry::Safe,
                || self.request(message.clone(), caller, None),
                |mut client, request| async move { client.resolve_handle(request).await },
            )
            .await?;
        Ok(info.code)
    }

    async fn end_session(&self, caller: &Caller, code: &str, token: Option<&str>) -> Outcome<()> {
        // Not asked again once sent: a second ending would say the session is gone.
        let message = pb::DeleteSessionRequest { code: code.into() };
        self.rpc(
            Retry::IfNotSent,
            || self.request(message.clone(), caller, token),
            |mut client, request| async move { client.delete_session(request).await },
        )
        .await?;
        Ok(())
    }

    async fn manifest(&self, caller: &Caller, code: &str) -> Outcome<GroupedManifest> {
        let message = pb::GetManifestRequest { code: code.into() };
        let manifest = self
            .rpc(
                Retry::Safe,
                || self.request(message.clone(), caller, None),
                |mut client, request| async move { client.get_manifest(request).await },
            )
            .await?;
        Ok(manifest.into())
    }

    async fn register_manifest(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        tools: &Value,
    ) -> Outcome<usize> {
        let message = pb::RegisterManifestRequest {
            code: code.into(),
            tools: Vec::new(),
            tools_json: tools.to_string(),
        };
        // The same manifest again is the same manifest.
        let reply = self
            .rpc(
                Retry::Safe,
                || self.request(message.clone(), caller, token),
                |mut client, request| async move { client.register_manifest(request).await },
            )
            .await?;
        Ok(reply.tool_count as usize)
    }

    async fn submit(&self, caller: &Caller, code: &str, call: CallInput) -> Outcome<RequestView> {
        self.accepting()?;
        self.check_depth(&call.args, "The arguments are")?;
        // Named here, so that asking another replica again is the same call.
        let message = pb::SubmitRequest {
            code: code.into(),
            request_id: call.request_id.unwrap_or_else(crate::code::unique_id),
            tool_id: call.tool_id.unwrap_or_default(),
            function_name: call.function_name,
            args: Some(to_struct(&call.args)),
        };
        let state = self
            .rpc(
                Retry::Safe,
                || self.request(message.clone(), caller, None),
                |mut client, request| async move { client.submit(request).await },
            )
            .await?;
        Ok(state.into())
    }

    async fn await_response(
        &self,
        caller: &Caller,
        code: &str,
        request_id: &str,
        wait: Duration,
    ) -> Outcome<RequestView> {
        let message = pb::AwaitResponseRequest {
            code: code.into(),
            request_id: request_id.into(),
            wait_ms: millis(wait),
        };
        // A wait cut off by its replica's death goes on, on another replica.
        let reply = self.rpc(
            Retry::Safe,
            || self.request(message.clone(), caller, None),
            |mut client, request| async move { client.await_response(request).await },
        );
        let state = self.waiting(code, request_id, reply).await?;
        Ok(state.into())
    }

    async fn call(
        &self,
        caller: &Caller,
        code: &str,
        call: CallInput,
        wait: Option<Duration>,
    ) -> Outcome<RequestView> {
        self.accepting()?;
        self.check_depth(&call.args, "The arguments are")?;
        // Chosen here, so that a caller cut off by the drain can be told which call to ask for,
        // and so that asking another replica again is the same call.
        let request_id = call.request_id.unwrap_or_else(crate::code::unique_id);
        let message = pb::CallRequest {
            code: code.into(),
            request_id: request_id.clone(),
            tool_id: call.tool_id.unwrap_or_default(),
            function_name: call.function_name,
            args: Some(to_struct(&call.args)),
            timeout_ms: wait.map_or(0, millis),
        };
        let reply = self.rpc(
            Retry::Safe,
            || self.request(message.clone(), caller, None),
            |mut client, request| async move { client.call(request).await },
        );
        let state = self.waiting(code, &request_id, reply).await?;
        Ok(state.into())
    }

    async fn responses(
        &self,
        caller: &Caller,
        code: &str,
        request_id: Option<&str>,
    ) -> Outcome<Vec<ToolResponse>> {
        let message = pb::ListResponsesRequest {
            code: code.into(),
            request_id: request_id.unwrap_or_default().into(),
        };
        let reply = self
            .rpc(
                Retry::Safe,
                || self.request(message.clone(), caller, None),
                |mut client, request| async move { client.list_responses(request).await },
            )
            .await?;
        Ok(reply.responses.into_iter().map(Into::into).collect())
    }

    async fn request_status(
        &self,
        caller: &Caller,
        code: &str,
        request_id: &str,
    ) -> Outcome<RequestView> {
        let message = pb::GetRequestStatusRequest {
            code: code.into(),
            request_id: request_id.into(),
        };
        let state = self
            .rpc(
                Retry::Safe,
                || self.request(message.clone(), caller, None),
                |mut client, request| async move { client.get_request_status(request).await },
            )
            .await?;
        Ok(state.into())
    }

    async fn poll(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        max: Option<usize>,
    ) -> Outcome<Vec<ToolRequest>> {
        // A stopping gateway hands out no more calls, as one process does.
        self.accepting()?;
        let message = pb::PollRequestsRequest {
            code: code.into(),
            max: max.map_or(0, |max| u32::try_from(max).unwrap_or(u32::MAX)),
        };
        // Calls a lost poll took are handed out again when their lease runs out.
        let reply = self
            .rpc(
                Retry::IfNotSent,
                || self.request(message.clone(), caller, token),
                |mut client, request| async move { client.poll_requests(request).await },
            )
            .await?;
        Ok(reply.requests.into_iter().map(Into::into).collect())
    }

    async fn post_response(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        response: ProviderResponse,
    ) -> Outcome<ResponseOutcome> {
        // Only the nesting is checked here (it could not cross gRPC); the relay checks the rest.
        let limits = AnswerLimits::depth_only(self.options.max_json_depth);
        let (response, refused) = contain_response(response, limits);
        let message = pb::PostResponseRequest {
            code: code.into(),
            response: Some(response.into()),
        };
        // Not asked again once sent: the first answer wins, and a second would be told so.
        let reply = self
            .rpc(
                Retry::IfNotSent,
                || self.request(message.clone(), caller, token),
                |mut client, request| async move { client.post_response(request).await },
            )
            .await?;
        if let Some(error) = refused.filter(|_| reply.accepted) {
            return Err(error.into());
        }
        Ok(ResponseOutcome {
            status: reply.status().into(),
            request_id: reply.request_id,
            accepted: reply.accepted,
        })
    }

    async fn manifest_changes(
        &self,
        caller: &Caller,
        code: &str,
    ) -> Outcome<futures::stream::BoxStream<'static, ()>> {
        let message = pb::GetManifestRequest { code: code.into() };
        let changes = self
            .rpc(
                Retry::Safe,
                || self.request(message.clone(), caller, None),
                |mut client, request| async move { client.watch_manifest(request).await },
            )
            .await?;
        // A broken stream ends like an ended session: the watcher stops.
        Ok(changes
            .take_while(|change| std::future::ready(change.is_ok()))
            .map(|_| ())
            .boxed())
    }

    async fn tools(&self, caller: &Caller) -> Outcome<Vec<ToolInfo>> {
        let reply = self
            .rpc(
                Retry::Safe,
                || self.request(pb::ListToolsRequest {}, caller, None),
                |mut client, request| async move { client.list_tools(request).await },
            )
            .await?;
        Ok(reply.tools.into_iter().map(Into::into).collect())
    }

    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
        scope: Scope,
    ) -> Outcome<Result<Value, ToolFailure>> {
        if let Err(error) = self.check_depth(&args, "The arguments are") {
            return Ok(Err(ToolFailure::new(
                FailureKind::BadInput,
                ToolCode::NestedTooDeeply,
                error.message,
            )));
        }
        let request = pb::CallToolRequest {
            name: name.to_owned(),
            args: Some(to_struct(&args)),
            scope: scope.into(),
        };
        // A tool's run is not repeated: a caller whose relay died asks again itself.
        let reply = self
            .rpc(
                Retry::IfNotSent,
                || self.request(request.clone(), caller, None),
                |mut client, request| async move { client.call_tool(request).await },
            )
            .await?;
        Ok(tool_run(reply))
    }

    async fn attach(
        &self,
        caller: &Caller,
        code: &str,
        token: Option<&str>,
        transport: Transport,
    ) -> Outcome<ProviderLink> {
        self.accepting()?;
        let code_value = MetadataValue::try_from(code)
            .map_err(|_| ErrorInfo::from(crate::RelayError::InvalidCode))?;
        // Each attempt has its own uplink: a failed attempt drops the stream it was given.
        // Attaching again elsewhere is safe: the newest connection of a session wins.
        let (uplink, mut inbound) = self
            .rpc(
                Retry::Safe,
                || {
                    let (uplink, from_provider) = channel::<ProviderFrame>(LINK_BUFFER);
                    let outbound = from_provider.map(pb::ProviderMessage::from);
                    let mut request = self.request((uplink, outbound), caller, token);
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
        tokio::spawn(async move {
            let mut ended_by_relay = false;
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
            // Answers go up the `Connect` stream to the relay that holds the session.
            answers: None,
            // It runs there too.
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
    ErrorInfo {
        kind: code.kind(),
        code,
        message: status.message().to_owned(),
        retry_after,
        request_id: None,
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

fn millis(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}
