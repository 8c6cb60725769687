// Dropping the tab's connection in the middle of a run — its WebSocket closed under it, or the
// network gone for a moment — loses no call and runs none twice.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { codapSnapshot, Llm, openInCodap, startStack, stopStack, until } from '../harness.mjs';

let relay;
let host;
let browser;

before(async () => ({ relay, host, browser } = await startStack()));
after(() => stopStack({ relay, host, browser }));

const CALLS = 12;

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
      // The plugin reconnects over WebSocket.
      await until(plugin, () => window.toolrelay.ready);
      await page.waitForTimeout(50);
      assert.ok(sockets.length > open || sockets.length >= 1);
    });
    assert.ok(sockets.length >= 2, 'the tab reconnected after the drop');
  } finally {
    await context.close();
  }
});

test('a network blip while on SSE', async () => {
  const context = await browser.newContext();
  await context.routeWebSocket(/\/api\/sessions\/[^/]+\/ws/, (ws) => ws.close());
  try {
    const { page, plugin, code } = await openInCodap(context, host, relay);
    await until(plugin, () => window.toolrelay.transport === 'sse' && window.toolrelay.ready);
    const llm = new Llm(relay.base, code);
    await runThrough(page, llm, async () => {
      await context.setOffline(true);
      await page.waitForTimeout(1500);
      await context.setOffline(false);
    });
  } finally {
    await context.close();
  }
});
