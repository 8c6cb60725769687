// A claim link (MCP `open_codap`'s `link`: CODAP with the plugin as `?di=`, the claim in the
// plugin's URL) is a secret its minter can send to anyone. The real plugin, in the CODAP
// stand-in, with MCP clients of the official TypeScript SDK minting claims:
// * opened at top level (not inside an app host's conversation) it asks first — "A
//   conversation sent you this link. Connect this CODAP to that assistant?", naming the
//   assistant as its MCP client calls itself — and Not me leaves the claim unspent and the
//   minter's calls undelivered, the plugin paired with a code of its own;
// * after Connect, the minter is listed among the allowed callers; a reload of the tab resumes
//   the session without redeeming the (spent) claim, and a later load without the claim starts
//   a session of its own that the minter's calls do not reach; the spent link, opened again,
//   says so and offers a code;
// * framed under a page of a known app host (`APP_HOSTS`) it pairs without asking; framed
//   under any other page it asks;
// * an empty or malformed claim is no claim: the plugin pairs with a code, and its page may be
//   framed by CODAP and the relay only (its `frame-ancestors`), as a well-formed claim's page
//   may be framed by any.
// The SDK's rules themselves (`underAppHost`, `isClaim`) are checked first, under node.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { underAppHost } from '../../../services/gateway/sdk/connection.js';
import { isClaim } from '../../../services/gateway/sdk/session.js';
import { artifact, eventually, launchBrowser, pluginFrame, startCodapHost, startPageHost, startRelay, until, watchErrors } from '../harness.mjs';

const AXE = readFileSync(path.join(path.dirname(fileURLToPath(import.meta.url)), '../node_modules/axe-core/axe.min.js'), 'utf8');
// A read-only function of the plugin.
const READ = 'listDataContexts';
// What the pairing element asks about a claim link (its page-name is "this CODAP").
const QUESTION = 'A conversation sent you this link. Connect this CODAP to that assistant?';
// What an MCP call may wait for in all.
const MCP_REQUEST_MS = 60000;
// A page of a conversation: it frames what its `src` parameter names, as a host frames an app.
const CONVERSATION = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Conversation</title></head>
<body><iframe id="app" title="app" style="width: 820px; height: 700px; border: 0"></iframe>
<script>document.getElementById('app').src = new URL(location.href).searchParams.get('src');</script>
</body></html>`;

let host;
let relay;
let knownHost;
let otherHost;
let browser;

before(async () => {
  host = await startCodapHost();
  knownHost = await startPageHost({ '/conversation.html': CONVERSATION });
  otherHost = await startPageHost({ '/conversation.html': CONVERSATION });
  relay = await startRelay({ CORS_ORIGIN: host.origin, CODAP_URL: `${host.origin}/index.html`, APP_HOSTS: knownHost.origin });
  browser = await launchBrowser();
});
after(async () => {
  await browser?.close();
  await relay?.stop();
  await otherHost?.stop();
  await knownHost?.stop();
  await host?.stop();
});

async function accessibilityViolations(frame) {
  await frame.evaluate(AXE);
  return frame.evaluate(async () => {
    const result = await window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } });
    return result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
  });
}

/** An MCP client of its own on the relay's /mcp, calling itself `name` (its clientInfo). */
async function assistant(name) {
  const client = new Client({ name, version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${relay.base}/mcp`)));
  return client;
}

/** `open_codap`'s answer: {handle, link, …}, the link's plugin URL and its claim. */
async function openCodap(client) {
  const result = await client.callTool({ name: 'open_codap', arguments: {} });
  assert.notEqual(result.isError, true, JSON.stringify(result));
  const opened = result.structuredContent;
  const plugin = new URL(opened.link).searchParams.get('di');
  const claim = new URL(plugin).searchParams.get('claim');
  assert.match(claim, /^[0-9a-f]{32}$/, plugin);
  return { ...opened, plugin, claim };
}

/**
 * The assistant calls a function of the session it opened. Resolves with `{result}` when the
 * call is answered, or `{queued}` (the relay's progress message) once the relay says no tab is
 * connected and the call waits in its queue — the call is then cancelled.
 */
