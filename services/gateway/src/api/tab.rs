//! The browser tab's side (the tool provider): create and end a session, receive calls by
//! server-sent events or polling, answer them, register the manifest. The WebSocket, the
//! primary transport, is in [`crate::websocket`].

use futures::StreamExt;
use futures::stream::BoxStream;
use poem::web::sse::Event;
use poem::{FromRequest, Request, RequestBody};
use poem_openapi::error::ParseRequestPayloadError;
use poem_openapi::param::{Header, Path, Query};
use poem_openapi::payload::{EventStream, Json, ParsePayload, Payload};
use poem_openapi::registry::{MetaSchemaRef, Registry};
use poem_openapi::types::{ParseFromJSON, Type};
use poem_openapi::{ApiResponse, OpenApi};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use toolrelay::json::ReadError;
use toolrelay::wire::ProviderFrame;
use toolrelay_relay::front::ops::{
    AnswerApproval, CreateSession, DescribeClaim, EndSession, GetApprovals, PollRequests, PostNews,
    PostResponse, RedeemClaim, RegisterManifest,
};
use toolrelay_relay::front::too_deep_response;
use toolrelay_relay::front::{
    Caller, Downlink, ErrorInfo, NewSession, ProviderLink, RelayError, ResponseOutcome, Transport,
};

use super::{Client, State, Tag, provider_token};
use crate::error::ApiError;
use crate::types::{
    ApprovalAnswer, ApprovalOutcome, Approvals, ClaimAbout, ClaimBody, CreatedSession, PolledItem,
    Registered, ResponseAccepted, Status, TabResponse,
};

/// The tab-side operations.
pub struct TabApi {
    /// Shared state.
    pub state: State,
}

/// A created session.
#[derive(ApiResponse)]
pub enum SessionCreated {
    /// The session; keep providerToken secret in the tab.
    #[oai(status = 201)]
    Created(Json<CreatedSession>),
}

/// An ended session.
#[derive(ApiResponse)]
pub enum SessionEnded {
    /// The session is gone; its connected tab was told.
    #[oai(status = 204)]
    Ended,
}

/// A stream of server-sent events.
pub type Events = EventStream<BoxStream<'static, Value>>;

impl TabApi {
    /// The answer for a session the tab now holds (created, or redeemed from a claim).
    fn created(&self, session: NewSession) -> SessionCreated {
        let created = CreatedSession::new(session, &self.state.config.public_base_url);
        SessionCreated::Created(Json(created))
    }
}

