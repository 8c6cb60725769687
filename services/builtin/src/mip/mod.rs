//! The MIP tools (claim-check pattern): an LLM writes PuLP code; the relay builds the model in
//! a sandboxed Python, solves it (HiGHS in-process, or a ReMIP server), checks it, and only
//! small ids pass through the LLM's context.
//!
//! * `generate_mip_problem {problemDefinitionCode}` → `{problemId, summary, stdout}`
//! * `solve_mip_problem {problemId, timeLimitSeconds?}` → `{solutionId, status, objectiveValue,
//!   solveTimeSeconds}`
//! * `validate_mip_solution {solutionId, validationCode}` → `{status: success|failure, message}`
//! * `get_mip_solution {solutionId, includeZero?, limit?, offset?}` → the values, paged
//!
//! Ids are kept for an hour in the relay's store, namespaced by scope (the session, the MCP
//! session, or a `scope` the caller names). Sandbox runs and solves are limited in number at
//! once, shared fairly between clients ([`turns`]), and to one at a time per scope.

pub mod highs;
pub mod model;
pub mod remip;
pub mod sandbox;
mod seccomp;
pub mod turns;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};

use self::model::{Model, Solution};
use self::sandbox::{Sandbox, SandboxConfig};
use self::turns::{Turn, Turns};
use crate::plantuml::read_only;
use toolrelay_relay::builtin::{
    Context, FailureCode, FailureKind, Scope, SharedLock, Tool, ToolCode, ToolFailure, ToolHints,
};
use toolrelay_relay::limits::{DEFAULT_IPV6_PREFIX, client_key};
use toolrelay_relay::metrics::{Metrics, MipOutcome, MipTool};

/// Settings of the MIP tools.
#[derive(Debug, Clone)]
pub struct MipConfig {
    /// The Python sandbox.
    pub sandbox: SandboxConfig,
    /// A ReMIP server to solve with instead of HiGHS (`REMIP_URL`).
    pub remip_url: Option<String>,
    /// Sandbox runs and solves at once (`MIP_MAX_CONCURRENT`).
    pub max_concurrent: usize,
    /// How long a call waits for its turn when every slot is taken (`MIP_QUEUE_WAIT_SECONDS`).
    pub queue_wait: Duration,
}

impl Default for MipConfig {
    fn default() -> Self {
        Self {
            sandbox: SandboxConfig::default(),
            remip_url: None,
            max_concurrent: 2,
            queue_wait: DEFAULT_QUEUE_WAIT,
        }
    }
}

/// How long a call waits for its turn by default.
pub const DEFAULT_QUEUE_WAIT: Duration = Duration::from_secs(10);

/// Solve time when the caller gives none.
const DEFAULT_TIME_LIMIT: f64 = 30.0;
/// Longest solve a caller may ask for.
const MAX_TIME_LIMIT: f64 = 120.0;
/// Values returned per page by default, and at most.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

const SCOPE_PROPERTY: &str = "Only outside a session: any string you choose that identifies you (e.g. a conversation id). Ids are found again only with the same scope.";

/// What the four tools share: the sandbox, the solver, and the limits on work at once.
struct Mip {
    sandbox: Sandbox,
    remip: Option<(reqwest::Client, String)>,
    /// The slots of this replica, shared fairly between clients.
    turns: Turns,
    /// Scopes with a run or solve under way or waiting for its turn. A std mutex: taken for an
    /// insert or remove.
    busy_scopes: Mutex<HashSet<String>>,
}

/// Permission to run one sandbox run or solve; released when dropped.
struct Admission {
    mip: Arc<Mip>,
    scope: String,
    /// The slot, given back (to the next waiter) when the admission ends.
    turn: Option<Turn>,
    /// The scope's lock in the store, so that one run per scope holds across replicas.
    shared: Option<SharedLock>,
}

