//! The WebSocket adapter over channels (a socket made of two, a link whose other end the test
//! holds), and the size of an idle tab's future.

use super::*;

/// An idle tab's task keeps the future of `serve_upgraded` (or of `serve_link`), the
/// driver's inside it: every idle tab pays its size (BENCHMARKS.md).
#[tokio::test]
async fn an_idle_tabs_task_stays_small() {
    use crate::clock::Clock;
    use crate::metrics::Metrics;
    use crate::store::memory::{MemoryStore, StoreLimits};
    let config = crate::config::RelayConfig::default();
    let clock = Clock::new();
    let limits = StoreLimits::keeping(config.response_retention);
    let store = MemoryStore::observed(clock.clone(), limits, Metrics::default());
    let relay = Relay::new(store, config, clock, Metrics::default());
    let session = relay.create_session().await.unwrap();
    let link = relay
        .attach(
            session.code.as_str(),
            Some(&session.provider_token),
            Transport::WebSocket,
        )
        .await
        .unwrap();
    let settings = SocketSettings::of(&relay);
    let (io, _peer) = tokio::io::duplex(64);
    let serving = serve_upgraded(io, &settings, Ok(link));
    let size = std::mem::size_of_val(&serving);
    // 4,168 bytes when `serve_upgraded` and `serve_link` were `async fn`s, which kept the
    // socket and the link twice.
    assert!(size <= 3000, "an idle tab's future is {size} bytes");
}

/// A socket made of two channels: what a test sends in, what the adapter wrote out. Like a
/// real socket's, its writer buffers: what is fed goes out, as one write, when it is flushed.
struct ChannelSocket {
    incoming: futures::channel::mpsc::UnboundedReceiver<Result<Message, WsError>>,
    outgoing: futures::channel::mpsc::UnboundedSender<Vec<Message>>,
    buffer: Vec<Message>,
}

impl ChannelSocket {
    fn write_out(&mut self) -> std::task::Poll<Result<(), WsError>> {
        if !self.buffer.is_empty() {
            let write = std::mem::take(&mut self.buffer);
            if self.outgoing.unbounded_send(write).is_err() {
                return std::task::Poll::Ready(Err(WsError::ConnectionClosed));
            }
        }
        std::task::Poll::Ready(Ok(()))
    }
}

impl futures::Stream for ChannelSocket {
    type Item = Result<Message, WsError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.incoming.poll_next_unpin(cx)
    }
}

impl futures::Sink<Message> for ChannelSocket {
    type Error = WsError;

    fn poll_ready(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), WsError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn start_send(mut self: std::pin::Pin<&mut Self>, message: Message) -> Result<(), WsError> {
        self.buffer.push(message);
        Ok(())
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), WsError>> {
        self.write_out()
    }

    fn poll_close(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), WsError>> {
        self.write_out()
    }
}

/// The adapter over channels, with a link whose other end the test holds.
struct Adapter {
    tab_in: futures::channel::mpsc::UnboundedSender<Result<Message, WsError>>,
    tab_out: futures::channel::mpsc::UnboundedReceiver<Vec<Message>>,
    /// What the last write held that the test has not read yet.
    unread: std::collections::VecDeque<Message>,
    down: crate::channel::Sender<Downlink>,
    up: crate::channel::Receiver<Uplink>,
    drain: Drain,
    serving: tokio::task::JoinHandle<()>,
}

impl Adapter {
    fn start(uplink_room: usize) -> Self {
        let (tab_in, incoming) = futures::channel::mpsc::unbounded();
        let (outgoing, tab_out) = futures::channel::mpsc::unbounded();
        let (down, downlink) = crate::channel::channel(8);
        let (uplink, up) = crate::channel::channel(uplink_room);
        let drain = Drain::new();
        let settings = SocketSettings {
            config: websocket_config(1024),
            answers: AnswerLimits::depth_only(32),
            drain: drain.clone(),
        };
        let link = ProviderLink {
            code: crate::code::SessionCode::generate(),
            connection_id: "c1".into(),
            downlink,
            uplink,
            driver: None,
        };
        let socket = ChannelSocket {
            incoming,
            outgoing,
            buffer: Vec::new(),
        };
        let serving = tokio::spawn(async move { relay_frames(socket, &settings, link).await });
        Self {
            tab_in,
            tab_out,
            unread: Default::default(),
            down,
            up,
            drain,
            serving,
        }
    }

    fn tab_sends(&self, message: Message) {
        self.tab_in.unbounded_send(Ok(message)).unwrap();
    }

    /// The next message written, from the last write or the next.
    async fn written(&mut self) -> Message {
        if self.unread.is_empty() {
            self.unread = self.next_write().await.into();
        }
        self.unread.pop_front().expect("a write holds a message")
    }