async function sessionCall(client, handle, name = READ) {
  const controller = new AbortController();
  let queued = null;
  try {
    const result = await client.callTool({ name: 'call_session_tool', arguments: { session: handle, name, arguments: {} } }, undefined, {
      signal: controller.signal,
      timeout: MCP_REQUEST_MS,
      onprogress: (progress) => {
        if (/No tab is connected/.test(progress.message ?? '')) {
          queued = progress.message;
          controller.abort();
        }
      },
    });
    return { result };
  } catch (error) {
    if (queued) return { queued };
    throw error;
  }
}

/** Asserts that an assistant's call reached no tab: no tab is connected, or none registered tools. */
function assertUndelivered(outcome) {
  if (outcome.queued) return;
  assert.equal(outcome.result.isError, true, `the call was answered: ${JSON.stringify(outcome.result)}`);
  assert.match(JSON.stringify(outcome.result), /has not registered its tools yet|not open|No tab is connected/, JSON.stringify(outcome.result));
}

/** The claim requests (`POST /api/sessions/claim`, `…/claim/about`) pages of `context` make. */
function claimRequests(context) {
  const seen = [];
  context.on('request', (request) => {
    const { pathname } = new URL(request.url());
    if (pathname === '/api/sessions/claim' || pathname === '/api/sessions/claim/about') seen.push(pathname);
  });
  return seen;
}

/** Whether the relay would still redeem `claim`: what `/api/sessions/claim/about` says. */
async function claimAbout(claim) {
  const response = await fetch(`${relay.base}/api/sessions/claim/about`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ claim }),
  });
  return { status: response.status, body: await response.json() };
}

/** Opens `url` in a new page of `context`; returns the page and the plugin's frame. */
async function openPage(context, url) {
  const page = await context.newPage();
  watchErrors(page);
  await page.goto(url);
  return { page, plugin: await pluginFrame(page, `${relay.base}/codap/`) };
}

/** The CODAP stand-in at top level with the plugin at `pluginUrl`. */
function codapWith(pluginUrl) {
  return `${host.origin}/index.html?di=${encodeURIComponent(pluginUrl)}`;
}

/** Waits until the plugin asks about the claim, its buttons taking answers; returns what it says. */
async function claimQuestion(plugin) {
  await until(plugin, () => document.querySelector('toolrelay-pairing')?.dataset.state === 'asking');
  await until(plugin, () => !document.getElementById('claim-connect').hasAttribute('aria-disabled'));
  return plugin.evaluate(() => `${document.getElementById('assistant-title').textContent} ${document.getElementById('assistant-text').textContent}`);
}

/** Waits until the plugin is paired with a code of its own, shown; returns its session. */
async function pairedWithCode(plugin) {
  await until(plugin, () => {
    const element = document.querySelector('toolrelay-pairing');
    const session = window.toolrelay?.session;
    return window.toolrelay?.ready && element.dataset.mode === 'code' && session && document.getElementById('code').textContent === `${session.code.slice(0, 4)}-${session.code.slice(4)}`;
  });
  return plugin.evaluate(() => ({ ...window.toolrelay.session }));
}

/** Waits until the plugin is paired with the assistant's session (no code shown); returns it. */
async function pairedWithAssistant(plugin) {
  await until(plugin, () => window.toolrelay?.ready && document.querySelector('toolrelay-pairing').dataset.mode === 'assistant' && window.toolrelay.session?.claimed);
  return plugin.evaluate(() => ({ ...window.toolrelay.session }));
}

/** What the relay says of the session `handle` names: `{providerConnected, …}`. */
async function sessionStatus(handle) {
  const response = await fetch(`${relay.base}/api/sessions/${handle}`);
  return response.json();
}

/** A window `depth` frames below a top window, whose browser tells `ancestors` (or nothing). */
function windowAt(depth, ancestors) {
  const top = {};
  top.top = top;
  top.parent = top;
  let win = top;
  for (let level = 0; level < depth; level += 1) win = { parent: win, top };
  win.location = ancestors ? { ancestorOrigins: ancestors } : {};
  return win;
}

