//! The built-in MIP tools called the way the MIP suites call them, and the PuLP models they
//! share.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::system::{Answer, System};
use crate::wait_until;

/// A small PuLP production plan (integer, binary and continuous variables; optimum 85/3).
pub const PLAN: &str = r#"
import pulp
prob = pulp.LpProblem("plan", pulp.LpMaximize)
x = pulp.LpVariable("x", 0, 10, cat="Integer")
y = pulp.LpVariable("y", 0, None, cat="Integer")
b = pulp.LpVariable("use_b", cat="Binary")
z = pulp.LpVariable("z", 0, 5)
prob += 3 * x + 2 * y + 4 * b + z + 7, "profit"
prob += x + y + b <= 8
prob += x - y == 2, "balance"
prob += 2 * x + y + 3 * z <= 14, "capacity"
prob += z <= 2 * b, "link"
print("built", len(prob.variables()), "variables")
"#;

/// Market split (Cornuéjols and Dawande): 4 equality rows over 40 binaries with slacks.
pub const MARKET_SPLIT: &str = r#"
import random
import pulp
rng = random.Random(7)
rows, cols = 4, 40
a = [[rng.randint(0, 99) for _ in range(cols)] for _ in range(rows)]
p = pulp.LpProblem("market_split", pulp.LpMinimize)
x = [pulp.LpVariable(f"x{j}", cat="Binary") for j in range(cols)]
plus = [pulp.LpVariable(f"sp{i}", 0) for i in range(rows)]
minus = [pulp.LpVariable(f"sm{i}", 0) for i in range(rows)]
p += pulp.lpSum(plus) + pulp.lpSum(minus)
for i in range(rows):
    p += pulp.lpSum(a[i][j] * x[j] for j in range(cols)) + plus[i] - minus[i] == sum(a[i]) // 2
"#;

/// Calls a built-in tool over `POST /api/tools/{name}?scope=`.
pub async fn tool(system: &System, scope: &str, name: &str, args: Value) -> Answer {
    system
        .post(&format!("/api/tools/{name}?scope={scope}"), args)
        .await
}

/// The result of a call that must succeed.
pub async fn ok(system: &System, scope: &str, name: &str, args: Value) -> Value {
    let answer = tool(system, scope, name, args).await;
    assert_eq!(answer.status, StatusCode::OK, "{name}: {answer:?}");
    assert_eq!(answer.body["success"], true, "{name}: {answer:?}");
    answer.body["result"].clone()
}

/// The live processes (not zombies, which are runs already over): (pid, parent's pid).
fn processes() -> Vec<(u32, u32)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // pid (comm) state ppid …: comm may hold spaces, so read after its ')'.
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse::<u32>().ok()?;
            (state != "Z").then_some((pid, ppid))
        })
        .collect()
}

/// Processes that descend from `pid` (live ones, not zombies).
pub fn descendants_of(pid: u32) -> Vec<u32> {
    let all = processes();
    let mut family = vec![pid];
    let mut next = 0;
    while let Some(&parent) = family.get(next) {
        family.extend(
            all.iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        next += 1;
    }
    family.split_off(1)
}

/// Model code whose run holds its slot until the test ends it ([`release`]), for 25 s at
/// most (the sandbox stops a run at 30): a test that needs a run under way while it does
/// something else decides when the run ends, rather than betting that a sleep outlasts its
/// work on a loaded machine.
pub const HELD: &str = r#"
import signal, time, pulp
class Released(Exception):
    pass
def release(*_):
    raise Released()
signal.signal(signal.SIGUSR1, release)
try:
    time.sleep(25)
except Released:
    pass
prob = pulp.LpProblem("p")
"#;

/// The signal [`HELD`] waits for, as a bit of `/proc/<pid>/status`'s `SigCgt` mask.
const SIGUSR1_BIT: u64 = 1 << (10 - 1);

/// Waits (with a deadline) until the relay process `system` runs [`HELD`] and its Python
/// waits to be released (it catches `SIGUSR1`); returns that Python's process id.
async fn until_a_run_is_held(system: &System) -> u32 {
    let relay = system.pid().expect("a relay in a process of its own");
    wait_until(Duration::from_secs(30), async || {
        let held = descendants_of(relay).into_iter().find(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let caught = status
                .lines()
                .find_map(|line| line.strip_prefix("SigCgt:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok());
            comm.starts_with("python") && caught.is_some_and(|mask| mask & SIGUSR1_BIT != 0)
        });
        held.ok_or("no run of HELD waits to be released")
    })
    .await
}

/// Starts a generate call for `scope` running [`HELD`] and waits (with a deadline) until its
/// run holds its slot; returns its Python's process id, to [`release`], and the call.
pub async fn start_held_run<'a>(
    system: &'a System,
    scope: &'a str,
) -> (u32, Pin<Box<dyn Future<Output = Answer> + 'a>>) {
    let mut running = Box::pin(tool(
        system,
        scope,
        "generate_mip_problem",
        json!({"problemDefinitionCode": HELD}),
    ));
    let held = tokio::select! {
        held = until_a_run_is_held(system) => held,
        answer = &mut running => panic!("the run ended before it held its slot: {answer:?}"),
    };
    (held, running)
}

/// Ends the run of [`HELD`] whose Python is `pid`.
pub fn release(pid: u32) {
    let sent = std::process::Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -USR1 {pid}: {sent}");
}
