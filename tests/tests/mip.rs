//! The MIP tools end to end over HTTP: a PuLP model goes generate → solve → validate in the
//! real sandbox with HiGHS and with a real ReMIP server; solver statuses; claim-check scopes;
//! and the limits on work at once.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay::json::to_struct;
use toolrelay::proto::v1 as pb;
use toolrelay_builtin::BuiltinConfig;
use toolrelay_builtin::config::{ENV_MIP_MAX_CONCURRENT, ENV_MIP_QUEUE_WAIT};
use toolrelay_gateway::config::ENV_TRUSTED_PROXIES;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::remip::ReMip;
use toolrelay_tests::system::{Answer, System, send};
use toolrelay_tests::{Deadline, relay_client, wait_until};

/// A small production plan: integers, a binary, a continuous variable, an equality, an
/// unnamed constraint and an objective constant (7).
///
/// With x = y + 2 the objective is 5y + 4b + z + 13. For b = 1, x + y + b <= 8 gives y <= 2
/// and then 3y + 4 + 3z <= 14 gives z <= 4/3: 85/3. For b = 0, z = 0 and y <= 3: 28. So the
/// optimum is 85/3 at x = 4, y = 2, use_b = 1, z = 4/3.
const PLAN: &str = r#"
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
const PLAN_OPTIMUM: f64 = 85.0 / 3.0;

const PLAN_CHECK: &str = r#"
v = solution["variables"]
assert solution["status"] == "optimal", solution["status"]
assert abs(v["x"] - v["y"] - 2) < 1e-6, "balance broken"
assert v["x"] + v["y"] + v["use_b"] <= 8 + 1e-6
print("x =", round(v["x"]), "y =", round(v["y"]))
"#;

