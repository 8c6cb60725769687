// An LLM builds data, a formula, a table and a graph in a CODAP document through the relay —
// over WebSocket, over SSE when WebSocket is blocked, over polling when SSE is blocked too —
// and the CODAP stand-in holds exactly what was asked.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { codapSnapshot, Llm, openInCodap, startStack, stopStack, until } from '../harness.mjs';

let relay;
let host;
let browser;

before(async () => ({ relay, host, browser } = await startStack()));
after(() => stopStack({ relay, host, browser }));

const PEOPLE = [
  { name: 'Ada', age: 36, height: 165 },
  { name: 'Bo', age: 8, height: 128 },
  { name: 'Cy', age: 15, height: 170 },
];

/** The whole conversation, as an assistant would hold it, then what CODAP holds. */
async function buildAndCheck(page, llm) {
  const { body: metadata } = await llm.metadata();
  const functions = metadata.tools.flatMap((tool) => tool.functions.map((f) => f.name));
  for (const name of ['createDataContext', 'createItems', 'createAttributes', 'createCaseTable', 'createGraph', 'getCases', 'codapRequest']) {
    assert.ok(functions.includes(name), `${name} is offered`);
  }

  const created = await llm.ok('createDataContext', {
    name: 'People',
    collections: [
      {
        name: 'People',
        attributes: [{ name: 'name' }, { name: 'age', type: 'numeric' }, { name: 'height', type: 'numeric', unit: 'cm' }],
      },
    ],
  });
  assert.equal(created.name, 'People');
  assert.equal(typeof created.id, 'number', 'ids come back as CODAP gives them');

  const added = await llm.ok('createItems', { dataContext: 'People', items: PEOPLE });
  assert.equal(added.itemIDs.length, 3);

  await llm.ok('createAttributes', {
    dataContext: 'People',
    collection: 'People',
    attributes: [{ name: 'growth', formula: 'height / age' }],
  });
  const table = await llm.ok('createCaseTable', { dataContext: 'People' });
  const graph = await llm.ok('createGraph', { dataContext: 'People', xAttribute: 'age', yAttribute: 'height' });
  assert.equal(typeof graph.id, 'number');

  const cases = await llm.ok('getCases', { dataContext: 'People', collection: 'People' });
  assert.equal(cases.length, 3);
  const ada = cases.find((c) => c.values.name === 'Ada');
  assert.equal(ada.values.age, 36);
  assert.ok(Math.abs(Number(ada.values.growth) - 165 / 36) < 1e-9, `formula values are read back: ${ada.values.growth}`);

  // The graph is an image item (its data left out for REST: content.test.mjs reads the PNG).
  const image = await llm.call('getGraphImage', { graph: graph.id });
  assert.equal(image.success, true, JSON.stringify(image).slice(0, 300));
  assert.ok(image.content?.some((item) => item.type === 'image' && item.mimeType === 'image/png'), JSON.stringify(image).slice(0, 300));
  assert.ok(image.content.some((item) => item.type === 'text' && item.text.startsWith('Scatter plot of height against age, 3 cases')));
  const evaluated = await llm.ok('evaluateFormula', { formula: 'round(height / age, 1)', records: [{ height: 165, age: 36 }] });
  assert.deepEqual(evaluated, [4.6]);

  // What the document holds is exactly what was asked.
  const model = await codapSnapshot(page);
  assert.deepEqual(model.dataContexts.map((d) => d.name), ['People']);
  const [people] = model.dataContexts;
  assert.deepEqual(people.collections.map((c) => c.name), ['People']);
  const attributes = people.collections[0].attrs;
  assert.deepEqual(attributes.map((a) => a.name), ['name', 'age', 'height', 'growth']);
  assert.equal(attributes.find((a) => a.name === 'growth').formula, 'height / age');
  assert.equal(attributes.find((a) => a.name === 'height').unit, 'cm');
  assert.deepEqual(
    people.items.map((item) => ({ name: item.values.name, age: item.values.age, height: item.values.height })),
    PEOPLE,
  );
  const components = model.components.map((c) => ({ id: c.id, type: c.type, dataContext: c.dataContext, x: c.xAttributeName, y: c.yAttributeName }));
  assert.deepEqual(components, [
    { id: table.id, type: 'caseTable', dataContext: 'People', x: undefined, y: undefined },
    { id: graph.id, type: 'graph', dataContext: 'People', x: 'age', y: 'height' },
  ]);
  const notifications = await page.evaluate(() => window.codap.notifications);
  assert.equal(notifications.codapPresentAcknowledged, true, 'the plugin acknowledged codap-present');
  assert.ok(notifications.sent > 0);
  assert.equal(notifications.acknowledged, notifications.sent, 'every change notice was acknowledged');
}

async function run(block, expected) {
  const context = await browser.newContext();
  try {
    if (block.includes('websocket')) await context.routeWebSocket(/\/api\/sessions\/[^/]+\/ws/, (ws) => ws.close());
    if (block.includes('sse')) await context.route(/\/api\/sessions\/[^/]+\/stream/, (route) => route.abort());
    const { page, plugin, code } = await openInCodap(context, host, relay);
    await until(plugin, (kind) => window.toolrelay.transport === kind && window.toolrelay.ready, expected);
    const llm = new Llm(relay.base, code);
    await buildAndCheck(page, llm);
    const { body: status } = await llm.status();
    assert.equal(status.transport, expected, `the relay sees the tab on ${expected}`);
    assert.equal(await plugin.evaluate(() => window.toolrelay.transport), expected);
  } finally {
    await context.close();
  }
}

test('over WebSocket', () => run([], 'websocket'));

test('over SSE when WebSocket is blocked', () => run(['websocket'], 'sse'));

test('over polling when WebSocket and SSE are blocked', () => run(['websocket', 'sse'], 'polling'));
