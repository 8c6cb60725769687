//! `toolrelay-floor`: the least a relay can do for toolrelay's call loop, so that the bench
//! reports every figure beside a floor measured in the same run on the same machine.
//!
//! The same paths and message shapes as toolrelay, so the bench's tabs and callers drive both:
//! `POST /api/sessions` → 201 `{code, providerToken}`; `GET /api/sessions/{code}/ws` (the tab:
//! `register` → `registered`, `tool-request` out, `response` in); `POST
//! /api/sessions/{code}/call` `{functionName, args}` → 200 with the tab's answer. Nothing is
//! validated, stored or timed out: a map of sessions, a map of calls waiting for their answer,
//! hyper's HTTP/1 with keep-alive, tokio-tungstenite with 4 KiB buffers, `TCP_NODELAY`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// The WebSocket read and write buffers (tungstenite's default is 128 KiB).
const SOCKET_BUFFER: usize = 4 * 1024;

/// What the floor knows: the tab of each session, and the calls waiting for an answer.
#[derive(Default)]
struct Floor {
    /// Session code → the tab's outbox (`None` until a tab connects). A std mutex: held for a
    /// map operation, never across an await.
    sessions: Mutex<HashMap<String, Option<mpsc::UnboundedSender<String>>>>,
    /// Request id → the caller waiting for the answer.
    waiting: Mutex<HashMap<String, oneshot::Sender<Bytes>>>,
    next: AtomicU64,
}

type Body = Full<Bytes>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let listen: SocketAddr = std::env::var("LISTEN_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:8080".into())
        .parse()?;
    let listener = TcpListener::bind(listen).await?;
    // The line the bench waits for, shaped like toolrelay's JSON log line.
    println!(
        "{}",
        json!({"message": "toolrelay-floor listening", "listen": listener.local_addr()?.to_string()})
    );
    let floor = Arc::new(Floor::default());
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let floor = Arc::clone(&floor);
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(Arc::clone(&floor), request));
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        "application/json".parse().expect("a valid header"),
    );
    response
}

async fn handle(
    floor: Arc<Floor>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path().to_owned();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let response = match (request.method(), parts.as_slice()) {
        (&Method::POST, ["api", "sessions"]) => create(&floor),
        (&Method::GET, ["api", "sessions", code, "ws"]) => {
            let code = (*code).to_owned();
            upgrade(floor, code, request)
        }
        (&Method::POST, ["api", "sessions", code, "call"]) => {
            let code = (*code).to_owned();
            call(&floor, &code, request).await
        }
        _ => reply(StatusCode::NOT_FOUND, r#"{"error":"not_found"}"#),
    };
    Ok(response)
}

fn create(floor: &Floor) -> Response<Body> {
    let n = floor.next.fetch_add(1, Ordering::Relaxed);
    let code = format!("F{n:07}");
    let lock = floor.sessions.lock();
    lock.expect("the sessions lock is never poisoned")
        .insert(code.clone(), None);
    reply(
        StatusCode::CREATED,
        json!({"code": code, "providerToken": format!("token-{n}")}).to_string(),
    )
}

async fn call(floor: &Floor, code: &str, request: Request<Incoming>) -> Response<Body> {
    let Ok(body) = request.into_body().collect().await else {
        return reply(StatusCode::BAD_REQUEST, r#"{"error":"body"}"#);
    };
    let Ok(body) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return reply(StatusCode::BAD_REQUEST, r#"{"error":"json"}"#);
    };
    let tab = floor
        .sessions
        .lock()
        .expect("the sessions lock is never poisoned")
        .get(code)
        .cloned()
        .flatten();
    let Some(tab) = tab else {
        return reply(StatusCode::ACCEPTED, r#"{"providerConnected":false}"#);
    };
    let id = format!("r{}", floor.next.fetch_add(1, Ordering::Relaxed));
    let (answer, answered) = oneshot::channel();
    floor
        .waiting
        .lock()
        .expect("the waiting lock is never poisoned")
        .insert(id.clone(), answer);
    let frame = json!({"type": "tool-request", "requestId": id, "toolId": "",
        "functionName": body["functionName"], "args": body["args"]});
    if tab.send(frame.to_string()).is_err() {
        floor
            .waiting
            .lock()
            .expect("the waiting lock is never poisoned")
            .remove(&id);
        return reply(StatusCode::ACCEPTED, r#"{"providerConnected":false}"#);
    }
    match answered.await {
        Ok(answer) => reply(StatusCode::OK, answer),
        Err(_) => reply(StatusCode::GATEWAY_TIMEOUT, r#"{"error":"tab_gone"}"#),
    }
}

fn upgrade(floor: Arc<Floor>, code: String, request: Request<Incoming>) -> Response<Body> {
    let Some(key) = request.headers().get(SEC_WEBSOCKET_KEY) else {
        return reply(StatusCode::BAD_REQUEST, r#"{"error":"not a websocket"}"#);
    };
    let accept = derive_accept_key(key.as_bytes());
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(request).await else {
            return;
        };
        let config = WebSocketConfig::default()
            .read_buffer_size(SOCKET_BUFFER)
            .write_buffer_size(SOCKET_BUFFER);
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                .await;
        serve_tab(&floor, &code, socket).await;
    });
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(CONNECTION, "upgrade".parse().expect("a valid header"));
    headers.insert(UPGRADE, "websocket".parse().expect("a valid header"));
    headers.insert(
        SEC_WEBSOCKET_ACCEPT,
        accept.parse().expect("a valid header"),
    );
    response
}

async fn serve_tab<S>(floor: &Floor, code: &str, mut socket: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (outbox, mut calls) = mpsc::unbounded_channel();
    floor
        .sessions
        .lock()
        .expect("the sessions lock is never poisoned")
        .insert(code.to_owned(), Some(outbox));
    loop {
        tokio::select! {
            Some(frame) = calls.recv() => {
                if socket.send(Message::text(frame)).await.is_err() {
                    break;
                }
            }
            message = socket.next() => {
                let Some(Ok(message)) = message else { break };
                let Message::Text(text) = message else { continue };
                let Ok(frame) = serde_json::from_str::<Value>(&text) else { continue };
                match frame["type"].as_str() {
                    Some("response") => {
                        let waiting = frame["requestId"].as_str().and_then(|id| {
                            floor.waiting.lock().expect("the waiting lock is never poisoned").remove(id)
                        });
                        if let Some(waiting) = waiting {
                            let _ = waiting.send(Bytes::from(text));
                        }
                    }
                    Some("register") => {
                        let registered = json!({"type": "registered", "tools": frame["tools"].as_array().map_or(0, Vec::len)});
                        if socket.send(Message::text(registered.to_string())).await.is_err() {
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    if let Some(tab) = floor
        .sessions
        .lock()
        .expect("the sessions lock is never poisoned")
        .get_mut(code)
    {
        *tab = None;
    }
}
