//! Solving a [`Model`] with HiGHS in process (the `highs` crate, HiGHS 1.15 vendored).
//!
//! [`solve`] blocks the calling thread; the tools run it under `spawn_blocking`. It never
//! panics on a model a client sent: names that do not resolve and anything HiGHS refuses
//! become an [`SolveStatus::Error`] solution.
//!
//! The status never claims more than HiGHS proved. `Optimal` is reported only for HiGHS'
//! `Optimal`, and the relative MIP gap tolerance is set to 0 so that this means proven
//! optimal, not "within 0.01 %" (HiGHS' default). A time limit gives `Timeout`, with the
//! incumbent only when HiGHS holds a feasible primal solution. Iteration, memory, solution
//! or interrupt limits, and solver failures, give `Error` naming HiGHS' status.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::time::{Duration, Instant};

use highs::{HighsModelStatus, HighsSolutionStatus, RowProblem, Sense};

use super::model::{Constraint, Model, Outcome, Relation, Solution, SolveStatus};

/// How far an empty constraint's zero may stray from its right-hand side and still hold;
/// HiGHS' default primal feasibility tolerance.
const FEASIBILITY_TOLERANCE: f64 = 1e-7;

/// Solves `model` within `time_limit`.
pub fn solve(model: &Model, time_limit: Duration) -> Solution {
    let started = Instant::now();
    run(model, time_limit).into_solution(model.objective_constant, started)
}

fn run(model: &Model, time_limit: Duration) -> Outcome {
    let problem = match build(model) {
        Ok(problem) => problem,
        Err(message) => return Outcome::bare(SolveStatus::Error, message),
    };
    // HiGHS answers a model without columns with `ModelEmpty` whatever its rows say, so
    // such a model (whose rows are necessarily empty) is decided here.
    if model.variables.is_empty() {
        return decide_empty(model);
    }
    let sense = if model.minimise {
        Sense::Minimise
    } else {
        Sense::Maximise
    };
    let mut highs = match problem.try_optimise(sense) {
        Ok(highs) => highs,
        Err(status) => {
            return Outcome::bare(
                SolveStatus::Error,
                format!(
                    "HiGHS refused the model ({status:?}): check for infinite or huge coefficients"
                ),
            );
        }
    };
    let options = [
        highs.try_set_option("output_flag", false),
        highs.try_set_option("threads", 1),
        highs.try_set_option("time_limit", time_limit.as_secs_f64()),
        // HiGHS stops at a 0.01 % gap by default and calls that optimal.
        highs.try_set_option("mip_rel_gap", 0.0),
    ];
    if options.iter().any(Result::is_err) {
        return Outcome::bare(SolveStatus::Error, "HiGHS refused its options");
    }
    let solved = match highs.try_solve() {
        Ok(solved) => solved,
        Err(status) => {
            return Outcome::bare(
                SolveStatus::Error,
                format!("HiGHS failed to solve the model ({status:?})"),
            );
        }
    };
    let feasible = solved.primal_solution_status() == HighsSolutionStatus::Feasible;
    let values = || {
        let columns = solved.get_solution();
        let values = model
            .variables
            .iter()
            .zip(columns.columns())
            .map(|(variable, value)| (variable.name.clone(), *value))
            .collect();
        (solved.objective_value(), values)
    };
    match solved.status() {
        HighsModelStatus::Optimal if feasible => Outcome {
            status: SolveStatus::Optimal,
            values: Some(values()),
            message: None,
        },
        HighsModelStatus::Optimal => Outcome::bare(
            SolveStatus::Error,
            "HiGHS reported an optimum without a feasible solution",
        ),
        HighsModelStatus::Infeasible => Outcome::bare(
            SolveStatus::Infeasible,
            "no values satisfy all the constraints and bounds",
        ),
        HighsModelStatus::Unbounded => Outcome::bare(
            SolveStatus::Unbounded,
            "the objective can improve without limit: a bound or constraint is missing",
        ),
        HighsModelStatus::UnboundedOrInfeasible => Outcome::bare(
            SolveStatus::InfeasibleOrUnbounded,
            "HiGHS proved the model infeasible or unbounded without telling which: \
             bounding every variable tells them apart",
        ),
        HighsModelStatus::ReachedTimeLimit if feasible => {
            let gap = solved.mip_gap();
            let gap = if gap.is_finite() {
                format!(" (relative gap {:.3} %)", gap * 100.0)
            } else {
                String::new()
            };
            Outcome {
                status: SolveStatus::Timeout,
                values: Some(values()),
                message: Some(format!(
                    "the time limit of {} s was reached: these are the best values found{gap}, \
                     not proven optimal",
                    time_limit.as_secs_f64()
                )),
            }
        }
        HighsModelStatus::ReachedTimeLimit => Outcome::bare(
            SolveStatus::Timeout,
            format!(
                "the time limit of {} s was reached before any feasible solution was found",
                time_limit.as_secs_f64()
            ),
        ),
        other => Outcome::bare(
            SolveStatus::Error,
            format!("HiGHS stopped without an answer (model status {other:?})"),
        ),
    }
}

