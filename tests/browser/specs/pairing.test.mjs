// The pairing UI: its states (kept as screenshots, each checked by axe-core for WCAG AA), the
// c and r keys, the copy buttons and the clipboard, the connect instructions per kind of
// assistant and per address the relay is reached at, the countdown against real heartbeats,
// the fit at CODAP's frame sizes, reloads and second tabs, ending a session, the "ask me"
// switch, and the page opened outside CODAP.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import {
  artifact,
  eventually,
  Llm,
  openInCodap,
  pluginFrame,
  startBlipProxy,
  startRelay,
  startStack,
  stopStack,
  until,
} from '../harness.mjs';

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

/** A browser context whose pages may read and write the clipboard. */
async function clipboardContext(...relays) {
  const context = await browser.newContext({ bypassCSP: true });
  for (const origin of [...relays.map((r) => r.base), host.origin]) {
    await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin });
  }
  return context;
}

/** Waits until the clipboard, as the user's next paste would see it, holds `text`. */
function clipboardHolds(page, text) {
  return eventually(async () => (await page.evaluate(() => navigator.clipboard.readText())) === text, `the clipboard to hold ${text}`);
}

/** Gives the plugin the frame CODAP would give it, `width` × `height`. */
async function resize(page, plugin, width, height) {
  await page.evaluate(([w, h]) => {
    const frame = document.getElementById('plugin');
    frame.style.width = `${w}px`;
    frame.style.height = `${h}px`;
  }, [width, height]);
  await until(plugin, ([w, h]) => window.innerWidth === w && window.innerHeight === h, [width, height]);
}

/**
 * What sticks out sideways or is cut off: any element shown past the frame's left or right
 * edge, or holding content wider than its own box (the activity's ellipsis is meant).
 */
function sidewaysProblems(frame) {
  return frame.evaluate(() => {
    const width = document.documentElement.clientWidth;
    const name = (el) => (el.id ? `#${el.id}` : [el.tagName.toLowerCase(), ...el.classList].join('.'));
    const problems = [];
    for (const el of document.querySelectorAll('header, header *, main, main *')) {
      if (!el.getClientRects().length) continue;
      const box = el.getBoundingClientRect();
      if (box.left < -0.5 || box.right > width + 0.5) problems.push(`${name(el)} spans ${Math.round(box.left)}..${Math.round(box.right)} of ${width}`);
      if (!el.classList.contains('what') && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
        problems.push(`${name(el)} holds ${el.scrollWidth}px in ${el.clientWidth}px`);
      }
    }
    return problems;
  });
}

