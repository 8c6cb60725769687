// CODAP inside the conversation (the MCP App `ui://toolrelay/codap`): a web host made from the
// extension's own host library (ext-apps' AppBridge, with the MCP TypeScript SDK's client; see
// app-host/) calls `open_codap`, reads the resource and renders it in a sandbox proxy under
// the CSP it builds from `_meta.ui.csp`. The app frames the CODAP stand-in (its own origin)
// with the plugin and the claim; the plugin redeems the claim, and the model's next
// `call_session_tool` calls change that CODAP, with no code shown and no pairing tool called.
// Rendered again (a conversation reopened), the app reconnects to the same session — in a
// browser that lets frames of other sites keep storage. In one that does not (this chromium's
// default, and private windows), the plugin still pairs and serves, but rendered again it cannot
// know its session and says why. A host that leaves CODAP's origin out of `frame-src` gets no
// CODAP, and the app says so.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startAppHost } from '../app-host/host-server.mjs';
import { artifact, eventually, launchBrowser, launchWithThirdPartyStorage, startCodapHost, startRelay, until, watchErrors } from '../harness.mjs';

const EXT_APPS_VERSION = '2.0.4';
const AXE = readFileSync(path.join(path.dirname(fileURLToPath(import.meta.url)), '../node_modules/axe-core/axe.min.js'), 'utf8');
const PEOPLE = [
  { name: 'Ada', age: 36, height: 165 },
  { name: 'Bo', age: 8, height: 128 },
  { name: 'Cy', age: 15, height: 170 },
];

let codap;
let relay;
let appHost;
let browser;
let profile;

before(async () => {
  codap = await startCodapHost();
  // The relay knows CODAP's origin, not the host's: the plugin loaded for a claim may be framed
  // under any ancestors (a browser checks frame-ancestors against each one).
  relay = await startRelay({ CORS_ORIGIN: codap.origin, CODAP_URL: `${codap.origin}/index.html` });
  appHost = await startAppHost(relay);
  browser = await launchBrowser();
  profile = await launchWithThirdPartyStorage();
});
after(async () => {
  await profile?.close();
  await browser?.close();
  await appHost?.stop();
  await relay?.stop();
  await codap?.stop();
});

/** The host page, its MCP client connected; `open_codap` called and its resource read. */
async function conversation(context) {
  const page = await context.newPage();
  watchErrors(page);
  await page.goto(appHost.page);
  await until(page, () => window.host);
  const names = await page.evaluate(() => window.host.connect());
  assert.ok(names.includes('open_codap'), `open_codap is listed: ${names.join(', ')}`);
  const opened = await page.evaluate(() => window.host.open('open_codap'));
  return { page, ...opened };
}

/** A frame of `page` whose URL starts with `prefix` and that is not one of `old`. */
function frameAt(page, prefix, old = []) {
  return eventually(() => page.frames().find((frame) => !old.includes(frame) && !frame.isDetached() && frame.url().startsWith(prefix)), `a frame at ${prefix}`);
}

/** A later turn: the model calls a tool of the session `open_codap` opened, by its handle. */
async function sessionCall(page, handle, name, args) {
  const result = await page.evaluate(([session, tool, toolArgs]) => window.host.call('call_session_tool', { session, name: tool, arguments: toolArgs }), [handle, name, args]);
  assert.notEqual(result.isError, true, `${name}: ${JSON.stringify(result)}`);
  return result.structuredContent;
}

/** What axe-core finds against WCAG 2.1 AA in a frame. */
async function accessibilityViolations(frame) {
  await frame.evaluate(AXE);
  return frame.evaluate(async () => {
    const result = await window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } });
    return result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
  });
}

/** What the person sees in the plugin: its text, including what is only announced. */
function pluginText(plugin) {
  return plugin.evaluate(() => `${document.body.innerText}\n${document.getElementById('announcer')?.textContent ?? ''}\n${document.title}`);
}

