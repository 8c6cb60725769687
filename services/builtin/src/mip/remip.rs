//! Solving with a ReMIP server (`pip install remip==0.3.3`, SCIP inside) instead of HiGHS.
//!
//! [`solve`] posts PuLP's dict to `{base_url}/solve?timeout=<seconds>` and reads
//! `{name, status, objective_value, variables{}, mip_gap, slacks, duals, reduced_costs}`.
//! ReMIP's statuses map as follows; none is read as more than SCIP proved:
//!
//! | ReMIP                               | [`SolveStatus`] | values                 |
//! |-------------------------------------|-----------------|------------------------|
//! | `optimal`                           | `Optimal`       | yes                    |
//! | `infeasible`                        | `Infeasible`    | no                     |
//! | `unbounded`                         | `Unbounded`     | no (ReMIP sends 1e20s) |
//! | `timeout` (time limit or interrupt) | `Timeout`       | the incumbent, if any  |
//! | `gaplimit`                          | `Timeout`       | yes; `message` says so |
//! | anything else                       | `Error`         | no                     |
//!
//! `gaplimit` (only reachable through `solver_options` in the dict) is a solution SCIP stopped
//! improving at a gap: not optimal, so it is reported as "stopped early with a solution".
//! ReMIP says `not solved` for every SCIP status it does not know, SCIP's
//! infeasible-or-unbounded among them, so that is an error rather than a guess.
//!
//! ReMIP silently drops coefficients of undeclared variables, so the dict is read and its
//! names checked here before it is sent. HTTP failures, timeouts (the limit plus
//! [`HTTP_MARGIN`]) and unreachable servers become `Error` solutions; nothing here panics.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use super::highs::check_names;
use super::model::{Model, Outcome, Solution, SolveStatus};

/// How much longer than the solve's time limit the HTTP request may take: ReMIP builds the
/// model before SCIP's clock starts, and the answer has to travel back.
pub const HTTP_MARGIN: Duration = Duration::from_secs(30);
/// Largest answer read, in bytes: an answer grows with the number of variables and
/// constraints, and a misbehaving server must not exhaust memory.
const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;
/// Shortest time limit sent: ReMIP reads `timeout=0` as "no limit".
const MIN_TIME_LIMIT_SECONDS: f64 = 0.001;
/// How many of a 422's complaints the message quotes.
const MAX_COMPLAINTS: usize = 5;

/// Solves PuLP's `dict` (whose objective constant is `objective_constant`) with the ReMIP
/// server at `base_url`, within `time_limit`.
pub async fn solve(
    client: &reqwest::Client,
    base_url: &str,
    dict: &Value,
    objective_constant: f64,
    time_limit: Duration,
) -> Solution {
    let started = Instant::now();
    let outcome = match check(dict, objective_constant) {
        Err(message) => Outcome::error(message),
        Ok(()) => match ask(client, base_url, dict, time_limit).await {
            Ok(answer) => interpret(answer),
            Err(message) => Outcome::error(message),
        },
    };
    outcome.into_solution(objective_constant, started)
}

/// ReMIP's answer; the slacks, duals and reduced costs are not used.
#[derive(Debug, Deserialize)]
struct Answer {
    status: String,
    objective_value: Option<f64>,
    #[serde(default)]
    variables: BTreeMap<String, f64>,
    mip_gap: Option<f64>,
}

fn check(dict: &Value, objective_constant: f64) -> Result<(), String> {
    let model = Model::from_pulp(dict, objective_constant)
        .map_err(|error| format!("the problem is not a PuLP model: {error}"))?;
    check_names(&model)
}