impl Admission {
    /// Ends the run's admission now, its shared lock released before this returns, so that
    /// the caller's next call (on any replica) finds it free. Dropping does the same, with the
    /// shared lock released in the background.
    async fn release(mut self) {
        // The slot first: the next waiter need not wait for the store.
        self.turn.take();
        if let Some(lock) = self.shared.take() {
            lock.release().await;
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.mip.scopes().remove(&self.scope);
    }
}

/// The caller already has a run under way.
fn scope_busy() -> ToolFailure {
    ToolFailure {
        kind: FailureKind::Busy,
        code: ToolCode::Busy.into(),
        message: "You already have a model running; wait for it to finish, then try again.".into(),
        retry_after: Some(Duration::from_secs(5)),
    }
}

/// Whose turn a run takes ([`turns`]): the session for a call through a session, else the
/// client's address (IPv6 by /64), else (a caller the relay does not know) the scope.
fn turn_key(context: &Context, scope: &str) -> String {
    match (&context.scope, context.client) {
        (Scope::Session(_), _) | (_, None) => scope.to_owned(),
        // The relay keyed the address already (its /GUARD_IPV6_PREFIX); keying it again keeps
        // a tool context made elsewhere from holding 2^64 keys.
        (_, Some(address)) => format!("client:{}", client_key(address, DEFAULT_IPV6_PREFIX)),
    }
}

impl Mip {
    /// Admits one run for `scope`, or says to come back later (HTTP 429 with Retry-After):
    /// the scope's lock here, a turn for one of this replica's slots (waiting for it up to
    /// `MIP_QUEUE_WAIT_SECONDS`), then the scope's lock in the store, where every replica looks.
    async fn admit(
        self: &Arc<Self>,
        scope: &str,
        context: &Context,
    ) -> Result<Admission, ToolFailure> {
        if !self.scopes().insert(scope.to_owned()) {
            return Err(scope_busy());
        }
        // Made first, so that a failure below frees the scope.
        let mut admission = Admission {
            mip: Arc::clone(self),
            scope: scope.to_owned(),
            turn: None,
            shared: None,
        };
        admission.turn = Some(self.turns.take(&turn_key(context, scope)).await?);
        match context.tickets.lock(&format!("mip:{scope}")).await? {
            Some(lock) => admission.shared = Some(lock),
            None => return Err(scope_busy()),
        }
        Ok(admission)
    }

    /// Whether [`Mip::admit`] would take a run for the context's scope now (it may wait for
    /// its turn): not while the scope has one under way here.
    fn ready(&self, context: &Context) -> Result<(), ToolFailure> {
        match context.scope.key() {
            Some(scope) if self.scopes().contains(&scope) => Err(scope_busy()),
            _ => Ok(()),
        }
    }

