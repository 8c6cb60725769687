//! The ReMIP client against a real ReMIP server (SCIP inside), started from the test venv on
//! a free port, checked against HiGHS on the same models.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolrelay_builtin::mip::model::{Model, Solution, SolveStatus};
use toolrelay_builtin::mip::{highs, remip};
use toolrelay_tests::free_port;
use toolrelay_tests::remip::ReMip;

const LIMIT: Duration = Duration::from_secs(30);
const CONSTANT: f64 = 7.5;

fn variable(name: &str, category: &str, low: Option<f64>, up: Option<f64>) -> Value {
    json!({"name": name, "cat": category, "lowBound": low, "upBound": up, "varValue": null, "dj": null})
}

fn terms(pairs: &[(&str, f64)]) -> Value {
    pairs
        .iter()
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect()
}

/// A PuLP constraint `Σ terms (sense) -constant`; sense -1 ≤, 0 =, 1 ≥.
fn constraint(name: Option<&str>, sense: i64, pairs: &[(&str, f64)], rhs: f64) -> Value {
    json!({"name": name, "sense": sense, "coefficients": terms(pairs), "pi": null, "constant": -rhs})
}

fn problem(
    name: &str,
    sense: i64,
    objective: &[(&str, f64)],
    variables: Vec<Value>,
    constraints: Vec<Value>,
) -> Value {
    json!({
        "parameters": {"name": name, "sense": sense, "status": 0, "sol_status": 0},
        "objective": {"name": "objective", "coefficients": terms(objective)},
        "variables": variables,
        "constraints": constraints,
        "sos1": [],
        "sos2": []
    })
}

/// The small MIP of the HiGHS unit tests, as PuLP 3 exports it: integers `x ∈ [0, 10]`,
/// `y`, `v` (constraints only), binary `b`, continuous `z`, `u ∈ [0, 3]` (objective only),
/// free `w`; an equality and an unnamed constraint; objective constant 7.5.
fn demo(sense: i64, objective: &[(&str, f64)]) -> Value {
    problem(
        "demo",
        sense,
        objective,
        vec![
            variable("x", "Integer", Some(0.0), Some(10.0)),
            variable("y", "Integer", Some(0.0), None),
            variable("b", "Integer", Some(0.0), Some(1.0)),
            variable("z", "Continuous", Some(0.0), None),
            variable("u", "Continuous", Some(0.0), Some(3.0)),
            variable("v", "Integer", Some(0.0), None),
            variable("w", "Continuous", None, None),
        ],
        vec![
            constraint(
                Some("capacity"),
                -1,
                &[("x", 2.0), ("y", 3.0), ("z", 1.0)],
                11.5,
            ),
            constraint(Some("link"), -1, &[("z", 1.0), ("b", -4.0)], 0.5),
            constraint(None, 0, &[("x", 1.0), ("v", 1.0)], 4.0),
            constraint(
                Some("balance"),
                1,
                &[("x", 1.0), ("y", 1.0), ("b", 1.0)],
                2.0,
            ),
            constraint(Some("floor"), 1, &[("w", 1.0), ("b", -1.0)], -2.5),
        ],
    )
}

fn maximum() -> Value {
    demo(
        -1,
        &[
            ("x", 5.0),
            ("y", 4.0),
            ("z", 3.0),
            ("b", 2.0),
            ("u", 1.0),
            ("w", -1.0),
        ],
    )
}

fn minimum() -> Value {
    demo(
        1,
        &[
            ("x", 1.0),
            ("y", 2.0),
            ("z", 3.0),
            ("b", -2.0),
            ("u", 1.0),
            ("w", 1.0),
        ],
    )
}

/// `max x` with `x - y ≤ 1` and both unbounded above.
fn ray(category: &str) -> Value {
    problem(
        "ray",
        -1,
        &[("x", 1.0)],
        vec![
            variable("x", category, Some(0.0), None),
            variable("y", category, Some(0.0), None),
        ],
        vec![constraint(Some("c"), -1, &[("x", 1.0), ("y", -1.0)], 1.0)],
    )
}

/// Market split (Cornuéjols and Dawande), 5 equalities over 40 binaries: far beyond 0.05 s.
fn market_split() -> Value {
    let mut state: u64 = 12345;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % 100) as f64
    };
    let names: Vec<String> = (0..40).map(|j| format!("x{j}")).collect();
    let constraints = (0..5)
        .map(|i| {
            let pairs: Vec<(&str, f64)> = names.iter().map(|n| (n.as_str(), next())).collect();
            let total: f64 = pairs.iter().map(|(_, c)| c).sum();
            constraint(Some(&format!("r{i}")), 0, &pairs, (total / 2.0).floor())
        })
        .collect();
    let objective: Vec<(&str, f64)> = names.iter().map(|n| (n.as_str(), 1.0)).collect();
    let variables = names
        .iter()
        .map(|n| variable(n, "Integer", Some(0.0), Some(1.0)))
        .collect();
    problem("split", 1, &objective, variables, constraints)
}

async fn remip(server: &ReMip, dict: &Value, limit: Duration) -> Solution {
    let client = reqwest::Client::new();
    remip::solve(&client, &server.url, dict, CONSTANT, limit).await
}