test('the rules: a claim is 32 hex digits; it pairs without asking only deep enough under a known app host', () => {
  assert.equal(isClaim('0123456789abcdefABCDEF0123456789'), true);
  for (const no of [null, undefined, '', 'xyz', 'a'.repeat(31), 'a'.repeat(33), 'g'.repeat(32), ` ${'a'.repeat(31)}`, 32]) {
    assert.equal(isClaim(no), false, String(no));
  }
  const hosts = ['https://claude.ai', 'https://chatgpt.com'];
  // claude.ai → its sandbox → the app → CODAP → the plugin.
  const plugin = windowAt(4, ['https://codap3.concord.org', 'null', 'https://sandbox.example', 'https://claude.ai']);
  assert.equal(underAppHost(hosts, { depth: 2, win: plugin }), true);
  assert.equal(underAppHost(['HTTPS://Claude.AI/'], { depth: 2, win: plugin }), true, 'hosts are compared as origins');
  assert.equal(underAppHost(['https://chatgpt.com'], { depth: 2, win: plugin }), false, 'a host not listed');
  assert.equal(underAppHost([], { depth: 2, win: plugin }), false, 'no hosts known (no discovery)');
  assert.equal(underAppHost(undefined, { depth: 2, win: plugin }), false);
  assert.equal(underAppHost(['not an origin'], { depth: 2, win: plugin }), false);
  // The link opened in a tab: CODAP at top level, the plugin in it.
  assert.equal(underAppHost(hosts, { depth: 2, win: windowAt(1, ['https://claude.ai']) }), false, 'CODAP not framed');
  assert.equal(underAppHost(hosts, { depth: 1, win: windowAt(0, []) }), false, 'at top level');
  // Any page may frame a claim's CODAP: its origin decides.
  assert.equal(underAppHost(hosts, { depth: 2, win: windowAt(2, ['https://codap3.concord.org', 'https://evil.example']) }), false);
  // A browser that does not tell the ancestors' origins (Firefox): the framing alone.
  assert.equal(underAppHost(hosts, { depth: 2, win: windowAt(2, null) }), true);
  // A window that cannot be compared is doubt.
  const broken = windowAt(3, ['https://claude.ai']);
  Object.defineProperty(broken, 'top', { get() { throw new DOMException('Blocked a frame', 'SecurityError'); } });
  assert.equal(underAppHost(hosts, { depth: 2, win: broken }), false);
});

test('a claim link opened at top level asks first, naming the assistant; Not me leaves the claim unspent and its calls undelivered', async () => {
  const attacker = await assistant('attacker-assistant');
  const context = await browser.newContext();
  try {
    const opened = await openCodap(attacker);
    const requests = claimRequests(context);
    const { page, plugin } = await openPage(context, opened.link);

    const asked = await claimQuestion(plugin);
    assert.ok(asked.startsWith(QUESTION), asked);
    assert.match(asked, /It says it is attacker-assistant 1\.0\.0\./, asked);
    assert.match(await plugin.textContent('[role="alert"]'), /A conversation sent you this link/, 'the question is announced');
    assert.equal(await plugin.evaluate(() => document.activeElement?.id), 'assistant-title', 'the question has the focus, not Connect');
    assert.equal(await plugin.evaluate(() => window.toolrelay.session), null, 'nothing is paired while it asks');
    assert.equal(await plugin.textContent('#code'), '····-····', 'no code while it asks');
    assert.deepEqual(requests, ['/api/sessions/claim/about'], 'the claim was described, not redeemed');
    assert.deepEqual(await accessibilityViolations(plugin), [], 'the question meets WCAG AA');
    await page.locator('#plugin').screenshot({ path: artifact('claim-link-question.png') });

    // Not me, by keyboard: Tab from the question reaches Connect, then Not me.
    await page.keyboard.press('Tab');
    assert.equal(await plugin.evaluate(() => document.activeElement?.id), 'claim-connect');
    await page.keyboard.press('Tab');
    assert.equal(await plugin.evaluate(() => document.activeElement?.id), 'claim-decline');
    await page.keyboard.press('Enter');

    const own = await pairedWithCode(plugin);
    assert.ok(!own.connectorUrl.endsWith(opened.handle), `a session of its own, not the assistant's: ${own.connectorUrl}`);
    assert.equal(own.claimed, undefined);
    assert.equal(await plugin.evaluate(() => location.search), '', 'the claim left the URL');
    assert.deepEqual(requests, ['/api/sessions/claim/about'], 'never redeemed');
    const about = await claimAbout(opened.claim);
    assert.equal(about.status, 200, `the claim is still unspent: ${JSON.stringify(about.body)}`);
    assert.equal(about.body.label, 'attacker-assistant 1.0.0');

    // The minter's calls reach nobody: its session has no tab.
    assertUndelivered(await sessionCall(attacker, opened.handle));
    assert.equal(await plugin.evaluate(() => window.toolrelay.connection.handled), 0, 'no call reached the plugin');
    assert.equal(await plugin.isVisible('#no-activity'), true);
    assert.equal((await sessionStatus(opened.handle)).providerConnected, false);
  } finally {
    await context.close();
    await attacker.close();
  }
});

