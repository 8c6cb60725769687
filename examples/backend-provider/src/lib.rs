//! An example backend service that serves tools to LLMs through a toolrelay session.
//!
//! It attaches to the relay over gRPC `Connect` with the session's code and provider token,
//! registers its tools, and answers each `tool_request` with a `response`, which it keeps until
//! the relay acknowledges it (`ack`) and sends again when the relay could not store it (an
//! `error` naming its `request_id`) or delivers the call again. Everything it needs is in the
//! `toolrelay` contract crate: the generated client and the JSON helpers.
//!
//! The tools: `add_numbers {a, b}` → `{sum}` and `word_count {text}` → `{words, characters}`.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Request;
use tonic::transport::Channel;
use toolrelay::json::{from_struct, to_struct, to_value};
use toolrelay::proto::v1::relay_client::RelayClient;
use toolrelay::proto::v1::{
    Ping, ProviderMessage, Register, Tool, ToolError, ToolResponse, provider_message, relay_message,
};

/// How long to wait before sending again an answer the relay could not store.
const RESEND_AFTER: Duration = Duration::from_millis(500);

/// Why serving stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The caller asked to stop.
    Shutdown,
    /// The session ended (expired or deleted).
    SessionEnded,
    /// The relay closed the stream (replaced by another provider, or restarting).
    Closed(String),
}

/// The tools this provider serves, as registered with the relay.
pub fn tools() -> Vec<Tool> {
    let tool = |name: &str, description: &str, schema: Value| Tool {
        name: name.into(),
        description: description.into(),
        input_schema: Some(to_struct(&schema)),
        tool_id: "example".into(),
        // Both only compute: read-only, so hosts need not ask the person before a call.
        read_only: Some(true),
        ..Tool::default()
    };
    vec![
        tool(
            "add_numbers",
            "Adds two numbers and returns {sum}.",
            json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
        ),
        tool(
            "word_count",
            "Counts the words and characters of a text; returns {words, characters}.",
            json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        ),
    ]
}

/// Runs one tool. The relay has already checked the arguments against the schema.
pub fn run_tool(name: &str, args: &Value) -> Result<Value, String> {
    match name {
        "add_numbers" => {
            let a = args["a"].as_f64().ok_or("a must be a number")?;
            let b = args["b"].as_f64().ok_or("b must be a number")?;
            Ok(json!({"sum": a + b}))
        }
        "word_count" => {
            let text = args["text"].as_str().ok_or("text must be a string")?;
            Ok(
                json!({"words": text.split_whitespace().count(), "characters": text.chars().count()}),
            )
        }
        other => Err(format!("this provider has no tool {other}")),
    }
}

/// Attaches to session `code` and serves until `shutdown` completes or the relay ends the
/// stream. Errors are transport failures; the caller may reconnect.
pub async fn serve(
    mut client: RelayClient<Channel>,
    code: &str,
    token: &str,
    shutdown: impl Future<Output = ()>,
) -> Result<Ended, tonic::Status> {
    let (outbound, to_relay) = mpsc::channel(16);
    let register = provider_message::Kind::Register(Register {
        tools: tools(),
        ..Register::default()
    });
    // The channel is fresh and has room: this cannot fail.
    let _ = outbound.try_send(ProviderMessage {
        kind: Some(register),
    });

    let mut request = Request::new(ReceiverStream::new(to_relay));
    let metadata = request.metadata_mut();
    metadata.insert(
        "x-session-code",
        code.parse()
            .map_err(|_| tonic::Status::invalid_argument("bad code"))?,
    );
    metadata.insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::invalid_argument("bad token"))?,
    );
    let mut inbound = client.connect(request).await?.into_inner();

    tokio::pin!(shutdown);
    // Answers sent and not acknowledged yet.
    let mut unacknowledged: HashMap<String, ToolResponse> = HashMap::new();
    loop {
        let message = tokio::select! {
            () = &mut shutdown => return Ok(Ended::Shutdown),
            message = inbound.next() => message,
        };
        let Some(message) = message.transpose()? else {
            return Ok(Ended::Closed("the relay closed the stream".into()));
        };
        match message.kind {
            Some(relay_message::Kind::ToolRequest(call)) => {
                // Delivered again (the relay lost track of it): the same answer, not a new run.
                if let Some(answer) = unacknowledged.get(&call.request_id) {
                    resend(&outbound, answer.clone(), Duration::ZERO);
                    continue;
                }
                let args = call.args.as_ref().map(from_struct).unwrap_or(Value::Null);
                let response = match run_tool(&call.function_name, &args) {
                    Ok(result) => ToolResponse {
                        request_id: call.request_id,
                        success: true,
                        result: Some(to_value(&result)),
                        error: None,
                        content: Vec::new(),
                        structured_content: None,
                    },
                    Err(message) => ToolResponse {
                        request_id: call.request_id,
                        success: false,
                        result: None,
                        error: Some(ToolError {
                            code: "tool_error".into(),
                            message,
                        }),
                        content: Vec::new(),
                        structured_content: None,
                    },
                };
                unacknowledged.insert(response.request_id.clone(), response.clone());
                let reply = provider_message::Kind::Response(response);
                if outbound
                    .send(ProviderMessage { kind: Some(reply) })
                    .await
                    .is_err()
                {
                    return Ok(Ended::Closed("the stream to the relay closed".into()));
                }
            }
            Some(relay_message::Kind::Heartbeat(_)) => {
                let _ = outbound.try_send(ProviderMessage {
                    kind: Some(provider_message::Kind::Ping(Ping {})),
                });
            }
            Some(relay_message::Kind::Expired(_)) => return Ok(Ended::SessionEnded),
            Some(relay_message::Kind::Ack(ack)) => {
                unacknowledged.remove(&ack.request_id);
                if !ack.error.is_empty() {
                    eprintln!("relay refused an answer for good: {}", ack.message);
                }
            }
            Some(relay_message::Kind::Error(error)) if !error.request_id.is_empty() => {
                if let Some(answer) = unacknowledged.get(&error.request_id) {
                    resend(&outbound, answer.clone(), RESEND_AFTER);
                }
            }
            Some(relay_message::Kind::Error(error)) => {
                if matches!(error.error.as_str(), "replaced" | "shutting_down") {
                    return Ok(Ended::Closed(error.message));
                }
                eprintln!("relay refused something we sent: {}", error.message);
            }
            // This provider's tools answer at once: a call is never running when its caller
            // cancels it (a provider with long tools stops the one named). A backend does not
            // approve callers (its Register says so), so it is never asked about one.
            Some(
                relay_message::Kind::Welcome(_)
                | relay_message::Kind::Registered(_)
                | relay_message::Kind::Cancel(_)
                | relay_message::Kind::ApprovalRequest(_)
                | relay_message::Kind::ApprovalClosed(_)
                | relay_message::Kind::Callers(_),
            )
            | None => {}
        }
    }
}

/// Sends an answer again after `wait`, unless the stream has closed by then.
fn resend(outbound: &mpsc::Sender<ProviderMessage>, answer: ToolResponse, wait: Duration) {
    let outbound = outbound.clone();
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        let reply = provider_message::Kind::Response(answer);
        let _ = outbound.send(ProviderMessage { kind: Some(reply) }).await;
    });
}