test('the states of the pairing banner, the keys, and accessibility', async () => {
  let page;
  let plugin;
  let code;
  const context = await clipboardContext(relay);
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
    const copied = await page.evaluate(() => navigator.clipboard.readText());
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
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations when copied');

    // Copy code copies just the code, says "Copied" on its button for a moment, then not.
    await plugin.click('#copy-code');
    await until(plugin, () => document.getElementById('copy-code').textContent.includes('Copied'));
    await clipboardHolds(page, display);
    await until(plugin, () => {
      const button = document.getElementById('copy-code');
      return button.textContent === 'Copy code' && !button.classList.contains('done');
    });

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
    await page.locator('#plugin').screenshot({ path: artifact('pairing-ask-me.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations while asking');
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
    await page.locator('#plugin').screenshot({ path: artifact('pairing-ended.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations when ended');
  } finally {
    await context.close();
  }
});

test('ask me holds every change, raw CODAP requests and layout changes included', async () => {
  const context = await browser.newContext();
  try {
    const { page, plugin, code } = await openInCodap(context, host, relay);
    const llm = new Llm(relay.base, code);
    const text = await llm.ok('createText', { text: 'Notes' });
    const components = () => page.evaluate(() => window.codap.model.components.map((c) => c.type));
    await plugin.check('#confirm');

    // A web view pointing anywhere waits for the person, and CODAP sees nothing of it.
    const webView = { type: 'webView', name: 'elsewhere', URL: 'https://example.com/' };
    const asked = llm.call('codapRequest', { action: 'create', resource: 'component', values: webView });
    await until(plugin, () => !document.getElementById('held').hidden);
    assert.match(await plugin.textContent('#held-text'), /codapRequest.*webView/);
    assert.deepEqual(await components(), ['text'], 'nothing created while held');
    // Reading goes on meanwhile, also through codapRequest.
    assert.deepEqual(
      (await llm.ok('codapRequest', { action: 'get', resource: 'componentList' })).map((c) => c.type),
      ['text'],
    );
    await plugin.click('#deny');
    const refusal = await asked;
    assert.equal(refusal.success, false);
    assert.equal(refusal.error.code, 'declined_by_user');
    assert.deepEqual(await components(), ['text']);

    // Changing a component's layout is held too.
    const retitled = llm.call('updateComponent', { component: text.id, changes: { title: 'Changed' } });
    await until(plugin, () => !document.getElementById('held').hidden);
    assert.match(await plugin.textContent('#held-text'), /updateComponent/);
    await plugin.click('#deny');
    assert.equal((await retitled).error.code, 'declined_by_user');
    const titles = await page.evaluate(() => window.codap.model.components.map((c) => c.title));
    assert.notDeepEqual(titles, ['Changed']);
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
    // The plugin approves callers by default: the person allows the assistant's first call.
    const pending = new Llm(relay.base, code).call('listDataContexts');
    await page.click('#approval-allow');
    const answer = await pending;
    assert.equal(answer.success, false);
    assert.equal(answer.error.code, 'codap_unavailable');
    assert.match(answer.error.message, /not running inside CODAP/);
    assert.deepEqual(await accessibilityViolations(page.mainFrame()), [], 'no WCAG AA violations outside CODAP');
    await page.screenshot({ path: artifact('pairing-outside-codap.png') });
  } finally {
    await context.close();
  }
});

/** Shows the instructions for one kind of assistant; returns their text as shown. */
async function instructions(plugin, kind) {
  await plugin.click(`#tab-${kind}`);
  return plugin.textContent(`#panel-${kind}`);
}

/** Which of the instruction panels are on screen. */
async function panelsShown(plugin) {
  const shown = [];
  for (const kind of ['connector', 'gpt', 'agent']) if (await plugin.isVisible(`#panel-${kind}`)) shown.push(kind);
  return shown;
}

test('connect instructions use the public address, one kind at a time, remembered', async () => {
  const proxied = await startRelay({ CORS_ORIGIN: host.origin, PUBLIC_BASE_URL: 'https://relay.example.test' });
  const context = await clipboardContext(proxied);
  try {
    // The page comes from 127.0.0.1; assistants are given the public address.
    const { page, plugin, code } = await openInCodap(context, host, proxied);
    const frame = page.locator('#plugin');
    assert.equal(await plugin.isVisible('#connect-local'), false, 'a public HTTPS relay needs no warning');
    const display = `${code.slice(0, 4)}-${code.slice(4)}`;
    const connector = await instructions(plugin, 'connector');
    assert.deepEqual(await panelsShown(plugin), ['connector']);
    assert.equal(await plugin.getAttribute('#tab-connector', 'aria-selected'), 'true');
    assert.ok(connector.includes('https://relay.example.test/mcp'), connector);
    assert.match(connector, /https:\/\/relay\.example\.test\/mcp\/s\/[0-9a-f]{32}/);
    assert.ok(connector.includes(display), connector);
    await frame.screenshot({ path: artifact('connect-claude-chatgpt.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations in the connector instructions');
    const gpt = await instructions(plugin, 'gpt');
    assert.deepEqual(await panelsShown(plugin), ['gpt'], 'one kind at a time');
    assert.equal(await plugin.getAttribute('#tab-connector', 'aria-selected'), 'false');
    assert.ok(gpt.includes('https://relay.example.test/openapi/actions.json'), gpt);
    await frame.screenshot({ path: artifact('connect-custom-gpt.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations in the custom GPT instructions');
    const agent = await instructions(plugin, 'agent');
    assert.deepEqual(await panelsShown(plugin), ['agent']);
    assert.match(agent, /Copy prompt/);
    assert.match(agent, /use a connector or a custom GPT/);
    await frame.screenshot({ path: artifact('connect-http-agent.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations in the HTTP agent instructions');
    const prompt = await plugin.evaluate(() => window.toolrelay.prompt());
    assert.ok(prompt.includes('Relay: https://relay.example.test'), prompt);
    assert.ok(prompt.includes(`GET https://relay.example.test/api/sessions/${display}/metadata`), prompt);
    assert.ok(prompt.includes('With MCP instead (Claude, ChatGPT connectors): connect to https://relay.example.test/mcp'), prompt);
    assert.ok(!prompt.includes(proxied.base), 'the page origin is not handed to assistants');

    // Each copy button copies its URL and says so.
    const sessionUrl = await plugin.evaluate(() => window.toolrelay.session.connectorUrl);
    assert.match(sessionUrl, /^https:\/\/relay\.example\.test\/mcp\/s\/[0-9a-f]{32}$/);
    for (const [kind, id, url] of [
      ['connector', 'mcp-url', 'https://relay.example.test/mcp'],
      ['connector', 'session-url', sessionUrl],
      ['gpt', 'actions-url', 'https://relay.example.test/openapi/actions.json'],
    ]) {
      await plugin.click(`#tab-${kind}`);
      await plugin.click(`[data-copy="${id}"]`);
      await until(plugin, (which) => document.querySelector(`[data-copy="${which}"]`).textContent.includes('Copied'), id);
      await clipboardHolds(page, url);
    }

    // The kind last shown comes first after a reload.
    await page.reload();
    const reloaded = await pluginFrame(page, `${proxied.base}/codap/`);
    await until(reloaded, () => window.toolrelay?.session?.code && window.toolrelay.ready);
    assert.equal(await reloaded.getAttribute('#tab-gpt', 'aria-selected'), 'true');
    assert.deepEqual(await panelsShown(reloaded), ['gpt']);
  } finally {
    await context.close();
    await proxied.stop();
  }
});

test('a relay cloud assistants cannot reach says why, per address, and gives no cloud instructions', async () => {
  const cases = [
    {
      name: 'loopback',
      publicBase: null,
      notice:
        'This relay is only reachable from this computer; ChatGPT and claude.ai cannot call it — use a desktop client or deploy the relay.',
      mcp: 'an MCP client on this computer',
      screenshot: 'connect-local-relay.png',
    },
    {
      name: 'a private address',
      publicBase: 'http://192.168.1.20:8080',
      notice:
        'This relay is only reachable on this network; ChatGPT and claude.ai cannot call it — use a desktop client on this network or deploy the relay.',
      mcp: 'an MCP client on this network',
      screenshot: 'connect-private-relay.png',
    },
    {
      name: 'plain http on a public name',
      publicBase: 'http://relay.example.test',
      notice:
        "This relay's address is plain http; ChatGPT and claude.ai only call https addresses — put the relay behind HTTPS (PUBLIC_BASE_URL) or use a desktop client.",
      mcp: 'a desktop MCP client',
      screenshot: 'connect-plain-http-relay.png',
    },
  ];
  for (const each of cases) {
    const served = each.publicBase ? await startRelay({ CORS_ORIGIN: host.origin, PUBLIC_BASE_URL: each.publicBase }) : relay;
    const base = each.publicBase ?? served.base;
    const context = await browser.newContext({ bypassCSP: true });
    try {
      const { page, plugin, code } = await openInCodap(context, host, served);
      assert.equal(await plugin.isVisible('#connect-local'), true, each.name);
      assert.equal(await plugin.textContent('#connect-local'), each.notice, each.name);
      // Nothing that could only work from the cloud: no custom GPT, no connector settings.
      assert.equal(await plugin.isVisible('#tab-gpt'), false, `${each.name}: no custom GPT, it calls from OpenAI's servers`);
      assert.equal(await plugin.textContent('#tab-connector'), 'Desktop client', each.name);
      const desktop = await instructions(plugin, 'connector');
      assert.ok(desktop.includes(`${base}/mcp`), desktop);
      assert.doesNotMatch(desktop, /ChatGPT|claude\.ai|Settings → Connectors/, `${each.name}: ${desktop}`);
      const agent = await instructions(plugin, 'agent');
      assert.doesNotMatch(agent, /connector|custom GPT|ChatGPT|Claude/, `${each.name}: ${agent}`);
      const prompt = await plugin.evaluate(() => window.toolrelay.prompt());
      assert.ok(prompt.includes(`With MCP instead (${each.mcp}): connect to ${base}/mcp`), prompt);
      assert.ok(prompt.includes(`Pairing code: ${code.slice(0, 4)}-${code.slice(4)}`), prompt);
      assert.doesNotMatch(prompt, /ChatGPT|Claude|claude\.ai|connectors?\b/i, `${each.name}: ${prompt}`);
      await plugin.click('#tab-connector');
      await page.locator('#plugin').screenshot({ path: artifact(each.screenshot) });
      assert.deepEqual(await accessibilityViolations(plugin), [], `no WCAG AA violations with the notice (${each.name})`);
    } finally {
      await context.close();
      if (served !== relay) await served.stop();
    }
  }
});

test('before the first call the connect instructions fit the frame, down to 300 × 420', async () => {
  const proxied = await startRelay({ CORS_ORIGIN: host.origin, PUBLIC_BASE_URL: 'https://relay.example.test' });
  const context = await browser.newContext({ bypassCSP: true });
  try {
    for (const served of [proxied, relay]) {
      const { page, plugin } = await openInCodap(context, host, served);
      assert.equal((await state(plugin)).state, 'fresh');
      const kinds = served === proxied ? ['connector', 'gpt', 'agent'] : ['connector', 'agent'];
      for (const [width, height] of [
        [360, 500],
        [300, 420],
      ]) {
        await resize(page, plugin, width, height);
        for (const kind of kinds) {
          await plugin.click(`#tab-${kind}`);
          assert.deepEqual(await panelsShown(plugin), [kind]);
          const where = `${served === proxied ? 'public' : 'local'} relay, ${kind}, ${width} × ${height}`;
          assert.deepEqual(await sidewaysProblems(plugin), [], `nothing sticks out or is cut off: ${where}`);
        }
      }
      // The smallest frame, as a teacher first sees it.
      await plugin.click('#tab-connector');
      await page.locator('#plugin').screenshot({ path: artifact(`fresh-300x420-${served === proxied ? 'public' : 'local'}.png`) });
      assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations at 300 × 420');
      await page.close();
    }
  } finally {
    await context.close();
    await proxied.stop();
  }
});

test('the countdown stays still through heartbeats and runs once the tab is cut off', async () => {
  // A 10 s session with heartbeats every second, slid while its tab is attached: a countdown
  // tied to the slides would jump back.
  const beating = await startRelay({ CORS_ORIGIN: host.origin, HEARTBEAT_SECONDS: '1', SESSION_TTL_SECONDS: '10' });
  const proxy = await startBlipProxy(beating);
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { page, plugin, code } = await openInCodap(context, host, proxy);
    const connected = 'Connected — stays open while this tab is open';
    assert.equal(await plugin.textContent('#countdown'), connected);
    // Every text the countdown shows from now on.
    await plugin.evaluate(() => {
      const countdown = document.getElementById('countdown');
      window.countdownShown = [];
      new MutationObserver(() => window.countdownShown.push(countdown.textContent)).observe(countdown, {
        childList: true,
        characterData: true,
        subtree: true,
      });
    });
    // The relay keeps the session of an attached tab alive: its upkeep slides it whenever less
    // than half its time to live is left, every 2.5 s here (a quarter of the time to live).
    // Seen from outside, as an assistant would see it: the expiry moves on, twice.
    const llm = new Llm(beating.base, code);
    const expiries = [];
    await eventually(async () => {
      const { body } = await llm.status();
      if (expiries.at(-1) !== body.expiresAt) expiries.push(body.expiresAt);
      return expiries.length >= 3;
    }, 'the upkeep to move the session\'s expiry twice', 30_000);
    for (let n = 1; n < expiries.length; n += 1) {
      assert.ok(Date.parse(expiries[n]) > Date.parse(expiries[n - 1]), `the expiry moves on: ${expiries.join(', ')}`);
    }
    // Meanwhile the plugin kept saying the same, with no number in it to go up.
    const whileConnected = await plugin.evaluate(() => window.countdownShown.splice(0));
    assert.ok(whileConnected.length > 0, 'the countdown was redrawn meanwhile');
    assert.deepEqual([...new Set(whileConnected)], [connected]);

    // The network goes away and stays away: now the idle time-out really runs.
    proxy.cut();
    await until(plugin, () => document.body.dataset.link === 'disconnected');
    const first = await until(plugin, () => {
      const match = /^Not connected — expires in (\d\d):(\d\d)$/.exec(document.getElementById('countdown').textContent);
      return match && Number(match[1]) * 60 + Number(match[2]);
    });
    assert.ok(first > 0 && first <= 10, `${first}`);
    await page.locator('#plugin').screenshot({ path: artifact('pairing-disconnected.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations while counting down');
    await until(plugin, (start) => {
      const match = /(\d\d):(\d\d)$/.exec(document.getElementById('countdown').textContent);
      return match && Number(match[1]) * 60 + Number(match[2]) < start;
    }, first);
    // It only ever went down.
    const counted = (await plugin.evaluate(() => window.countdownShown))
      .map((text) => /^Not connected — expires in (\d\d):(\d\d)$/.exec(text))
      .filter(Boolean)
      .map((match) => Number(match[1]) * 60 + Number(match[2]));
    assert.deepEqual(counted, [...counted].sort((a, b) => b - a), `counted down: ${counted.join(', ')}`);
  } finally {
    await context.close();
    await proxy.close();
    await beating.stop();
  }
});

test('the last hour of a session is announced, connected or not, with a new code at hand', async () => {
  const brief = await startRelay({ CORS_ORIGIN: host.origin, SESSION_MAX_LIFETIME_SECONDS: '1800' });
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { page, plugin, code } = await openInCodap(context, host, brief);
    await until(plugin, () => !document.getElementById('lifetime').hidden);
    const warning = await plugin.textContent('#lifetime');
    assert.match(warning, /stops working in (29|30):\d\d \(a session lasts at most 30 min\)/, warning);
    assert.equal(await plugin.isVisible('#lifetime-new'), true, 'the warning offers a new code');
    assert.equal(await plugin.textContent('#countdown'), 'Connected — stays open while this tab is open');
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations with the warning');

    // Once the assistant is at work the banner's New code is folded away; the warning's is not.
    await new Llm(brief.base, code).ok('listDataContexts');
    await until(plugin, () => document.body.dataset.state === 'active');
    assert.equal(await plugin.isVisible('#regenerate'), false, 'the compact header has no New code of its own');
    assert.equal(await plugin.isVisible('#lifetime'), true);
    assert.equal(await plugin.isVisible('#lifetime-new'), true);
    await page.locator('#plugin').screenshot({ path: artifact('pairing-last-hour.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations with the warning, compact');
    await plugin.click('#lifetime-new');
    await until(plugin, (old) => window.toolrelay.session && window.toolrelay.session.code !== old && window.toolrelay.ready, code);
    const fresh = await plugin.evaluate(() => window.toolrelay.session.code);
    assert.equal(await plugin.textContent('#code'), `${fresh.slice(0, 4)}-${fresh.slice(4)}`);
    assert.equal((await state(plugin)).state, 'fresh');
    assert.equal((await new Llm(brief.base, code).status()).status, 404, 'the old code is gone');
  } finally {
    await context.close();
    await brief.stop();
  }
});

test('the activity list keeps its columns in line', async () => {
  const context = await browser.newContext({ bypassCSP: true });
  try {
    const { plugin, code } = await openInCodap(context, host, relay);
    const llm = new Llm(relay.base, code);
    await llm.ok('createDataContext', { name: 'A rather long name for a table', collections: [{ name: 'P', attributes: [{ name: 'x' }] }] });
    await llm.ok('listDataContexts');
    await llm.call('getDataContext', { dataContext: 'Nowhere' });
    await llm.ok('createItems', { dataContext: 'A rather long name for a table', items: [{ x: 1 }] });
    await until(plugin, () => document.querySelectorAll('#activity li').length === 4);
    const columns = await plugin.evaluate(() =>
      [...document.querySelectorAll('#activity li')].map((line) => {
        const edges = (el) => {
          const box = el.getBoundingClientRect();
          return [Math.round(box.left), Math.round(box.right)];
        };
        return { what: edges(line.querySelector('.what')), time: edges(line.querySelector('time')), outcome: edges(line.querySelector('.ok, .error')) };
      }),
    );
    for (const column of ['what', 'time', 'outcome']) {
      const placed = new Set(columns.map((line) => JSON.stringify(line[column])));
      assert.equal(placed.size, 1, `every line's ${column} at the same x: ${[...placed].join(' ')}`);
    }
    assert.ok(columns[0].what[1] <= columns[0].time[0] && columns[0].time[1] <= columns[0].outcome[0], JSON.stringify(columns[0]));
  } finally {
    await context.close();
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
    await resize(page, plugin, 300, 420);
    assert.deepEqual(await fits(), { endVisible: true, scrolled: 0, overflowsSideways: false, clipped: [] }, 'at 300 × 420');
    await page.locator('#plugin').screenshot({ path: artifact('plugin-300x420.png') });
    assert.deepEqual(await accessibilityViolations(plugin), [], 'no WCAG AA violations at 300 × 420');
    await plugin.click('#end');
    await until(plugin, () => document.body.dataset.state === 'ended');
  } finally {
    await context.close();
  }
});
