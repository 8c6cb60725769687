// CODAP inside the conversation (the MCP App `ui://toolrelay/codap`): a web host made from the
// extension's own host library (ext-apps' AppBridge, with an MCP TypeScript SDK client; see
// app-host/) calls `open_codap`, reads the resource and renders it in a sandbox proxy under
// the CSP it builds from `_meta.ui.csp`. The app frames the CODAP stand-in (its own origin)
// with the plugin and the claim; the plugin redeems the claim, and the model's next
// `call_session_tool` calls change that CODAP, with no code shown and no pairing tool called.
// The app learns that the plugin paired from `codap_status`, a tool only apps may call, through
// the host. Rendered again (a conversation reopened), the app reconnects to the same session —
// in a browser that lets frames of other sites keep storage. In one that does not (this
// chromium's default, and private windows), the plugin still pairs and serves, but rendered
// again it cannot know its session, and the app and the plugin say why. A host that keeps
// CODAP's origin out of `frame-src` (claude.ai fixes it to `'self' blob: data:`) gets no CODAP,
// and the app says so at once; a CODAP that cannot start without storage (the stand-in's
// `?storage=blocked`) gets the same way out once the app's deadline passes. Hosts of ext-apps
// 1.7.5, 2.0.4 and ext-apps 2's renamed wire all render it.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startAppHost } from '../app-host/host-server.mjs';
import { artifact, eventually, launchBrowser, launchWithThirdPartyStorage, startCodapHost, startRelay, until, watchErrors } from '../harness.mjs';

const EXT_APPS_VERSION = '2.0.4';
const EXTENSION = 'io.modelcontextprotocol/ui';
const AXE = readFileSync(path.join(path.dirname(fileURLToPath(import.meta.url)), '../node_modules/axe-core/axe.min.js'), 'utf8');
const PEOPLE = [
  { name: 'Ada', age: 36, height: 165 },
  { name: 'Bo', age: 8, height: 128 },
  { name: 'Cy', age: 15, height: 170 },
];
// The app's deadlines for a plugin that does not pair (12 s after CODAP's load, 30 s after its
// frame went in), shortened for the test through the app's `codap-wait`.
const AFTER_LOAD_MS = 1500;
const AFTER_INSERT_MS = 6000;
const WAIT = `${AFTER_LOAD_MS},${AFTER_INSERT_MS}`;
// What claude.ai allows an app to frame, whatever the app declares.
const CLAUDE_FRAME_SRC = "'self' blob: data:";

let codap;
let relay;
let appHost;
let browser;
let profile;

/**
 * A relay whose CODAP is `codapUrl`, behind a host of its own: the relay knows the host's origin
 * as an app host (APP_HOSTS), so the plugin framed under it pairs by claim without asking.
 */
async function relayBehindHost(codapUrl) {
  const host = await startAppHost();
  try {
    const started = await startRelay({ CORS_ORIGIN: codap.origin, CODAP_URL: codapUrl, APP_HOSTS: host.origin });
    host.use(started);
    return { host, relay: started };
  } catch (error) {
    await host.stop();
    throw error;
  }
}