/// Calls a built-in tool over `POST /api/tools/{name}?scope=`.
async fn tool(system: &System, scope: &str, name: &str, args: Value) -> Answer {
    system
        .post(&format!("/api/tools/{name}?scope={scope}"), args)
        .await
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

/// Processes that descend from `pid`.
fn descendants_of(pid: u32) -> Vec<u32> {
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
const HELD: &str = r#"
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
async fn start_held_run<'a>(
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
fn release(pid: u32) {
    let sent = std::process::Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -USR1 {pid}: {sent}");
}

/// The result of a call that must succeed.
async fn ok(system: &System, scope: &str, name: &str, args: Value) -> Value {
    let answer = tool(system, scope, name, args).await;
    assert_eq!(answer.status, StatusCode::OK, "{name}: {answer:?}");
    assert_eq!(answer.body["success"], true, "{name}: {answer:?}");
    answer.body["result"].clone()
}

/// Generates and solves `code`; returns the solve result.
async fn generate_and_solve(system: &System, scope: &str, code: &str, limit: f64) -> Value {
    let generated = ok(
        system,
        scope,
        "generate_mip_problem",
        json!({"problemDefinitionCode": code}),
    )
    .await;
    ok(
        system,
        scope,
        "solve_mip_problem",
        json!({"problemId": generated["problemId"], "timeLimitSeconds": limit}),
    )
    .await
}

/// The plan goes generate → solve → validate → read back on `system`.
async fn plan_round_trip(system: &System, scope: &str) {
    let generated = ok(
        system,
        scope,
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    let problem_id = generated["problemId"].as_str().unwrap();
    assert!(
        problem_id.starts_with("prob_") && problem_id.len() == 5 + 32,
        "{problem_id}"
    );
    assert_eq!(
        generated["summary"],
        json!({"variables": 4, "constraints": 4, "integers": 3})
    );
    assert_eq!(generated["stdout"], "built 4 variables");

    let solved = ok(
        system,
        scope,
        "solve_mip_problem",
        json!({"problemId": problem_id}),
    )
    .await;
    assert_eq!(solved["status"], "optimal", "{solved}");
    let objective = solved["objectiveValue"].as_f64().unwrap();
    assert!(
        (objective - PLAN_OPTIMUM).abs() < 1e-6,
        "objective {objective}"
    );
    assert!(solved["solveTimeSeconds"].as_f64().unwrap() >= 0.0);
    let solution_id = solved["solutionId"].as_str().unwrap();
    assert!(solution_id.starts_with("sol_"), "{solution_id}");

    let passed = ok(
        system,
        scope,
        "validate_mip_solution",
        json!({"solutionId": solution_id, "validationCode": PLAN_CHECK}),
    )
    .await;
    assert_eq!(
        passed,
        json!({"status": "success", "message": "x = 4 y = 2"})
    );
    let silent = ok(
        system,
        scope,
        "validate_mip_solution",
        json!({"solutionId": solution_id, "validationCode": "assert solution['objective_value'] > 28"}),
    )
    .await;
    assert_eq!(silent["message"], "validation passed");
    let failed = ok(
        system,
        scope,
        "validate_mip_solution",
        json!({"solutionId": solution_id, "validationCode": "x = solution['variables']['x']\nassert x > 5, f'x is only {x:.0f}'"}),
    )
    .await;
    assert_eq!(
        failed,
        json!({"status": "failure", "message": "AssertionError: x is only 4"})
    );

    let values = ok(
        system,
        scope,
        "get_mip_solution",
        json!({"solutionId": solution_id}),
    )
    .await;
    assert_eq!(values["total"], 4);
    let by_name: Vec<(String, f64)> = values["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                v["value"].as_f64().unwrap(),
            )
        })
        .collect();
    let expected = [("use_b", 1.0), ("x", 4.0), ("y", 2.0), ("z", 4.0 / 3.0)];
    assert_eq!(by_name.len(), expected.len(), "{values}");
    for ((name, value), (want_name, want)) in by_name.iter().zip(expected) {
        assert_eq!(name, want_name);
        assert!((value - want).abs() < 1e-6, "{name} = {value}, not {want}");
    }
    let page = ok(
        system,
        scope,
        "get_mip_solution",
        json!({"solutionId": solution_id, "limit": 2, "offset": 1}),
    )
    .await;
    let names: Vec<&str> = page["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["x", "y"]);
}

#[tokio::test]
async fn a_small_mip_is_solved_with_highs() {
    let system = System::start().await;
    plan_round_trip(&system, "highs-conversation").await;
    system.stop().await;
}

#[tokio::test]
async fn a_small_mip_is_solved_by_a_remip_server() {
    let remip = ReMip::start().await;
    let mut tools = BuiltinConfig::default();
    tools.mip.remip_url = Some(remip.url.clone());
    let system = System::with_tools(RelayConfig::default(), tools, |_| {}).await;
    plan_round_trip(&system, "remip-conversation").await;
    assert!(
        remip.solves() >= 1,
        "the ReMIP server solved nothing: HiGHS answered instead"
    );
    system.stop().await;
    remip.stop().await;
}

#[tokio::test]
async fn statuses_are_reported_as_the_solver_proved_them() {
    let system = System::start().await;
    let scope = "statuses";
    let infeasible = generate_and_solve(
        &system,
        scope,
        "import pulp\np = pulp.LpProblem('p', pulp.LpMinimize)\nx = pulp.LpVariable('x', 0, 10, cat='Integer')\np += x\np += x >= 5\np += x <= 3",
        10.0,
    )
    .await;
    assert_eq!(infeasible["status"], "infeasible", "{infeasible}");
    assert_eq!(infeasible["objectiveValue"], Value::Null);

    let unbounded = generate_and_solve(
        &system,
        scope,
        "import pulp\np = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, cat='Integer')\ny = pulp.LpVariable('y', 0)\np += x + y\np += x - y <= 3",
        10.0,
    )
    .await;
    assert!(
        ["unbounded", "infeasible_or_unbounded"].contains(&unbounded["status"].as_str().unwrap()),
        "{unbounded}"
    );
    assert_ne!(unbounded["status"], "optimal");

    // A market-split instance: tiny, and famously hard for branch and bound.
    let hard = generate_and_solve(&system, scope, MARKET_SPLIT, 1.0).await;
    assert_eq!(hard["status"], "timeout", "{hard}");
    let took = hard["solveTimeSeconds"].as_f64().unwrap();
    assert!((0.9..10.0).contains(&took), "the 1 s limit took {took} s");
    system.stop().await;
}

/// Market split (Cornuéjols and Dawande): 4 equality rows over 40 binaries with slacks.
const MARKET_SPLIT: &str = r#"
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

#[tokio::test]
async fn python_errors_say_what_went_wrong() {
    let system = System::start().await;
    let scope = "errors";
    let generate = |code: &str| {
        tool(
            &system,
            scope,
            "generate_mip_problem",
            json!({"problemDefinitionCode": code}),
        )
    };
    let broken = generate("import pulp\nprob = pulp.LpProblem('p')\nx = undefined_name + 1").await;
    assert_eq!(broken.status, StatusCode::BAD_REQUEST, "{broken:?}");
    assert_eq!(broken.body["error"]["code"], "PYTHON_ERROR");
    let message = broken.body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("NameError: name 'undefined_name' is not defined"),
        "{message}"
    );
    assert!(message.contains("line 3"), "the traceback tail: {message}");

    let none = generate("import pulp\nx = 1").await;
    assert_eq!(none.body["error"]["code"], "PYTHON_ERROR");
    assert!(
        none.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("defines no pulp.LpProblem"),
        "{none:?}"
    );
    let two = generate("import pulp\na = pulp.LpProblem('a')\nb = pulp.LpProblem('b')").await;
    assert!(
        two.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("several pulp.LpProblem objects (a, b)"),
        "{two:?}"
    );
    let empty = generate("  ").await;
    assert_eq!(empty.body["error"]["code"], "EMPTY_CODE", "{empty:?}");
    system.stop().await;
}

#[tokio::test]
async fn ids_are_found_only_in_the_scope_that_made_them() {
    let system = System::start().await;

    // Outside a session the caller must name a scope.
    let unscoped = system
        .post(
            "/api/tools/generate_mip_problem",
            json!({"problemDefinitionCode": PLAN}),
        )
        .await;
    assert_eq!(unscoped.status, StatusCode::BAD_REQUEST, "{unscoped:?}");
    assert_eq!(unscoped.body["error"]["code"], "SCOPE_REQUIRED");
    assert!(
        unscoped.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("?scope="),
        "{unscoped:?}"
    );

    // The scope may come as an argument too; another scope does not see the id.
    let generated = system
        .post(
            "/api/tools/generate_mip_problem",
            json!({"problemDefinitionCode": PLAN, "scope": "alice"}),
        )
        .await;
    assert_eq!(generated.status, StatusCode::OK, "{generated:?}");
    let problem_id = generated.body["result"]["problemId"].clone();
    let stolen = tool(
        &system,
        "mallory",
        "solve_mip_problem",
        json!({"problemId": problem_id}),
    )
    .await;
    assert_eq!(stolen.status, StatusCode::NOT_FOUND, "{stolen:?}");
    assert_eq!(stolen.body["error"]["code"], "NOT_FOUND");
    let mine = ok(
        &system,
        "alice",
        "solve_mip_problem",
        json!({"problemId": problem_id}),
    )
    .await;
    assert_eq!(mine["status"], "optimal");

    // Session calls are scoped by the session: a problemId from one is unknown in another.
    let (first, _) = system.create_session().await;
    let (second, _) = system.create_session().await;
    let session_call = |code: &str, name: &str, args: Value| {
        system.post(
            &format!("/api/sessions/{code}/call"),
            json!({"functionName": name, "args": args}),
        )
    };
    let made = session_call(
        &first,
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    assert_eq!(made.body["success"], true, "{made:?}");
    let session_problem = made.body["result"]["problemId"].clone();
    let elsewhere = session_call(
        &second,
        "solve_mip_problem",
        json!({"problemId": session_problem}),
    )
    .await;
    assert_eq!(elsewhere.body["success"], false, "{elsewhere:?}");
    assert_eq!(elsewhere.body["error"]["code"], "NOT_FOUND");
    let outside = tool(
        &system,
        &first,
        "solve_mip_problem",
        json!({"problemId": session_problem}),
    )
    .await;
    assert_eq!(
        outside.status,
        StatusCode::NOT_FOUND,
        "a caller scope named like the session is not the session: {outside:?}"
    );
    let solved = session_call(
        &first,
        "solve_mip_problem",
        json!({"problemId": session_problem}),
    )
    .await;
    assert_eq!(solved.body["result"]["status"], "optimal", "{solved:?}");
    system.stop().await;
}

#[tokio::test]
async fn work_past_the_limits_gets_429_with_retry_after() {
    let system = System::binary(&[(ENV_MIP_MAX_CONCURRENT, "1"), (ENV_MIP_QUEUE_WAIT, "1")]).await;
    let (held, running) = start_held_run(&system, "first").await;
    // Another caller waits its second for the slot, then is told to come back.
    let other = tool(
        &system,
        "second",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    // So is a call through a session (as the call's answer: it was queued).
    let (code, _) = system.create_session().await;
    let in_session = system
        .post(
            &format!("/api/sessions/{code}/call"),
            json!({"functionName": "generate_mip_problem", "args": {"problemDefinitionCode": PLAN}}),
        )
        .await;
    release(held);
    let first = running.await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(other.status, StatusCode::TOO_MANY_REQUESTS, "{other:?}");
    let wait: u64 = other.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&wait), "Retry-After {wait}");
    assert_eq!(other.body["error"]["code"], "BUSY");
    assert_eq!(in_session.body["success"], false, "{in_session:?}");
    assert_eq!(in_session.body["error"]["code"], "BUSY", "{in_session:?}");

    // Free again once the run is over.
    let after = tool(
        &system,
        "second",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    assert_eq!(after.status, StatusCode::OK, "{after:?}");
}

/// Python that prints when it ran (the Unix time, in seconds), then sleeps `seconds`.
fn timed(seconds: u32) -> String {
    format!(
        "import time, pulp\nprint(time.time())\nprob = pulp.LpProblem('p')\ntime.sleep({seconds})"
    )
}

/// When the run of a generate call answered `answer` began (as it printed).
fn began(answer: &Answer) -> f64 {
    let stdout = answer.body["result"]["stdout"].as_str();
    stdout
        .and_then(|printed| printed.trim().parse().ok())
        .unwrap_or_else(|| panic!("no start time in {answer:?}"))
}

#[tokio::test]
async fn a_client_holding_every_slot_does_not_lock_others_out() {
    // Both slots taken by one client, under two scopes of its choosing, with a third call of
    // its own waiting: another client's call and a call through a session wait for their
    // turns instead of being refused, and are served ahead of the third (which then would
    // be the client's second model at once, while they run none).
    let system = System::binary(&[
        (ENV_MIP_MAX_CONCURRENT, "2"),
        (ENV_MIP_QUEUE_WAIT, "60"),
        (ENV_TRUSTED_PROXIES, "127.0.0.1"),
    ])
    .await;
    let hog = |scope: &'static str, seconds: u32| {
        tool(
            &system,
            scope,
            "generate_mip_problem",
            json!({"problemDefinitionCode": timed(seconds)}),
        )
    };
    let (code, _) = system.create_session().await;
    let hogging = async {
        // The second outlasts the others' runs: each of them has a slot freed by the first.
        tokio::join!(hog("hog-1", 4), hog("hog-2", 12))
    };
    let crowding = async {
        until_mip_slots(&system, (2, 0)).await;
        // The client alone used both slots; its third call waits.
        let third = hog("hog-3", 0);
        let others = async {
            until_mip_slots(&system, (2, 1)).await;
            let elsewhere = send(
                system
                    .request(
                        reqwest::Method::POST,
                        "/api/tools/generate_mip_problem?scope=mine",
                    )
                    .header("x-forwarded-for", "2001:db8::1")
                    .json(&json!({"problemDefinitionCode": timed(0)})),
            );
            let in_session = system.post(
                &format!("/api/sessions/{code}/call"),
                json!({"functionName": "generate_mip_problem", "args": {"problemDefinitionCode": timed(0)}, "timeoutMs": 40000}),
            );
            let waiting = async {
                // Both wait behind the hog's running models (and not refused).
                until_mip_slots(&system, (2, 3)).await;
            };
            let (elsewhere, in_session, ()) = tokio::join!(elsewhere, in_session, waiting);
            (elsewhere, in_session)
        };
        tokio::join!(third, others)
    };
    let ((first, second), (third, (elsewhere, in_session))) = tokio::join!(hogging, crowding);
    for answer in [&first, &second, &third, &elsewhere] {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }
    assert_eq!(in_session.status, StatusCode::OK, "{in_session:?}");
    assert_eq!(in_session.body["success"], true, "{in_session:?}");
    let hog_started = began(&third);
    for other in [&elsewhere, &in_session] {
        assert!(
            began(other) < hog_started,
            "another client's call ran before the hog's third: {other:?} {third:?}"
        );
    }
    assert_eq!(mip_slots(&system).await, (0, 0));
    system.stop().await;
}

#[tokio::test]
async fn a_split_gateway_gives_the_relay_the_client_address_to_take_turns_by() {
    // As above, over gRPC: were every call from the gateway keyed by the gateway's address,
    // the hog's waiting call, first in line, would go first.
    let system = System::split_with(
        &[(ENV_MIP_MAX_CONCURRENT, "2"), (ENV_MIP_QUEUE_WAIT, "60")],
        &[(ENV_TRUSTED_PROXIES, "127.0.0.1")],
    )
    .await;
    let hog = |scope: &'static str, seconds: u32| {
        tool(
            &system,
            scope,
            "generate_mip_problem",
            json!({"problemDefinitionCode": timed(seconds)}),
        )
    };
    let hogging = async { tokio::join!(hog("hog-1", 4), hog("hog-2", 8)) };
    let crowding = async {
        until_mip_slots(&system, (2, 0)).await;
        let third = hog("hog-3", 0);
        let elsewhere = async {
            until_mip_slots(&system, (2, 1)).await;
            let elsewhere = send(
                system
                    .request(
                        reqwest::Method::POST,
                        "/api/tools/generate_mip_problem?scope=mine",
                    )
                    .header("x-forwarded-for", "2001:db8::1")
                    .json(&json!({"problemDefinitionCode": timed(0)})),
            );
            let ((), elsewhere) = tokio::join!(until_mip_slots(&system, (2, 2)), elsewhere);
            elsewhere
        };
        tokio::join!(third, elsewhere)
    };
    let ((first, second), (third, elsewhere)) = tokio::join!(hogging, crowding);
    for answer in [&first, &second, &third, &elsewhere] {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }
    assert!(
        began(&elsewhere) < began(&third),
        "another client's call ran before the hog's third: {elsewhere:?} {third:?}"
    );
    system.stop().await;
}

