// The built-in tools through the official TypeScript MCP SDK (@modelcontextprotocol/sdk), a
// client that checks every structured result against the tool's outputSchema: each tool is
// called with good input and with failing input, and every tool of /mcp has a title and
// annotations. No browser needed: this runs in node against the real relay.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { startRelay } from '../harness.mjs';

const PLAN = `
import pulp
prob = pulp.LpProblem("plan", pulp.LpMaximize)
x = pulp.LpVariable("x", 0, 4, cat="Integer")
y = pulp.LpVariable("y", 0, 3)
prob += 3 * x + 2 * y
prob += x + y <= 5
print("built")
`;

// `/mcp`'s pairing tools: their results are the session's (or the pairing's), with no schema.
const PAIRING = ['open_codap', 'connect_session', 'list_session_tools', 'call_session_tool', 'read_session_tool', 'codap_status'];

let relay;
before(async () => {
  relay = await startRelay();
});
after(async () => {
  await relay?.stop();
});

async function connected() {
  const client = new Client({ name: 'toolrelay-tests', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${relay.base}/mcp`)));
  return client;
}

/** Calls `name`; the SDK throws when the structured content breaks the outputSchema. */
async function call(client, name, args) {
  return client.callTool({ name, arguments: args });
}

function succeeded(result, name) {
  assert.notEqual(result.isError, true, `${name}: ${JSON.stringify(result)}`);
  return result.structuredContent;
}

function failed(result, name, code) {
  assert.equal(result.isError, true, `${name}: ${JSON.stringify(result)}`);
  assert.equal(result.structuredContent?.error?.code, code, `${name}: ${JSON.stringify(result)}`);
}

test('every tool of /mcp has a title and annotations, built-in tools an outputSchema', async () => {
  const client = await connected();
  try {
    assert.ok(client.getServerVersion().icons?.length > 0, 'the relay has an icon');
    const { tools } = await client.listTools();
    assert.ok(tools.length >= 11, tools.map((tool) => tool.name).join());
    for (const name of PAIRING) assert.ok(tools.some((tool) => tool.name === name), `${name} is listed`);
    for (const tool of tools) {
      assert.ok(tool.title, `${tool.name} has a title`);
      for (const hint of ['readOnlyHint', 'destructiveHint', 'idempotentHint', 'openWorldHint']) {
        assert.equal(typeof tool.annotations?.[hint], 'boolean', `${tool.name} says ${hint}`);
      }
      const pairing = PAIRING.includes(tool.name);
      assert.equal(tool.outputSchema?.type === 'object', !pairing, `${tool.name}: outputSchema`);
    }
  } finally {
    await client.close();
  }
});

test('every built-in tool answers good input with results its outputSchema accepts, and bad input with a clear error', async () => {
  const client = await connected();
  try {
    // The SDK keeps the output schemas it lists and checks every call's result against them.
    const { tools } = await client.listTools();
    const builtins = tools.filter((tool) => tool.outputSchema).map((tool) => tool.name);
    const called = new Set();
    const good = async (name, args) => {
      called.add(name);
      return succeeded(await call(client, name, args), name);
    };
    const bad = async (name, args, code) => {
      called.add(name);
      failed(await call(client, name, args), name, code);
    };

    const diagram = '@startuml\nA -> B : hi\n@enduml';
    const encoded = await good('encodePlantUML', { plantumlCode: diagram, format: 'png' });
    assert.match(encoded.url, /\/plantuml\/png\//);
    assert.deepEqual(await good('decodePlantUML', { url: encoded.url }), { plantumlCode: diagram });
    await bad('encodePlantUML', { plantumlCode: '   ' }, 'EMPTY_CODE');
    await bad('encodePlantUML', { plantumlCode: 5 }, 'INVALID_ARGUMENTS');
    await bad('decodePlantUML', {}, 'EMPTY_CODE');

    const problem = await good('generate_mip_problem', { problemDefinitionCode: PLAN });
    assert.deepEqual(problem.summary, { variables: 2, constraints: 1, integers: 1 });
    assert.equal(problem.stdout, 'built');
    const solved = await good('solve_mip_problem', { problemId: problem.problemId });
    assert.equal(solved.status, 'optimal');
    assert.ok(Math.abs(solved.objectiveValue - 14) < 1e-6, JSON.stringify(solved));
    const valid = await good('validate_mip_solution', { solutionId: solved.solutionId, validationCode: "assert solution['status'] == 'optimal'" });
    assert.deepEqual(valid, { status: 'success', message: 'validation passed' });
    const broken = await good('validate_mip_solution', { solutionId: solved.solutionId, validationCode: "assert solution['objective_value'] < 0, 'too big'" });
    assert.equal(broken.status, 'failure');
    assert.match(broken.message, /too big/);
    const values = await good('get_mip_solution', { solutionId: solved.solutionId });
    assert.deepEqual(values.variables, [{ name: 'x', value: 4 }, { name: 'y', value: 1 }]);

    await bad('generate_mip_problem', { problemDefinitionCode: 'raise ValueError("no model here")' }, 'PYTHON_ERROR');
    await bad('solve_mip_problem', { problemId: 'prob_00000000000000000000000000000000' }, 'NOT_FOUND');
    await bad('validate_mip_solution', { solutionId: 'sol_00000000000000000000000000000000', validationCode: 'pass' }, 'NOT_FOUND');
    await bad('get_mip_solution', { solutionId: solved.solutionId, limit: 0 }, 'INVALID_ARGUMENTS');

    assert.deepEqual([...called].sort(), builtins.sort(), 'every built-in tool was called');
  } finally {
    await client.close();
  }
});

// A market split problem (Cornuéjols and Dawande): 6 equalities over 50 binaries with random
// coefficients, each right-hand side half its row's sum — hard for branch and bound, so a
// solve given 20 s runs its 20 s.
const MARKET_SPLIT = `
import random
import pulp
random.seed(7)
m, n = 6, 50
prob = pulp.LpProblem("market_split", pulp.LpMinimize)
x = [pulp.LpVariable(f"x{j}", cat="Binary") for j in range(n)]
s = [pulp.LpVariable(f"s{i}", lowBound=0) for i in range(m)]
t = [pulp.LpVariable(f"t{i}", lowBound=0) for i in range(m)]
prob += pulp.lpSum(s) + pulp.lpSum(t)
for i in range(m):
    a = [random.randint(0, 99) for _ in range(n)]
    prob += pulp.lpSum(a[j] * x[j] for j in range(n)) + s[i] - t[i] == sum(a) // 2
`;

test('a 20 s MIP solve reaches a client whose 10 s timeout is kept alive by progress', async () => {
  const client = await connected();
  try {
    const problem = succeeded(await call(client, 'generate_mip_problem', { problemDefinitionCode: MARKET_SPLIT }), 'generate');
    assert.deepEqual(problem.summary, { variables: 62, constraints: 6, integers: 50 });
    const heard = [];
    const started = Date.now();
    const result = await client.callTool(
      { name: 'solve_mip_problem', arguments: { problemId: problem.problemId, timeLimitSeconds: 20 } },
      undefined,
      { timeout: 10_000, resetTimeoutOnProgress: true, onprogress: (progress) => heard.push({ ...progress, at: Date.now() }) },
    );
    const took = Date.now() - started;
    const solved = succeeded(result, 'solve_mip_problem');
    assert.ok(took > 10_000, `the solve outlived the client's 10 s timeout (${took} ms): ${JSON.stringify(solved)}`);
    assert.ok(['timeout', 'optimal', 'feasible'].includes(solved.status), JSON.stringify(solved));
    assert.ok(heard.length >= 3, JSON.stringify(heard));
    const times = [started, ...heard.map((progress) => progress.at), started + took];
    const gaps = times.slice(1).map((at, i) => at - times[i]);
    assert.ok(gaps.every((gap) => gap <= 5_000), `progress at least every 5 s: ${gaps}`);
    const values = heard.map((progress) => progress.progress);
    assert.ok(values.every((value, i) => i === 0 || value > values[i - 1]), `increasing: ${values}`);
    assert.match(heard[0].message, /solve_mip_problem is running \(\d+ s\)/);
  } finally {
    await client.close();
  }
});
