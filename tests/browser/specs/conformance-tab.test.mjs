// The official MCP conformance suite (@modelcontextprotocol/conformance 0.2.0-alpha.12, pinned
// in package.json) against a session's own connector URL, /mcp/s/{handle}, whose tab is the
// browser SDK offering the suite's fixture tools (conformance-tab/fixtures.html): the
// requirements frozen for 2025-11-25 and for 2026-07-28, so each fixture's content, progress
// and log lines cross the relay and a tab. What cannot apply through a tab is listed, with its
// reason, in tests/conformance/expected-failures-tab-<revision>.yml; anything else failing (a
// warning included), or a listed one passing, fails the run. The suite judges only the
// scenarios a revision scores by that list; the ones it runs without scoring (pending ones such
// as json-schema-2020-12, the tasks extension) are judged here by the same rule from their
// checks, so the tab's JSON Schema 2020-12 tool counts too. (/mcp's own run is
// tests/tests/mcp_eras.rs.)

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { artifact, launchBrowser, startPageHost, startRelay, until, watchErrors } from '../harness.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, '../../..');
const SUITE = path.join(HERE, '../node_modules/@modelcontextprotocol/conformance/dist/index.js');
const FIXTURES = path.join(HERE, '../conformance-tab/fixtures.html');
// A whole revision's run; each scenario has the suite's own 30 s.
const RUN_TIMEOUT_MS = 300000;

let relay;
let host;
let browser;
let context;
let connectorUrl;

before(async () => {
  relay = await startRelay();
  host = await startPageHost({ '/fixtures.html': readFileSync(FIXTURES, 'utf8') });
  browser = await launchBrowser();
  context = await browser.newContext();
  const page = await context.newPage();
  watchErrors(page);
  await page.goto(`${host.origin}/fixtures.html?relay=${encodeURIComponent(relay.base)}`);
  await until(page, () => window.relay?.ready);
  ({ connectorUrl } = await page.evaluate(() => window.relay.session));
  assert.match(connectorUrl, new RegExp(`^${relay.base}/mcp/s/[0-9a-f]{32}$`), 'the session has a connector URL of its own');
});

after(async () => {
  await context?.close();
  await browser?.close();
  await host?.stop();
  await relay?.stop();
});

/** The entries of an expected-failures file: `scenario` or `scenario:check-id`. */
function expectedFailures(file) {
  return readFileSync(file, 'utf8')
    .split('\n')
    .map((line) => line.match(/^\s*-\s+([^\s#]+)/)?.[1])
    .filter(Boolean);
}

/**
 * Each scenario the suite ran (its `=== Running scenario: … ===` and `Results saved to …`
 * lines) with its checks, read from the results it saved.
 */
function scenarioResults(stdout) {
  const results = new Map();
  let scenario = null;
  for (const line of stdout.split('\n')) {
    const running = line.match(/^=== Running scenario: (\S+) ===$/);
    if (running) scenario = running[1];
    const saved = line.match(/^Results saved to (.+)$/);
    if (saved && scenario) results.set(scenario, JSON.parse(readFileSync(path.join(saved[1], 'checks.json'), 'utf8')));
  }
  return results;
}

/**
 * The suite's baseline rule applied to every scenario it ran, scored or not: a scenario with a
 * failure or a warning that is not listed, a listed scenario without one, a failing check of a
 * scenario listed by check that is not listed, and a listed check that passes, each fails.
 */
function judged(results, entries) {
  const failed = (check) => check.status === 'FAILURE' || check.status === 'WARNING';
  const unexpected = [];
  const stale = [];
  for (const [scenario, checks] of results) {
    const byCheck = entries.filter((entry) => entry.startsWith(`${scenario}:`)).map((entry) => entry.slice(scenario.length + 1));
    if (entries.includes(scenario)) {
      if (!checks.some(failed)) stale.push(scenario);
      continue;
    }
    for (const check of checks.filter(failed)) {
      if (!byCheck.includes(check.id)) unexpected.push(`${scenario}:${check.id} (${check.status}: ${check.errorMessage})`);
    }
    for (const id of byCheck) {
      const same = checks.filter((check) => check.id === id);
      if (same.some((check) => check.status === 'SUCCESS') && !same.some(failed)) stale.push(`${scenario}:${id}`);
    }
  }
  return { unexpected: [...new Set(unexpected)], stale };
}

/**
 * Runs the suite on `url` for `revision`'s requirements with the tab's expected failures;
 * resolves with its exit code and output (its per-check results are kept in test-artifacts/).
 */
function conformance(url, revision) {
  const expected = path.join(REPO, `tests/conformance/expected-failures-tab-${revision}.yml`);
  const results = artifact(`conformance-tab-${revision}`);
  rmSync(results, { recursive: true, force: true });
  const child = spawn(
    process.execPath,
    [SUITE, 'server', '--url', url, '--requirements', revision, '--expected-failures', expected, '--output-dir', results],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk) => { stdout += chunk; });
  child.stderr.on('data', (chunk) => { stderr += chunk; });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the conformance suite (${revision}) did not finish in ${RUN_TIMEOUT_MS / 1000} s:\n${stdout}\n${stderr}`));
    }, RUN_TIMEOUT_MS);
    child.on('error', (error) => {
      clearTimeout(timer);
      reject(new Error(`the conformance suite cannot start (${error.message}): run scripts/setup.sh --test`));
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr, expected });
    });
  });
}

for (const revision of ['2025-11-25', '2026-07-28']) {
  test(`the conformance suite (${revision}) passes against an SDK tab's /mcp/s/{handle}, but for what a tab cannot do`, { timeout: RUN_TIMEOUT_MS + 10000 }, async () => {
    const { code, stdout, stderr, expected } = await conformance(connectorUrl, revision);
    const summary = stdout.split('=== SUMMARY ===')[1] ?? stdout;
    console.log(`conformance suite (${revision}) against ${connectorUrl}:${summary}`);
    const results = scenarioResults(stdout);
    assert.ok(results.size > 0, `the suite ran no scenario:\n${stdout}\n${stderr}`);
    const { unexpected, stale } = judged(results, expectedFailures(expected));
    assert.deepEqual(
      { unexpected, stale },
      { unexpected: [], stale: [] },
      `scenarios run (scored or not) failing though not in ${path.relative(REPO, expected)}, or listed there and passing`,
    );
    assert.equal(
      code,
      0,
      `the conformance suite (${revision}) failed against the tab's ${connectorUrl}: a scenario failed that is not in ` +
        `${path.relative(REPO, expected)}, or one listed there passes now (its checks: test-artifacts/conformance-tab-${revision}/):\n${summary}\n${stderr}`,
    );
  });
}