/// Checks that each variable is declared once and that every coefficient names one of them.
pub(crate) fn check_names(model: &Model) -> Result<(), String> {
    let positions = Positions::of(model)?;
    for (name, _) in &model.objective {
        positions.find(name, objective_place)?;
    }
    for (index, constraint) in model.constraints.iter().enumerate() {
        for (name, _) in &constraint.coefficients {
            positions.find(name, || constraint_place(index, constraint))?;
        }
    }
    Ok(())
}

/// Each variable's position, by name.
struct Positions<'a>(HashMap<&'a str, usize>);

impl<'a> Positions<'a> {
    fn of(model: &'a Model) -> Result<Self, String> {
        let mut positions = HashMap::with_capacity(model.variables.len());
        for (position, variable) in model.variables.iter().enumerate() {
            if positions.insert(variable.name.as_str(), position).is_some() {
                return Err(format!(
                    "the variable {:?} is declared twice",
                    variable.name
                ));
            }
        }
        Ok(Self(positions))
    }

    /// The position of `name`, used in the place `place` describes.
    fn find(&self, name: &str, place: impl FnOnce() -> String) -> Result<usize, String> {
        self.0.get(name).copied().ok_or_else(|| {
            format!(
                "{} uses the variable {name:?}, which is not among the model's variables",
                place()
            )
        })
    }
}

fn objective_place() -> String {
    "the objective".to_owned()
}

fn constraint_place(index: usize, constraint: &Constraint) -> String {
    match &constraint.name {
        Some(name) => format!("the constraint {name:?}"),
        None => format!("the unnamed constraint #{}", index + 1),
    }
}

/// The problem HiGHS is given: one column per variable, in order, and one row per constraint.
fn build(model: &Model) -> Result<RowProblem, String> {
    let positions = Positions::of(model)?;
    let mut costs = vec![0.0; model.variables.len()];
    for (name, coefficient) in &model.objective {
        costs[positions.find(name, objective_place)?] += coefficient;
    }
    let mut problem = RowProblem::new();
    let columns: Vec<_> = model
        .variables
        .iter()
        .zip(costs)
        .map(|(variable, cost)| {
            let bounds = (bound(variable.lower), bound(variable.upper));
            problem.add_column_with_integrality(cost, bounds, variable.integer)
        })
        .collect();
    for (index, constraint) in model.constraints.iter().enumerate() {
        // A variable listed twice in one row is summed: HiGHS rejects duplicate entries.
        let mut row: Vec<(highs::Col, f64)> = Vec::with_capacity(constraint.coefficients.len());
        let mut in_row: HashMap<usize, usize> = HashMap::new();
        for (name, coefficient) in &constraint.coefficients {
            let position = positions.find(name, || constraint_place(index, constraint))?;
            match in_row.get(&position) {
                Some(&entry) => row[entry].1 += coefficient,
                None => {
                    in_row.insert(position, row.len());
                    row.push((columns[position], *coefficient));
                }
            }
        }
        let rhs = Bound::Included(constraint.rhs);
        let bounds = match constraint.relation {
            Relation::LessOrEqual => (Bound::Unbounded, rhs),
            Relation::Equal => (rhs, rhs),
            Relation::GreaterOrEqual => (rhs, Bound::Unbounded),
        };
        problem.add_row(bounds, row);
    }
    Ok(problem)
}

