//! What the relay sends a provider connection ([`Downlink`]), as every transport carries it,
//! and what a provider is told about each answer it sends ([`receipt`]).

use std::sync::Arc;

use toolrelay::PROTOCOL_VERSION;
use toolrelay::wire::{CallerCard, RelayFrame, ToolRequest, ToolRequestFrame};

use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::{ErrorCode, RelayError};
use crate::relay::ResponseOutcome;
use crate::store::RequestRecord;

/// What the relay sends to a provider.
#[derive(Debug, Clone, PartialEq)]
pub enum Downlink {
    /// First message of a connection.
    Welcome {
        /// The session.
        code: SessionCode,
        /// When it expires unless there is activity.
        expires_at: Timestamp,
    },
    /// A call to run.
    ToolRequest {
        /// The call.
        request: HandedCall,
        /// Its position in the session's queue.
        seq: u64,
    },
    /// The caller cancelled a call this connection was given: the provider stops running it.
    Cancel {
        /// The call.
        request_id: String,
    },
    /// A caller the person has not allowed asks to use the session: ask the person.
    ApprovalRequest(Box<CallerCard>),
    /// The question about a caller is closed: (its id, `allowed` / `declined` / `timeout`).
    ApprovalClosed(Box<(String, String)>),
    /// The callers the person allowed, and whether new ones are refused.
    Callers(Box<(Vec<CallerCard>, bool)>),
    /// Periodic, and the answer to a ping.
    Heartbeat {
        /// When the session expires unless there is activity.
        expires_at: Timestamp,
        /// Whether it answers the provider's ping rather than being the relay's periodic one:
        /// only periodic heartbeats count towards a silent provider's limit.
        answers_ping: bool,
    },
    /// A manifest was accepted.
    Registered {
        /// Its number of functions.
        tools: usize,
    },
    /// Something the provider sent was refused; the connection stays.
    Error {
        /// What was refused, by name.
        error: ErrorCode,
        /// What to do about it.
        message: String,
    },
    /// The relay is done with an answer the provider sent: it is stored, or (with a refusal)
    /// refused for good. The provider may forget it.
    Ack {
        /// The call answered.
        request_id: String,
        /// Why the answer was refused for good (or replaced by a failed one), if it was.
        refusal: Option<Box<Refusal>>,
    },
    /// An answer could not be stored now (the store is unavailable): the provider sends it
    /// again.
    NotStored {
        /// The call answered.
        request_id: String,
        /// Why, and what to do.
        refusal: Box<Refusal>,
    },
    /// Another connection took over the session; this one ends.
    Replaced,
    /// The relay is stopping; this connection ends and should be made again.
    Restarting,
    /// The session ended; this connection ends.
    Expired {
        /// Why, and what to do.
        message: String,
    },
}

/// A call handed to a provider: the store's record of it, shared (a relay hands the calls it
/// holds without copying them), or the call as another relay sent it over gRPC. Either is
/// one pointer: the other messages are small, and every connection's channel holds a block
/// of messages from the start.
#[derive(Debug, Clone)]
pub enum HandedCall {
    /// The call as the store holds it.
    Held(Arc<RequestRecord>),
    /// The call as it came.
    Sent(Box<ToolRequest>),
}

impl HandedCall {
    /// Its `tool-request` frame, borrowing it.
    pub fn frame(&self) -> ToolRequestFrame<'_> {
        match self {
            Self::Held(record) => record.frame(),
            Self::Sent(request) => request.frame(),
        }
    }

    /// The call's id.
    pub fn request_id(&self) -> &str {
        self.frame().request_id
    }

    /// The call, moved out where it is not shared.
    pub fn into_request(self) -> ToolRequest {
        match self {
            Self::Held(record) => record.tool_request(),
            Self::Sent(request) => *request,
        }
    }
}

impl PartialEq for HandedCall {
    /// The same call, however it is held.
    fn eq(&self, other: &Self) -> bool {
        self.frame() == other.frame()
    }
}

impl From<ToolRequest> for HandedCall {
    fn from(request: ToolRequest) -> Self {
        Self::Sent(Box::new(request))
    }
}

/// Why the relay did not take an answer as it was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// By name.
    pub error: ErrorCode,
    /// What it means.
    pub message: String,
}

impl Refusal {
    fn of(error: &RelayError) -> Box<Self> {
        Box::new(Self {
            error: error.code(),
            message: error.to_string(),
        })
    }
}

/// What the provider is told about an answer it sent, from what recording it gave: an
/// acknowledgement when the relay is done with it (stored, already answered, or refused for
/// good), [`Downlink::NotStored`] when the store failed. `Err` only when the session is gone
/// (the driver then ends the connection).
pub fn receipt(
    request_id: String,
    recorded: Result<ResponseOutcome, RelayError>,
) -> Result<Downlink, RelayError> {
    match recorded {
        // Accepted, or the call had its answer already: the first answer wins.
        Ok(_) => Ok(Downlink::Ack {
            request_id,
            refusal: None,
        }),
        Err(error @ RelayError::SessionNotFound { .. }) => Err(error),
        Err(error @ (RelayError::StoreUnavailable(_) | RelayError::StoreFull(_))) => {
            Ok(Downlink::NotStored {
                request_id,
                refusal: Refusal::of(&error),
            })
        }
        // Not the connection's call, no such call, an unusable answer (the caller then has a
        // failed one): sending it again changes nothing.
        Err(error) => Ok(Downlink::Ack {
            request_id,
            refusal: Some(Refusal::of(&error)),
        }),
    }
}