test('Connect pairs with the assistant and lists it; a reload resumes without redeeming; a load without the claim starts its own session, out of the assistant\'s reach', async () => {
  const minter = await assistant('conversation-assistant');
  const context = await browser.newContext();
  try {
    const opened = await openCodap(minter);
    const requests = claimRequests(context);
    const { page, plugin } = await openPage(context, opened.link);
    await claimQuestion(plugin);
    await plugin.click('#claim-connect');

    const claimed = await pairedWithAssistant(plugin);
    assert.ok(claimed.connectorUrl.endsWith(opened.handle), `the assistant's session: ${claimed.connectorUrl}`);
    assert.deepEqual(requests, ['/api/sessions/claim/about', '/api/sessions/claim']);
    assert.equal(await plugin.evaluate(() => location.search), '', 'the claim left the URL');
    assert.equal((await claimAbout(opened.claim)).body.error, 'claim_used', 'the claim is spent');
    // The assistant is among the allowed callers, with Disconnect.
    const listed = await until(plugin, () => document.querySelector('#callers-list li')?.textContent);
    assert.match(listed, /Opened from your conversation in conversation-assistant 1\.0\.0/, listed);
    assert.match(await plugin.getAttribute('#callers-list li button', 'aria-label'), /^Disconnect Opened from your conversation in conversation-assistant/);
    // Its calls reach this CODAP.
    const { result } = await sessionCall(minter, opened.handle);
    assert.notEqual(result?.isError, true, JSON.stringify(result));
    assert.equal(await plugin.evaluate(() => window.toolrelay.connection.handled), 1);
    // Kept for this tab only, never where the plugin keeps its own sessions.
    const kept = await plugin.evaluate(() => ({
      local: Object.keys(localStorage).filter((key) => key.startsWith('mcp-session-') || key.startsWith('toolrelay-claim:')),
      tab: Object.keys(sessionStorage),
    }));
    assert.deepEqual(kept.local, []);
    assert.equal(kept.tab.length, 1, JSON.stringify(kept.tab));
    assert.match(kept.tab[0], /^toolrelay-claim:[0-9a-f]{64}$/);

    // The tab reloaded (CODAP's URL still names the claim): the same session, no question, no redeem.
    requests.length = 0;
    await page.reload();
    const reloaded = await pluginFrame(page, `${relay.base}/codap/`);
    const resumed = await pairedWithAssistant(reloaded);
    assert.equal(resumed.code, claimed.code, 'the same session');
    assert.deepEqual(requests, [], 'the spent claim was neither described nor redeemed again');
    assert.equal(await reloaded.evaluate(() => window.toolrelay.pendingClaim), null);
    const { result: again } = await sessionCall(minter, opened.handle);
    assert.notEqual(again?.isError, true, JSON.stringify(again));

    // What the plugin kept of a claimed session before this change (in localStorage, as a
    // session of its own, and which claim opened it) is dropped unused, too.
    await reloaded.evaluate(() => {
      const [key] = Object.keys(sessionStorage);
      const record = JSON.parse(sessionStorage.getItem(key));
      localStorage.setItem(`mcp-session-${record.code}`, JSON.stringify({ ...record, tab: null, markedAt: 0 }));
      localStorage.setItem(key, JSON.stringify({ code: record.code, expiresAt: record.maxExpiresAt }));
    });

    // The tab closed; the plugin loaded again without the claim, in the same browser.
    await page.close();
    await eventually(async () => (await sessionStatus(opened.handle)).providerConnected === false, 'the relay to see the tab gone');
    const later = await openPage(context, codapWith(`${relay.base}/codap/`));
    const own = await pairedWithCode(later.plugin);
    assert.notEqual(own.code, claimed.code, 'a session of its own');
    assert.ok(!own.connectorUrl.endsWith(opened.handle));
    assert.deepEqual(requests, []);
    const left = await later.plugin.evaluate(() => Object.keys(localStorage).filter((key) => key.startsWith('mcp-session-') || key.startsWith('toolrelay-claim:')));
    assert.deepEqual(left, [`mcp-session-${own.code}`], 'only its own session is kept');
    assertUndelivered(await sessionCall(minter, opened.handle));
    assert.equal(await later.plugin.evaluate(() => window.toolrelay.connection.handled), 0, 'the assistant reached nothing');

    // The spent link opened again, in another tab: it says so, and offers a code.
    const spent = await openPage(context, opened.link);
    await until(spent.plugin, () => document.querySelector('toolrelay-pairing')?.dataset.state === 'refused');
    const told = await spent.plugin.evaluate(() => document.querySelector('.banner').innerText);
    assert.match(told, /Not connected to your assistant/);
    assert.match(told, /This link was used already/);
    assert.equal(await spent.plugin.isVisible('#regenerate'), true, 'New code is offered');
    assert.deepEqual(await accessibilityViolations(spent.plugin), [], 'the refusal meets WCAG AA');
    await spent.plugin.click('#regenerate');
    const fresh = await pairedWithCode(spent.plugin);
    assert.notEqual(fresh.code, claimed.code);
  } finally {
    await context.close();
    await minter.close();
  }
});