fn bound(value: Option<f64>) -> Bound<f64> {
    value.map_or(Bound::Unbounded, Bound::Included)
}

/// A model without variables: optimal (the constant) when every empty row holds, else
/// infeasible.
fn decide_empty(model: &Model) -> Outcome {
    let holds = model
        .constraints
        .iter()
        .all(|constraint| match constraint.relation {
            Relation::LessOrEqual => constraint.rhs >= -FEASIBILITY_TOLERANCE,
            Relation::Equal => constraint.rhs.abs() <= FEASIBILITY_TOLERANCE,
            Relation::GreaterOrEqual => constraint.rhs <= FEASIBILITY_TOLERANCE,
        });
    if holds {
        Outcome {
            status: SolveStatus::Optimal,
            values: Some((0.0, BTreeMap::new())),
            message: None,
        }
    } else {
        Outcome::bare(
            SolveStatus::Infeasible,
            "a constraint without variables cannot hold",
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mip::model::Variable;

    const LIMIT: Duration = Duration::from_secs(30);

    fn variable(name: &str, integer: bool, lower: Option<f64>, upper: Option<f64>) -> Variable {
        Variable {
            name: name.into(),
            integer,
            lower,
            upper,
        }
    }

    fn constraint(
        name: Option<&str>,
        terms: &[(&str, f64)],
        relation: Relation,
        rhs: f64,
    ) -> Constraint {
        Constraint {
            name: name.map(str::to_owned),
            coefficients: terms.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect(),
            relation,
            rhs,
        }
    }

    /// Integers `x ∈ [0, 10]`, `y ≥ 0`, `v ≥ 0` (constraints only), binary `b`, continuous
    /// `z ≥ 0`, `u ∈ [0, 3]` (objective only) and free `w`; the LP relaxation of the maximum
    /// is fractional (x = 3.5), so the integrality matters.
    fn demo(minimise: bool, objective: &[(&str, f64)]) -> Model {
        Model {
            name: "demo".into(),
            minimise,
            objective: objective
                .iter()
                .map(|(n, c)| ((*n).to_owned(), *c))
                .collect(),
            objective_constant: 7.5,
            variables: vec![
                variable("x", true, Some(0.0), Some(10.0)),
                variable("y", true, Some(0.0), None),
                variable("b", true, Some(0.0), Some(1.0)),
                variable("z", false, Some(0.0), None),
                variable("u", false, Some(0.0), Some(3.0)),
                variable("v", true, Some(0.0), None),
                variable("w", false, None, None),
            ],
            constraints: vec![
                constraint(
                    Some("capacity"),
                    &[("x", 2.0), ("y", 3.0), ("z", 1.0)],
                    Relation::LessOrEqual,
                    11.5,
                ),
                constraint(
                    Some("link"),
                    &[("z", 1.0), ("b", -4.0)],
                    Relation::LessOrEqual,
                    0.5,
                ),
                constraint(None, &[("x", 1.0), ("v", 1.0)], Relation::Equal, 4.0),
                constraint(
                    Some("balance"),
                    &[("x", 1.0), ("y", 1.0), ("b", 1.0)],
                    Relation::GreaterOrEqual,
                    2.0,
                ),
                constraint(
                    Some("floor"),
                    &[("w", 1.0), ("b", -1.0)],
                    Relation::GreaterOrEqual,
                    -2.5,
                ),
            ],
        }
    }

    fn assert_values(solution: &Solution, expected: &[(&str, f64)]) {
        assert_eq!(solution.variables.len(), expected.len(), "{solution:?}");
        for (name, value) in expected {
            let got = solution.variables[*name];
            assert!(
                (got - value).abs() < 1e-6,
                "{name} = {got}, expected {value}"
            );
        }
    }

    #[test]
    fn finds_the_exact_maximum_of_a_small_mip() {
        let model = demo(
            false,
            &[
                ("x", 5.0),
                ("y", 4.0),
                ("z", 3.0),
                ("b", 2.0),
                ("u", 1.0),
                ("w", -1.0),
            ],
        );
        let solution = solve(&model, LIMIT);
        assert_eq!(solution.status, SolveStatus::Optimal, "{solution:?}");
        // 20 + 10.5 + 2 + 3 + 1.5, plus the constant 7.5 (checked by enumeration).
        assert!(
            (solution.objective_value.unwrap() - 44.5).abs() < 1e-6,
            "{solution:?}"
        );
        assert_values(
            &solution,
            &[
                ("x", 4.0),
                ("y", 0.0),
                ("b", 1.0),
                ("z", 3.5),
                ("u", 3.0),
                ("v", 0.0),
                ("w", -1.5),
            ],
        );
        assert_eq!(solution.message, None);
    }

    #[test]
    fn finds_the_exact_minimum_of_a_small_mip() {
        let model = demo(
            true,
            &[
                ("x", 1.0),
                ("y", 2.0),
                ("z", 3.0),
                ("b", -2.0),
                ("u", 1.0),
                ("w", 1.0),
            ],
        );
        let solution = solve(&model, LIMIT);
        assert_eq!(solution.status, SolveStatus::Optimal, "{solution:?}");
        // 1 - 2 - 1.5 + 7.5.
        assert!(
            (solution.objective_value.unwrap() - 5.0).abs() < 1e-6,
            "{solution:?}"
        );
        assert_values(
            &solution,
            &[
                ("x", 1.0),
                ("y", 0.0),
                ("b", 1.0),
                ("z", 0.0),
                ("u", 0.0),
                ("v", 3.0),
                ("w", -1.5),
            ],
        );
    }

    #[test]
    fn repeated_names_in_a_row_or_the_objective_are_summed() {
        let mut model = demo(
            false,
            &[
                ("x", 5.0),
                ("y", 4.0),
                ("z", 1.0),
                ("z", 2.0),
                ("b", 2.0),
                ("u", 1.0),
                ("w", -1.0),
            ],
        );
        model.constraints[0] = constraint(
            Some("capacity"),
            &[("x", 2.0), ("y", 1.0), ("y", 2.0), ("z", 1.0)],
            Relation::LessOrEqual,
            11.5,
        );
        let solution = solve(&model, LIMIT);
        assert_eq!(solution.status, SolveStatus::Optimal, "{solution:?}");
        assert!(
            (solution.objective_value.unwrap() - 44.5).abs() < 1e-6,
            "{solution:?}"
        );
    }

    #[test]
    fn an_infeasible_model_is_infeasible() {
        let mut model = demo(true, &[("x", 1.0)]);
        // x + v = 4 with v ≥ 0 and x ≥ 5.
        model.constraints.push(constraint(
            Some("too_much"),
            &[("x", 1.0)],
            Relation::GreaterOrEqual,
            5.0,
        ));
        let solution = solve(&model, LIMIT);
        assert_eq!(solution.status, SolveStatus::Infeasible, "{solution:?}");
        assert_eq!(solution.objective_value, None);
        assert!(solution.variables.is_empty());
    }

    fn ray(integer: bool) -> Model {
        Model {
            name: "ray".into(),
            minimise: false,
            objective: vec![("x".into(), 1.0)],
            objective_constant: 0.0,
            variables: vec![
                variable("x", integer, Some(0.0), None),
                variable("y", integer, Some(0.0), None),
            ],
            constraints: vec![constraint(
                Some("c"),
                &[("x", 1.0), ("y", -1.0)],
                Relation::LessOrEqual,
                1.0,
            )],
        }
    }

    #[test]
    fn an_unbounded_lp_is_unbounded() {
        let solution = solve(&ray(false), LIMIT);
        assert_eq!(solution.status, SolveStatus::Unbounded, "{solution:?}");
        assert_eq!(solution.objective_value, None);
    }

    #[test]
    fn an_unbounded_mip_is_reported_as_highs_proves_it() {
        let solution = solve(&ray(true), LIMIT);
        assert!(
            matches!(
                solution.status,
                SolveStatus::Unbounded | SolveStatus::InfeasibleOrUnbounded
            ),
            "{solution:?}"
        );
        assert_eq!(solution.objective_value, None);
        assert!(solution.variables.is_empty());
    }

    /// Whole numbers below `modulus`, the same for the same `seed` (a linear congruential
    /// generator: the test models must not change from run to run).
    fn numbers(seed: u64, modulus: u64) -> impl FnMut() -> f64 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % modulus) as f64
        }
    }

    /// A market split instance (Cornuéjols and Dawande): 5 equalities over 40 binaries with
    /// coefficients below 100. Branch and bound needs far more than the time given.
    fn market_split() -> Model {
        let mut next = numbers(12345, 100);
        let (names, constraints) = random_rows("x", 40, "r", 5, Relation::Equal, 0.5, &mut next);
        let objective = names.iter().map(|n| (n.clone(), 1.0)).collect();
        binary_model("split", true, &names, objective, constraints)
    }

    /// A knapsack over 10 resources with 150 items: a feasible packing is found at once,
    /// proving the best one takes much longer.
    fn knapsack() -> Model {
        let mut below_1000 = numbers(7, 1000);
        let mut next = move || below_1000() + 1.0;
        let (names, constraints) = random_rows(
            "item",
            150,
            "resource",
            10,
            Relation::LessOrEqual,
            1.0 / 3.0,
            &mut next,
        );
        let objective = names.iter().map(|n| (n.clone(), next())).collect();
        binary_model("knapsack", false, &names, objective, constraints)
    }

    /// `columns` variable names and `rows` rows over all of them with coefficients from
    /// `next`, each bounded by `share` of its coefficients' total (rounded down).
    fn random_rows(
        variable: &str,
        columns: usize,
        row: &str,
        rows: usize,
        relation: Relation,
        share: f64,
        next: &mut impl FnMut() -> f64,
    ) -> (Vec<String>, Vec<Constraint>) {
        let names: Vec<String> = (0..columns).map(|j| format!("{variable}{j}")).collect();
        let constraints = (0..rows)
            .map(|i| {
                let coefficients: Vec<(String, f64)> =
                    names.iter().map(|n| (n.clone(), next())).collect();
                let total: f64 = coefficients.iter().map(|(_, c)| c).sum();
                Constraint {
                    name: Some(format!("{row}{i}")),
                    coefficients,
                    relation,
                    rhs: (total * share).floor(),
                }
            })
            .collect();
        (names, constraints)
    }

    /// A model over binaries called `names`.
    fn binary_model(
        name: &str,
        minimise: bool,
        names: &[String],
        objective: Vec<(String, f64)>,
        constraints: Vec<Constraint>,
    ) -> Model {
        Model {
            name: name.into(),
            minimise,
            objective,
            objective_constant: 0.0,
            variables: names
                .iter()
                .map(|n| variable(n, true, Some(0.0), Some(1.0)))
                .collect(),
            constraints,
        }
    }

    /// A timeout is never optimal; values, when given, satisfy the model and match the objective.
    fn assert_honest_timeout(model: &Model, solution: &Solution) {
        assert_eq!(solution.status, SolveStatus::Timeout, "{solution:?}");
        let message = solution.message.as_deref().unwrap_or_default();
        assert!(message.contains("time limit"), "{message}");
        let Some(objective) = solution.objective_value else {
            assert!(solution.variables.is_empty());
            return;
        };
        let value = |name: &String| solution.variables[name];
        let computed: f64 = model
            .objective
            .iter()
            .map(|(n, c)| c * value(n))
            .sum::<f64>()
            + model.objective_constant;
        assert!(
            (computed - objective).abs() < 1e-6,
            "{computed} vs {objective}"
        );
        for constraint in &model.constraints {
            let lhs: f64 = constraint
                .coefficients
                .iter()
                .map(|(n, c)| c * value(n))
                .sum();
            let holds = match constraint.relation {
                Relation::LessOrEqual => lhs <= constraint.rhs + 1e-6,
                Relation::Equal => (lhs - constraint.rhs).abs() <= 1e-6,
                Relation::GreaterOrEqual => lhs >= constraint.rhs - 1e-6,
            };
            assert!(holds, "{constraint:?} violated: {lhs}");
        }
    }

    #[test]
    fn a_hard_model_times_out_without_claiming_an_optimum() {
        let model = market_split();
        let solution = solve(&model, Duration::from_millis(50));
        assert_honest_timeout(&model, &solution);
        assert!(solution.solve_time_seconds < 5.0, "{solution:?}");
    }

    #[test]
    fn a_timeout_with_an_incumbent_reports_it() {
        let model = knapsack();
        let solution = solve(&model, Duration::from_millis(50));
        assert_honest_timeout(&model, &solution);
        assert!(solution.objective_value.is_some(), "{solution:?}");
    }

    #[test]
    fn an_unknown_variable_is_an_error_not_a_panic() {
        let mut model = demo(true, &[("x", 1.0)]);
        model.constraints[2]
            .coefficients
            .push(("ghost".into(), 1.0));
        let solution = solve(&model, LIMIT);
        assert_eq!(solution.status, SolveStatus::Error);
        let message = solution.message.unwrap();
        assert!(
            message.contains("\"ghost\"") && message.contains("unnamed constraint #3"),
            "{message}"
        );

        let model = demo(true, &[("x", 1.0), ("phantom", 2.0)]);
        let solution = solve(&model, LIMIT);
        assert_eq!(solution.status, SolveStatus::Error);
        assert!(solution.message.unwrap().contains("\"phantom\""));
    }

    #[test]
    fn a_variable_declared_twice_is_an_error() {
        let mut model = demo(true, &[("x", 1.0)]);
        model.variables.push(variable("x", false, None, None));
        let solution = solve(&model, LIMIT);
        assert_eq!(solution.status, SolveStatus::Error);
        assert!(
            solution
                .message
                .unwrap()
                .contains("\"x\" is declared twice")
        );
    }

    #[test]
    fn a_model_without_variables_is_decided_by_its_rows() {
        let mut model = Model {
            name: "empty".into(),
            minimise: true,
            objective: vec![],
            objective_constant: 2.0,
            variables: vec![],
            constraints: vec![constraint(None, &[], Relation::LessOrEqual, 1.0)],
        };
        let solution = solve(&model, LIMIT);
        assert_eq!(
            (solution.status, solution.objective_value),
            (SolveStatus::Optimal, Some(2.0))
        );
        model
            .constraints
            .push(constraint(None, &[], Relation::GreaterOrEqual, 1.0));
        assert_eq!(solve(&model, LIMIT).status, SolveStatus::Infeasible);
    }

    #[test]
    fn concurrent_solves_agree() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    let model = demo(
                        false,
                        &[
                            ("x", 5.0),
                            ("y", 4.0),
                            ("z", 3.0),
                            ("b", 2.0),
                            ("u", 1.0),
                            ("w", -1.0),
                        ],
                    );
                    solve(&model, LIMIT)
                })
            })
            .collect();
        for thread in threads {
            let solution = thread.join().unwrap();
            assert_eq!(solution.status, SolveStatus::Optimal, "{solution:?}");
            assert!((solution.objective_value.unwrap() - 44.5).abs() < 1e-6);
        }
    }
}