impl Downlink {
    /// Whether the connection ends after this message.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Self::Replaced | Self::Restarting | Self::Expired { .. }
        )
    }

    /// The error name and message of the messages sent as `error` frames.
    pub fn error(&self) -> Option<(ErrorCode, String)> {
        match self {
            Self::Error { error, message } => Some((*error, message.clone())),
            Self::Replaced => Some((
                ErrorCode::Replaced,
                "Another connection with this session's token took over; this one is closed."
                    .to_owned(),
            )),
            Self::Restarting => Some((
                RelayError::ShuttingDown.code(),
                RelayError::ShuttingDown.to_string(),
            )),
            _ => None,
        }
    }

    /// The JSON frame of the browser protocol (a call and an answer's `ack` moved, not copied).
    pub fn into_frame(self) -> RelayFrame {
        match self {
            Self::ToolRequest { request, .. } => RelayFrame::ToolRequest(request.into_request()),
            Self::Ack {
                request_id,
                refusal,
            } => {
                let (error, message) = refusal
                    .map(|refusal| (refusal.error, refusal.message))
                    .unzip();
                RelayFrame::Ack {
                    request_id,
                    error,
                    message,
                }
            }
            other => other.to_frame(),
        }
    }

    /// The JSON frame of the browser protocol.
    pub fn to_frame(&self) -> RelayFrame {
        match self {
            Self::Welcome { code, expires_at } => RelayFrame::Welcome {
                code: code.as_str().to_owned(),
                expires_at: expires_at.rfc3339(),
                protocol_version: PROTOCOL_VERSION.to_owned(),
            },
            Self::ToolRequest { request, .. } => {
                RelayFrame::ToolRequest(request.frame().to_request())
            }
            Self::Heartbeat { expires_at, .. } => RelayFrame::Heartbeat {
                expires_at: expires_at.rfc3339(),
            },
            Self::Registered { tools } => RelayFrame::Registered { tools: *tools },
            Self::Cancel { request_id } => RelayFrame::Cancel {
                request_id: request_id.clone(),
            },
            Self::ApprovalRequest(card) => RelayFrame::ApprovalRequest(card.as_ref().clone()),
            Self::ApprovalClosed(closed) => RelayFrame::ApprovalClosed {
                caller_id: closed.0.clone(),
                outcome: closed.1.clone(),
            },
            Self::Callers(callers) => RelayFrame::Callers {
                allowed: callers.0.clone(),
                refused: callers.1,
            },
            Self::Error { .. } | Self::Replaced | Self::Restarting => {
                let (error, message) = self
                    .error()
                    .unwrap_or((ErrorCode::InternalError, String::new()));
                RelayFrame::Error {
                    error,
                    message,
                    request_id: None,
                }
            }
            Self::Ack {
                request_id,
                refusal,
            } => RelayFrame::Ack {
                request_id: request_id.clone(),
                error: refusal.as_ref().map(|refusal| refusal.error),
                message: refusal.as_ref().map(|refusal| refusal.message.clone()),
            },
            Self::NotStored {
                request_id,
                refusal,
            } => RelayFrame::Error {
                error: refusal.error,
                message: refusal.message.clone(),
                request_id: Some(request_id.clone()),
            },
            Self::Expired { message } => RelayFrame::Expired {
                message: message.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_moved_out_is_the_frame_copied_out() {
        let call = Downlink::ToolRequest {
            request: ToolRequest {
                request_id: "r:1".into(),
                tool_id: Some("codap".into()),
                function_name: "create_table".into(),
                args: serde_json::json!({"name": "heights", "rows": [1, 2]}),
            }
            .into(),
            seq: 7,
        };
        let stored = Downlink::Ack {
            request_id: "r:1".into(),
            refusal: None,
        };
        let refused = Downlink::Ack {
            request_id: "r:2".into(),
            refusal: Some(Refusal::of(&RelayError::ShuttingDown)),
        };
        for message in [call, stored, refused, Downlink::Replaced] {
            assert_eq!(message.clone().into_frame(), message.to_frame());
        }
    }

    #[test]
    fn a_call_held_in_the_store_is_handed_as_the_call_it_holds() {
        let record = RequestRecord::queued(
            crate::store::NewRequest {
                id: "r:1".into(),
                tool_id: Some("codap".into()),
                function_name: "create_table".into(),
                args: serde_json::json!({"name": "heights", "rows": [1, 2]}),
                created_at: Timestamp(0),
                deadline: Timestamp(60_000),
                builtin: false,
                correlation_id: Some("c1".into()),
                caller: Some("user:1".into()),
            },
            7,
        );
        let sent = HandedCall::from(record.tool_request());
        let held = HandedCall::Held(Arc::new(record));
        assert_eq!(held.frame(), sent.frame());
        assert_eq!(held, sent);
        assert_eq!(held.request_id(), "r:1");
        let call = |request| Downlink::ToolRequest { request, seq: 7 };
        assert_eq!(
            call(held.clone()).to_frame(),
            call(sent.clone()).into_frame()
        );
        assert_eq!(held.into_request(), sent.into_request());
    }
}
