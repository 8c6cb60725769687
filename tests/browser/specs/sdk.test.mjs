// The browser SDK (/sdk/toolrelay.js) on pages that are not the plugin: the demo page the
// relay serves, and a plain WebMCP page on another origin that imports the SDK from the relay.
// An assistant calls their tools over HTTP /call, over MCP (/mcp/s/{handle}; rmcp's client,
// the tests crate's mcp-call, and the official Python SDK's) and over gRPC;
// each call runs once and the page shows it — over WebSocket, SSE and polling, through a
// network that drops mid-run — including a tool that throws, one that never answers and one
// added after pairing.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { artifact, eventually, grpcCall, inNewPage, launchBrowser, Llm, McpClient, officialMcpCall, rmcpCall, rmcpWatchListChanged, startBlipProxy, startPageHost, startRelay, until } from '../harness.mjs';

const AXE = readFileSync(path.join(path.dirname(fileURLToPath(import.meta.url)), '../node_modules/axe-core/axe.min.js'), 'utf8');
// A call nobody answers expires this soon (REQUEST_TIMEOUT_SECONDS).
const REQUEST_TIMEOUT_SECONDS = 3;

let relay;
// The same, where calls expire after REQUEST_TIMEOUT_SECONDS.
let impatient;
let browser;

// No CORS_ORIGIN: provider routes are open to every origin, as by default.
before(async () => {
  relay = await startRelay();
  impatient = await startRelay({ REQUEST_TIMEOUT_SECONDS: String(REQUEST_TIMEOUT_SECONDS) });
  browser = await launchBrowser();
});
after(async () => {
  await browser?.close();
  await relay?.stop();
  await impatient?.stop();
});

async function accessibilityViolations(page) {
  await page.evaluate(AXE);
  return page.evaluate(async () => {
    const result = await window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } });
    return result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
  });
}

/** The names of the session's functions, as /metadata lists them. */
async function functionNames(llm) {
  const { body } = await llm.metadata();
  return body.tools.flatMap((tool) => tool.functions.map((f) => f.name));
}

/** Once the page's `say` and `shout` are both registered, an assistant calls each, and the page shows it. */
async function saysAndShouts(page, llm) {
  await eventually(async () => (await functionNames(llm)).includes('shout'), 'both tools to be registered');
  assert.deepEqual(await llm.ok('say', { text: 'hello' }), { said: 'hello' });
  assert.equal(await page.textContent('#said'), 'hello');
  await llm.ok('shout', { text: 'hello' });
  assert.equal(await page.textContent('#said'), 'HELLO');
}

/** What `pending` (a call held for the person's approval) gives once the person presses Allow in `page`. */
async function allowing(page, pending) {
  await page.click('#approval-allow');
  return pending;
}

/** The text of an MCP tool result. */
function mcpText(result) {
  return result.content.map((part) => part.text).join('\n');
}