before(async () => {
  codap = await startCodapHost();
  // The relay knows CODAP's origin, not the host's: the plugin loaded for a claim may be framed
  // under any ancestors (a browser checks frame-ancestors against each one).
  ({ host: appHost, relay } = await relayBehindHost(`${codap.origin}/index.html`));
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

/** The host page (of `kind`), its MCP client connected; `open_codap` called and its resource read. */
async function conversation(context, { host = appHost, kind = `ext-apps-${EXT_APPS_VERSION}` } = {}) {
  const page = await context.newPage();
  watchErrors(page);
  await page.goto(host.page);
  await until(page, () => window.host);
  const names = await page.evaluate((hostKind) => window.host.connect(hostKind), kind);
  assert.ok(names.includes('open_codap'), `open_codap is listed: ${names.join(', ')}`);
  const opened = await page.evaluate(() => window.host.open('open_codap'));
  return { page, ...opened };
}

/** A frame of `page` whose URL starts with `prefix` and that is not one of `old`. */
function frameAt(page, prefix, old = []) {
  return eventually(() => page.frames().find((frame) => !old.includes(frame) && !frame.isDetached() && frame.url().startsWith(prefix)), `a frame at ${prefix}`);
}

/** The app's document in the latest sandbox proxy of `host`. */
async function appFrame(page, host = appHost, old = []) {
  const sandbox = await frameAt(page, host.sandbox, old);
  return eventually(() => sandbox.childFrames()[0], 'the app frame');
}

/** What the app shows: its state, its words, the tab it offers, whether CODAP's frame is there. */
function appView(app) {
  return app.evaluate(() => ({
    state: document.body.dataset.state,
    layout: document.body.dataset.layout,
    messageShown: !document.getElementById('message').hidden,
    status: document.getElementById('status').textContent,
    detail: document.getElementById('detail').hidden ? '' : document.getElementById('detail').textContent,
    tab: document.getElementById('fallback').hidden ? null : document.getElementById('open').href,
    codapFrame: Boolean(document.getElementById('codap')),
    messageHeight: Math.ceil(document.getElementById('message').getBoundingClientRect().height),
  }));
}

/** Waits until the app is in `state`; returns what it shows. */
async function appIn(app, state, timeout) {
  await until(app, (wanted) => document.body.dataset.state === wanted, state, timeout);
  return appView(app);
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

/** A render's record (see app-host/host.mjs). */
function renderOf(page, index = -1) {
  return page.evaluate((at) => window.host.renders.at(at), index);
}

/** The app asked for the height of what it shows: its message, not room for CODAP. */
async function assertSizedToMessage(page, app) {
  const { messageHeight } = await appView(app);
  assert.ok(messageHeight > 40 && messageHeight < 400, `a message, not room for CODAP: ${messageHeight}px`);
  await until(page, (height) => window.host.renders.at(-1).sizes.at(-1)?.height === height, messageHeight);
  assert.equal(await app.evaluate(() => document.documentElement.getBoundingClientRect().height), messageHeight);
}

test(`an app host (ext-apps ${EXT_APPS_VERSION}) opens a paired CODAP in the conversation; the model's next calls build a graph in it; rendered again it reconnects`, async () => {
  const { context } = profile;
  const { page, structured, meta } = await conversation(context);
  try {
    const tools = await page.evaluate(() => window.host.tools);
    const openTool = tools.find((t) => t.name === 'open_codap');
    assert.equal(openTool._meta?.ui?.resourceUri, 'ui://toolrelay/codap');
    // The app's own tool: listed by the server, for hosts to keep from the model.
    const statusTool = tools.find((t) => t.name === 'codap_status');
    assert.ok(statusTool, `codap_status is listed: ${tools.map((t) => t.name).join(', ')}`);
    assert.deepEqual(statusTool._meta?.ui?.visibility, ['app']);
    assert.equal(typeof structured.handle, 'string');
    assert.ok(structured.link.startsWith(`${codap.origin}/index.html?di=`), structured.link);
    const pluginUrl = new URL(structured.link).searchParams.get('di');
    assert.match(pluginUrl, /\/codap\/\?claim=[^&]+$/, 'the plugin URL carries the claim');
    const claim = new URL(pluginUrl).searchParams.get('claim');
    // CODAP's origin for its frame (the app reaches the relay only through the host).
    assert.deepEqual(meta.csp.frameDomains, [codap.origin]);

    const first = await page.evaluate((sandboxUrl) => window.host.render({ sandboxUrl }), appHost.sandbox);
    assert.match(appHost.policies.at(-1), new RegExp(`frame-src ${codap.origin}(;|$)`));
    const codapPage = await frameAt(page, codap.origin);
    const plugin = await frameAt(page, `${relay.base}/codap/`);
    await until(plugin, () => window.toolrelay?.ready && !location.search.includes('claim='));
    const code = await plugin.evaluate(() => window.toolrelay.session.code);
    // The app learnt it through the host: CODAP fills it, nothing else said.
    const app = codapPage.parentFrame();
    const paired = await appIn(app, 'open');
    assert.equal(paired.messageShown, false, JSON.stringify(paired));
    assert.equal(paired.layout, 'codap');
    let render = await renderOf(page, first);
    assert.deepEqual(render.appInfo, { name: 'toolrelay-codap', version: '1.0.0' });
    assert.ok(render.sizes.some((size) => size.height === 640), `the app asked for a useful height: ${JSON.stringify(render.sizes)}`);
    assert.ok(render.appToolCalls.includes('codap_status'), `the app asked codap_status: ${render.appToolCalls}`);
    const asked = appHost.toolCalls.find((call) => call.name === 'codap_status');
    assert.deepEqual(asked.arguments, { session: structured.handle, claim });
    // A version-1 wire (this release's): MCP `initialize` refused, `ui/initialize`, logs by
    // version 1's name.
    assert.deepEqual(render.received.slice(0, 2), ['initialize', 'ui/initialize']);
    await until(page, (index) => window.host.renders[index].logs.some((log) => /paired/.test(log.data)), first);
    render = await renderOf(page, first);
    assert.deepEqual([...new Set(render.logs.map((log) => log.method))], ['notifications/message']);

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
    const byModel = appHost.toolCalls.map((call) => call.name).filter((name) => name !== 'codap_status');
    assert.ok(!byModel.includes('connect_session'), `no pairing tool: ${byModel.join(', ')}`);
    assert.deepEqual([...new Set(byModel)], ['open_codap', 'call_session_tool']);
    await page.screenshot({ path: artifact('codap-app.png'), fullPage: true });

    // The host turns dark and gives less room: the app follows and asks for what there is.
    await page.evaluate(() => window.host.changeContext({ theme: 'dark', containerDimensions: { maxHeight: 500 } }));
    await until(app, () => document.documentElement.style.colorScheme === 'dark' && document.documentElement.style.height === '500px');
    await until(page, (index) => window.host.renders[index].sizes.some((size) => size.height === 500), first);

    // The conversation shown again: the same tool result, a new render of the app. Its claim
    // is spent, its session lives: the app frames CODAP again and the plugin finds its session.
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
    const appAgain = codapAgain.parentFrame();
    assert.equal((await appIn(appAgain, 'open')).messageShown, false);
    await sessionCall(page, structured.handle, 'createDataContext', { name: 'Again', collections: [{ name: 'Again', attributes: [{ name: 'x' }] }] });
    const reopened = await codapAgain.evaluate(() => window.codap.snapshot());
    assert.deepEqual(reopened.dataContexts.map((d) => d.name), ['Again'], 'the model reaches the CODAP rendered again');
    await page.screenshot({ path: artifact('codap-app-rerendered.png'), fullPage: true });
  } finally {
    await page.close();
  }
});

test("a host that fixes frame-src to 'self' blob: data: (as claude.ai does) gets no CODAP: the app says so at once, sized to what it says, and offers a tab", async () => {
  const context = await browser.newContext();
  try {
    const { page, structured } = await conversation(context);
    await page.evaluate(([sandboxUrl, frameSrc]) => window.host.render({ sandboxUrl, frameSrc }), [appHost.sandbox, CLAUDE_FRAME_SRC]);
    assert.match(appHost.policies.at(-1), /frame-src 'self' blob: data:(;|$)/);
    const app = await appFrame(page);
    const said = await appIn(app, 'blocked', 2000);
    assert.match(said.status, /does not allow CODAP/);
    assert.match(said.detail, new RegExp(`blocks frames from ${codap.origin}`));
    assert.equal(said.tab, structured.link, 'the same CODAP in a tab of its own');
    assert.equal(said.codapFrame, false);
    assert.equal(said.layout, 'message');
    await assertSizedToMessage(page, app);
    assert.deepEqual(await accessibilityViolations(app), [], 'the app saying so meets WCAG AA');
    // The host opens links (ui/open-link): no address to copy.
    assert.equal(await app.evaluate(() => document.getElementById('address').hidden), true);
    await app.click('#open');
    const links = await until(page, () => window.host.renders.at(-1).links.length > 0 && window.host.renders.at(-1).links);
    assert.deepEqual(links, [structured.link]);
    // Nothing of CODAP ran: no plugin frame, and no frame holding the stand-in.
    for (const frame of page.frames()) {
      assert.ok(!frame.url().startsWith(`${relay.base}/codap/`), `no plugin: ${frame.url()}`);
      const isCodap = await frame.evaluate(() => typeof window.codap?.snapshot === 'function').catch(() => false);
      assert.equal(isCodap, false, `no CODAP in ${frame.url()}`);
    }
    await page.screenshot({ path: artifact('codap-app-blocked.png'), fullPage: true });
  } finally {
    await context.close();
  }
});

test('a browser that blocks third-party storage pairs but cannot reconnect a rendering again: the plugin and the app say why', async () => {
  const context = await browser.newContext();
  try {
    const { page, structured } = await conversation(context);
    await page.evaluate((sandboxUrl) => window.host.render({ sandboxUrl }), appHost.sandbox);
    const codapPage = await frameAt(page, codap.origin);
    const plugin = await frameAt(page, `${relay.base}/codap/`);
    assert.equal(await plugin.evaluate(() => { try { return Boolean(localStorage); } catch { return false; } }), false, 'no third-party storage here');
    await until(plugin, () => window.toolrelay?.ready);
    await sessionCall(page, structured.handle, 'createDataContext', { name: 'People', collections: [{ name: 'People', attributes: [{ name: 'age' }] }] });
    assert.deepEqual((await codapPage.evaluate(() => window.codap.snapshot())).dataContexts.map((d) => d.name), ['People']);
    await appIn(codapPage.parentFrame(), 'open');

    // Rendered again, the page cannot know the session its spent claim opened: it says why.
    const firstSandbox = await frameAt(page, appHost.sandbox);
    await page.evaluate(([sandboxUrl, wait]) => window.host.render({ sandboxUrl, wait }), [appHost.sandbox, WAIT]);
    const again = await frameAt(page, `${relay.base}/codap/`, [plugin]);
    await until(again, () => document.querySelector('toolrelay-pairing')?.dataset.state === 'refused');
    const told = await pluginText(again);
    assert.match(told, /Not connected to your assistant/);
    assert.match(told, /keeps no storage for pages embedded in another site/);
    assert.deepEqual(await accessibilityViolations(again), [], 'the refused plugin meets WCAG AA');
    assert.equal(await again.evaluate(() => location.search), '', 'the spent claim left the URL');
    const app = await appFrame(page, appHost, [firstSandbox]);
    const said = await appIn(app, 'stalled', AFTER_LOAD_MS + AFTER_INSERT_MS + 5000);
    assert.equal(said.status, 'This CODAP was opened earlier — ask your assistant to open it again.');
    assert.match(said.detail, /your browser keeps no storage for CODAP inside this conversation/);
    assert.equal(said.tab, null, 'no tab for a spent claim');
    assert.equal(said.codapFrame, true, 'CODAP stays, saying for itself what it can');
    assert.deepEqual(await accessibilityViolations(app), [], 'the app saying so meets WCAG AA');
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

test('a spent claim rendered in another view says so, with its session\'s state: still connected elsewhere, then ended', async () => {
  const { context } = profile;
  const { page, structured } = await conversation(context);
  const other = await context.newPage();
  watchErrors(other);
  try {
    await page.evaluate((sandboxUrl) => window.host.render({ sandboxUrl }), appHost.sandbox);
    const plugin = await frameAt(page, `${relay.base}/codap/`);
    await until(plugin, () => window.toolrelay?.ready && !location.search.includes('claim='));
    await appIn((await frameAt(page, codap.origin)).parentFrame(), 'open');

    // The same tool result shown in another view of the conversation while the first holds it.
    await other.goto(appHost.page);
    await until(other, () => window.host);
    await other.evaluate((kind) => window.host.connect(kind), `ext-apps-${EXT_APPS_VERSION}`);
    const shown = await page.evaluate(() => ({ result: window.host.result, resource: window.host.resource }));
    const showAgain = () => other.evaluate(([sandboxUrl, wait, { result, resource }]) => {
      window.host.result = result;
      window.host.resource = resource;
      return window.host.render({ sandboxUrl, wait });
    }, [appHost.sandbox, WAIT, shown]);
    await showAgain();
    const app = await appFrame(other);
    const held = await appIn(app, 'spent');
    assert.equal(held.status, 'This CODAP was opened earlier — ask your assistant to open it again.');
    assert.match(held.detail, /still connected to your assistant \(\d+ tools\), in another view or tab/);
    assert.equal(held.codapFrame, false, 'no second CODAP competes for the session');
    assert.equal(held.tab, null);
    await assertSizedToMessage(other, app);
    assert.deepEqual(await accessibilityViolations(app), [], 'the app saying so meets WCAG AA');
    await other.screenshot({ path: artifact('codap-app-spent.png'), fullPage: true });

    // The person ends the session in the first view: shown again, the app says that.
    await plugin.click('#end');
    await until(plugin, () => document.body.dataset.state === 'ended');
    await showAgain();
    const app2 = await appFrame(other, appHost, [app.parentFrame()]);
    const ended = await appIn(app2, 'spent');
    assert.equal(ended.status, 'This CODAP was opened earlier — ask your assistant to open it again.');
    assert.equal(ended.detail, 'Its session has ended.');
    assert.equal(ended.codapFrame, false);
  } finally {
    await other.close();
    await page.close();
  }
});

test('a CODAP that cannot start without third-party storage: the app explains within its deadline and offers a tab, and leaves the loading CODAP in place', async () => {
  const blocked = await relayBehindHost(`${codap.origin}/index.html?storage=blocked`);
  const context = await browser.newContext();
  try {
    const { page, structured } = await conversation(context, { host: blocked.host });
    assert.match(structured.link, /\?storage=blocked&di=/);
    await page.evaluate(([sandboxUrl, wait]) => window.host.render({ sandboxUrl, wait }), [blocked.host.sandbox, WAIT]);
    const app = await appFrame(page, blocked.host);
    const codapPage = await frameAt(page, codap.origin);
    assert.match(await until(codapPage, () => window.codap?.startError), /^SecurityError/, 'the stand-in stopped where CODAP does');
    // Said once the deadline after CODAP's load passed (the one after insertion says otherwise).
    const said = await appIn(app, 'stalled', AFTER_LOAD_MS + 5000);
    assert.equal(said.status, 'CODAP has not connected to your assistant.');
    assert.match(said.detail, /your browser keeps no storage for CODAP inside this conversation/);
    assert.equal(said.tab, structured.link, 'the same CODAP in a tab of its own');
    // CODAP is not torn down: it may still be loading.
    assert.equal(said.codapFrame, true);
    assert.equal(said.layout, 'codap');
    assert.equal(codapPage.isDetached(), false);
    assert.ok(!page.frames().some((frame) => frame.url().startsWith(`${blocked.relay.base}/codap/`)), 'no plugin was loaded');
    assert.deepEqual(await accessibilityViolations(app), [], 'the app saying so meets WCAG AA');
    // The host was told too (version 1's log name: this host's).
    const render = await renderOf(page);
    assert.ok(render.logs.some((log) => log.method === 'notifications/message' && log.level === 'warning' && /not paired/.test(log.data)), JSON.stringify(render.logs));
    await page.screenshot({ path: artifact('codap-app-storage-blocked.png'), fullPage: true });

    // The way out: the person opens it, the host opens the link in a tab of its own, where
    // CODAP has its storage; the plugin there asks before it takes the claim (no app host
    // frames it). The app learns it paired there and says so; the model reaches that CODAP.
    await app.click('#open');
    assert.deepEqual(await until(page, () => window.host.renders.at(-1).links.length > 0 && window.host.renders.at(-1).links), [structured.link]);
    const tab = await context.newPage();
    watchErrors(tab);
    await tab.goto(structured.link);
    const tabPlugin = await frameAt(tab, `${blocked.relay.base}/codap/`);
    await tabPlugin.click('#claim-connect');
    await until(tabPlugin, () => window.toolrelay?.ready && !location.search.includes('claim='));
    const elsewhere = await appIn(app, 'elsewhere');
    assert.equal(elsewhere.status, 'CODAP is open in a tab of its own, connected to your assistant.');
    assert.equal(elsewhere.layout, 'message');
    assert.equal(elsewhere.codapFrame, true, 'the frame that never loaded is hidden, not torn down');
    await assertSizedToMessage(page, app);
    await sessionCall(page, structured.handle, 'createDataContext', { name: 'InTab', collections: [{ name: 'InTab', attributes: [{ name: 'x' }] }] });
    assert.deepEqual((await tab.evaluate(() => window.codap.snapshot())).dataContexts.map((d) => d.name), ['InTab']);
  } finally {
    await context.close();
    await blocked.host.stop();
    await blocked.relay.stop();
  }
});

for (const { kind, wire } of [
  { kind: 'ext-apps-1.7.5', wire: 1 },
  { kind: 'ext-apps-2-wire', wire: 2 },
]) {
  test(`a host of ${kind} renders the app, which pairs CODAP and speaks that host's wire`, async () => {
    const { page } = await conversation(profile.context, { kind });
    try {
      const index = await page.evaluate((sandboxUrl) => window.host.render({ sandboxUrl }), appHost.sandbox);
      const codapPage = await frameAt(page, codap.origin);
      const plugin = await frameAt(page, `${relay.base}/codap/`);
      await until(plugin, () => window.toolrelay?.ready && !location.search.includes('claim='));
      assert.equal((await appIn(codapPage.parentFrame(), 'open')).messageShown, false);
      await until(page, (at) => window.host.renders[at].logs.some((log) => /paired/.test(log.data)), index);
      const render = await renderOf(page, index);
      assert.deepEqual(render.appInfo, { name: 'toolrelay-codap', version: '1.0.0' });
      assert.ok(render.appToolCalls.includes('codap_status'));
      const logMethods = [...new Set(render.logs.map((log) => log.method))];
      if (wire === 2) {
        // Capabilities in MCP `initialize`, under the extension; then `ui/initialize` for the context.
        assert.deepEqual(render.received.slice(0, 3), ['initialize', 'notifications/initialized', 'ui/initialize']);
        assert.deepEqual(render.initialize.capabilities.extensions[EXTENSION], { availableDisplayModes: ['inline'] });
        assert.deepEqual(render.initialize.clientInfo, { name: 'toolrelay-codap', version: '1.0.0' });
        assert.deepEqual(logMethods, ['ui/log']);
      } else {
        assert.deepEqual(render.received.slice(0, 2), ['initialize', 'ui/initialize']);
        assert.ok(!render.received.includes('notifications/initialized'));
        assert.deepEqual(logMethods, ['notifications/message']);
      }
    } finally {
      await page.close();
    }
  });
}