    fn scopes(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.busy_scopes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn solve(&self, model: Model, dict: &Value, time_limit: Duration) -> Solution {
        match &self.remip {
            Some((client, url)) => {
                remip::solve(client, url, dict, model.objective_constant, time_limit).await
            }
            None => {
                match tokio::task::spawn_blocking(move || highs::solve(&model, time_limit)).await {
                    Ok(solution) => solution,
                    Err(error) => Solution {
                        status: model::SolveStatus::Error,
                        objective_value: None,
                        variables: Default::default(),
                        solve_time_seconds: 0.0,
                        message: Some(format!("the solver stopped unexpectedly: {error}")),
                    },
                }
            }
        }
    }
}

/// The four MIP tools over one shared sandbox and solver, reporting their slots to `metrics`.
pub fn tools(config: &MipConfig, metrics: &Metrics) -> Vec<Arc<dyn Tool>> {
    let gauges = metrics.clone();
    let mip = Arc::new(Mip {
        sandbox: Sandbox::new(config.sandbox.clone()),
        remip: config
            .remip_url
            .as_ref()
            .map(|url| (reqwest::Client::new(), url.trim_end_matches('/').to_owned())),
        turns: Turns::new(config.max_concurrent, config.queue_wait)
            .reporting(move |busy, waiting| gauges.mip_slots(busy, waiting)),
        busy_scopes: Mutex::new(HashSet::new()),
    });
    vec![
        Arc::new(Generate(Arc::clone(&mip))),
        Arc::new(Solve(Arc::clone(&mip))),
        Arc::new(Validate(mip)),
        Arc::new(GetSolution),
    ]
}

/// The namespace of the caller's ids: the session or MCP session, else the `scope` argument.
fn scope_of(context: &Context, args: &Value) -> Result<String, ToolFailure> {
    if let Some(key) = context.scope.key() {
        return Ok(key);
    }
    match args
        .get("scope")
        .and_then(Value::as_str)
        .filter(|scope| !scope.trim().is_empty())
    {
        Some(scope) => Ok(Scope::Caller(scope.to_owned()).key().unwrap_or_default()),
        None => Err(ToolFailure::new(
            FailureKind::BadInput,
            ToolCode::ScopeRequired,
            "Outside a session, pass a scope (the \"scope\" argument, or ?scope= on /api/tools): any string that identifies you, e.g. a conversation id. Use the same scope for the later calls.",
        )),
    }
}

/// Runs a call of `tool`, counting it by how it ended (`toolrelay_mip_runs_total`).
async fn measured(
    tool: MipTool,
    context: &Context,
    run: impl Future<Output = Result<Value, ToolFailure>>,
) -> Result<Value, ToolFailure> {
    let started = Instant::now();
    let result = run.await;
    context
        .metrics
        .mip_run(tool, outcome_of(&result), started.elapsed());
    result
}

/// How a run ended, for the metrics: a solve answers `timeout` and `error` as results.
fn outcome_of(result: &Result<Value, ToolFailure>) -> MipOutcome {
    match result {
        Ok(answer) => match answer["status"].as_str() {
            Some("timeout") => MipOutcome::Timeout,
            Some("error") => MipOutcome::Error,
            _ => MipOutcome::Ok,
        },
        Err(failure) => match (failure.kind, failure.code) {
            (_, FailureCode::Tool(ToolCode::RunStopped)) => MipOutcome::Stopped,
            (
                _,
                FailureCode::Tool(
                    ToolCode::SandboxUnavailable | ToolCode::StoreUnavailable | ToolCode::StoreFull,
                ),
            )
            | (FailureKind::Unavailable, _) => MipOutcome::Unavailable,
            (FailureKind::Busy, _) => MipOutcome::Busy,
            (FailureKind::BadInput | FailureKind::TooLarge | FailureKind::NotFound, _) => {
                MipOutcome::Invalid
            }
            (FailureKind::Internal, _) => MipOutcome::Error,
        },
    }
}

fn python_failure(outcome: &Value) -> ToolFailure {
    let error = outcome["error"].as_str().unwrap_or("the code failed");
    let trace = outcome["traceback"].as_str().unwrap_or_default();
    let message = if trace.is_empty() {
        error.to_owned()
    } else {
        format!("{error}\n{trace}")
    };
    // The runner names its own refusals (INVALID_MODEL, MODEL_TOO_LARGE); else the code raised.
    let code = outcome["code"]
        .as_str()
        .and_then(ToolCode::parse)
        .unwrap_or(ToolCode::PythonError);
    let kind = match code {
        ToolCode::ModelTooLarge => FailureKind::TooLarge,
        _ => FailureKind::BadInput,
    };
    ToolFailure::new(kind, code, message)
}

fn not_found(what: &str, id: &str) -> ToolFailure {
    ToolFailure::new(
        FailureKind::NotFound,
        ToolCode::NotFound,
        format!(
            "No {what} {id} here: ids live for one hour and only in the scope (session) that made them. Make it again."
        ),
    )
}

/// A stored value of `kind` ("problem" or "solution").
async fn ticket(
    context: &Context,
    scope: &str,
    id: &str,
    kind: &str,
) -> Result<Arc<Value>, ToolFailure> {
    match context.tickets.get(scope, id).await? {
        Some(value) if value["kind"] == kind => Ok(value),
        _ => Err(not_found(kind, id)),
    }
}

fn text_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolFailure> {
    match args.get(name).and_then(Value::as_str) {
        Some(text) if !text.trim().is_empty() => Ok(text),
        _ => Err(ToolFailure::new(
            FailureKind::BadInput,
            ToolCode::EmptyCode,
            format!("{name} is required and cannot be empty."),
        )),
    }
}

struct Generate(Arc<Mip>);
struct Solve(Arc<Mip>);
struct Validate(Arc<Mip>);
struct GetSolution;

/// What a solve ends with (SPEC §7).
const STATUSES: [&str; 6] = [
    "optimal",
    "infeasible",
    "unbounded",
    "infeasible_or_unbounded",
    "timeout",
    "error",
];

/// A tool that only adds (a ticket of its scope): neither read-only nor destructive.
fn adds(title: &str) -> ToolHints {
    ToolHints {
        title: Some(title.to_owned()),
        read_only: Some(false),
        destructive: Some(false),
        idempotent: Some(false),
        untrusted_content: None,
    }
}

#[async_trait]
impl Tool for Generate {
    fn ready(&self, context: &Context) -> Result<(), ToolFailure> {
        self.0.ready(context)
    }

