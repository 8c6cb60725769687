// Approving callers in the CODAP plugin (the relay's approval protocol): a caller the person
// has not allowed waits at its first use of the code while the plugin asks "An assistant wants
// to use this CODAP — Allow / Deny"; Allow lets its call run, Deny refuses it, no answer lets
// it lapse, three denials close the code to new callers (New code opens a fresh one),
// Disconnect revokes an allowed caller's handle, and a question outlives a reload of the
// plugin. Callers: REST from node (on loopback every REST caller without an API key is one
// caller, known by its address), and MCP clients of the official TypeScript SDK (each MCP
// session a caller of its own).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { artifact, openInCodap, pluginFrame, startRelay, startStack, stopStack, until } from '../harness.mjs';

const AXE = readFileSync(path.join(path.dirname(fileURLToPath(import.meta.url)), '../node_modules/axe-core/axe.min.js'), 'utf8');
// A read-only function of the plugin: it changes nothing in the document.
const READ = 'listDataContexts';
// How long a held call may take in all: the question, the answer, the call.
const PATIENCE_MS = 60000;
// How often a call the relay answered 202 is asked about again.
const ASK_AGAIN_MS = 250;
// What an MCP request may wait (connect_session waits for the person's answer).
const MCP_REQUEST = { timeout: 120000 };

let relay;
let host;
let browser;

before(async () => ({ relay, host, browser } = await startStack()));
after(() => stopStack({ relay, host, browser }));

async function accessibilityViolations(frame) {
  await frame.evaluate(AXE);
  return frame.evaluate(async () => {
    const result = await window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } });
    return result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
  });
}

/** The error's name in a relay answer: an HTTP error body, or a call's failed answer. */
function errorCode(body) {
  if (typeof body?.error === 'string') return body.error;
  return body?.error?.code ?? null;
}

let sequence = 0;

/**
 * Calls `functionName` over REST as an HTTP agent would, and follows it to its end: a 202
 * (held past the wait) is asked about with getCall until it has an answer. Returns
 * `{status, body, code}`: the HTTP status of the answer, its body, and the error's name if any.
 */
async function restCall(base, code, functionName, args = {}) {
  const requestId = `approval-${Date.now()}-${(sequence += 1)}`;
  const response = await fetch(`${base}/api/sessions/${code}/call`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ requestId, functionName, args, timeoutMs: 30000 }),
  });
  const body = await response.json();
  if (response.status !== 202) return { status: response.status, body, code: errorCode(body) };
  const deadline = Date.now() + PATIENCE_MS;
  for (;;) {
    const asked = await fetch(`${base}/api/sessions/${code}/requests/${requestId}`);
    const state = await asked.json();
    if (!asked.ok) return { status: asked.status, body: state, code: errorCode(state) };
    if (state.response) return { status: 200, body: state.response, code: errorCode(state.response) };
    if (Date.now() > deadline) throw new Error(`${functionName} still ${state.status} after ${PATIENCE_MS} ms`);
    await new Promise((resolve) => setTimeout(resolve, ASK_AGAIN_MS));
  }
}

