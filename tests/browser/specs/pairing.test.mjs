// The pairing UI: its states (kept as screenshots), the c and r keys, accessibility (axe-core,
// WCAG AA), reloads and second tabs, ending a session, the "ask me" switch, and the page
// opened outside CODAP.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { artifact, Llm, openInCodap, pluginFrame, startRelay, startStack, stopStack, until } from '../harness.mjs';

const AXE = readFileSync(path.join(path.dirname(fileURLToPath(import.meta.url)), '../node_modules/axe-core/axe.min.js'), 'utf8');

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

function state(frame) {
  return frame.evaluate(() => ({ state: document.body.dataset.state, link: document.body.dataset.link }));
}

test('the states of the pairing banner, the keys, and accessibility', async () => {
  let page;
  let plugin;
  let code;
  const context = await browser.newContext({ bypassCSP: true });
  for (const origin of [relay.base, host.origin]) {
    await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin });
  }
  // The clipboard as the user's next paste would see it.
  const clipboard = () => page.evaluate(() => navigator.clipboard.readText());
  try {
    ({ page, plugin, code } = await openInCodap(context, host, relay));
    const frame = page.locator('#plugin');
    assert.match(await plugin.textContent('#code'), /^[A-Z2-7]{4}-[A-Z2-7]{4}$/);
    assert.match(await plugin.textContent('#countdown'), /^Expires in (09:[0-5]\d|10:00)$/);
    assert.deepEqual(await state(plugin), { state: 'fresh', link: 'idle' });
    await frame.screenshot({ path: artifact('pairing-fresh.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations when fresh');

    // c copies the prompt: the code, the relay, metadata first, the call endpoint.
    await plugin.click('h1');
    await page.keyboard.press('c');
    await until(plugin, () => document.body.dataset.state === 'copied');
    await until(plugin, () => /copied/i.test(document.getElementById('announcer').textContent));
    const copied = await clipboard();
    const display = `${code.slice(0, 4)}-${code.slice(4)}`;
    assert.ok(copied.includes(`Pairing code: ${display}`), copied);
    assert.ok(copied.includes(`GET ${relay.base}/api/sessions/${display}/metadata`), copied);
    assert.ok(copied.includes(`POST ${relay.base}/api/sessions/${display}/call`), copied);
    assert.ok(copied.includes('"functionName"'), copied);
    assert.match(copied, new RegExp(`MCP clients can connect to: ${relay.base}/mcp/s/[0-9a-f]{32}`), copied);
    assert.match(await plugin.textContent('#announcer'), /copied/i, 'the live region says so');
    await frame.screenshot({ path: artifact('pairing-copied.png') });

    // Copy code copies just the code (the clipboard is written asynchronously).
    await plugin.click('#copy-code');
    const deadline = Date.now() + 5000;
    while ((await clipboard()) !== display && Date.now() < deadline) await page.waitForTimeout(50);
    assert.equal(await clipboard(), display);

    // The first call turns the banner green.
    const llm = new Llm(relay.base, code);
    await llm.ok('listDataContexts');
    await until(plugin, () => document.body.dataset.state === 'active' && document.body.dataset.link === 'connected');
    assert.match(await plugin.textContent('#activity'), /listDataContexts/);
    await frame.screenshot({ path: artifact('pairing-connected.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations when connected');

    // r regenerates: a new code, the old session ended at the relay.
    await page.keyboard.press('r');
    await until(plugin, (old) => window.toolrelay.session && window.toolrelay.session.code !== old, code);
    const fresh = await plugin.evaluate(() => window.toolrelay.session.code);
    assert.notEqual(fresh, code);
    assert.equal((await new Llm(relay.base, code).status()).status, 404, 'the old code is gone');
    assert.equal(await plugin.textContent('#code'), `${fresh.slice(0, 4)}-${fresh.slice(4)}`);
  } finally {
    await context.close();
  }
});

test('an expired session turns red', async () => {
  const shortLived = await startRelay({
    CORS_ORIGIN: host.origin,
    SESSION_TTL_SECONDS: '2',
    SESSION_MAX_LIFETIME_SECONDS: '3',
    HEARTBEAT_SECONDS: '1',
  });
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { page, plugin } = await openInCodap(context, host, shortLived);
    await until(plugin, () => document.body.dataset.state === 'expired', undefined, 15000);
    assert.equal((await state(plugin)).link, 'disconnected');
    assert.match(await plugin.textContent('#countdown'), /Expired/);
    assert.match(await plugin.textContent('#announcer'), /^Session expired\./);
    await page.locator('#plugin').screenshot({ path: artifact('pairing-expired.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations when expired');
  } finally {
    await context.close();
    await shortLived.stop();
  }
});

test('a reload keeps the session and a second tab pairs on its own', async () => {
  const context = await browser.newContext();
  try {
    const first = await openInCodap(context, host, relay);
    await first.page.reload();
    const reloaded = await pluginFrame(first.page, `${relay.base}/codap/`);
    await until(reloaded, () => window.toolrelay?.session?.code && window.toolrelay.ready);
    assert.equal(await reloaded.evaluate(() => window.toolrelay.session.code), first.code, 'the reload reconnects to its session');

    const second = await openInCodap(context, host, relay);
    assert.notEqual(second.code, first.code, 'the second tab has its own session');
    // Both tabs serve their own sessions.
    await new Llm(relay.base, first.code).ok('listDataContexts');
    await new Llm(relay.base, second.code).ok('listDataContexts');
    assert.equal(await reloaded.evaluate(() => window.toolrelay.session.code), first.code, 'the first tab kept its session');
    assert.equal((await new Llm(relay.base, first.code).status()).body.transport, 'websocket');
  } finally {
    await context.close();
  }
});

test('ask me before changing data, and ending the session', async () => {
  const context = await browser.newContext();
  try {
    const { page, plugin, code } = await openInCodap(context, host, relay);
    const llm = new Llm(relay.base, code);
    await llm.ok('createDataContext', { name: 'Keep', collections: [{ name: 'Keep', attributes: [{ name: 'x' }] }] });
    await llm.ok('createDataContext', { name: 'Drop', collections: [{ name: 'Drop', attributes: [{ name: 'x' }] }] });
    await plugin.check('#confirm');

    // A destructive call waits for the user; reading does not.
    const denied = llm.call('deleteDataContext', { dataContext: 'Keep' });
    await until(plugin, () => !document.getElementById('held').hidden);
    assert.match(await plugin.textContent('#held-text'), /deleteDataContext/);
    assert.deepEqual(await llm.ok('listDataContexts').then((list) => list.map((d) => d.name)), ['Keep', 'Drop']);
    await plugin.click('#deny');
    const refusal = await denied;
    assert.equal(refusal.success, false);
    assert.equal(refusal.error.code, 'declined_by_user');

    const allowed = llm.call('deleteDataContext', { dataContext: 'Drop' });
    await until(plugin, () => !document.getElementById('held').hidden);
    await plugin.click('#allow');
    assert.equal((await allowed).success, true);
    const names = await page.evaluate(() => window.codap.model.dataContexts.map((d) => d.name));
    assert.deepEqual(names, ['Keep'], 'only the allowed deletion happened');

    await plugin.click('#end');
    await until(plugin, () => document.body.dataset.state === 'ended');
    assert.equal((await llm.status()).status, 404, 'the session is gone at the relay');
  } finally {
    await context.close();
  }
});

test('outside CODAP the plugin says so and still pairs', async () => {
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const page = await context.newPage();
    await page.goto(`${relay.base}/codap/`);
    await until(page, () => !document.getElementById('outside').hidden && window.toolrelay?.session?.code);
    assert.match(await page.textContent('#outside'), /Not running inside CODAP/);
    assert.match(await page.textContent('#outside'), /codap\.concord\.org\/app\/\?di=/);
    const code = await page.evaluate(() => window.toolrelay.session.code);
    await until(page, () => window.toolrelay.ready);
    const answer = await new Llm(relay.base, code).call('listDataContexts');
    assert.equal(answer.success, false);
    assert.equal(answer.error.code, 'codap_unavailable');
    assert.match(answer.error.message, /not running inside CODAP/);
    assert.deepEqual(await accessibilityViolations(page.mainFrame()), [], 'no WCAG AA violations outside CODAP');
    await page.screenshot({ path: artifact('pairing-outside-codap.png') });
  } finally {
    await context.close();
  }
});