#[OpenApi(tag = "Tag::Provider")]
impl TabApi {
    /// Create a session
    ///
    /// Called by the plugin when it loads. Returns the pairing code to show the user and the
    /// provider token the tab keeps to itself.
    #[oai(
        path = "/api/sessions",
        method = "post",
        operation_id = "createSession"
    )]
    async fn create_session(&self, client: Client) -> Result<SessionCreated, ApiError> {
        self.state.limits.create_session(&client.0).await?;
        let session = self.state.relay.run(&client.0, CreateSession).await?;
        Ok(self.created(session))
    }

    /// Redeem a claim
    ///
    /// Called by a page an MCP App opened for a session (the CODAP plugin in the app of MCP's
    /// `open_codap`) with the one-time claim in its URL, instead of creating a session: the
    /// answer is that session, as session creation answers. A claim works once, within
    /// `CLAIM_TTL_SECONDS` of `open_codap` (410 `claim_used`, `claim_expired`); an unknown
    /// claim (404 `unknown_claim`) counts against the brute-force guard like an unknown code.
    #[oai(
        path = "/api/sessions/claim",
        method = "post",
        operation_id = "redeemClaim"
    )]
    async fn redeem_claim(
        &self,
        body: Json<ClaimBody>,
        client: Client,
    ) -> Result<SessionCreated, ApiError> {
        let redeem = RedeemClaim {
            claim: body.0.claim,
        };
        let session = self.state.relay.run(&client.0, redeem).await?;
        Ok(self.created(session))
    }

    /// Describe a claim without redeeming it
    ///
    /// Who opened the claim (what its MCP client says it is) and until when it can be
    /// redeemed, for a page that asks the person before pairing (the plugin opened from a
    /// link rather than inside the conversation). Refused as a redemption is (404
    /// `unknown_claim`, 410 `claim_used`, `claim_expired`); the claim stays unspent.
    #[oai(
        path = "/api/sessions/claim/about",
        method = "post",
        operation_id = "describeClaim"
    )]
    async fn describe_claim(
        &self,
        body: Json<ClaimBody>,
        client: Client,
    ) -> Result<Json<ClaimAbout>, ApiError> {
        let describe = DescribeClaim {
            claim: body.0.claim,
        };
        let about = self.state.relay.run(&client.0, describe).await?;
        Ok(Json(ClaimAbout {
            label: about.label,
            expires_at: about.claim_expires_at.rfc3339(),
        }))
    }

    /// End a session
    ///
    /// Ends the session at once (provider token required).
    #[oai(
        path = "/api/sessions/:code",
        method = "delete",
        operation_id = "deleteSession"
    )]
    async fn delete_session(
        &self,
        /// The pairing code.
        code: Path<String>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        /// The provider token, when no Authorization header can be sent.
        token: Query<Option<String>>,
        client: Client,
    ) -> Result<SessionEnded, ApiError> {
        let caller = &client.0;
        let token = provider_token(authorization.as_deref(), token.0);
        self.state
            .relay
            .run(
                caller,
                EndSession {
                    code: code.0,
                    token,
                },
            )
            .await?;
        Ok(SessionEnded::Ended)
    }

    /// Receive calls as server-sent events
    ///
    /// The SSE fallback for tabs: events connected, tool-request (with an id; reconnect with
    /// Last-Event-ID), heartbeat every 25 s. Unanswered calls are sent again on reconnect.
    #[oai(
        path = "/api/sessions/:code/stream",
        method = "get",
        operation_id = "streamCalls"
    )]
    async fn stream_calls(
        &self,
        /// The pairing code.
        code: Path<String>,
        /// The provider token (EventSource cannot send headers).
        token: Query<Option<String>>,
        /// `Bearer <providerToken>`, for clients that can send it.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        /// The last event id seen, for a new EventSource resuming an old one.
        #[oai(name = "lastEventId")]
        last_event_id: Query<Option<String>>,
        /// Set by EventSource when it reconnects.
        #[oai(name = "Last-Event-ID")]
        last_event_header: Header<Option<String>>,
        client: Client,
    ) -> Result<Events, ApiError> {
        let caller = &client.0;
        let token = provider_token(authorization.as_deref(), token.0);
        let resumed = last_event_header.0.or(last_event_id.0);
        let link = self
            .state
            .relay
            .attach(caller, &code, token.as_deref(), Transport::Sse)
            .await?;
        // Every call not answered yet is sent again on a new stream, so resuming loses
        // nothing whatever the last id was; the tab de-duplicates by requestId.
        tracing::debug!(code = %link.code.redacted(), resumed = resumed.as_deref().unwrap_or(""), "SSE provider attached");
        Ok(events(link, event_value, &self.state))
    }

    /// Fetch waiting calls (polling fallback)
    ///
    /// Returns the calls waiting for this tab as a JSON array (`type: "tool-request"`) and
    /// hands them to it for 30 s; a call not answered by then is handed out again. Poll every
    /// second. Name the calls the tab is running in `running`: those their callers cancelled
    /// come first, as `{type: "cancel", requestId}` items.
    #[oai(
        path = "/api/sessions/:code/request",
        method = "get",
        operation_id = "pollCalls"
    )]
    async fn poll_calls(
        &self,
        /// The pairing code.
        code: Path<String>,
        /// The provider token.
        token: Query<Option<String>>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        /// The requestIds of the calls the tab is running, comma-separated (at most 64 are
        /// looked at).
        running: Query<Option<String>>,
        client: Client,
    ) -> Result<Json<Vec<PolledItem>>, ApiError> {
        let caller = &client.0;
        let token = provider_token(authorization.as_deref(), token.0);
        let running = running
            .0
            .iter()
            .flat_map(|ids| ids.split(','))
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .collect();
        let polled = self
            .state
            .relay
            .run(
                caller,
                PollRequests {
                    code: code.0,
                    token,
                    max: None,
                    running,
                },
            )
            .await?;
        Ok(Json(PolledItem::all(polled)))
    }

    /// Answer a call
    ///
    /// The tab posts the result (or error) of a call it received. The first answer to a call
    /// wins; later ones are acknowledged with accepted=false.
    #[oai(
        path = "/api/sessions/:code/response",
        method = "post",
        operation_id = "postResponse"
    )]
    async fn post_response(
        &self,
        /// The pairing code.
        code: Path<String>,
        body: AnswerBody<TabResponse>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        /// The provider token, when no Authorization header can be sent.
        token: Query<Option<String>>,
        client: Client,
    ) -> Result<Json<ResponseAccepted>, ApiError> {
        let caller = &client.0;
        let token = provider_token(authorization.as_deref(), token.0);
        let outcome = match body.0 {
            Ok(body) => {
                let request_id = body.request_id.clone();
                let response = match body.into_frame() {
                    Ok(ProviderFrame::Response(response)) => *response,
                    Ok(news) => {
                        let code = code.0;
                        let running = self
                            .state
                            .relay
                            .run(caller, PostNews { code, token, news })
                            .await?;
                        return Ok(Json(ResponseAccepted {
                            request_id,
                            status: Status::Delivered,
                            accepted: running,
                        }));
                    }
                    Err(reason) => {
                        let refused = RelayError::InvalidResponse { reason };
                        return Err(ErrorInfo::from(refused).into());
                    }
                };
                self.state
                    .relay
                    .run(
                        caller,
                        PostResponse {
                            code: code.0,
                            token,
                            response,
                        },
                    )
                    .await?
            }
            Err(too_deep) => {
                #[derive(serde::Deserialize)]
                #[serde(rename_all = "camelCase")]
                struct Head {
                    request_id: String,
                }
                let head: Head = too_deep.head(&self.state)?;
                let answer = TooDeepAnswer {
                    caller,
                    code: &code,
                    token: token.as_deref(),
                    request_id: head.request_id,
                };
                answer.fail_the_call(&self.state).await?
            }
        };
        Ok(Json(ResponseAccepted {
            request_id: outcome.request_id,
            status: outcome.status.into(),
            accepted: outcome.accepted,
        }))
    }

    /// Answer the person's question about a new caller
    ///
    /// For a tab without a WebSocket (SSE, polling): the person's Allow (`{allow: true}`) or
    /// Deny (`{allow: false}`) about the caller an `approval-request` named. 409
    /// `approval_not_pending` when that caller is not asked about (answered already, in this
    /// tab or another, or lapsed).
    #[oai(
        path = "/api/sessions/:code/approvals/:caller_id",
        method = "post",
        operation_id = "answerApproval"
    )]
    async fn answer_approval(
        &self,
        /// The pairing code.
        code: Path<String>,
        /// The caller (`callerId` of the `approval-request`).
        caller_id: Path<String>,
        body: Json<ApprovalAnswer>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        client: Client,
    ) -> Result<Json<ApprovalOutcome>, ApiError> {
        let token = provider_token(authorization.as_deref(), None);
        let answer = AnswerApproval {
            code: code.0,
            token,
            caller_id: caller_id.0,
            allow: Some(body.0.allow),
        };
        let outcome = self.state.relay.run(&client.0, answer).await?;
        Ok(Json(ApprovalOutcome { outcome }))
    }

    /// The session's approvals
    ///
    /// What the tab shows: the caller the person is asked about now (`pending`, or null), the
    /// callers allowed, and whether new ones are refused. Read it on every (re)connection.
    #[oai(
        path = "/api/sessions/:code/approvals",
        method = "get",
        operation_id = "getApprovals"
    )]
    async fn get_approvals(
        &self,
        /// The pairing code.
        code: Path<String>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        client: Client,
    ) -> Result<Json<Approvals>, ApiError> {
        let token = provider_token(authorization.as_deref(), None);
        let read = GetApprovals {
            code: code.0,
            token,
        };
        let view = self.state.relay.run(&client.0, read).await?;
        Ok(Json(Approvals {
            pending: view.asking.map(|(_, card)| card.into()),
            allowed: view.allowed.into_iter().map(Into::into).collect(),
            refused: view.refused,
        }))
    }

    /// Disconnect an allowed caller
    ///
    /// The person's **Disconnect**: the caller's handle stops working, and its next use of
    /// the code asks the person again.
    #[oai(
        path = "/api/sessions/:code/approvals/:caller_id",
        method = "delete",
        operation_id = "disconnectCaller"
    )]
    async fn disconnect_caller(
        &self,
        /// The pairing code.
        code: Path<String>,
        /// The caller.
        caller_id: Path<String>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        client: Client,
    ) -> Result<Json<ApprovalOutcome>, ApiError> {
        let token = provider_token(authorization.as_deref(), None);
        let answer = AnswerApproval {
            code: code.0,
            token,
            caller_id: caller_id.0,
            allow: None,
        };
        let outcome = self.state.relay.run(&client.0, answer).await?;
        Ok(Json(ApprovalOutcome { outcome }))
    }

    /// Register the tab's tools
    ///
    /// Replaces the session's manifest: {tools: [...]} with tools grouped
    /// ({id, description, functions}) or flat ({name, description, inputSchema}). A refused
    /// manifest leaves the old one in place.
    #[oai(
        path = "/api/sessions/:code/manifest",
        method = "put",
        operation_id = "putManifest"
    )]
    async fn put_manifest(
        &self,
        /// The pairing code.
        code: Path<String>,
        body: Json<Value>,
        /// `Bearer <providerToken>`.
        #[oai(name = "Authorization")]
        authorization: Header<Option<String>>,
        /// The provider token, when no Authorization header can be sent.
        token: Query<Option<String>>,
        client: Client,
    ) -> Result<Json<Registered>, ApiError> {
        let caller = &client.0;
        let token = provider_token(authorization.as_deref(), token.0);
        let count = self
            .state
            .relay
            .run(
                caller,
                RegisterManifest {
                    code: code.0,
                    token,
                    approves: body.0.get("approves").and_then(Value::as_bool) == Some(true),
                    tools: body.0,
                },
            )
            .await?;
        Ok(Json(Registered {
            tools: count as u64,
        }))
    }
}