    fn name(&self) -> &'static str {
        "generate_mip_problem"
    }

    fn description(&self) -> &'static str {
        "Builds a mixed-integer program from Python code using PuLP 3 (import pulp; define exactly one pulp.LpProblem with variables, objective and constraints; do not solve it). Runs in a sandbox; returns a problemId for solve_mip_problem, a summary and what the code printed."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "problemDefinitionCode": {"type": "string", "description": "Python using PuLP 3.x, e.g. prob = pulp.LpProblem('plan', pulp.LpMaximize); x = pulp.LpVariable('x', 0, cat='Integer'); prob += 3*x; prob += x <= 4"},
                "scope": {"type": "string", "description": SCOPE_PROPERTY}
            },
            "required": ["problemDefinitionCode"],
            "additionalProperties": false
        })
    }

    fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "problemId": {"type": "string", "description": "The problem, for solve_mip_problem."},
                "summary": {
                    "type": "object",
                    "properties": {
                        "variables": {"type": "integer"},
                        "constraints": {"type": "integer"},
                        "integers": {"type": "integer"}
                    },
                    "required": ["variables", "constraints", "integers"]
                },
                "stdout": {"type": "string", "description": "What the code printed."}
            },
            "required": ["problemId", "summary", "stdout"]
        })
    }

    fn hints(&self) -> ToolHints {
        adds("Generate MIP problem")
    }

    async fn call(&self, args: Value, context: &Context) -> Result<Value, ToolFailure> {
        measured(MipTool::Generate, context, self.generate(args, context)).await
    }
}

impl Generate {
    async fn generate(&self, args: Value, context: &Context) -> Result<Value, ToolFailure> {
        let scope = scope_of(context, &args)?;
        let code = text_arg(&args, "problemDefinitionCode")?;
        let mut outcome = {
            let admission = self.0.admit(&scope, context).await?;
            let outcome = self
                .0
                .sandbox
                .run(&json!({"mode": "generate", "code": code}))
                .await;
            admission.release().await;
            outcome?
        };
        if outcome["ok"] != true {
            return Err(python_failure(&outcome));
        }
        let mut dict = outcome["problem"].take();
        // PuLP never writes solver options; code that forges them must not lift the time limit.
        if let Some(fields) = dict.as_object_mut() {
            fields.remove("solver_options");
        }
        let constant = outcome["constant"].as_f64().unwrap_or(0.0);
        let model = Model::from_pulp(&dict, constant).map_err(|error| {
            ToolFailure::new(
                FailureKind::BadInput,
                ToolCode::InvalidModel,
                format!("PuLP produced a model the relay cannot read: {error}."),
            )
        })?;
        let (variables, constraints, integers) = model.counts();
        let summary =
            json!({"variables": variables, "constraints": constraints, "integers": integers});
        let stored =
            json!({"kind": "problem", "dict": dict, "constant": constant, "summary": summary});
        let problem_id = context.tickets.put(&scope, "prob", stored).await?;
        Ok(json!({
            "problemId": problem_id,
            "summary": summary,
            "stdout": outcome["stdout"].as_str().unwrap_or_default().trim(),
        }))
    }
}

#[async_trait]
impl Tool for Solve {
    fn ready(&self, context: &Context) -> Result<(), ToolFailure> {
        self.0.ready(context)
    }