/** An MCP client of its own (a caller of its own) on the relay's /mcp, named `name`. */
async function mcpClient(base, name) {
  const client = new Client({ name, version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`)));
  return client;
}

function connectSession(client, code) {
  return client.callTool({ name: 'connect_session', arguments: { code } }, undefined, MCP_REQUEST);
}

/** The whole of an MCP result as text: its error's name is in it wherever the relay put it. */
function resultText(result) {
  return JSON.stringify(result);
}

/** Waits until the plugin shows a question about a caller, ready to be answered; returns its text. */
async function question(plugin) {
  await plugin.locator('#approval').waitFor({ state: 'visible', timeout: PATIENCE_MS });
  // The buttons take answers a moment after the question appears.
  await until(plugin, () => !document.getElementById('approval-allow').hasAttribute('aria-disabled'));
  return plugin.textContent('#approval-text');
}

/** Waits until no question is shown. */
function noQuestion(plugin) {
  return plugin.locator('#approval').waitFor({ state: 'hidden', timeout: PATIENCE_MS });
}

/** Counts, in the plugin, every question about a caller from now on (in window.asked). */
function countQuestions(plugin) {
  return plugin.evaluate(() => {
    window.asked = 0;
    window.toolrelay.connection.addEventListener('approval-request', () => {
      window.asked += 1;
    });
  });
}

test('Allow lets a REST call run; Deny refuses an MCP caller; the plugin says so', async () => {
  const context = await browser.newContext({ bypassCSP: true });
  const claude = await mcpClient(relay.base, 'approval-test-denied');
  try {
    const { page, plugin, code } = await openInCodap(context, host, relay, { approve: 'ask' });
    const title = await plugin.evaluate(() => document.title);
    const prompt = await plugin.evaluate(() => window.toolrelay.prompt());
    assert.match(prompt, /asked once, in my browser tab, to allow you/, prompt);

    // A REST call of a caller nobody allowed waits for the person. (The frame has the
    // keyboard, as when the person works in it: the question takes the focus.)
    await plugin.click('h1');
    const held = restCall(relay.base, code, READ);
    const text = await question(plugin);
    assert.match(text, /^An assistant wants to use this CODAP \(says it is .+, via .+\)/, text);
    assert.match(await plugin.textContent('[role="alert"]'), /An assistant wants to use this CODAP/);
    assert.equal(await plugin.evaluate(() => document.activeElement?.id), 'approval-allow', 'Allow has the focus');
    assert.equal(await plugin.evaluate(() => document.title), `(1) ${title}`, 'the title counts the question');
    assert.equal(await plugin.isVisible('#approval-badge'), true, 'a badge says one is waiting');
    await page.locator('#plugin').screenshot({ path: artifact('approval-question.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations while asking');

    await plugin.click('#approval-allow');
    const answer = await held;
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    assert.equal(answer.body.success, true, JSON.stringify(answer.body));
    await noQuestion(plugin);
    assert.equal(await plugin.evaluate(() => document.title), title, 'the title is the page\'s again');
    assert.equal(await plugin.isVisible('#approval-badge'), false);
    // The caller is listed, with a Disconnect button.
    await plugin.locator('#callers-list li').first().waitFor({ state: 'visible' });
    assert.match(await plugin.textContent('#callers-list li'), / via .+Disconnect/);
    // Allowed once: its next call runs without a question.
    const again = await restCall(relay.base, code, READ);
    assert.equal(again.body.success, true, JSON.stringify(again.body));
    assert.equal(await plugin.isVisible('#approval'), false);

    // Another caller (an MCP session) is asked about on its own, and denied.
    const connecting = connectSession(claude, code);
    const asked = await question(plugin);
    assert.match(asked, /approval-test-denied/, `the MCP client's name is shown: ${asked}`);
    await plugin.click('#approval-deny');
    const refused = await connecting;
    assert.equal(refused.isError, true, resultText(refused));
    assert.match(resultText(refused), /approval_declined/);
    await noQuestion(plugin);
    assert.equal(await plugin.locator('#callers-list li').count(), 1, 'only the allowed caller is listed');
  } finally {
    await claude.close();
    await context.close();
  }
});

test('a question nobody answers lapses: approval_timeout', async () => {
  const hasty = await startRelay({ CORS_ORIGIN: host.origin, APPROVAL_TIMEOUT_SECONDS: '2' });
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { plugin, code } = await openInCodap(context, host, hasty, { approve: 'ask' });
    const held = restCall(hasty.base, code, READ);
    await question(plugin);
    const answer = await held;
    assert.equal(answer.code, 'approval_timeout', JSON.stringify(answer));
    assert.notEqual(answer.body.success, true);
    // The question goes with it.
    await noQuestion(plugin);
    assert.equal(await plugin.evaluate(() => window.toolrelay.pendingApprovals.length), 0);
  } finally {
    await context.close();
    await hasty.stop();
  }
});