#[tokio::test]
async fn one_caller_runs_one_model_at_a_time() {
    let system = System::binary(&[]).await;
    let (held, running) = start_held_run(&system, "eager").await;
    let second = tool(
        &system,
        "eager",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    release(held);
    let first = running.await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS, "{second:?}");
    assert!(
        second.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already have a model running"),
        "{second:?}"
    );
    assert!(second.header("retry-after").is_some());
    system.stop().await;
}

#[tokio::test]
async fn models_that_cannot_be_solved_honestly_are_refused() {
    let mut tools = BuiltinConfig::default();
    tools.mip.sandbox.result_bytes = 20_000;
    let system = System::with_tools(RelayConfig::default(), tools, |_| {}).await;
    let generate = |code: &str| {
        tool(
            &system,
            "refusals",
            "generate_mip_problem",
            json!({"problemDefinitionCode": code}),
        )
    };
    // HiGHS has no SOS constraints: dropping them would call a relaxation optimal.
    let sos = generate("import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 1)\ny = pulp.LpVariable('y', 0, 1)\nprob += x + y\nprob.sos1['s'] = {'x': 1, 'y': 2}").await;
    assert_eq!(sos.status, StatusCode::BAD_REQUEST, "{sos:?}");
    assert_eq!(sos.body["error"]["code"], "INVALID_MODEL");
    assert!(
        sos.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("special ordered sets"),
        "{sos:?}"
    );
    let overflow = generate("import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nx = pulp.LpVariable('x', 0, 1)\nprob += 1e308 * x + 1e308 * x").await;
    assert_eq!(overflow.status, StatusCode::BAD_REQUEST, "{overflow:?}");
    assert_eq!(overflow.body["error"]["code"], "INVALID_MODEL");
    assert!(
        overflow.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("infinite or NaN"),
        "{overflow:?}"
    );
    let large = generate("import pulp\nprob = pulp.LpProblem('p', pulp.LpMaximize)\nxs = [pulp.LpVariable(f'x{i}', 0, 1) for i in range(2000)]\nprob += pulp.lpSum(xs)").await;
    assert_eq!(large.status, StatusCode::PAYLOAD_TOO_LARGE, "{large:?}");
    assert_eq!(large.body["error"]["code"], "MODEL_TOO_LARGE");
    assert!(
        large.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("over the limit of 20 KB"),
        "{large:?}"
    );
    // Output written around the runner does not cost the result.
    let noisy = generate(&format!(
        "import os, pulp\nos.write(1, b'x' * 200000)\n{PLAN}"
    ))
    .await;
    assert_eq!(noisy.status, StatusCode::OK, "{noisy:?}");
    // A syntax error names its line.
    let syntax = generate("import pulp\nprob = pulp.LpProblem('p'\n").await;
    assert_eq!(syntax.body["error"]["code"], "PYTHON_ERROR");
    assert!(
        syntax.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("(line 2)"),
        "{syntax:?}"
    );
}