    fn name(&self) -> &'static str {
        "solve_mip_problem"
    }

    fn description(&self) -> &'static str {
        "Solves a problem made by generate_mip_problem. Returns a solutionId and the status: optimal, infeasible, unbounded, infeasible_or_unbounded, timeout (best solution so far) or error, with the objective value."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "problemId": {"type": "string"},
                "timeLimitSeconds": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIME_LIMIT, "description": "Stop after this many seconds (default 30)."},
                "scope": {"type": "string", "description": SCOPE_PROPERTY}
            },
            "required": ["problemId"],
            "additionalProperties": false
        })
    }

    fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "solutionId": {"type": "string", "description": "The solution, for get_mip_solution and validate_mip_solution."},
                "status": {"type": "string", "enum": STATUSES},
                "objectiveValue": {"type": ["number", "null"]},
                "solveTimeSeconds": {"type": "number"},
                "message": {"type": "string"}
            },
            "required": ["solutionId", "status", "objectiveValue", "solveTimeSeconds"]
        })
    }

    fn hints(&self) -> ToolHints {
        adds("Solve MIP problem")
    }

    async fn call(&self, args: Value, context: &Context) -> Result<Value, ToolFailure> {
        measured(MipTool::Solve, context, self.solve(args, context)).await
    }
}

impl Solve {
    async fn solve(&self, args: Value, context: &Context) -> Result<Value, ToolFailure> {
        let scope = scope_of(context, &args)?;
        let problem_id = text_arg(&args, "problemId")?;
        let problem = ticket(context, &scope, problem_id, "problem").await?;
        let constant = problem["constant"].as_f64().unwrap_or(0.0);
        let model = Model::from_pulp(&problem["dict"], constant).map_err(|error| {
            ToolFailure::new(FailureKind::Internal, ToolCode::InvalidModel, error)
        })?;
        let seconds = args["timeLimitSeconds"]
            .as_f64()
            .unwrap_or(DEFAULT_TIME_LIMIT)
            .clamp(0.01, MAX_TIME_LIMIT);
        let admission = self.0.admit(&scope, context).await?;
        // In its own task, holding the admission: a caller that goes away cannot leave a
        // solve running outside the limits (HiGHS cannot be stopped once started).
        let mip = Arc::clone(&self.0);
        let stored_problem = Arc::clone(&problem);
        let solving = tokio::spawn(async move {
            let solution = mip
                .solve(
                    model,
                    &stored_problem["dict"],
                    Duration::from_secs_f64(seconds),
                )
                .await;
            admission.release().await;
            solution
        });
        let mut solution = solving.await.map_err(|error| {
            ToolFailure::new(
                FailureKind::Internal,
                ToolCode::SolverFailed,
                format!("The solver stopped unexpectedly: {error}."),
            )
        })?;
        // PuLP adds a fixed `__dummy` variable to models without an objective; it is not theirs.
        solution.variables.remove("__dummy");
        let mut stored = serde_json::to_value(&solution).unwrap_or_default();
        stored["kind"] = json!("solution");
        stored["problemId"] = json!(problem_id);
        let solution_id = context.tickets.put(&scope, "sol", stored).await?;
        let mut answer = json!({
            "solutionId": solution_id,
            "status": solution.status,
            "objectiveValue": solution.objective_value,
            "solveTimeSeconds": solution.solve_time_seconds,
        });
        if let Some(message) = solution.message {
            answer["message"] = json!(message);
        }
        Ok(answer)
    }
}

#[async_trait]
impl Tool for Validate {
    fn ready(&self, context: &Context) -> Result<(), ToolFailure> {
        self.0.ready(context)
    }

