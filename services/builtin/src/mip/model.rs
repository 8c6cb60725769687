//! The optimisation model the solvers read: PuLP's `LpProblem.toDict()` made explicit, and the
//! solution every solver returns.
//!
//! PuLP 3.x dict: `{parameters: {name, sense: 1 min | -1 max, status, sol_status}, objective:
//! {name, coefficients: [{name, value}]}, variables: [{name, cat: Continuous | Integer,
//! lowBound, upBound, varValue, dj}], constraints: [{name | null, sense: -1 ≤ | 0 = | 1 ≥,
//! coefficients, pi, constant}], sos1, sos2}`. A constraint reads `Σ coef·x + constant (sense)
//! 0`, so its right-hand side is `-constant`. Binaries are Integer with bounds 0 and 1. The
//! objective's constant term is not in the dict: it is carried beside it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    /// Its name (unique).
    pub name: String,
    /// Whether it must take integer values.
    pub integer: bool,
    /// Lower bound; `None` is −∞.
    pub lower: Option<f64>,
    /// Upper bound; `None` is +∞.
    pub upper: Option<f64>,
}

/// How a constraint's left side compares with its right side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// `≤`
    LessOrEqual,
    /// `=`
    Equal,
    /// `≥`
    GreaterOrEqual,
}

/// A linear constraint `Σ coefficient·variable (relation) rhs`.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    /// Its name; PuLP leaves unnamed constraints without one.
    pub name: Option<String>,
    /// Coefficients by variable name.
    pub coefficients: Vec<(String, f64)>,
    /// The relation.
    pub relation: Relation,
    /// The right-hand side.
    pub rhs: f64,
}

/// A mixed-integer linear program.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The problem's name.
    pub name: String,
    /// Minimise (true) or maximise.
    pub minimise: bool,
    /// Objective coefficients by variable name.
    pub objective: Vec<(String, f64)>,
    /// The objective's constant term.
    pub objective_constant: f64,
    /// The variables, in PuLP's order.
    pub variables: Vec<Variable>,
    /// The constraints.
    pub constraints: Vec<Constraint>,
}

/// How a solve ended. Never `Optimal` unless the solver proved optimality.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SolveStatus {
    /// Proven optimal.
    Optimal,
    /// No solution satisfies the constraints.
    Infeasible,
    /// The objective can improve without limit.
    Unbounded,
    /// One of the two; the solver cannot tell which.
    InfeasibleOrUnbounded,
    /// The time limit was reached; the best solution found so far (if any) is reported.
    Timeout,
    /// The solver failed.
    Error,
}

/// What a solver found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// How the solve ended.
    pub status: SolveStatus,
    /// The objective value, constant included, when there is a solution.
    pub objective_value: Option<f64>,
    /// Variable values by name (empty without a solution).
    pub variables: BTreeMap<String, f64>,
    /// Wall-clock time of the solve.
    pub solve_time_seconds: f64,
    /// What went wrong, for `Error` (and why there are no values, when there are none).
    pub message: Option<String>,
}

/// What a solver found, before the objective constant and the timing are added.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub status: SolveStatus,
    /// The objective (without constant) and the values by name, when there is a solution.
    pub values: Option<(f64, BTreeMap<String, f64>)>,
    pub message: Option<String>,
}

impl Outcome {
    /// An outcome without values.
    pub fn bare(status: SolveStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            values: None,
            message: Some(message.into()),
        }
    }

    /// An [`SolveStatus::Error`] saying `message`.
    pub fn error(message: impl Into<String>) -> Self {
        Self::bare(SolveStatus::Error, message)
    }

    /// The solution, with `objective_constant` added back, of a solve that began at `started`.
    pub fn into_solution(self, objective_constant: f64, started: std::time::Instant) -> Solution {
        let (objective_value, variables) = match self.values {
            Some((objective, values)) => (Some(objective + objective_constant), values),
            None => (None, BTreeMap::new()),
        };
        Solution {
            status: self.status,
            objective_value,
            variables,
            solve_time_seconds: started.elapsed().as_secs_f64(),
            message: self.message,
        }
    }
}

