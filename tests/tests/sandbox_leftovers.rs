//! What bubblewrap leaves behind is ended. bubblewrap binds its inner process (pid 1 of the
//! run's PID namespace) to its outer one only once it has set up, so an outer process killed
//! before then (a run cancelled at once, or a relay killed) leaves the inner one running the
//! run's code, adopted by whatever reaps orphans. The relay ends such a process of a sandbox
//! uid when a run as that uid ends, and when it looks for a free uid and finds one there.
//!
//! The leftovers here are made the same way on purpose (a bubblewrap without
//! `--die-with-parent`, its outer process killed): the window in the relay's own runs cannot
//! be hit at will. One test in its own binary, so that no other relay of this suite takes a
//! sandbox uid while it runs.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::os::unix::fs::MetadataExt;

use reqwest::StatusCode;
use tokio::process::Command;
use toolrelay_tests::mip::{PLAN, descendants_of, ok, release, start_held_run};
use toolrelay_tests::system::System;
use toolrelay_tests::{PATIENCE, wait_until};

/// The first uid the sandbox gives a run (`SandboxConfig::base_uid`).
const BASE_UID: u32 = 61000;

/// A planted leftover, killed when dropped if it is still there (a test that fails before the
/// relay ends it leaves nothing running).
struct Orphan(u32);

impl Drop for Orphan {
    fn drop(&mut self) {
        if status_field(self.0, "State:").is_some_and(|state| !state.starts_with('Z')) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// What bubblewrap leaves when its outer process is killed before the inner one has set up:
/// the inner process (pid 1 of a PID namespace of its own, here running `sleep`), running as
/// `uid` and adopted by whatever reaps orphans. Made the same way: a bubblewrap as `uid`
/// without `--die-with-parent`, its outer process killed. Its `sleep` ends by itself after two
/// minutes, should this test be killed before it can clean up.
async fn plant_orphan(uid: u32) -> Orphan {
    let uid = uid.to_string();
    let mut outer = Command::new("setpriv")
        .args(["--reuid", &uid, "--regid", &uid, "--clear-groups", "--"])
        .args([
            "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--ro-bind",
            "/",
            "/",
        ])
        .args(["sleep", "120"])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let outer_pid = outer.id().unwrap();
    let inner = wait_until(PATIENCE, async || {
        let inner = descendants_of(outer_pid).into_iter().find(|&pid| {
            status_field(pid, "NSpid:").is_some_and(|ids| ids.ends_with("\t1"))
                && status_field(pid, "Uid:").is_some_and(|ids| ids.starts_with(&uid))
        });
        inner.ok_or("bubblewrap's inner process has not started")
    })
    .await;
    outer.kill().await.unwrap();
    wait_until(PATIENCE, async || match status_field(inner, "PPid:") {
        Some(parent) if parent != outer_pid.to_string() => Ok(()),
        _ => Err("the inner process was not adopted"),
    })
    .await;
    Orphan(inner)
}

/// Waits (with a deadline) until the process `pid` has been killed (it is gone, or a zombie
/// waiting for whoever adopted it).
async fn until_killed(orphan: &Orphan, what: &str) {
    wait_until(PATIENCE, async || match status_field(orphan.0, "State:") {
        Some(state) if !state.starts_with('Z') => Err(format!("{what} still runs ({state})")),
        _ => Ok(()),
    })
    .await;
}

/// A field of `/proc/<pid>/status`, trimmed.
fn status_field(pid: u32, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = status.lines().find_map(|line| line.strip_prefix(name))?;
    Some(value.trim().to_owned())
}

/// The real uid of process `pid`.
fn uid_of(pid: u32) -> u32 {
    std::fs::metadata(format!("/proc/{pid}")).unwrap().uid()
}

#[tokio::test]
async fn runs_bubblewrap_left_behind_are_ended() {
    assert_eq!(
        uid_of(std::process::id()),
        0,
        "this test needs root (CI runs the suite as root): only as root has each sandbox run a uid of its own"
    );

    // Left by a relay that died, as the first sandbox uid: the relay's first run (its
    // start-up probe) finds it there, ends it and takes the next uid.
    let left_by_the_dead = plant_orphan(BASE_UID).await;
    let system = System::binary(&[]).await;
    until_killed(&left_by_the_dead, "the run left by a relay that died").await;
    let built = ok(
        &system,
        "leftovers",
        "generate_mip_problem",
        serde_json::json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    assert!(built["problemId"].is_string(), "{built}");

    // Left as the uid of a run under way: ended when that run ends. The run itself, whose
    // inner process's parent is its outer one, is not touched: its answer comes as always.
    let (held, running) = start_held_run(&system, "leftovers").await;
    let uid = uid_of(held);
    assert!(
        (BASE_UID..BASE_UID + 4096).contains(&uid),
        "the run's Python runs as uid {uid}, not a sandbox uid"
    );
    let left_beside_the_run = plant_orphan(uid).await;
    release(held);
    let answer = running.await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    until_killed(&left_beside_the_run, "the run left as a run's uid").await;
}