    fn name(&self) -> &'static str {
        "validate_mip_solution"
    }

    fn description(&self) -> &'static str {
        "Checks a solution with Python: `solution` is {status, objective_value, variables: {name: value}}; use assert. Returns status failure with the error when the code raises, else success with what it printed."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "solutionId": {"type": "string"},
                "validationCode": {"type": "string", "description": "e.g. assert solution['status'] == 'optimal'; assert solution['variables']['x'] <= 4; print(solution['objective_value'])"},
                "scope": {"type": "string", "description": SCOPE_PROPERTY}
            },
            "required": ["solutionId", "validationCode"],
            "additionalProperties": false
        })
    }

    fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "status": {"type": "string", "enum": ["success", "failure"]},
                "message": {"type": "string"}
            },
            "required": ["status", "message"]
        })
    }

    fn hints(&self) -> ToolHints {
        read_only("Validate MIP solution")
    }

    async fn call(&self, args: Value, context: &Context) -> Result<Value, ToolFailure> {
        measured(MipTool::Validate, context, self.validate(args, context)).await
    }
}

impl Validate {
    async fn validate(&self, args: Value, context: &Context) -> Result<Value, ToolFailure> {
        let scope = scope_of(context, &args)?;
        let solution_id = text_arg(&args, "solutionId")?;
        let code = text_arg(&args, "validationCode")?;
        let solution = ticket(context, &scope, solution_id, "solution").await?;
        let bound = json!({
            "status": solution["status"],
            "objective_value": solution["objective_value"],
            "variables": solution["variables"],
        });
        let outcome = {
            let admission = self.0.admit(&scope, context).await?;
            let outcome = self
                .0
                .sandbox
                .run(&json!({"mode": "validate", "code": code, "solution": bound}))
                .await;
            admission.release().await;
            outcome?
        };
        if outcome["ok"] != true {
            let error = outcome["error"]
                .as_str()
                .unwrap_or("the validation code failed");
            return Ok(json!({"status": "failure", "message": error}));
        }
        let printed = outcome["stdout"].as_str().unwrap_or_default().trim();
        let message = if printed.is_empty() {
            "validation passed"
        } else {
            printed
        };
        Ok(json!({"status": "success", "message": message}))
    }
}

#[async_trait]
impl Tool for GetSolution {
    fn name(&self) -> &'static str {
        "get_mip_solution"
    }

    fn description(&self) -> &'static str {
        "Reads the variable values of a solution, sorted by name and paged (limit default 100, at most 1000); zero values are left out unless includeZero is true."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "solutionId": {"type": "string"},
                "includeZero": {"type": "boolean"},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
                "offset": {"type": "integer", "minimum": 0},
                "scope": {"type": "string", "description": SCOPE_PROPERTY}
            },
            "required": ["solutionId"],
            "additionalProperties": false
        })
    }

    fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "solutionId": {"type": "string"},
                "status": {"type": "string", "enum": STATUSES},
                "objectiveValue": {"type": ["number", "null"]},
                "total": {"type": "integer", "description": "Variables in all pages."},
                "offset": {"type": "integer"},
                "variables": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "value": {"type": "number"}},
                        "required": ["name", "value"]
                    }
                }
            },
            "required": ["solutionId", "status", "objectiveValue", "total", "offset", "variables"]
        })
    }

    fn hints(&self) -> ToolHints {
        read_only("Get MIP solution")
    }

    async fn call(&self, args: Value, context: &Context) -> Result<Value, ToolFailure> {
        let scope = scope_of(context, &args)?;
        let solution_id = text_arg(&args, "solutionId")?;
        let solution = ticket(context, &scope, solution_id, "solution").await?;
        let include_zero = args["includeZero"].as_bool().unwrap_or(false);
        let limit = args["limit"]
            .as_u64()
            .map_or(DEFAULT_PAGE, |limit| limit as usize)
            .min(MAX_PAGE);
        let offset = args["offset"].as_u64().unwrap_or(0) as usize;
        let values: Vec<(&String, f64)> = solution["variables"]
            .as_object()
            .map(|variables| {
                variables
                    .iter()
                    .filter_map(|(name, value)| value.as_f64().map(|value| (name, value)))
                    .filter(|(_, value)| include_zero || value.abs() > 1e-9)
                    .collect()
            })
            .unwrap_or_default();
        let page: Vec<Value> = values
            .iter()
            .skip(offset)
            .take(limit)
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect();
        Ok(json!({
            "solutionId": solution_id,
            "status": solution["status"],
            "objectiveValue": solution["objective_value"],
            "total": values.len(),
            "offset": offset,
            "variables": page,
        }))
    }
}