/// The SSE stream of a provider link, each message shaped by `shape`. The stream owns the
/// link: when the tab goes away the stream is dropped and the provider detached. It ends when
/// the process's drain does, so that the tab reconnects to another replica.
pub fn events(mut link: ProviderLink, shape: fn(Downlink) -> Value, state: &State) -> Events {
    link.spawn_driver();
    let uplink = link.uplink;
    let stream = link
        .downlink
        .map(move |message| {
            let _attached = &uplink;
            shape(message)
        })
        .take_until(state.drain.ended());
    EventStream::new(stream.boxed()).to_event(sse_event)
}

/// A provider message as the JSON of an SSE event: the browser protocol's frame, with the
/// event's type and id alongside (removed again by [`sse_event`]).
pub fn event_value(message: Downlink) -> Value {
    let seq = match &message {
        Downlink::ToolRequest { seq, .. } => Some(*seq),
        _ => None,
    };
    let welcome = matches!(message, Downlink::Welcome { .. });
    let mut frame = serde_json::to_value(message.into_frame()).unwrap_or(Value::Null);
    if let Value::Object(object) = &mut frame {
        if let Some(seq) = seq {
            object.insert(EVENT_ID.into(), json!(seq.to_string()));
        }
        if welcome {
            object.insert("type".into(), json!("connected"));
        }
    }
    frame
}