test(`an app host (ext-apps ${EXT_APPS_VERSION}) opens a paired CODAP in the conversation; the model's next calls build a graph in it; rendered again it reconnects`, async () => {
  const { context } = profile;
  const { page, structured, meta } = await conversation(context);
  try {
    const tool = await page.evaluate(() => window.host.tools.find((t) => t.name === 'open_codap'));
    assert.equal(tool._meta?.ui?.resourceUri, 'ui://toolrelay/codap');
    assert.equal(typeof structured.handle, 'string');
    assert.ok(structured.link.startsWith(`${codap.origin}/index.html?di=`), structured.link);
    const pluginUrl = new URL(structured.link).searchParams.get('di');
    assert.match(pluginUrl, /\/codap\/\?claim=[^&]+$/, 'the plugin URL carries the claim');
    assert.deepEqual(meta.csp.frameDomains, [codap.origin]);
    assert.ok(meta.csp.connectDomains.includes(relay.base), JSON.stringify(meta.csp));

    const first = await page.evaluate((sandboxUrl) => window.host.render({ sandboxUrl }), appHost.sandbox);
    assert.match(appHost.policies.at(-1), new RegExp(`frame-src ${codap.origin}(;|$)`));
    const codapPage = await frameAt(page, codap.origin);
    const plugin = await frameAt(page, `${relay.base}/codap/`);
    await until(plugin, () => window.toolrelay?.ready && !location.search.includes('claim='));
    const code = await plugin.evaluate(() => window.toolrelay.session.code);
    const render = await page.evaluate((index) => window.host.renders[index], first);
    assert.deepEqual(render.appInfo, { name: 'toolrelay-codap', version: '1.0.0' });
    assert.ok(render.sizes.some((size) => size.height === 640), `the app asked for a useful height: ${JSON.stringify(render.sizes)}`);

    // The model's next turn reaches this CODAP.
    const created = await sessionCall(page, structured.handle, 'createDataContext', {
      name: 'People',
      collections: [{ name: 'People', attributes: [{ name: 'name' }, { name: 'age', type: 'numeric' }, { name: 'height', type: 'numeric' }] }],
    });
    assert.equal(created.name, 'People');
    await sessionCall(page, structured.handle, 'createItems', { dataContext: 'People', items: PEOPLE });
    const graph = await sessionCall(page, structured.handle, 'createGraph', { dataContext: 'People', xAttribute: 'age', yAttribute: 'height' });
    const model = await codapPage.evaluate(() => window.codap.snapshot());
    assert.deepEqual(model.dataContexts.map((d) => d.name), ['People']);
    assert.deepEqual(model.dataContexts[0].items.map((item) => item.values.name), PEOPLE.map((p) => p.name));
    assert.deepEqual(
      model.components.map((c) => ({ id: c.id, type: c.type, x: c.xAttributeName, y: c.yAttributeName })),
      [{ id: graph.id, type: 'graph', x: 'age', y: 'height' }],
    );

    // No code was shown, and the model never paired by hand.
    const shown = await pluginText(plugin);
    assert.match(shown, /Connected to your assistant/);
    for (const form of [code, `${code.slice(0, 4)}-${code.slice(4)}`]) assert.ok(!shown.includes(form), `the code ${form} is not shown`);
    assert.equal(await plugin.evaluate(() => document.querySelector('toolrelay-pairing').dataset.mode), 'assistant');
    assert.deepEqual(await accessibilityViolations(plugin), [], 'the plugin paired by claim meets WCAG AA');
    // Its keys leave the assistant's session alone: no prompt to copy, no new code.
    await plugin.press('body', 'c');
    await plugin.press('body', 'r');
    assert.equal(await plugin.evaluate(() => window.toolrelay.prompt()), null);
    assert.equal(await plugin.evaluate(() => window.toolrelay.session.code), code);
    const called = appHost.toolCalls.map((call) => call.name);
    assert.ok(!called.includes('connect_session'), `no pairing tool: ${called.join(', ')}`);
    assert.deepEqual([...new Set(called)], ['open_codap', 'call_session_tool']);
    await page.screenshot({ path: artifact('codap-app.png'), fullPage: true });

    // The host turns dark and gives less room: the app follows and asks for what there is.
    const app = codapPage.parentFrame();
    await page.evaluate(() => window.host.changeContext({ theme: 'dark', containerDimensions: { maxHeight: 500 } }));
    await until(app, () => document.documentElement.style.colorScheme === 'dark' && document.documentElement.style.height === '500px');
    await until(page, (index) => window.host.renders[index].sizes.some((size) => size.height === 500), first);

    // The conversation shown again: the same tool result, a new render of the app.
    await page.evaluate((sandboxUrl) => window.host.render({ sandboxUrl }), appHost.sandbox);
    assert.equal(await page.evaluate((index) => window.host.renders[index].teardown, first), 'answered', 'the app answered ui/resource-teardown');
    const codapAgain = await frameAt(page, codap.origin, [codapPage]);
    const pluginAgain = await frameAt(page, `${relay.base}/codap/`, [plugin]);
    await until(pluginAgain, () => window.toolrelay?.ready);
    assert.equal(await pluginAgain.evaluate(() => window.toolrelay.session.code), code, 'the same session');
    assert.equal(await pluginAgain.evaluate(() => document.querySelector('toolrelay-pairing').dataset.state), 'fresh');
    const again = await pluginText(pluginAgain);
    assert.match(again, /Connected to your assistant/);
    assert.doesNotMatch(again, /used|expired|Not connected/i);
    await sessionCall(page, structured.handle, 'createDataContext', { name: 'Again', collections: [{ name: 'Again', attributes: [{ name: 'x' }] }] });
    const reopened = await codapAgain.evaluate(() => window.codap.snapshot());
    assert.deepEqual(reopened.dataContexts.map((d) => d.name), ['Again'], 'the model reaches the CODAP rendered again');
    await page.screenshot({ path: artifact('codap-app-rerendered.png'), fullPage: true });

  } finally {
    await page.close();
  }
});

