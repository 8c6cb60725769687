//! A test tab for deployments of several replicas: it records every raw delivery with the
//! connection it came on, reconnects to the next URL when a connection is lost (as a load
//! balancer would send it elsewhere), and can keep its answers back (a slow tool).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::{demo_tools, wait_until};

/// What the test tab saw: every raw delivery with the connection it came on (no
/// de-duplication, so a double delivery shows), and which frames it got besides calls.
#[derive(Default)]
pub struct Ledger {
    /// Every call delivered: (the connection it came on, from 1; its id).
    pub deliveries: Vec<(u32, String)>,
    /// Connections made so far.
    pub connections: u32,
    /// The `type`s of the frames other than calls.
    pub other_frames: Vec<String>,
}

/// A tab that connects to the first URL, and after a lost connection to the next (what the
/// load balancer would do), registers the demo tools, and runs `echo`. While `holding`, it
/// runs calls but keeps their answers back (a slow tool); a call delivered again after a
/// reconnect is answered from what it ran, never run again; an answer the relay could not
/// store (an `error` naming it) is sent again, as the SDK does.
pub struct RecordingTab {
    ledger: Arc<Mutex<Ledger>>,
    holding: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl RecordingTab {
    /// Starts the tab on `urls` (the first, then the next after each lost connection).
    pub fn start(urls: Vec<String>) -> Self {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let holding = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run_tab(urls, Arc::clone(&ledger), Arc::clone(&holding)));
        Self {
            ledger,
            holding,
            task,
        }
    }

    /// Keeps answers back (`true`) or lets them go.
    pub fn hold(&self, holding: bool) {
        self.holding.store(holding, Ordering::SeqCst);
    }

    /// Every delivery's call id, in order.
    pub fn deliveries(&self) -> Vec<String> {
        let ledger = self.ledger.lock().unwrap();
        ledger.deliveries.iter().map(|(_, id)| id.clone()).collect()
    }

    /// The call ids delivered on the tab's `connection`th connection (from 1), in order.
    pub fn delivered_on(&self, connection: u32) -> Vec<String> {
        let ledger = self.ledger.lock().unwrap();
        ledger
            .deliveries
            .iter()
            .filter(|(on, _)| *on == connection)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// The `type`s of the frames other than calls the tab got.
    pub fn other_frames(&self) -> Vec<String> {
        self.ledger.lock().unwrap().other_frames.clone()
    }

    /// Connections made so far.
    pub fn connections(&self) -> u32 {
        self.ledger.lock().unwrap().connections
    }

    /// Every delivery: (the connection it came on, from 1; the call's id), in order.
    pub fn delivered(&self) -> Vec<(u32, String)> {
        self.ledger.lock().unwrap().deliveries.clone()
    }

    /// Waits up to `patience` until `condition` holds of the ledger.
    pub async fn until(&self, what: &str, patience: Duration, condition: impl Fn(&Ledger) -> bool) {
        wait_until(patience, async || {
            if condition(&self.ledger.lock().unwrap()) {
                Ok(())
            } else {
                Err(format!("the tab never saw {what}"))
            }
        })
        .await;
    }
}

impl Drop for RecordingTab {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run_tab(urls: Vec<String>, ledger: Arc<Mutex<Ledger>>, holding: Arc<AtomicBool>) {
    let mut answers: HashMap<String, Value> = HashMap::new();
    for attempt in 0.. {
        let url = &urls[(attempt as usize).min(urls.len() - 1)];
        let Ok((mut socket, _)) =
            tokio_tungstenite::connect_async_with_config(url.as_str(), None, true).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let connection = {
            let mut ledger = ledger.lock().unwrap();
            ledger.connections += 1;
            ledger.connections
        };
        let register = json!({"type": "register", "tools": demo_tools()});
        if socket
            .send(Message::text(register.to_string()))
            .await
            .is_err()
        {
            continue;
        }
        let mut held: Vec<String> = Vec::new();
        let mut release = tokio::time::interval(Duration::from_millis(20));
        loop {
            tokio::select! {
                message = socket.next() => {
                    let Some(Ok(message)) = message else { break };
                    let Message::Text(text) = message else { continue };
                    let frame: Value = serde_json::from_str(&text).unwrap();
                    if frame["type"] == "error"
                        && let Some(id) = frame["requestId"].as_str()
                        && answers.contains_key(id)
                    {
                        // That answer could not be stored now (the store is away): it goes
                        // again shortly, as the SDK sends it.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        held.push(id.to_owned());
                        continue;
                    }
                    if frame["type"] != "tool-request" {
                        let kind = frame["type"].as_str().unwrap_or_default().to_owned();
                        ledger.lock().unwrap().other_frames.push(kind);
                        continue;
                    }
                    let id = frame["requestId"].as_str().unwrap().to_owned();
                    {
                        let mut ledger = ledger.lock().unwrap();
                        ledger.deliveries.push((connection, id.clone()));
                    }
                    answers
                        .entry(id.clone())
                        .or_insert_with(|| json!({"text": frame["args"]["text"]}));
                    held.push(id);
                }
                _ = release.tick() => {}
            }
            if holding.load(Ordering::SeqCst) {
                continue;
            }
            let mut lost = false;
            for id in held.drain(..) {
                let response = json!({"type": "response", "requestId": id, "success": true, "result": answers[&id]});
                if socket
                    .send(Message::text(response.to_string()))
                    .await
                    .is_err()
                {
                    lost = true;
                    break;
                }
            }
            if lost {
                break;
            }
        }
    }
}