test('framed under a page of a known app host a claim pairs without asking; under any other page it asks', async () => {
  const minter = await assistant('framed-assistant');
  const context = await browser.newContext();
  try {
    const opened = await openCodap(minter);
    const requests = claimRequests(context);
    const known = await openPage(context, `${knownHost.origin}/conversation.html?src=${encodeURIComponent(opened.link)}`);
    assert.equal(await known.plugin.evaluate(() => window.parent !== window.top), true, 'CODAP is framed');
    const claimed = await pairedWithAssistant(known.plugin);
    assert.ok(claimed.connectorUrl.endsWith(opened.handle));
    assert.deepEqual(requests, ['/api/sessions/claim'], 'redeemed without asking');
    const { result } = await sessionCall(minter, opened.handle);
    assert.notEqual(result?.isError, true, JSON.stringify(result));

    requests.length = 0;
    const elsewhere = await openCodap(minter);
    const other = await openPage(context, `${otherHost.origin}/conversation.html?src=${encodeURIComponent(elsewhere.link)}`);
    const asked = await claimQuestion(other.plugin);
    assert.ok(asked.startsWith(QUESTION), asked);
    assert.match(asked, /framed-assistant 1\.0\.0/);
    assert.deepEqual(requests, ['/api/sessions/claim/about']);
    await other.plugin.click('#claim-connect');
    const paired = await pairedWithAssistant(other.plugin);
    assert.ok(paired.connectorUrl.endsWith(elsewhere.handle));
  } finally {
    await context.close();
    await minter.close();
  }
});

test('an empty or malformed claim is no claim: the plugin pairs with a code, framed by CODAP and the relay only', async () => {
  const frameAncestors = async (query) => {
    const response = await fetch(`${relay.base}/codap/${query}`);
    assert.equal(response.status, 200);
    const policy = response.headers.get('content-security-policy') ?? '';
    return policy.match(/frame-ancestors ([^;]*)/)?.[1].trim().split(/\s+/).sort();
  };
  // CODAP (CORS_ORIGIN) and the relay: 'self', which the relay also names by its origin.
  const codapOnly = ["'self'", host.origin, relay.base].sort();
  for (const claim of ['', 'xyz', 'a'.repeat(31), 'a'.repeat(33), 'g'.repeat(32), `${'a'.repeat(31)}%20`]) {
    assert.deepEqual(await frameAncestors(`?claim=${claim}`), codapOnly, `?claim=${claim}`);
  }
  assert.deepEqual(await frameAncestors(''), codapOnly);
  assert.deepEqual(await frameAncestors(`?claim=${'0a'.repeat(16)}`), ['*'], 'a claim of the right shape may be framed by any page');

  const context = await browser.newContext();
  try {
    const requests = claimRequests(context);
    for (const claim of ['', 'not-a-claim', 'a'.repeat(31)]) {
      const { page, plugin } = await openPage(context, codapWith(`${relay.base}/codap/?claim=${claim}`));
      const session = await pairedWithCode(plugin);
      assert.equal(session.claimed, undefined, `?claim=${claim}`);
      assert.equal(await plugin.evaluate(() => location.search), '', `?claim=${claim} left the URL`);
      await page.close();
    }
    assert.deepEqual(requests, [], 'no claim was described or redeemed');
  } finally {
    await context.close();
  }
});