test('three denials close the code to new callers, without a question; New code opens a fresh one', async () => {
  const context = await browser.newContext({ bypassCSP: true });
  const clients = [];
  try {
    const { page, plugin, code } = await openInCodap(context, host, relay, { approve: 'ask' });
    for (let n = 1; n <= 3; n += 1) {
      const client = await mcpClient(relay.base, `approval-test-denied-${n}`);
      clients.push(client);
      const connecting = connectSession(client, code);
      await question(plugin);
      if (n === 2) {
        // The d key denies too (the frame has the keyboard once clicked).
        await plugin.click('#approval-text');
        await page.keyboard.press('d');
      } else {
        await plugin.click('#approval-deny');
      }
      const refused = await connecting;
      assert.equal(refused.isError, true, resultText(refused));
      assert.match(resultText(refused), /approval_declined/, `denial ${n}`);
      await noQuestion(plugin);
    }
    await plugin.locator('#refused-callers').waitFor({ state: 'visible' });
    assert.equal(
      (await plugin.textContent('#refused-callers')).replace(/\s+/g, ' ').trim(),
      'Three assistants were denied; this code no longer accepts new ones. New code',
    );
    assert.equal(await plugin.evaluate(() => window.toolrelay.callers.refused), true);
    await page.locator('#plugin').screenshot({ path: artifact('approval-refused.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations when refusing');

    // The next caller is refused at once: nobody is asked.
    await countQuestions(plugin);
    const answer = await restCall(relay.base, code, READ);
    assert.equal(answer.code, 'approval_refused', JSON.stringify(answer));
    assert.equal(await plugin.evaluate(() => window.asked), 0, 'no question for a refused code');
    assert.equal(await plugin.isVisible('#approval'), false);

    // New code: a fresh session that asks again.
    await plugin.click('#refused-new');
    await until(plugin, (old) => window.toolrelay.session && window.toolrelay.session.code !== old && window.toolrelay.ready, code);
    assert.equal(await plugin.isVisible('#refused-callers'), false);
    const fresh = await plugin.evaluate(() => window.toolrelay.session.code);
    assert.equal((await fetch(`${relay.base}/api/sessions/${code}`)).status, 404, 'the old code is gone');
    const held = restCall(relay.base, fresh, READ);
    await question(plugin);
    await plugin.click('#approval-allow');
    assert.equal((await held).body.success, true);
  } finally {
    await Promise.all(clients.map((client) => client.close()));
    await context.close();
  }
});

test('Disconnect revokes an allowed caller: its handle fails with caller_disconnected', async () => {
  const context = await browser.newContext({ bypassCSP: true });
  const client = await mcpClient(relay.base, 'approval-test-disconnected');
  try {
    const { plugin, code } = await openInCodap(context, host, relay, { approve: 'ask' });
    const connecting = connectSession(client, code);
    await question(plugin);
    await plugin.click('#approval-allow');
    const connected = await connecting;
    assert.notEqual(connected.isError, true, resultText(connected));
    const { handle } = connected.structuredContent;
    assert.match(handle, /^[0-9a-f]{32}$/, resultText(connected));
    const call = () => client.callTool({ name: 'call_session_tool', arguments: { session: handle, name: READ, arguments: {} } }, undefined, MCP_REQUEST);
    const first = await call();
    assert.notEqual(first.isError, true, resultText(first));

    // The plugin lists the caller; Disconnect takes it off.
    const listed = plugin.locator('#callers-list li', { hasText: 'approval-test-disconnected' });
    await listed.waitFor({ state: 'visible' });
    assert.match(await listed.textContent(), /approval-test-disconnected \S+ via .+ — since \d\d:\d\d/);
    await listed.locator('button', { hasText: 'Disconnect' }).click();
    await listed.waitFor({ state: 'detached' });

    const revoked = await call();
    assert.equal(revoked.isError, true, resultText(revoked));
    assert.match(resultText(revoked), /caller_disconnected/);
    assert.equal(await plugin.isVisible('#approval'), false, 'a revoked handle is refused, not asked about');
  } finally {
    await client.close();
    await context.close();
  }
});

test('a question outlives a reload of the plugin, and Allow then lets the call run', async () => {
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { page, plugin, code } = await openInCodap(context, host, relay, { approve: 'ask' });
    const held = restCall(relay.base, code, READ);
    await question(plugin);

    await page.reload();
    const reloaded = await pluginFrame(page, `${relay.base}/codap/`);
    await until(reloaded, () => window.toolrelay?.session?.code && window.toolrelay.ready);
    assert.equal(await reloaded.evaluate(() => window.toolrelay.session.code), code, 'the reload reconnects to its session');
    const text = await question(reloaded);
    assert.match(text, /^An assistant wants to use this CODAP/, text);
    await reloaded.click('#approval-allow');
    const answer = await held;
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    assert.equal(answer.body.success, true, JSON.stringify(answer.body));
    await noQuestion(reloaded);
  } finally {
    await context.close();
  }
});
