// Dropping the tab's connection in the middle of a run — its WebSocket closed under it, or the
// network gone for a moment — loses no call and runs none twice.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { codapSnapshot, Llm, openInCodap, startBlipProxy, startStack, stopStack, until } from '../harness.mjs';

let relay;
let host;
let browser;

before(async () => ({ relay, host, browser } = await startStack()));
after(() => stopStack({ relay, host, browser }));

const CALLS = 12;

/** Waits (with a deadline) until `check()` holds in this process. */
async function eventually(check, what, timeout = 15000) {
  const deadline = Date.now() + timeout;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Starts CALLS item creations at once, runs `disrupt` once a few have landed, checks the end. */
async function runThrough(page, llm, disrupt) {
  await llm.ok('createDataContext', { name: 'Runs', collections: [{ name: 'Runs', attributes: [{ name: 'n', type: 'numeric' }] }] });
  const calls = Array.from({ length: CALLS }, (_, n) =>
    llm.call('createItems', { dataContext: 'Runs', items: [{ n }] }, `run-item-${n}`),
  );
  await page.waitForFunction(() => (window.codap.model.dataContexts[0]?.items.length ?? 0) >= 3, null, { timeout: 15000 });
  await disrupt();
  const answers = await Promise.all(calls);
  for (const answer of answers) assert.equal(answer.success, true, JSON.stringify(answer));

  const model = await codapSnapshot(page);
  const values = model.dataContexts[0].items.map((item) => item.values.n).sort((a, b) => a - b);
  assert.deepEqual(values, Array.from({ length: CALLS }, (_, n) => n), 'every call ran exactly once');
  const executed = await page.evaluate(() => window.codap.requestCount('create', 'dataContext[Runs].item'));
  assert.equal(executed, CALLS, 'CODAP received each item creation once');

  // Asking again with the same ids returns the stored answers and runs nothing.
  const again = await llm.call('createItems', { dataContext: 'Runs', items: [{ n: 0 }] }, 'run-item-0');
  assert.deepEqual(again, answers[0]);
  assert.equal(await page.evaluate(() => window.codap.requestCount('create', 'dataContext[Runs].item')), CALLS);
}

test('the WebSocket is closed under the tab mid-run', async () => {
  const context = await browser.newContext();
  const sockets = [];
  await context.routeWebSocket(/\/api\/sessions\/[^/]+\/ws/, (ws) => {
    ws.connectToServer();
    sockets.push(ws);
  });
  try {
    const { page, plugin, code } = await openInCodap(context, host, relay);
    await until(plugin, () => window.toolrelay.transport === 'websocket' && window.toolrelay.ready);
    const llm = new Llm(relay.base, code);
    await runThrough(page, llm, async () => {
      const open = sockets.length;
      for (const socket of sockets) await socket.close({ code: 1006, reason: 'dropped' }).catch(() => {});
      // The plugin reconnects over WebSocket: a new socket opens, and it is ready again.
      await eventually(() => sockets.length > open, 'the plugin opened a new WebSocket');
      await until(plugin, () => window.toolrelay.ready);
    });
  } finally {
    await context.close();
  }
});

test('a network blip while on SSE', async () => {
  const context = await browser.newContext();
  await context.routeWebSocket(/\/api\/sessions\/[^/]+\/ws/, (ws) => ws.close());
  // The tab reaches the relay through a proxy whose network the test cuts.
  const proxy = await startBlipProxy(relay);
  try {
    const { page, plugin, code } = await openInCodap(context, host, proxy);
    await until(plugin, () => window.toolrelay.transport === 'sse' && window.toolrelay.ready);
    const llm = new Llm(relay.base, code);
    await runThrough(page, llm, async () => {
      // The network is down until the tab has felt it: its stream dropped, or an answer
      // or a reconnection could not get through.
      const before = await plugin.evaluate(() => window.toolrelay.interruptions);
      proxy.cut();
      await until(plugin, (seen) => window.toolrelay.interruptions > seen, before);
      proxy.restore();
    });
  } finally {
    await context.close();
    await proxy.close();
  }
});