/// Key under which [`event_value`] passes an event id to [`sse_event`].
pub const EVENT_ID: &str = "_eventId";

/// The SSE event of a value made by [`event_value`] (or by the legacy stream).
pub fn sse_event(mut value: Value) -> Event {
    let id = value
        .as_object_mut()
        .and_then(|object| object.remove(EVENT_ID))
        .and_then(|id| id.as_str().map(str::to_owned));
    let kind = value["type"].as_str().unwrap_or("message").to_owned();
    let event = Event::message(value.to_string()).event_type(kind);
    match id {
        Some(id) => event.id(id),
        None => event,
    }
}

/// A tab's answer as a request body: JSON, read as [`Json`] reads it, except that an answer
/// nested too deeply for the JSON parser to read at all (serde_json stops at 128 levels) is kept
/// as [`TooDeep`], so that the call it answers can still be failed at once (as an answer nested
/// past `MAX_JSON_DEPTH` but readable is) instead of being handed out again until it expires.
pub struct AnswerBody<T>(pub Result<T, TooDeep>);

/// A body nested past what the JSON parser reads: kept to find the answered call's id in.
pub struct TooDeep(Vec<u8>);

impl TooDeep {
    /// The body's top-level fields that `H` names (the call's id), or the 400
    /// `nested_too_deeply` such a body gets when they cannot be read.
    ///
    /// Safe however deep the body: serde_json hands a field `H` does not name to
    /// `deserialize_ignored_any`, which skips the value in a loop that keeps one byte per open
    /// bracket (`Deserializer::ignore_value`), neither recursing nor counting levels; the body
    /// is bounded by the gateway's body limit, and so is that. (`IgnoredAny` on a deserializer
    /// without such a skip would recurse: this relies on serde_json's.)
    pub fn head<H: DeserializeOwned>(&self, state: &State) -> Result<H, ApiError> {
        serde_json::from_slice(&self.0).map_err(|_| {
            let error = RelayError::NestedTooDeeply {
                what: "The JSON body is",
                limit: state.config.max_json_depth,
            };
            ErrorInfo::from(error).into()
        })
    }
}

