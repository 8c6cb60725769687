//! The browser SDK's own transport (`services/gateway/sdk/transport.js`) as a tab, run under
//! node by `tests/node/sdk_tab.mjs`: it connects, registers the demo tools, de-duplicates
//! calls and keeps its answers until the relay acknowledges them, exactly as a page does.
//! The test sees every run of a call (by its id) and every change of the connection.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{demo_tools, wait_until};

/// What the SDK tab reported.
#[derive(Debug, Default)]
pub struct SdkLedger {
    /// How often each call ran, by id.
    pub runs: HashMap<String, u32>,
    /// Each connection state it reported, in order (`connecting`, `connected`, …).
    pub statuses: Vec<String>,
    /// How often the relay confirmed its tools.
    pub registrations: u32,
    /// The calls whose AbortSignal the tool saw aborted (their callers cancelled them).
    pub aborted: Vec<String>,
}

/// A running SDK tab; dropping it stops the node process.
pub struct SdkTab {
    ledger: Arc<Mutex<SdkLedger>>,
    _child: Child,
}

impl SdkTab {
    /// Starts the SDK's transport against `base` (the origin a page would load the SDK from:
    /// a gateway, `http://127.0.0.1:port`) for session `code`; each call takes `run_time`.
    pub fn start(base: &str, code: &str, token: &str, run_time: Duration) -> Self {
        Self::over(base, code, token, run_time, "websocket")
    }

    /// [`SdkTab::start`] on the transport `kind` (`websocket`, `sse` or `polling`) from the
    /// start.
    pub fn over(base: &str, code: &str, token: &str, run_time: Duration, kind: &str) -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/node/sdk_tab.mjs");
        let mut child = Command::new("node")
            .arg("--experimental-websocket")
            .arg("--no-warnings")
            .arg(script)
            .args([base, code, token, &demo_tools().to_string()])
            .arg(run_time.as_millis().to_string())
            .arg(kind)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("node cannot start ({error}): install Node.js 20 or later (scripts/setup.sh --test does)")
            });
        let ledger = Arc::new(Mutex::new(SdkLedger::default()));
        let stdout = child.stdout.take().unwrap();
        let recorded = Arc::clone(&ledger);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(event) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let mut ledger = recorded.lock().unwrap();
                if let Some(id) = event["ran"].as_str() {
                    *ledger.runs.entry(id.to_owned()).or_default() += 1;
                } else if let Some(id) = event["aborted"].as_str() {
                    ledger.aborted.push(id.to_owned());
                } else if let Some(state) = event["status"].as_str() {
                    ledger.statuses.push(state.to_owned());
                } else if !event["registered"].is_null() {
                    ledger.registrations += 1;
                }
            }
        });
        Self {
            ledger,
            _child: child,
        }
    }

    /// Reads what the tab reported so far.
    pub fn read<T>(&self, look: impl FnOnce(&SdkLedger) -> T) -> T {
        look(&self.ledger.lock().unwrap())
    }

    /// Waits until `condition` holds, failing after `patience` with `what` and the ledger.
    pub async fn until(
        &self,
        what: &str,
        patience: Duration,
        condition: impl Fn(&SdkLedger) -> bool,
    ) {
        wait_until(patience, async || {
            if self.read(&condition) {
                Ok(())
            } else {
                Err(format!(
                    "the SDK tab never reached {what}: {:?}",
                    self.read(|ledger| (ledger.runs.len(), ledger.statuses.clone()))
                ))
            }
        })
        .await;
    }
}