async fn ask(
    client: &reqwest::Client,
    base_url: &str,
    dict: &Value,
    time_limit: Duration,
) -> Result<Answer, String> {
    let seconds = time_limit.as_secs_f64().max(MIN_TIME_LIMIT_SECONDS);
    let url = format!("{}/solve?timeout={seconds}", base_url.trim_end_matches('/'));
    let wait = time_limit.saturating_add(HTTP_MARGIN);
    let mut response = client
        .post(&url)
        .timeout(wait)
        .json(dict)
        .send()
        .await
        .map_err(|error| transport_failure(&error, wait))?;
    let status = response.status();
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| transport_failure(&error, wait))?
    {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            tracing::warn!(%url, "ReMIP's answer exceeds {MAX_ANSWER_BYTES} bytes");
            return Err("the ReMIP server's answer is too large to read".into());
        }
        body.extend_from_slice(&chunk);
    }
    if status == reqwest::StatusCode::UNPROCESSABLE_ENTITY {
        return Err(rejection(&body));
    }
    if !status.is_success() {
        tracing::warn!(%url, %status, body = %String::from_utf8_lossy(&body), "ReMIP failed");
        return Err(format!(
            "the ReMIP server failed on this problem (HTTP {})",
            status.as_u16()
        ));
    }
    serde_json::from_slice(&body).map_err(|error| {
        tracing::warn!(%url, %error, "ReMIP's answer is not a solution");
        "the ReMIP server answered something that is not a solution".to_owned()
    })
}

/// The message for a request that got no complete answer; the details go to the log.
fn transport_failure(error: &reqwest::Error, wait: Duration) -> String {
    tracing::warn!(%error, "ReMIP request failed");
    if error.is_timeout() {
        format!(
            "the ReMIP server did not answer within {} s",
            wait.as_secs_f64()
        )
    } else if error.is_connect() {
        "the ReMIP server cannot be reached: try again later".to_owned()
    } else if error.is_builder() {
        "the ReMIP server's address is not a valid http URL".to_owned()
    } else {
        "the connection to the ReMIP server failed before it answered".to_owned()
    }
}

