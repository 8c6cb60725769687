//! The MIP tools end to end over HTTP: a PuLP model goes generate → solve → validate in the
//! real sandbox with HiGHS and with a real ReMIP server; solver statuses; errors and models
//! refused; claim-check scopes. The limits on work at once: `mip_limits.rs`.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use reqwest::StatusCode;
use serde_json::{Value, json};
use toolrelay_builtin::BuiltinConfig;
use toolrelay_relay::RelayConfig;
use toolrelay_tests::mip::{MARKET_SPLIT, PLAN, ok, tool};
use toolrelay_tests::remip::ReMip;
use toolrelay_tests::system::System;

/// The optimum of [`PLAN`], a plan with an objective constant (7): with x = y + 2 the
/// objective is 5y + 4b + z + 13. For b = 1, x + y + b <= 8 gives y <= 2 and then
/// 3y + 4 + 3z <= 14 gives z <= 4/3: 85/3. For b = 0, z = 0 and y <= 3: 28. So the optimum
/// is 85/3 at x = 4, y = 2, use_b = 1, z = 4/3.
const PLAN_OPTIMUM: f64 = 85.0 / 3.0;

const PLAN_CHECK: &str = r#"
v = solution["variables"]
assert solution["status"] == "optimal", solution["status"]
assert abs(v["x"] - v["y"] - 2) < 1e-6, "balance broken"
assert v["x"] + v["y"] + v["use_b"] <= 8 + 1e-6
print("x =", round(v["x"]), "y =", round(v["y"]))
"#;

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