test('the demo page: tools called over HTTP, MCP and gRPC run once each and show; errors, time-outs and a tool added later', async () => {
  await inNewPage(browser, async (page) => {
    const mcp = { client: null };
    try {
      await page.goto(`${impatient.base}/demo/`);
      await until(page, () => window.demo?.relay.ready);
      const { code, connectorUrl } = await page.evaluate(() => window.demo.relay.session);
      assert.match(await page.textContent('#code'), /^[A-Z2-7]{4}-[A-Z2-7]{4}$/);
      assert.equal(await page.evaluate(() => window.demo.relay.transportKind), 'websocket');
      const llm = new Llm(impatient.base, code);
      // The page approves callers (its pairing element asks): the first use of the code — here
      // reading the tools — waits for the person's Allow, which allows this address from then on.
      const names = await allowing(page, functionNames(llm));
      for (const name of ['addItem', 'listItems', 'removeItem']) assert.ok(names.includes(name), `${name} in ${names}`);

      // One call over each way in.
      const viaHttp = await llm.ok('addItem', { text: 'from HTTP' });
      assert.deepEqual(viaHttp, { id: 1, text: 'from HTTP', by: 'assistant' });
      mcp.client = new McpClient(connectorUrl);
      await mcp.client.connect();
      const listed = (await mcp.client.listTools()).map((tool) => tool.name);
      assert.ok(listed.includes('addItem'), `MCP lists the page's tools: ${listed}`);
      // The call itself with rmcp's client (the tests crate's mcp-call), as an MCP host would.
      const viaMcp = await rmcpCall(connectorUrl, 'addItem', { text: 'from MCP' });
      assert.ok(!viaMcp.isError, JSON.stringify(viaMcp));
      assert.match(JSON.stringify(viaMcp), /from MCP/);
      const viaGrpc = await grpcCall(impatient, code, 'addItem', { text: 'from gRPC' }, 'grpc-add-1');
      assert.equal(viaGrpc.status, 'REQUEST_STATUS_COMPLETED', JSON.stringify(viaGrpc));
      assert.equal(viaGrpc.response.success, true);
      // Asked again with its id, the gRPC call is answered from the relay and not run again.
      const again = await grpcCall(impatient, code, 'addItem', { text: 'from gRPC' }, 'grpc-add-1');
      assert.deepEqual(again.response, viaGrpc.response);
      const shown = await page.$$eval('#list li', (items) => items.map((li) => li.firstChild.textContent));
      assert.deepEqual(shown, ['from HTTP', 'from MCP', 'from gRPC'], 'each call ran once, and the page shows it');
      await until(page, () => document.querySelectorAll('#activity li.done').length === 3);

      // A tool that throws answers with its message; the call does not hang.
      const missing = await llm.call('removeItem', { id: 99 });
      assert.equal(missing.success, false);
      assert.equal(missing.error.code, 'tool_error');
      assert.match(missing.error.message, /There is no item 99/);
      await until(page, () => /There is no item 99/.test(document.querySelector('#activity li.failed .reason')?.textContent));

      // Ask me before changes: a tool not marked read-only waits for the person.
      await page.check('#confirm');
      const removal = llm.call('removeItem', { id: 1 });
      await until(page, () => !document.getElementById('held').hidden);
      assert.deepEqual(await accessibilityViolations(page), [], 'no WCAG AA violations while asking');
      await page.click('#allow');
      assert.equal((await removal).success, true);
      assert.equal(await page.locator('#list li').count(), 2);
      // A call its caller cancels while it waits for the person: the question goes, the tool
      // never runs, and the activity list says cancelled.
      const waiting = await llm.request('POST', '/request', { functionName: 'removeItem', args: { id: 2 } });
      await until(page, () => !document.getElementById('held').hidden);
      const cancelled = await llm.request('DELETE', `/requests/${waiting.body.requestId}`);
      assert.equal(cancelled.body.status, 'cancelled', JSON.stringify(cancelled));
      await until(page, () => document.getElementById('held').hidden);
      await until(page, () => document.querySelector('#activity li.cancelled .cancelled')?.textContent === 'cancelled');
      assert.equal(await page.locator('#list li').count(), 2, 'the cancelled removal never ran');

      // A tool added after pairing: in the metadata, and MCP clients are told the list changed.
      await mcp.client.listen();
      const rmcpWatch = await rmcpWatchListChanged(connectorUrl, 20);
      const addCountItems = () =>
        page.evaluate(() =>
          window.demo.relay.addTool({
            name: 'countItems',
            description: 'How many items the list has.',
            // A read: the "ask me" switch, still on, lets it through.
            readOnly: true,
            inputSchema: { type: 'object', properties: {} },
            execute: () => ({ count: window.demo.items.length }),
          }),
        );
      await addCountItems();
      const deadline = Date.now() + 10000;
      while (!mcp.client.notifications.some((n) => n.method === 'notifications/tools/list_changed')) {
        assert.ok(Date.now() < deadline, `list_changed arrives: ${JSON.stringify(mcp.client.notifications)}`);
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      assert.ok((await mcp.client.listTools()).some((tool) => tool.name === 'countItems'));
      // rmcp's client is told too, and then lists the new tool. It opens its stream for
      // notifications by itself some time after connecting, and a change made before that
      // reaches nobody: until it hears, the page registers the same tools again (each
      // registration is a change).
      const rmcpDeadline = Date.now() + 15000;
      let rmcpListed;
      while (!rmcpListed) {
        rmcpListed = await Promise.race([rmcpWatch.changed, new Promise((resolve) => setTimeout(resolve, 500))]);
        if (!rmcpListed) {
          assert.ok(Date.now() < rmcpDeadline, 'rmcp hears of a change of the tools');
          await addCountItems();
        }
      }
      assert.ok(rmcpListed.includes('countItems'), `rmcp lists countItems after list_changed: ${rmcpListed}`);
      assert.ok((await functionNames(llm)).includes('countItems'));
      assert.deepEqual(await llm.ok('countItems'), { count: 2 });
      // And removed again.
      await page.evaluate(() => window.demo.relay.removeTool('countItems'));
      await eventually(async () => !(await functionNames(llm)).includes('countItems'), 'countItems to leave the metadata');

      // A tool that never answers: the call expires with an error that says so.
      await page.evaluate(() =>
        window.demo.relay.addTool({ name: 'never', description: 'Never answers.', execute: () => new Promise(() => {}) }),
      );
      await eventually(async () => (await functionNames(llm)).includes('never'), 'the tool to be registered');
      const started = Date.now();
      const { status, body: expired } = await llm.request('POST', '/call', { functionName: 'never', args: {}, timeoutMs: 20000 });
      assert.equal(status, 200, JSON.stringify(expired));
      assert.equal(expired.success, false);
      assert.equal(expired.error.code, 'request_expired', JSON.stringify(expired));
      assert.match(expired.error.message, new RegExp(`did not answer within ${REQUEST_TIMEOUT_SECONDS} s`));
      assert.ok(Date.now() - started < 15000, 'it expired at the relay\'s time-out');

      await page.screenshot({ path: artifact('demo.png') });
      assert.deepEqual(await accessibilityViolations(page), [], 'no WCAG AA violations on the demo');
    } finally {
      mcp.client?.close();
    }
  });
});

/** A WebMCP page (tools registered with document/navigator.modelContext) bridged by the SDK at `sdk`. */
function webMcpPage(sdk) {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>A WebMCP counter</title></head>
<body>
<h1>Counter: <output id="value">0</output></h1>
<script type="module">
  import { connect, bridgeWebMCP } from '${sdk}';
  window.relay = connect({ resume: false });
  bridgeWebMCP(window.relay);
</script>
<script type="module">
  // The page's own WebMCP code, which knows nothing of toolrelay.
  window.counter = { value: 0, runs: [] };
  const show = () => { document.getElementById('value').textContent = String(window.counter.value); };
  await document.modelContext.registerTool({
    name: 'increment',
    description: 'Adds n to the counter; returns the new value.',
    inputSchema: { type: 'object', properties: { n: { type: 'integer' }, tag: { type: 'string' } }, required: ['n'] },
    async execute({ n, tag }) {
      window.counter.runs.push(tag ?? null);
      // A moment's work, so that answers are on their way when the network drops.
      await new Promise((resolve) => setTimeout(resolve, 300));
      window.counter.value += n;
      show();
      return { content: [{ type: 'text', text: String(window.counter.value) }], structuredContent: { value: window.counter.value } };
    },
  });
  navigator.modelContext.provideContext({
    tools: [
      { name: 'read-counter', description: 'The counter.', annotations: { readOnlyHint: true }, execute: async () => ({ content: [{ type: 'text', text: JSON.stringify({ value: window.counter.value }) }] }) },
      { name: 'refuse', description: 'Always fails.', execute: async () => ({ isError: true, content: [{ type: 'text', text: 'The counter refuses.' }] }) },
    ],
  });
</script>
</body></html>`;
}

/**
 * A page whose model context came before the SDK (as an older polyfill's: registerTool,
 * getTools, executeTool taking a JSON string, so it refuses the object the bridge gives first;
 * toolchange), with a tool registered before the bridge and one after. (Chromium 156's own
 * context: specs/webmcp.test.mjs.)
 */
function polyfilledPage(sdk) {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>A polyfilled WebMCP page</title></head>
<body>
<p id="said">nothing yet</p>
<script>
  // A stand-in for a polyfill's context: the bridge sees only its public methods.
  const tools = new Map();
  const context = new EventTarget();
  context.registerTool = async (tool) => { tools.set(tool.name, tool); context.dispatchEvent(new Event('toolchange')); };
  context.getTools = async () => [...tools.values()].map(({ name, description, inputSchema }) => ({ name, description, inputSchema }));
  context.executeTool = async (tool, json) => JSON.stringify(await tools.get(tool.name).execute(JSON.parse(json)));
  Object.defineProperty(document, 'modelContext', { value: context });
  context.registerTool({ name: 'say', description: 'Shows a sentence.', inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
    execute: ({ text }) => { document.getElementById('said').textContent = text; return { structuredContent: { said: text }, content: [] }; } });
</script>
<script type="module">
  import { connect, bridgeWebMCP } from '${sdk}';
  window.relay = connect({ resume: false });
  bridgeWebMCP(window.relay);
  document.modelContext.registerTool({ name: 'shout', description: 'Shows a sentence loudly.', inputSchema: { type: 'object', properties: { text: { type: 'string' } } },
    execute: ({ text }) => { document.getElementById('said').textContent = text.toUpperCase(); return { content: [{ type: 'text', text: 'done' }] }; } });
</script>
</body></html>`;
}

test('a page with a WebMCP context of its own (a polyfill taking JSON strings) is bridged through getTools and executeTool', async () => {
  const host = await startPageHost({ '/polyfilled.html': polyfilledPage(`${relay.base}/sdk/toolrelay.js`) });
  try {
    await inNewPage(browser, async (page) => {
      await page.goto(`${host.origin}/polyfilled.html`);
      await until(page, () => window.relay?.ready);
      const llm = new Llm(relay.base, await page.evaluate(() => window.relay.code));
      await saysAndShouts(page, llm);
    });
  } finally {
    await host.stop();
  }
});

/**
 * A page with a model context as browsers before Chromium 156 had (registerTool with {signal},
 * unregisterTool, provideContext, clearContext; no getTools, no executeTool), defined before
 * the SDK; the page registers its tools after bridging.
 */
function nativePage(sdk) {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>A page with a native model context</title></head>
<body>
<p id="said">nothing yet</p>
<script>
  // A stand-in for the browser's own context: it keeps its tools to itself.
  const tools = new Map();
  window.nativeTools = tools;
  const context = {
    registerTool(tool, { signal } = {}) {
      if (tools.has(tool.name)) return Promise.reject(new DOMException('duplicate', 'InvalidStateError'));
      tools.set(tool.name, tool);
      signal?.addEventListener('abort', () => tools.delete(tool.name), { once: true });
      return Promise.resolve();
    },
    unregisterTool(name) { tools.delete(name); },
    provideContext({ tools: given = [] } = {}) { tools.clear(); for (const tool of given) tools.set(tool.name, tool); },
    clearContext() { tools.clear(); },
  };
  Object.defineProperty(navigator, 'modelContext', { value: context });
</script>
<script type="module">
  import { connect, bridgeWebMCP } from '${sdk}';
  window.relay = connect({ resume: false });
  bridgeWebMCP(window.relay);
  const show = (text) => { document.getElementById('said').textContent = text; };
  window.shoutControl = new AbortController();
  await navigator.modelContext.registerTool({ name: 'say', description: 'Shows a sentence.',
    inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
    execute: ({ text }) => { show(text); return { structuredContent: { said: text }, content: [] }; } });
  await navigator.modelContext.registerTool({ name: 'shout', description: 'Shows a sentence loudly.',
    inputSchema: { type: 'object', properties: { text: { type: 'string' } } },
    execute: ({ text }) => { show(text.toUpperCase()); return { content: [{ type: 'text', text: 'done' }] }; } }, { signal: window.shoutControl.signal });
  window.registered = true;
</script>
</body></html>`;
}

test('a page with a pre-156 native WebMCP context (registerTool, no getTools) is bridged by wrapping its methods; an aborted signal unregisters', async () => {
  const host = await startPageHost({ '/native.html': nativePage(`${relay.base}/sdk/toolrelay.js`) });
  try {
    await inNewPage(browser, async (page) => {
      await page.goto(`${host.origin}/native.html`);
      await until(page, () => window.relay?.ready && window.registered);
      // The native context got them too.
      assert.deepEqual(await page.evaluate(() => [...window.nativeTools.keys()]), ['say', 'shout']);
      const llm = new Llm(relay.base, await page.evaluate(() => window.relay.code));
      await saysAndShouts(page, llm);

      await page.evaluate(() => window.shoutControl.abort());
      await eventually(async () => !(await functionNames(llm)).includes('shout'), 'shout to be gone from /metadata');
      assert.ok((await functionNames(llm)).includes('say'));
      assert.deepEqual(await page.evaluate(() => [...window.nativeTools.keys()]), ['say']);

      // provideContext and clearContext pass through, and the relay follows.
      await page.evaluate(() => navigator.modelContext.provideContext({ tools: [{ name: 'ping', description: 'Pong.', execute: () => ({ structuredContent: { pong: true }, content: [] }) }] }));
      await eventually(async () => (await functionNames(llm)).includes('ping'), 'ping to be registered');
      assert.deepEqual(await llm.ok('ping', {}), { pong: true });
      await page.evaluate(() => navigator.modelContext.clearContext());
      assert.equal(await page.evaluate(() => window.nativeTools.size), 0);
      // (/metadata lists the relay's built-in tools as well.)
      await eventually(async () => !(await functionNames(llm)).some((name) => ['say', 'ping'].includes(name)), 'say and ping to be gone after clearContext');
    });
  } finally {
    await host.stop();
  }
});

/** A page of another origin with <toolrelay-pairing>, both imported from the relay at `base`. */
function pairingPage(base) {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>A page with the pairing element</title></head>
<body>
<main><h1>Notes</h1><p>A page of its own origin that pairs with an assistant.</p></main>
<toolrelay-pairing heading="Assistant" subject="the notes"></toolrelay-pairing>
<script type="module">
  import { connect } from '${base}/sdk/toolrelay.js';
  import '${base}/sdk/pairing.js';
  window.relay = connect({ resume: false });
  window.relay.addTool({ name: 'ping', description: 'Pong.', execute: () => ({ pong: true }) });
  document.querySelector('toolrelay-pairing').connection = window.relay;
</script>
</body></html>`;
}

test('<toolrelay-pairing> on a page of another origin loads its styles from the relay, shows the code, and has no WCAG AA violation', async () => {
  const host = await startPageHost({ '/pairing.html': pairingPage(relay.base) });
  try {
    await inNewPage(browser, async (page) => {
      const styles = [];
      page.on('response', (response) => {
        if (response.url().endsWith('/pairing.css')) styles.push({ url: response.url(), status: response.status() });
      });
      await page.goto(`${host.origin}/pairing.html`);
      await until(page, () => window.relay?.ready);
      const code = await page.evaluate(() => window.relay.code);
      await until(page, () => /^[A-Z2-7]{4}-[A-Z2-7]{4}$/.test(document.getElementById('code').textContent));
      assert.equal((await page.textContent('#code')).replace('-', ''), code.replace('-', ''), 'the element shows the code of the session');
      // Its stylesheet is the relay's, loaded, and applied; the page's origin was never asked.
      assert.deepEqual(styles, [{ url: `${relay.base}/sdk/pairing.css`, status: 200 }]);
      assert.equal(await page.evaluate(() => document.querySelector('link[rel="stylesheet"]').href), `${relay.base}/sdk/pairing.css`);
      assert.equal(await page.evaluate(() => document.styleSheets.length), 1);
      assert.deepEqual(await accessibilityViolations(page), [], 'no WCAG AA violations on the other origin');
      // And the code is the session's: an assistant given it calls the page's tool, once the
      // person allows it (the element asks).
      assert.deepEqual(await allowing(page, new Llm(relay.base, code).ok('ping')), { pong: true });
    });
  } finally {
    await host.stop();
  }
});

test('with CORS_ORIGIN narrowed to other origins, a page from an origin not listed cannot pair, and connect says why', async () => {
  const narrowed = await startRelay({ CORS_ORIGIN: 'http://listed.example.test' });
  const host = await startPageHost({
    '/refused.html': `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>A page not listed</title></head>
<body>
<script type="module">
  import { connect } from '${narrowed.base}/sdk/toolrelay.js';
  window.statuses = [];
  window.relay = connect({ resume: false });
  window.relay.addEventListener('status', (event) => window.statuses.push(event.detail));
</script>
</body></html>`,
  });
  try {
    await inNewPage(browser, async (page) => {
      await page.goto(`${host.origin}/refused.html`);
      const refused = await until(page, () => window.statuses?.find((status) => status.state === 'unreachable'));
      assert.match(refused.message, /does not allow pages from http:\/\/127\.0\.0\.1:\d+ \(its CORS_ORIGIN\)/, refused.message);
      assert.equal(await page.evaluate(() => window.relay.ready), false);
      assert.equal(await page.evaluate(() => window.relay.code ?? null), null);
    });
  } finally {
    await host.stop();
    await narrowed.stop();
  }
});

const CALLS = 8;

/**
 * Opens the WebMCP page on the second origin, its SDK (and so its relay traffic) through a
 * proxy whose network the test cuts mid-run; `block` lists transports the browser may not use.
 */
async function runWebMcp(block, expected) {
  const proxy = await startBlipProxy(relay);
  const host = await startPageHost({ '/counter.html': webMcpPage(`${proxy.base}/sdk/toolrelay.js`) });
  try {
    await inNewPage(browser, async (page, context) => {
      if (block.includes('websocket')) await context.routeWebSocket(/\/api\/sessions\/[^/]+\/ws/, (ws) => ws.close());
      if (block.includes('sse')) await context.route(/\/api\/sessions\/[^/]+\/stream/, (route) => route.abort());
      await page.goto(`${host.origin}/counter.html`);
      await until(page, (kind) => window.relay?.ready && window.relay.transportKind === kind, expected, 30000);
      const code = await page.evaluate(() => window.relay.code);
      const llm = new Llm(relay.base, code);
      const names = (await functionNames(llm)).sort();
      assert.deepEqual(names.filter((name) => ['increment', 'read_counter', 'refuse'].includes(name)), ['increment', 'read_counter', 'refuse']);

      // Calls in flight while the page's network drops and comes back.
      const calls = Array.from({ length: CALLS }, (_, n) => llm.call('increment', { n: 1, tag: `call-${n}` }, `${expected}-${n}`));
      await until(page, () => window.counter.runs.length >= 2, undefined, 20000);
      // Every call is queued before the network drops: on a busy machine a call still on its way
      // would find no tab connected and be answered 202 (queued) instead of waiting.
      const queued = async () => {
        for (let n = 0; n < CALLS; n += 1) {
          const { status } = await llm.request('GET', `/requests/${expected}-${n}`);
          if (status !== 200) return false;
        }
        return true;
      };
      await eventually(queued, 'every call queued', 20000);
      const seen = await page.evaluate(() => window.relay.interruptions);
      proxy.cut();
      await until(page, (before) => window.relay.interruptions > before, seen, 20000);
      proxy.restore();
      const answers = await Promise.all(calls);
      await until(page, () => window.relay.ready, undefined, 20000);
      for (const answer of answers) assert.equal(answer.success, true, JSON.stringify(answer));
      const runs = await page.evaluate(() => window.counter.runs.slice().sort());
      assert.deepEqual(runs, Array.from({ length: CALLS }, (_, n) => `call-${n}`).sort(), 'every call ran exactly once');
      assert.equal(await page.textContent('#value'), String(CALLS), 'and the page shows it');
      // An MCP-shaped result without structured content is content, for REST too.
      const read = await llm.call('read_counter');
      assert.equal(read.success, true, JSON.stringify(read));
      assert.deepEqual(read.content, [{ type: 'text', text: JSON.stringify({ value: CALLS }) }]);
      const refused = await llm.call('refuse');
      assert.equal(refused.success, false);
      assert.match(refused.error.message, /The counter refuses\./);
    });
  } finally {
    await host.stop();
    await proxy.close();
  }
}

test('a WebMCP page on another origin pairs over WebSocket and answers HTTP, MCP and gRPC; a dropped connection loses nothing', async () => {
  const proxy = await startBlipProxy(relay);
  const host = await startPageHost({ '/counter.html': webMcpPage(`${proxy.base}/sdk/toolrelay.js`) });
  try {
    await inNewPage(browser, async (page) => {
      const mcp = { client: null };
      try {
        await page.goto(`${host.origin}/counter.html`);
        await until(page, () => window.relay?.ready);
        assert.equal(await page.evaluate(() => window.relay.transportKind), 'websocket');
        // The SDK's own model context runs tools as Chromium 156 does: an object in, a string out.
        const polyfill = await page.evaluate(async () => {
          const context = document.modelContext;
          const tool = (await context.getTools()).find((t) => t.name === 'read-counter');
          const answer = await context.executeTool(tool, {});
          const refused = await context.executeTool(tool, null).then(() => 'accepted', (error) => error.constructor.name);
          return { type: typeof answer, value: JSON.parse(answer).content[0].text, refused };
        });
        assert.deepEqual(polyfill, { type: 'string', value: '{"value":0}', refused: 'TypeError' });
        const { code, connectorUrl } = await page.evaluate(() => window.relay.session);
        // MCP with the official Python SDK, a client of its own.
        const viaMcp = await officialMcpCall(connectorUrl, 'increment', { n: 10 });
        assert.ok(viaMcp.tools.includes('read_counter'), JSON.stringify(viaMcp));
        assert.deepEqual(viaMcp.structured, { value: 10 }, JSON.stringify(viaMcp));
        mcp.client = new McpClient(connectorUrl);
        await mcp.client.connect();
        // WebMCP's readOnlyHint reaches hosts; an unmarked tool is taken to change data.
        const { tools } = await mcp.client.request('tools/list');
        const annotations = Object.fromEntries(tools.map((tool) => [tool.name, tool.annotations]));
        assert.equal(annotations.read_counter.readOnlyHint, true, JSON.stringify(annotations));
        assert.deepEqual(
          [annotations.increment.readOnlyHint, annotations.increment.destructiveHint],
          [false, true],
          JSON.stringify(annotations),
        );
        assert.equal(tools.find((tool) => tool.name === 'increment').title, 'Increment');
        const viaGrpc = await grpcCall(relay, code, 'increment', { n: 100 });
        assert.equal(viaGrpc.response.success, true, JSON.stringify(viaGrpc));
        // gRPC carries the MCP-shaped result whole: its content and its structured content.
        assert.deepEqual(viaGrpc.response.structuredContent, { value: 110 }, JSON.stringify(viaGrpc));
        assert.deepEqual(viaGrpc.response.content, [{ type: 'text', text: '110' }]);
        const refused = await mcp.client.callTool('refuse', {});
        assert.equal(refused.isError, true);
        assert.match(mcpText(refused), /The counter refuses\./);
        assert.equal(await page.textContent('#value'), '110');
      } finally {
        mcp.client?.close();
      }
    });
  } finally {
    await host.stop();
    await proxy.close();
  }
  await runWebMcp([], 'websocket');
});

test('a WebMCP page on another origin falls back to SSE, then to polling, through a dropping network', async () => {
  await runWebMcp(['websocket'], 'sse');
  await runWebMcp(['websocket', 'sse'], 'polling');
});