fn assert_same_optimum(remip: &Solution, highs: &Solution, objective: f64, values: &[(&str, f64)]) {
    for solution in [remip, highs] {
        assert_eq!(solution.status, SolveStatus::Optimal, "{solution:?}");
        let got = solution.objective_value.unwrap();
        assert!(
            (got - objective).abs() < 1e-6,
            "objective {got}, expected {objective}: {solution:?}"
        );
        assert_eq!(solution.variables.len(), values.len(), "{solution:?}");
        for (name, value) in values {
            let got = solution.variables[*name];
            assert!(
                (got - value).abs() < 1e-6,
                "{name} = {got}, expected {value}: {solution:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remip_answers_like_highs_and_honestly() {
    let server = ReMip::start().await;

    // The same optimum as HiGHS, objective constant included, both senses.
    for (dict, objective, values) in [
        (
            maximum(),
            44.5,
            [
                ("x", 4.0),
                ("y", 0.0),
                ("b", 1.0),
                ("z", 3.5),
                ("u", 3.0),
                ("v", 0.0),
                ("w", -1.5),
            ],
        ),
        (
            minimum(),
            5.0,
            [
                ("x", 1.0),
                ("y", 0.0),
                ("b", 1.0),
                ("z", 0.0),
                ("u", 0.0),
                ("v", 3.0),
                ("w", -1.5),
            ],
        ),
    ] {
        let by_remip = remip(&server, &dict, LIMIT).await;
        let model = Model::from_pulp(&dict, CONSTANT).unwrap();
        let by_highs = tokio::task::spawn_blocking(move || highs::solve(&model, LIMIT))
            .await
            .unwrap();
        assert_same_optimum(&by_remip, &by_highs, objective, &values);
        assert_eq!(by_remip.message, None);
    }

    // Infeasible: x + v = 4 with v ≥ 0 and x ≥ 5.
    let mut infeasible = minimum();
    infeasible["constraints"]
        .as_array_mut()
        .unwrap()
        .push(constraint(Some("too_much"), 1, &[("x", 1.0)], 5.0));
    let solution = remip(&server, &infeasible, LIMIT).await;
    assert_eq!(solution.status, SolveStatus::Infeasible, "{solution:?}");
    assert_eq!(
        (solution.objective_value, solution.variables.len()),
        (None, 0)
    );

    // Unbounded, as an LP and as a MIP: SCIP says so for both, and ReMIP's 1e20 values are dropped.
    for category in ["Continuous", "Integer"] {
        let solution = remip(&server, &ray(category), LIMIT).await;
        assert_eq!(
            solution.status,
            SolveStatus::Unbounded,
            "{category}: {solution:?}"
        );
        assert_eq!(
            (solution.objective_value, solution.variables.len()),
            (None, 0),
            "{category}"
        );
    }

    // A time limit too short to finish is a timeout, never an optimum.
    let started = Instant::now();
    let solution = remip(&server, &market_split(), Duration::from_millis(50)).await;
    assert_eq!(solution.status, SolveStatus::Timeout, "{solution:?}");
    assert!(
        solution.message.as_deref().unwrap().contains("time limit"),
        "{solution:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // A gap limit set through solver_options stops early with a solution: not optimal.
    let mut loose = maximum();
    loose["solver_options"] = json!({"limits/gap": 0.5});
    let solution = remip(&server, &loose, LIMIT).await;
    assert_eq!(solution.status, SolveStatus::Timeout, "{solution:?}");
    assert!(
        solution.objective_value.unwrap() <= 44.5 + 1e-6,
        "{solution:?}"
    );
    assert!(!solution.variables.is_empty());
    assert!(
        solution.message.as_deref().unwrap().contains("gap limit"),
        "{solution:?}"
    );

    // ReMIP would silently drop this coefficient and solve another model: refused here.
    let mut ghost = minimum();
    ghost["constraints"][0]["coefficients"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "ghost", "value": 1.0}));
    let solution = remip(&server, &ghost, LIMIT).await;
    assert_eq!(solution.status, SolveStatus::Error, "{solution:?}");
    assert!(
        solution.message.as_deref().unwrap().contains("\"ghost\""),
        "{solution:?}"
    );

    // ReMIP's 422 (PuLP 4's dict lacks parameters.status) says what is missing.
    let mut pulp4 = minimum();
    pulp4["parameters"]
        .as_object_mut()
        .unwrap()
        .remove("status");
    let solution = remip(&server, &pulp4, LIMIT).await;
    assert_eq!(solution.status, SolveStatus::Error, "{solution:?}");
    let message = solution.message.unwrap();
    assert!(
        message.contains("422") && message.contains("parameters.status"),
        "{message}"
    );

    // ReMIP fails (HTTP 500) on a constraint without variables.
    let mut empty_row = minimum();
    empty_row["constraints"]
        .as_array_mut()
        .unwrap()
        .push(constraint(Some("empty"), -1, &[], 1.0));
    let solution = remip(&server, &empty_row, LIMIT).await;
    assert_eq!(solution.status, SolveStatus::Error, "{solution:?}");
    assert!(
        solution.message.as_deref().unwrap().contains("HTTP 500"),
        "{solution:?}"
    );

    // No server on the port: an error, quickly.
    let stopped = format!("http://127.0.0.1:{}", free_port());
    let solution = remip::solve(
        &reqwest::Client::new(),
        &stopped,
        &minimum(),
        CONSTANT,
        LIMIT,
    )
    .await;
    assert_eq!(solution.status, SolveStatus::Error, "{solution:?}");
    assert!(
        solution
            .message
            .as_deref()
            .unwrap()
            .contains("cannot be reached"),
        "{solution:?}"
    );
    assert_eq!(solution.objective_value, None);
    server.stop().await;
}