    /// The next write to the socket, whole (nothing of the last may be unread).
    async fn next_write(&mut self) -> Vec<Message> {
        assert!(self.unread.is_empty(), "unread: {:?}", self.unread);
        tokio::time::timeout(Duration::from_secs(30), self.tab_out.next())
            .await
            .expect("the adapter wrote nothing")
            .expect("the socket's writer was dropped")
    }

    async fn written_frame(&mut self) -> serde_json::Value {
        match self.written().await {
            Message::Text(text) => serde_json::from_str(&text).unwrap(),
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    async fn closed_with(&mut self) -> u16 {
        match self.written().await {
            Message::Close(Some(frame)) => u16::from(frame.code),
            other => panic!("expected a close, got {other:?}"),
        }
    }

    async fn sent_up(&mut self) -> Uplink {
        tokio::time::timeout(Duration::from_secs(30), self.up.recv())
            .await
            .expect("nothing went up")
            .expect("the uplink ended")
    }

    async fn ends(self) {
        tokio::time::timeout(Duration::from_secs(30), self.serving)
            .await
            .expect("the adapter did not stop")
            .unwrap();
    }
}

#[tokio::test]
async fn the_adapter_passes_the_tabs_frames_up_and_the_relays_down() {
    let mut adapter = Adapter::start(8);
    // It pings its tab, and says so first.
    assert_eq!(adapter.sent_up().await, Uplink::Heard);
    adapter.tab_sends(Message::text(r#"{"type": "ping"}"#));
    assert_eq!(
        adapter.sent_up().await,
        Uplink::Frame(toolrelay::wire::ProviderFrame::Ping)
    );
    adapter.tab_sends(Message::Pong(Default::default()));
    assert_eq!(adapter.sent_up().await, Uplink::Heard);
    adapter.tab_sends(Message::text(
        r#"{"type": "response", "requestId": "r1", "success": true, "result": 1}"#,
    ));
    let Uplink::Frame(toolrelay::wire::ProviderFrame::Response(response)) = adapter.sent_up().await
    else {
        panic!("the answer did not go up");
    };
    assert_eq!(response.request_id, "r1");
    // What it cannot read, it says so and keeps the connection.
    adapter.tab_sends(Message::Binary(Default::default()));
    assert_eq!(adapter.written_frame().await["error"], "invalid_frame");
    adapter.tab_sends(Message::text("not json"));
    assert_eq!(adapter.written_frame().await["error"], "invalid_frame");

    // The relay's heartbeat goes with a ping; one answering the tab's ping does not.
    let expires_at = crate::clock::Timestamp(0);
    adapter
        .down
        .send(Downlink::Heartbeat {
            expires_at,
            answers_ping: false,
        })
        .await
        .unwrap();
    assert!(matches!(adapter.written().await, Message::Ping(_)));
    assert_eq!(adapter.written_frame().await["type"], "heartbeat");
    adapter
        .down
        .send(Downlink::Heartbeat {
            expires_at,
            answers_ping: true,
        })
        .await
        .unwrap();
    assert_eq!(adapter.written_frame().await["type"], "heartbeat");
    adapter
        .down
        .send(Downlink::Ack {
            request_id: "r1".into(),
            refusal: None,
        })
        .await
        .unwrap();
    assert_eq!(adapter.written_frame().await["requestId"], "r1");
    // A final message, then the close it calls for.
    adapter.down.send(Downlink::Replaced).await.unwrap();
    assert_eq!(adapter.written_frame().await["error"], "replaced");
    assert_eq!(adapter.closed_with().await, 1000);
    adapter.ends().await;
}

/// A stored answer's `ack` waits for the next frame to the tab and goes in its write; with
/// nothing after it, it goes by itself `ACK_DELAY` later. An answer refused is told at once.
#[tokio::test(start_paused = true)]
async fn an_ack_goes_with_the_next_frame_or_a_moment_later() {
    fn frames(write: &[Message]) -> Vec<serde_json::Value> {
        write
            .iter()
            .map(|message| match message {
                Message::Text(text) => serde_json::from_str(text).unwrap(),
                other => panic!("expected a text frame, got {other:?}"),
            })
            .collect()
    }
    let ack = |id: &str, refusal: Option<Box<crate::provider::Refusal>>| Downlink::Ack {
        request_id: id.into(),
        refusal,
    };
    let mut adapter = Adapter::start(8);
    assert_eq!(adapter.sent_up().await, Uplink::Heard);

    // Two answers stored, then a frame for the tab: one write, in order.
    adapter.down.send(ack("r1", None)).await.unwrap();
    adapter.down.send(ack("r2", None)).await.unwrap();
    let expires_at = crate::clock::Timestamp(1_700_000_000_000);
    let heartbeat = Downlink::Heartbeat {
        expires_at,
        answers_ping: true,
    };
    adapter.down.send(heartbeat).await.unwrap();
    let write = frames(&adapter.next_write().await);
    let kinds: Vec<_> = write.iter().map(|frame| frame["type"].clone()).collect();
    assert_eq!(kinds, ["ack", "ack", "heartbeat"], "{write:?}");
    assert_eq!(
        (&write[0]["requestId"], &write[1]["requestId"]),
        (&"r1".into(), &"r2".into())
    );

    // Nothing after it: it goes alone, a moment later.
    let start = tokio::time::Instant::now();
    adapter.down.send(ack("r3", None)).await.unwrap();
    let write = frames(&adapter.next_write().await);
    assert_eq!(write.len(), 1, "{write:?}");
    assert_eq!(write[0]["requestId"], "r3");
    assert!(start.elapsed() >= ACK_DELAY, "{:?}", start.elapsed());

    // Refused: the tab hears why at once.
    let start = tokio::time::Instant::now();
    let refusal = Box::new(crate::provider::Refusal {
        error: ErrorCode::InvalidResponse,
        message: "no".into(),
    });
    adapter.down.send(ack("r4", Some(refusal))).await.unwrap();
    let write = frames(&adapter.next_write().await);
    assert_eq!(write.len(), 1, "{write:?}");
    assert_eq!(
        (&write[0]["requestId"], &write[0]["error"]),
        (&"r4".into(), &"invalid_response".into())
    );
    assert_eq!(start.elapsed(), Duration::ZERO);

    // A held ack goes before the close of a connection that ends.
    adapter.down.send(ack("r5", None)).await.unwrap();
    adapter.down.send(Downlink::Replaced).await.unwrap();
    assert_eq!(adapter.written_frame().await["requestId"], "r5");
    assert_eq!(adapter.written_frame().await["error"], "replaced");
    assert_eq!(adapter.closed_with().await, 1000);
    adapter.ends().await;
}

#[tokio::test]
async fn the_adapter_closes_as_the_relay_or_the_tab_ends() {
    // The process drains: the tab hears why, and reconnects.
    let mut adapter = Adapter::start(8);
    assert_eq!(adapter.sent_up().await, Uplink::Heard);
    adapter.drain.begin();
    adapter.drain.end();
    assert_eq!(adapter.written_frame().await["error"], "shutting_down");
    assert_eq!(adapter.closed_with().await, 1012);
    adapter.ends().await;

    // The relay dropped a tab that answered no ping: its link ends with no last word.
    let mut adapter = Adapter::start(8);
    assert_eq!(adapter.sent_up().await, Uplink::Heard);
    adapter.down = crate::channel::channel(1).0;
    assert_eq!(adapter.closed_with().await, 1001);
    adapter.ends().await;

    // A frame over the limit is not read: 1009, and the tab reconnects.
    let mut adapter = Adapter::start(8);
    adapter
        .tab_in
        .unbounded_send(Err(WsError::Capacity(CapacityError::MessageTooLong {
            size: 2_000_000,
            max_size: 1_000_000,
        })))
        .unwrap();
    assert_eq!(adapter.closed_with().await, 1009);
    adapter.ends().await;

    // The tab closed: the adapter stops, and the uplink ends (the relay sees it gone).
    let mut adapter = Adapter::start(8);
    adapter.tab_sends(Message::Close(None));
    let Adapter { up, serving, .. } = &mut adapter;
    tokio::time::timeout(Duration::from_secs(30), serving)
        .await
        .expect("the adapter did not stop")
        .unwrap();
    assert_eq!(up.recv().await, Some(Uplink::Heard));
    assert_eq!(up.recv().await, None);
}

#[tokio::test]
async fn a_full_uplink_stops_the_reading_but_not_the_writing() {
    // Room for one: nothing takes what goes up.
    let mut adapter = Adapter::start(1);
    for _ in 0..5 {
        adapter.tab_sends(Message::text(r#"{"type": "ping"}"#));
    }
    adapter
        .down
        .send(Downlink::Registered { tools: 3 })
        .await
        .unwrap();
    assert_eq!(adapter.written_frame().await["tools"], 3);
    // Then everything read arrives, in order.
    assert_eq!(adapter.sent_up().await, Uplink::Heard);
    for _ in 0..5 {
        assert_eq!(
            adapter.sent_up().await,
            Uplink::Frame(toolrelay::wire::ProviderFrame::Ping)
        );
    }
}

#[test]
fn parses_the_websocket_path() {
    let uri: Uri = "/api/sessions/ABCD-EFGH/ws?token=abc%2Bdef&x=1"
        .parse()
        .unwrap();
    assert_eq!(
        parse_target(&uri),
        Some(("ABCD-EFGH".to_owned(), Some("abc+def".to_owned())))
    );
    let without_token: Uri = "/api/sessions/ABCDEFGH/ws".parse().unwrap();
    assert_eq!(
        parse_target(&without_token),
        Some(("ABCDEFGH".to_owned(), None))
    );
    for other in [
        "/api/sessions//ws",
        "/api/sessions/A/B/ws",
        "/ws",
        "/api/sessions/ABCDEFGH",
    ] {
        assert_eq!(parse_target(&other.parse().unwrap()), None, "{other}");
    }
}
