//! The built-in MIP tools called the way the MIP suites call them, and the PuLP models they
//! share.

use reqwest::StatusCode;
use serde_json::Value;

use crate::system::{Answer, System};

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