/// The relay's MIP slots in use and the calls waiting for one, as its `/metrics` says (the
/// relay's own port in a split system).
async fn mip_slots(system: &System) -> (u64, u64) {
    let url = match system.relay_ws {
        Some(relay) => format!("http://{relay}/metrics"),
        None => system.url("/metrics"),
    };
    let page = system.http.get(url).send().await.unwrap();
    let text = page.text().await.unwrap();
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    (
        value("toolrelay_mip_slots_busy"),
        value("toolrelay_mip_waiting"),
    )
}

/// Waits (with a deadline) until the relay's MIP slots and waiting calls are `wanted`.
async fn until_mip_slots(system: &System, wanted: (u64, u64)) {
    let every = Deadline::within(Duration::from_secs(30)).every(Duration::from_millis(50));
    wait_until(every, async || {
        let now = mip_slots(system).await;
        if now == wanted {
            Ok(())
        } else {
            Err(format!(
                "the MIP slots and waiting calls never became {wanted:?} (now {now:?})"
            ))
        }
    })
    .await;
}

#[tokio::test]
async fn a_solve_whose_caller_left_keeps_its_slot_until_it_ends() {
    const LIMIT_SECONDS: f64 = 3.0;
    let mut tools = BuiltinConfig::default();
    tools.mip.max_concurrent = 1;
    // A call that finds the slot taken is refused at once rather than waiting for its turn.
    tools.mip.queue_wait = Duration::ZERO;
    let system = System::with_tools(RelayConfig::default(), tools, |_| {}).await;
    let hard = ok(
        &system,
        "leaver",
        "generate_mip_problem",
        json!({"problemDefinitionCode": MARKET_SPLIT}),
    )
    .await;
    assert_eq!(mip_slots(&system).await, (0, 0));

    // The caller asks for the solve over gRPC and gives up (its stream is reset, and the
    // relay drops its handler) as soon as the relay has started the solve; HiGHS goes on for
    // its 3 s. (Over HTTP/1 the server finishes a handler whose client has gone, so a caller
    // leaving there would show nothing.)
    let sent = tokio::time::Instant::now();
    let mut client = relay_client(system.grpc).await;
    let solve = pb::CallToolRequest {
        name: "solve_mip_problem".into(),
        args: Some(to_struct(
            &json!({"problemId": hard["problemId"], "timeLimitSeconds": LIMIT_SECONDS}),
        )),
        scope: Some(pb::call_tool_request::Scope::CallerScope("leaver".into())),
    };
    let caller = tokio::spawn(async move { client.call_tool(solve).await });
    until_mip_slots(&system, (1, 0)).await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());

    // The abandoned solve still holds the only slot, until its time is up: another caller is
    // told to come back (unless this machine was so slow that the 3 s are over already).
    let at_least = LIMIT_SECONDS - 0.5;
    let meanwhile = tool(
        &system,
        "other",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    if sent.elapsed().as_secs_f64() < at_least {
        assert_eq!(
            meanwhile.status,
            StatusCode::TOO_MANY_REQUESTS,
            "the abandoned solve still holds the only slot: {meanwhile:?}"
        );
    }
    until_mip_slots(&system, (0, 0)).await;
    let held = sent.elapsed().as_secs_f64();
    assert!(
        held >= at_least,
        "the slot was freed {held:.2} s after the solve was sent, before its {LIMIT_SECONDS} s were up"
    );
    let after = tool(
        &system,
        "other",
        "generate_mip_problem",
        json!({"problemDefinitionCode": PLAN}),
    )
    .await;
    assert_eq!(after.status, StatusCode::OK, "{after:?}");
    system.stop().await;
}