test("a host that leaves CODAP's origin out of frame-src gets no CODAP; a browser that blocks third-party storage pairs but cannot reconnect, and says so", async () => {
  const context = await browser.newContext();
  try {
    const { page, meta } = await conversation(context);
    const strict = { ...meta.csp, frameDomains: [] };
    await page.evaluate(([sandboxUrl, csp]) => window.host.render({ sandboxUrl, csp }), [appHost.sandbox, strict]);
    assert.match(appHost.policies.at(-1), /frame-src 'none'/);
    const sandbox = await frameAt(page, appHost.sandbox);
    const app = await eventually(() => sandbox.childFrames()[0], 'the app frame');
    const said = await until(app, () => document.body.dataset.state === 'error' && document.getElementById('status').textContent);
    assert.match(said, /does not allow CODAP/);
    assert.deepEqual(await accessibilityViolations(app), [], 'the app saying so meets WCAG AA');
    // It offers the same CODAP in a tab, which the host opens (ui/open-link): no address to copy.
    assert.equal(await app.evaluate(() => document.getElementById('address').hidden), true);
    await app.click('#open');
    const links = await until(page, () => window.host.renders.at(-1).links.length > 0 && window.host.renders.at(-1).links);
    assert.deepEqual(links, [(await page.evaluate(() => window.host.result.structuredContent.link))]);
    // Nothing of CODAP ran: no plugin frame, and no frame holding the stand-in.
    for (const frame of page.frames()) {
      assert.ok(!frame.url().startsWith(`${relay.base}/codap/`), `no plugin: ${frame.url()}`);
      const isCodap = await frame.evaluate(() => typeof window.codap?.snapshot === 'function').catch(() => false);
      assert.equal(isCodap, false, `no CODAP in ${frame.url()}`);
    }
    await page.screenshot({ path: artifact('codap-app-blocked.png'), fullPage: true });

    // This browser's default: no storage for frames of other sites. The plugin pairs anyway.
    const { structured } = await page.evaluate(() => window.host.open('open_codap'));
    await page.evaluate((sandboxUrl) => window.host.render({ sandboxUrl }), appHost.sandbox);
    const codapPage = await frameAt(page, codap.origin);
    const plugin = await frameAt(page, `${relay.base}/codap/`);
    assert.equal(await plugin.evaluate(() => { try { return Boolean(localStorage); } catch { return false; } }), false, 'no third-party storage here');
    await until(plugin, () => window.toolrelay?.ready);
    await sessionCall(page, structured.handle, 'createDataContext', { name: 'People', collections: [{ name: 'People', attributes: [{ name: 'age' }] }] });
    assert.deepEqual((await codapPage.evaluate(() => window.codap.snapshot())).dataContexts.map((d) => d.name), ['People']);
    // Rendered again, the page cannot know the session its spent claim opened: it says why.
    await page.evaluate((sandboxUrl) => window.host.render({ sandboxUrl }), appHost.sandbox);
    const again = await frameAt(page, `${relay.base}/codap/`, [plugin]);
    await until(again, () => document.querySelector('toolrelay-pairing')?.dataset.state === 'refused');
    const told = await pluginText(again);
    assert.match(told, /Not connected to your assistant/);
    assert.match(told, /keeps no storage for pages embedded in another site/);
    assert.deepEqual(await accessibilityViolations(again), [], 'the refused plugin meets WCAG AA');
    assert.equal(await again.evaluate(() => location.search), '', 'the spent claim left the URL');
    await page.screenshot({ path: artifact('codap-app-no-storage.png'), fullPage: true });
    // A code still works in the same plugin.
    await again.click('#regenerate');
    const shownCode = await until(again, () => window.toolrelay.ready && document.querySelector('toolrelay-pairing').dataset.mode === 'code' && document.getElementById('code').textContent);
    const newCode = await again.evaluate(() => window.toolrelay.session.code);
    assert.equal(shownCode, `${newCode.slice(0, 4)}-${newCode.slice(4)}`);
  } finally {
    await context.close();
  }
});