impl Model {
    /// Reads PuLP's dict; `objective_constant` is the constant `toDict` drops.
    pub fn from_pulp(dict: &Value, objective_constant: f64) -> Result<Self, String> {
        let parameters = dict
            .get("parameters")
            .ok_or("the problem has no parameters")?;
        for sos in ["sos1", "sos2"] {
            let present = match dict.get(sos) {
                None | Some(Value::Null) => false,
                Some(Value::Array(sets)) => !sets.is_empty(),
                Some(Value::Object(sets)) => !sets.is_empty(),
                Some(_) => true,
            };
            if present {
                // Dropping them would solve a relaxation and call it optimal.
                return Err(format!(
                    "special ordered sets ({sos}) are not supported; model them with binary variables"
                ));
            }
        }
        let minimise = match parameters.get("sense").and_then(Value::as_i64) {
            Some(1) => true,
            Some(-1) => false,
            other => return Err(format!("unknown objective sense {other:?}")),
        };
        let name = parameters
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("problem")
            .to_owned();
        let objective = match dict.get("objective") {
            None | Some(Value::Null) => Vec::new(),
            Some(objective) => coefficients(objective.get("coefficients"))?,
        };
        let variables = dict
            .get("variables")
            .and_then(Value::as_array)
            .ok_or("the problem has no variables list")?
            .iter()
            .map(|variable| {
                let name = variable
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or("a variable has no name")?;
                let integer = match variable.get("cat").and_then(Value::as_str) {
                    Some("Integer") => true,
                    Some("Continuous") | None => false,
                    Some(other) => {
                        return Err(format!("variable {name} has unknown category {other}"));
                    }
                };
                Ok(Variable {
                    name: name.to_owned(),
                    integer,
                    lower: variable.get("lowBound").and_then(Value::as_f64),
                    upper: variable.get("upBound").and_then(Value::as_f64),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let constraints = dict
            .get("constraints")
            .and_then(Value::as_array)
            .ok_or("the problem has no constraints list")?
            .iter()
            .map(|constraint| {
                let relation = match constraint.get("sense").and_then(Value::as_i64) {
                    Some(-1) => Relation::LessOrEqual,
                    Some(0) => Relation::Equal,
                    Some(1) => Relation::GreaterOrEqual,
                    other => return Err(format!("a constraint has unknown sense {other:?}")),
                };
                Ok(Constraint {
                    name: constraint
                        .get("name")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    coefficients: coefficients(constraint.get("coefficients"))?,
                    relation,
                    rhs: -constraint
                        .get("constant")
                        .and_then(Value::as_f64)
                        .unwrap_or(0.0),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            name,
            minimise,
            objective,
            objective_constant,
            variables,
            constraints,
        })
    }

    /// Numbers for a summary: variables, constraints, integer variables.
    pub fn counts(&self) -> (usize, usize, usize) {
        let integers = self.variables.iter().filter(|v| v.integer).count();
        (self.variables.len(), self.constraints.len(), integers)
    }
}

fn coefficients(list: Option<&Value>) -> Result<Vec<(String, f64)>, String> {
    let Some(Value::Array(items)) = list else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .map(|item| {
            let name = item
                .get("name")
                .and_then(Value::as_str)
                .ok_or("a coefficient has no variable name")?;
            let value = item
                .get("value")
                .and_then(Value::as_f64)
                .ok_or("a coefficient has no value")?;
            Ok((name.to_owned(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_a_pulp_dict() {
        let dict = json!({
            "parameters": {"name": "demo", "sense": -1, "status": 0, "sol_status": 0},
            "objective": {"name": "profit", "coefficients": [{"name": "x", "value": 3.0}, {"name": "y", "value": 2.0}]},
            "variables": [
                {"name": "x", "cat": "Integer", "lowBound": 0, "upBound": null, "varValue": null, "dj": null},
                {"name": "y", "cat": "Continuous", "lowBound": null, "upBound": 4.5, "varValue": null, "dj": null}
            ],
            "constraints": [
                {"name": "cap", "sense": -1, "coefficients": [{"name": "x", "value": 1}, {"name": "y", "value": 1}], "pi": null, "constant": -10},
                {"name": null, "sense": 0, "coefficients": [{"name": "x", "value": 1}], "pi": null, "constant": -3}
            ],
            "sos1": [], "sos2": []
        });
        let model = Model::from_pulp(&dict, 7.5).unwrap();
        assert!(!model.minimise);
        assert_eq!(model.objective_constant, 7.5);
        assert_eq!(
            model.variables[0],
            Variable {
                name: "x".into(),
                integer: true,
                lower: Some(0.0),
                upper: None
            }
        );
        assert_eq!(model.variables[1].lower, None);
        assert_eq!(model.constraints[0].rhs, 10.0);
        assert_eq!(
            model.constraints[1],
            Constraint {
                name: None,
                coefficients: vec![("x".into(), 1.0)],
                relation: Relation::Equal,
                rhs: 3.0,
            }
        );
        assert_eq!(model.counts(), (2, 2, 1));
    }

    #[test]
    fn refuses_what_is_not_a_pulp_dict() {
        assert!(Model::from_pulp(&json!({}), 0.0).is_err());
        assert!(Model::from_pulp(&json!({"parameters": {"sense": 2}}), 0.0).is_err());
        let with_sos = json!({
            "parameters": {"name": "s", "sense": 1},
            "objective": null,
            "variables": [{"name": "x", "cat": "Continuous", "lowBound": 0, "upBound": 1}],
            "constraints": [],
            "sos1": {"s1": {"x": 1}}, "sos2": []
        });
        let refused = Model::from_pulp(&with_sos, 0.0).unwrap_err();
        assert!(refused.contains("special ordered sets (sos1)"), "{refused}");
    }
}
