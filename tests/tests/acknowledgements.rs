//! A tab's answer is acknowledged only once it is stored: on the relay's own WebSocket and on
//! a gateway's (whose answers reach the relay over the gRPC provider stream), with Redis
//! killed and started again from its append-only file in between.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_tests::cluster::Cluster;
use toolrelay_tests::{Deadline, PATIENCE, WsTab, demo_tools, wait_until};

/// The relay's next word about an answer (`ack`, or `error`), heartbeats skipped.
async fn receipt(tab: &mut WsTab) -> Value {
    loop {
        let frame = tab.next_any_frame().await.expect("the connection stayed");
        if frame["type"] != "heartbeat" {
            return frame;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_acknowledged_once_stored_and_named_in_an_error_while_redis_is_down() {
    let mut cluster = Cluster::start(1, 1, &[]).await;
    let gateway_ws = cluster.gateways[0].replacen("http", "ws", 1);
    let mut tabs = Vec::new();
    for through_gateway in [false, true] {
        let (code, token) = cluster.create_session(0).await;
        let url = if through_gateway {
            format!("{gateway_ws}/api/sessions/{code}/ws?token={token}")
        } else {
            cluster.tab_url(0, &code, &token)
        };
        let mut tab = WsTab::attach_url(&url).await;
        tab.send(json!({"type": "register", "tools": demo_tools()}))
            .await;
        assert_eq!(tab.recv().await["type"], "registered");
        let queued = cluster
            .post(
                0,
                &format!("/api/sessions/{code}/request"),
                json!({"requestId": "held", "functionName": "echo", "args": {"text": "h"}}),
            )
            .await;
        assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
        assert_eq!(tab.next_request().await["requestId"], "held");
        tabs.push((code, tab));
    }
    let answer =
        json!({"type": "response", "requestId": "held", "success": true, "result": {"text": "h"}});

    // Redis is gone: the answer is not stored, and the error says which answer to send again.
    cluster.redis.stop().await;
    for (_, tab) in &mut tabs {
        tab.send(answer.clone()).await;
        let refused = receipt(tab).await;
        assert_eq!(refused["type"], "error", "{refused}");
        assert_eq!(refused["error"], "store_unavailable", "{refused}");
        assert_eq!(refused["requestId"], "held", "{refused}");
    }

    cluster.redis.restart().await;
    for (code, tab) in &mut tabs {
        // Sent again until acknowledged, as the SDK does (the relay may take a moment to
        // reach Redis again).
        let every = Deadline::within(3 * PATIENCE).every(Duration::from_millis(100));
        wait_until(every, async || {
            tab.send(answer.clone()).await;
            let frame = receipt(tab).await;
            if frame["type"] == "ack" {
                assert_eq!(frame, json!({"type": "ack", "requestId": "held"}));
                return Ok(());
            }
            assert_eq!(frame["requestId"], "held", "{frame}");
            Err(format!("never acknowledged: {frame}"))
        })
        .await;
        // Once more: the call has its answer; acknowledged, nothing to send again.
        tab.send(answer.clone()).await;
        assert_eq!(
            receipt(tab).await,
            json!({"type": "ack", "requestId": "held"})
        );
        // An answer to a call this tab never got: refused for good, and said so.
        tab.send(json!({"type": "response", "requestId": "never", "success": true, "result": {}}))
            .await;
        let refused = receipt(tab).await;
        assert_eq!(refused["type"], "ack", "{refused}");
        assert_eq!(refused["requestId"], "never", "{refused}");
        assert_eq!(refused["error"], "request_not_found", "{refused}");
        // The caller has the tab's answer.
        let call = cluster
            .get(0, &format!("/api/sessions/{code}/requests/held"))
            .await;
        assert_eq!(call.body["status"], "completed", "{call:?}");
        assert_eq!(
            call.body["response"]["result"],
            json!({"text": "h"}),
            "{call:?}"
        );
    }
}