/// ReMIP's 422 (FastAPI's `{detail: [{loc, msg}]}`), as "where: what" complaints.
fn rejection(body: &[u8]) -> String {
    let detail = serde_json::from_slice::<Value>(body).unwrap_or_default();
    let complaints: Vec<String> = detail["detail"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .take(MAX_COMPLAINTS)
        .map(|complaint| {
            let place: Vec<String> = complaint["loc"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|part| match part {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                })
                .collect();
            let what = complaint["msg"].as_str().unwrap_or("invalid");
            format!("{}: {what}", place.join("."))
        })
        .collect();
    if complaints.is_empty() {
        "the ReMIP server rejected the problem (HTTP 422)".to_owned()
    } else {
        format!(
            "the ReMIP server rejected the problem (HTTP 422): {}",
            complaints.join("; ")
        )
    }
}

fn interpret(answer: Answer) -> Outcome {
    let values = answer
        .objective_value
        .map(|objective| (objective, answer.variables));
    match (answer.status.as_str(), values) {
        ("optimal", Some(values)) => Outcome {
            status: SolveStatus::Optimal,
            values: Some(values),
            message: None,
        },
        ("optimal", None) => Outcome::error("the ReMIP server reported an optimum without values"),
        ("infeasible", _) => Outcome::bare(
            SolveStatus::Infeasible,
            "no values satisfy all the constraints and bounds",
        ),
        ("unbounded", _) => Outcome::bare(
            SolveStatus::Unbounded,
            "the objective can improve without limit: a bound or constraint is missing",
        ),
        ("timeout", Some(values)) => Outcome {
            status: SolveStatus::Timeout,
            values: Some(values),
            message: Some(format!(
                "the time limit was reached: these are the best values found{}, not proven optimal",
                gap(answer.mip_gap)
            )),
        },
        ("timeout", None) => Outcome::bare(
            SolveStatus::Timeout,
            "the time limit was reached before any feasible solution was found",
        ),
        ("gaplimit", Some(values)) => Outcome {
            status: SolveStatus::Timeout,
            values: Some(values),
            message: Some(format!(
                "the solver stopped at its gap limit, before the time limit: these are the best \
                 values found{}, not proven optimal",
                gap(answer.mip_gap)
            )),
        },
        (other, _) => Outcome::error(format!(
            "the ReMIP server did not solve the problem (its status: {other:?})"
        )),
    }
}

fn gap(mip_gap: Option<f64>) -> String {
    match mip_gap {
        Some(gap) if gap.is_finite() => format!(" (relative gap {:.3} %)", gap * 100.0),
        _ => String::new(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(status: &str, objective_value: Option<f64>) -> Answer {
        Answer {
            status: status.into(),
            objective_value,
            variables: objective_value
                .map(|_| BTreeMap::from([("x".to_owned(), 1.0)]))
                .unwrap_or_default(),
            mip_gap: Some(0.25),
        }
    }

    #[test]
    fn only_optimal_is_optimal() {
        let optimal = interpret(answer("optimal", Some(3.0)));
        assert_eq!(optimal.status, SolveStatus::Optimal);
        assert_eq!(optimal.values.unwrap().0, 3.0);

        let gap = interpret(answer("gaplimit", Some(3.0)));
        assert_eq!(gap.status, SolveStatus::Timeout);
        assert!(gap.values.is_some());
        assert!(gap.message.unwrap().contains("gap limit"));

        let early = interpret(answer("timeout", Some(3.0)));
        assert_eq!(early.status, SolveStatus::Timeout);
        assert!(early.message.unwrap().contains("25.000 %"));

        let nothing = interpret(answer("timeout", None));
        assert_eq!(
            (nothing.status, nothing.values),
            (SolveStatus::Timeout, None)
        );

        for status in [
            "not solved",
            "nodelimit",
            "solutionlimit",
            "memorylimit",
            "surprise",
        ] {
            let outcome = interpret(answer(status, Some(3.0)));
            assert_eq!(outcome.status, SolveStatus::Error, "{status}");
            assert!(outcome.values.is_none());
            assert!(outcome.message.unwrap().contains(status));
        }
        assert_eq!(
            interpret(answer("optimal", None)).status,
            SolveStatus::Error
        );
    }

    #[test]
    fn unbounded_and_infeasible_carry_no_values() {
        let unbounded = interpret(answer("unbounded", Some(1e20)));
        assert_eq!(
            (unbounded.status, unbounded.values),
            (SolveStatus::Unbounded, None)
        );
        let infeasible = interpret(answer("infeasible", None));
        assert_eq!(
            (infeasible.status, infeasible.values),
            (SolveStatus::Infeasible, None)
        );
    }

    #[test]
    fn a_rejection_names_what_is_wrong() {
        let body = json!({"detail": [
            {"type": "missing", "loc": ["body", "parameters", "status"], "msg": "Field required"},
            {"type": "missing", "loc": ["body", "variables", 0, "cat"], "msg": "Field required"}
        ]});
        let message = rejection(body.to_string().as_bytes());
        assert!(
            message.contains(
                "body.parameters.status: Field required; body.variables.0.cat: Field required"
            ),
            "{message}"
        );
        assert!(rejection(b"not json").contains("HTTP 422"));
    }

    #[test]
    fn undeclared_variables_are_refused_before_sending() {
        let dict = json!({
            "parameters": {"name": "p", "sense": 1, "status": 0, "sol_status": 0},
            "objective": {"name": "o", "coefficients": [{"name": "x", "value": 1}]},
            "variables": [{"name": "x", "cat": "Continuous", "lowBound": 0, "upBound": null}],
            "constraints": [{"name": "c", "sense": 1, "coefficients": [{"name": "q", "value": 1}], "constant": -5}]
        });
        assert!(check(&dict, 0.0).unwrap_err().contains("\"q\""));
        assert!(
            check(&json!({}), 0.0)
                .unwrap_err()
                .contains("not a PuLP model")
        );
    }
}
