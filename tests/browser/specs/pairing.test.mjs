// The pairing UI: its states (kept as screenshots), the c and r keys, accessibility (axe-core,
// WCAG AA), reloads and second tabs, ending a session, the "ask me" switch, and the page
// opened outside CODAP.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { artifact, Llm, openInCodap, pluginFrame, startBlipProxy, startRelay, startStack, stopStack, until } from '../harness.mjs';

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
    // Connected: the session does not expire, so nothing counts down.
    assert.equal(await plugin.textContent('#countdown'), 'Connected — stays open while this tab is open');
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
    assert.ok(copied.startsWith('For an AI agent that can make HTTP requests'), copied);
    assert.ok(copied.includes(`Pairing code: ${display}`), copied);
    assert.ok(copied.includes(`GET ${relay.base}/api/sessions/${display}/metadata`), copied);
    assert.ok(copied.includes(`POST ${relay.base}/api/sessions/${display}/call`), copied);
    assert.ok(copied.includes('"functionName"'), copied);
    assert.ok(copied.includes(`connect to ${relay.base}/mcp and call connect_session`), copied);
    assert.match(copied, new RegExp(`this session alone: ${relay.base}/mcp/s/[0-9a-f]{32}`), copied);
    assert.ok(copied.length < 1500, `short enough to paste: ${copied.length}`);
    assert.match(await plugin.textContent('#announcer'), /copied/i, 'the live region says so');
    assert.match(await plugin.textContent('#copy-prompt'), /Copied/, 'the button says so');
    await frame.screenshot({ path: artifact('pairing-copied.png') });

    // Copy code copies just the code (the clipboard is written asynchronously).
    await plugin.click('#copy-code');
    const deadline = Date.now() + 5000;
    while ((await clipboard()) !== display && Date.now() < deadline) await page.waitForTimeout(50);
    assert.equal(await clipboard(), display);

    // The first call turns the banner green and folds it into a compact header.
    const llm = new Llm(relay.base, code);
    await llm.ok('listDataContexts');
    await until(plugin, () => document.body.dataset.state === 'active' && document.body.dataset.link === 'connected');
    assert.match(await plugin.textContent('#activity'), /listDataContexts/);
    assert.equal(await plugin.isVisible('#connect'), false, 'the instructions fold away');
    assert.equal(await plugin.isVisible('#code'), true, 'the code stays visible');
    assert.equal(await plugin.isVisible('#copy-code'), true, 'and copyable');
    await frame.screenshot({ path: artifact('pairing-connected.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations when connected');

    // A failed call says why, inline, in a few words.
    const failed = await llm.call('getDataContext', { dataContext: 'Nowhere' });
    assert.equal(failed.success, false);
    await until(plugin, () => document.querySelector('#activity li.failed .reason'));
    const line = await plugin.textContent('#activity li.failed');
    assert.match(line, /getDataContext · Nowhere/, line);
    assert.match(await plugin.textContent('#activity li.failed .reason'), /\S/);
    await frame.screenshot({ path: artifact('pairing-failed-call.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations with a failed call');

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
    const link = await page.getAttribute('#outside a', 'href');
    assert.equal(link, `https://codap.concord.org/app/?di=${encodeURIComponent(`${relay.base}/codap/`)}`);
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

/** The text of the connect instructions as shown, per kind of assistant. */
async function instructions(plugin, kind) {
  await plugin.click(`#tab-${kind}`);
  return plugin.textContent(`#panel-${kind}`);
}

test('connect instructions use the public address, one kind at a time, remembered', async () => {
  const proxied = await startRelay({ CORS_ORIGIN: host.origin, PUBLIC_BASE_URL: 'https://relay.example.test' });
  const context = await browser.newContext({ bypassCSP: true });
  for (const origin of [proxied.base, host.origin]) {
    await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin });
  }
  try {
    // The page comes from 127.0.0.1; assistants are given the public address.
    const { page, plugin, code } = await openInCodap(context, host, proxied);
    const frame = page.locator('#plugin');
    assert.equal(await plugin.isVisible('#connect-local'), false, 'a public HTTPS relay needs no warning');
    const display = `${code.slice(0, 4)}-${code.slice(4)}`;
    const connector = await instructions(plugin, 'connector');
    assert.ok(connector.includes('https://relay.example.test/mcp'), connector);
    assert.match(connector, /https:\/\/relay\.example\.test\/mcp\/s\/[0-9a-f]{32}/);
    assert.ok(connector.includes(display), connector);
    await frame.screenshot({ path: artifact('connect-claude-chatgpt.png') });
    const gpt = await instructions(plugin, 'gpt');
    assert.ok(gpt.includes('https://relay.example.test/openapi/actions.json'), gpt);
    await frame.screenshot({ path: artifact('connect-custom-gpt.png') });
    const agent = await instructions(plugin, 'agent');
    assert.match(agent, /Copy prompt/);
    await frame.screenshot({ path: artifact('connect-http-agent.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations in the instructions');
    const prompt = await plugin.evaluate(() => window.toolrelay.prompt());
    assert.ok(prompt.includes('Relay: https://relay.example.test'), prompt);
    assert.ok(prompt.includes(`GET https://relay.example.test/api/sessions/${display}/metadata`), prompt);
    assert.ok(!prompt.includes(proxied.base), 'the page origin is not handed to assistants');
    // Each copy button copies its URL and says so.
    await plugin.click('#tab-gpt');
    await plugin.click('[data-copy="actions-url"]');
    await until(plugin, () => document.querySelector('[data-copy="actions-url"]').textContent.includes('Copied'));
    assert.equal(await plugin.evaluate(() => navigator.clipboard.readText()), 'https://relay.example.test/openapi/actions.json');

    // The kind last shown comes first after a reload.
    await page.reload();
    const reloaded = await pluginFrame(page, `${proxied.base}/codap/`);
    await until(reloaded, () => window.toolrelay?.session?.code && window.toolrelay.ready);
    assert.equal(await reloaded.getAttribute('#tab-gpt', 'aria-selected'), 'true');
    assert.equal(await reloaded.isVisible('#panel-gpt'), true);
  } finally {
    await context.close();
    await proxied.stop();
  }
});

test('a relay only this computer can reach says so instead of cloud instructions', async () => {
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { page, plugin } = await openInCodap(context, host, relay);
    assert.equal(await plugin.isVisible('#connect-local'), true);
    assert.equal(
      await plugin.textContent('#connect-local'),
      'This relay is only reachable from this computer; ChatGPT and claude.ai cannot call it — use a desktop client or deploy the relay.',
    );
    assert.equal(await plugin.isVisible('#tab-gpt'), false, 'no custom GPT: it calls from OpenAI\'s servers');
    const desktop = await instructions(plugin, 'connector');
    assert.match(desktop, /desktop client on this computer/);
    assert.ok(!/Settings → Connectors/.test(desktop), desktop);
    await page.locator('#plugin').screenshot({ path: artifact('connect-local-relay.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations with the notice');
  } finally {
    await context.close();
  }
});

test('the countdown runs only while the tab is not connected', async () => {
  const proxy = await startBlipProxy(relay);
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { plugin } = await openInCodap(context, host, proxy);
    const connected = 'Connected — stays open while this tab is open';
    assert.equal(await plugin.textContent('#countdown'), connected);
    // Heartbeats and the clock do not make it move while connected.
    const before = await plugin.evaluate(() => window.toolrelay.interruptions);
    assert.equal(await plugin.textContent('#countdown'), connected);
    // The network goes away and stays away: now the idle time-out really runs.
    proxy.cut();
    await until(plugin, (seen) => window.toolrelay.interruptions > seen && document.body.dataset.link === 'disconnected', before);
    const first = await until(plugin, () => {
      const match = /^Not connected — expires in (\d\d):(\d\d)$/.exec(document.getElementById('countdown').textContent);
      return match && Number(match[1]) * 60 + Number(match[2]);
    });
    assert.ok(first > 0 && first <= 600, `${first}`);
    const later = await until(plugin, (start) => {
      const match = /(\d\d):(\d\d)$/.exec(document.getElementById('countdown').textContent);
      const left = match && Number(match[1]) * 60 + Number(match[2]);
      return left !== null && left < start && left;
    }, first);
    assert.ok(later < first, `${later} < ${first}`);
  } finally {
    await context.close();
    await proxy.close();
  }
});

test('the last hour of a session is announced, connected or not', async () => {
  const brief = await startRelay({ CORS_ORIGIN: host.origin, SESSION_MAX_LIFETIME_SECONDS: '1800' });
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { page, plugin } = await openInCodap(context, host, brief);
    await until(plugin, () => !document.getElementById('lifetime').hidden);
    const warning = await plugin.textContent('#lifetime');
    assert.match(warning, /stops working in (29|30):\d\d/, warning);
    assert.match(warning, /New code/);
    assert.equal(await plugin.textContent('#countdown'), 'Connected — stays open while this tab is open');
    await page.locator('#plugin').screenshot({ path: artifact('pairing-last-hour.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations with the warning');
  } finally {
    await context.close();
    await brief.stop();
  }
});

test('at CODAP\'s plugin size everything fits, End session included, after many calls', async () => {
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { page, plugin, code } = await openInCodap(context, host, relay);
    // The plugin asks CODAP for at most 360 × 500.
    const size = await page.evaluate(() => {
      const frame = document.getElementById('plugin');
      return [frame.clientWidth, frame.clientHeight];
    });
    assert.deepEqual(size, [360, 500]);
    const llm = new Llm(relay.base, code);
    await llm.ok('createDataContext', { name: 'Heights', collections: [{ name: 'People', attributes: [{ name: 'Age' }, { name: 'Height' }] }] });
    for (let n = 0; n < 7; n += 1) await llm.ok('createItems', { dataContext: 'Heights', items: [{ Age: 10 + n, Height: 130 + n }] });
    await llm.ok('createGraph', { dataContext: 'Heights', xAttribute: 'Age', yAttribute: 'Height' });
    await llm.call('getDataContext', { dataContext: 'Nowhere' });
    await until(plugin, () => document.querySelectorAll('#activity li').length >= 10);
    assert.match(await plugin.textContent('#activity'), /createGraph · Heights: Age × Height/);
    const fits = () =>
      plugin.evaluate(() => {
        const end = document.getElementById('end').getBoundingClientRect();
        const main = document.querySelector('main');
        const clipped = [...document.querySelectorAll('button, .code, .what')].filter((el) => el.offsetParent && el.scrollWidth > el.clientWidth + 1 && !el.classList.contains('what'));
        return {
          endVisible: end.top >= 0 && end.bottom <= window.innerHeight && end.right <= window.innerWidth,
          scrolled: main.scrollTop,
          overflowsSideways: document.documentElement.scrollWidth > window.innerWidth,
          clipped: clipped.map((el) => el.id || el.className),
        };
      });
    assert.deepEqual(await fits(), { endVisible: true, scrolled: 0, overflowsSideways: false, clipped: [] }, 'at 360 × 500');
    await page.locator('#plugin').screenshot({ path: artifact('plugin-360x500.png') });
    // And down to 300 × 420.
    await page.evaluate(() => {
      const frame = document.getElementById('plugin');
      frame.style.width = '300px';
      frame.style.height = '420px';
    });
    await until(plugin, () => window.innerWidth === 300 && window.innerHeight === 420);
    assert.deepEqual(await fits(), { endVisible: true, scrolled: 0, overflowsSideways: false, clipped: [] }, 'at 300 × 420');
    await page.locator('#plugin').screenshot({ path: artifact('plugin-300x420.png') });
    await plugin.click('#end');
    await until(plugin, () => document.body.dataset.state === 'ended');
  } finally {
    await context.close();
  }
});