/// A tab's answer to `request_id` that was too deep to read.
pub struct TooDeepAnswer<'a> {
    /// Who posted it.
    pub caller: &'a Caller,
    /// The session.
    pub code: &'a str,
    /// The provider token it came with.
    pub token: Option<&'a str>,
    /// The call it answers.
    pub request_id: String,
}

impl TooDeepAnswer<'_> {
    /// Gives the call the failed answer that says why (`nested_too_deeply`), as the relay does
    /// for any answer nested too deeply, and the tab that error (400) once the caller has its
    /// answer; the outcome when the call had its answer already.
    pub async fn fail_the_call(self, state: &State) -> Result<ResponseOutcome, ApiError> {
        let (failed, refusal) = too_deep_response(self.request_id, state.config.max_json_depth);
        let outcome = state
            .relay
            .run(
                self.caller,
                PostResponse {
                    code: self.code.to_owned(),
                    token: self.token.map(str::to_owned),
                    response: failed,
                },
            )
            .await?;
        if outcome.accepted {
            return Err(ErrorInfo::from(refusal).into());
        }
        Ok(outcome)
    }
}

impl<T: Type> Payload for AnswerBody<T> {
    const CONTENT_TYPE: &'static str = Json::<T>::CONTENT_TYPE;

    fn check_content_type(content_type: &str) -> bool {
        Json::<T>::check_content_type(content_type)
    }

    fn schema_ref() -> MetaSchemaRef {
        T::schema_ref()
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

impl<T: ParseFromJSON> ParsePayload for AnswerBody<T> {
    const IS_REQUIRED: bool = T::IS_REQUIRED;

    async fn from_request(request: &Request, body: &mut RequestBody) -> poem::Result<Self> {
        let data = Vec::<u8>::from_request(request, body).await?;
        let unreadable = |reason: String| ParseRequestPayloadError { reason };
        let value = if data.is_empty() {
            Value::Null
        } else {
            match toolrelay::json::from_slice(&data) {
                Ok(value) => value,
                Err(ReadError::TooDeep(_)) => return Ok(Self(Err(TooDeep(data)))),
                Err(ReadError::Invalid(error)) => return Err(unreadable(error.to_string()).into()),
            }
        };
        let parsed =
            T::parse_from_json(Some(value)).map_err(|error| unreadable(error.into_message()))?;
        Ok(Self(Ok(parsed)))
    }
}

poem_openapi::impl_apirequest_for_payload!(AnswerBody<T>, T: ParseFromJSON);
