//! A real ReMIP server (`remip` from PyPI, in the test venv) on a free loopback port.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::{Deadline, free_port, test_python, wait_until};

/// A running `remip --host 127.0.0.1 --port P`; [`ReMip::stop`] (or dropping it) kills it.
pub struct ReMip {
    /// `http://127.0.0.1:P`.
    pub url: String,
    child: Child,
    solves: Arc<AtomicUsize>,
}

impl ReMip {
    /// Starts the server and waits until it answers HTTP.
    pub async fn start() -> Self {
        let remip = test_python().with_file_name("remip");
        assert!(
            remip.is_file(),
            "no ReMIP at {}: run scripts/setup.sh --test (scripts/test.sh does)",
            remip.display()
        );
        let port = free_port();
        let mut child = Command::new(&remip)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", remip.display()));
        let solves = Arc::new(AtomicUsize::new(0));
        watch(child.stdout.take().unwrap(), Arc::clone(&solves));
        watch(child.stderr.take().unwrap(), Arc::clone(&solves));
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let every = Deadline::within(Duration::from_secs(60)).every(Duration::from_millis(200));
        wait_until(every, async || {
            let health = http.get(format!("{url}/health")).send().await;
            if health.is_ok_and(|response| response.status().is_success()) {
                return Ok(());
            }
            assert!(
                child.try_wait().unwrap().is_none(),
                "remip exited before it served (see its output above)"
            );
            Err("remip did not start in 60 s")
        })
        .await;
        Self { url, child, solves }
    }

    /// How many `POST /solve` requests the server has logged.
    pub fn solves(&self) -> usize {
        self.solves.load(Ordering::SeqCst)
    }

    /// Kills the server and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Echoes a stream of the server's output and counts the solves it logs.
fn watch(stream: impl AsyncRead + Unpin + Send + 'static, solves: Arc<AtomicUsize>) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            println!("[remip] {line}");
            if line.contains("POST /solve") {
                solves.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
}
