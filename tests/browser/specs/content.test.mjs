// What the assistant gets back from the CODAP plugin besides JSON (issue 43), through the real
// relay and the TypeScript MCP SDK's client (and, for the image, the Python SDK's) on the
// session's connector URL: a graph as an image
// it can look at — a PNG whose header says the size the CODAP stand-in reports for the graph
// (±1 px), at most 1,024 px wide for a wider graph, aspect kept — with a sentence on what the
// graph shows; the same item with its data left out for a REST caller; and the progress of a
// long item creation (CODAP answering slowly), which the MCP client that gave a progressToken
// hears in order. Over WebSocket, and over polling, where answers and progress go by POST.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Llm, codapSnapshot, eventually, officialMcpCall, openInCodap, startStack, stopStack, until } from '../harness.mjs';

let relay;
let host;
let browser;

before(async () => ({ relay, host, browser } = await startStack()));
after(() => stopStack({ relay, host, browser }));

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/** A PNG's width and height, read from its IHDR; fails the test when `base64` is no PNG. */
function pngSize(base64) {
  const bytes = Buffer.from(base64, 'base64');
  assert.ok(bytes.subarray(0, 8).equals(PNG_SIGNATURE), 'the image is a PNG');
  assert.equal(bytes.subarray(12, 16).toString('latin1'), 'IHDR');
  return { width: bytes.readUInt32BE(16), height: bytes.readUInt32BE(20) };
}

function near(actual, expected, what) {
  assert.ok(Math.abs(actual - expected) <= 1, `${what}: ${actual}, not ${expected} ±1`);
}

async function mcpClient(url) {
  const client = new Client({ name: 'toolrelay-content-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  return client;
}

/** Calls `name` over MCP; fails the test unless it succeeded. */
async function ok(client, name, args, options) {
  const result = await client.callTool({ name, arguments: args }, undefined, options);
  assert.notEqual(result.isError, true, `${name}: ${JSON.stringify(result).slice(0, 500)}`);
  return result;
}

/** The structured answer of a CODAP call (its JSON result). */
function structured(result) {
  return result.structuredContent ?? JSON.parse(result.content.find((item) => item.type === 'text').text);
}

const CLASS = Array.from({ length: 31 }, (_, i) => ({ name: `kid ${i}`, age: 6 + (i % 12), height: 110 + ((i * 7) % 70) }));

async function pictures(page, client, llm, connectorUrl) {
  await ok(client, 'createDataContext', {
    name: 'Class',
    collections: [{ name: 'Kids', attributes: [{ name: 'name' }, { name: 'age', type: 'numeric' }, { name: 'height', type: 'numeric' }] }],
  });
  await ok(client, 'createItems', { dataContext: 'Class', items: CLASS });
  const graph = structured(await ok(client, 'createGraph', { dataContext: 'Class', xAttribute: 'age', yAttribute: 'height' }));
  const reported = async (id) => (await codapSnapshot(page)).components.find((c) => c.id === id).dimensions;

  // The graph as CODAP draws it: the size it reports, and what it plots in words.
  const shown = await ok(client, 'getGraphImage', { graph: graph.id });
  const image = shown.content.find((item) => item.type === 'image');
  assert.equal(image?.mimeType, 'image/png', JSON.stringify(shown.content.map((item) => item.type)));
  const size = pngSize(image.data);
  const { width, height } = await reported(graph.id);
  assert.deepEqual([width, height], [640, 480], 'the stand-in reports its default size');
  near(size.width, width, 'width');
  near(size.height, height, 'height');
  const words = shown.content.find((item) => item.type === 'text')?.text;
  assert.equal(words, 'Scatter plot of height against age, 31 cases (PNG 640×480)');
  // The official Python SDK, an independent client, gets the same image.
  const python = await officialMcpCall(connectorUrl, 'getGraphImage', { graph: graph.id });
  assert.equal(python.isError, false, JSON.stringify(python).slice(0, 500));
  const pythonImage = python.content.find((item) => item.type === 'image');
  assert.equal(pythonImage?.mimeType, 'image/png', JSON.stringify(python.content.map((item) => item.type)));
  const pythonSize = pngSize(pythonImage.data);
  near(pythonSize.width, width, 'width (Python SDK)');
  near(pythonSize.height, height, 'height (Python SDK)');
  assert.ok(python.content.some((item) => item.type === 'text' && item.text === words));

  // A graph wider than 1,024 px comes drawn smaller, its aspect kept.
  const wide = structured(await ok(client, 'codapRequest', {
    action: 'create',
    resource: 'component',
    values: { type: 'graph', dataContext: 'Class', xAttributeName: 'age', yAttributeName: 'height', dimensions: { width: 1600, height: 500 } },
  }));
  assert.deepEqual(await reported(wide.id), { width: 1600, height: 500 });
  const narrowed = await ok(client, 'getGraphImage', { graph: wide.id });
  const small = pngSize(narrowed.content.find((item) => item.type === 'image').data);
  assert.ok(small.width <= 1024, `at most 1,024 px wide: ${small.width}`);
  near(small.width, 1024, 'width');
  near(small.height, (500 * 1024) / 1600, 'height');
  assert.match(narrowed.content.find((item) => item.type === 'text').text, /\(PNG 1024×320, scaled down from 1600×500\)$/);
  // codapRequest's own `get dataDisplay[…]` is the same picture.
  const raw = await ok(client, 'codapRequest', { action: 'get', resource: `dataDisplay[${graph.id}]` });
  assert.deepEqual(pngSize(raw.content.find((item) => item.type === 'image').data), size);

  // A REST caller gets the items, the image's data left out.
  const answer = await llm.call('getGraphImage', { graph: graph.id });
  assert.equal(answer.success, true, JSON.stringify(answer).slice(0, 500));
  const item = answer.content?.find((entry) => entry.type === 'image');
  assert.ok(item, `an image item: ${JSON.stringify(answer).slice(0, 500)}`);
  assert.equal(item.data, undefined, 'no base64 for REST');
  assert.equal(item.mimeType, 'image/png');
  assert.ok(item.bytes > 0 && typeof item.omitted === 'string', JSON.stringify(item));
  assert.ok(answer.content.some((entry) => entry.type === 'text' && entry.text === words));

  // A graph CODAP does not have, and a component that is no graph: CODAP's own refusals.
  const unknown = await client.callTool({ name: 'getGraphImage', arguments: { graph: 'no such graph' } });
  assert.equal(unknown.isError, true);
  assert.match(JSON.stringify(unknown.content), /component not found: no such graph/);
  const table = structured(await ok(client, 'createCaseTable', { dataContext: 'Class' }));
  const notGraph = await client.callTool({ name: 'getGraphImage', arguments: { graph: table.id } });
  assert.equal(notGraph.isError, true);
  assert.match(JSON.stringify(notGraph.content), /Data display not found/);
}

async function progress(page, client) {
  // CODAP takes its time over each request of 500 items: the creation runs over a second.
  await page.evaluate(() => { window.codap.answerDelayMs = 150; });
  const items = Array.from({ length: 3000 }, (_, i) => ({ name: `p${i}`, age: i % 90, height: 100 + (i % 80) }));
  const heard = [];
  const created = await ok(client, 'createItems', { dataContext: 'Class', items }, { onprogress: (update) => heard.push(update), timeout: 60000 })
    .finally(() => page.evaluate(() => { window.codap.answerDelayMs = 0; }));
  assert.equal(structured(created).itemIDs.length, 3000);
  // The plugin's progress (the relay may say things of its own while a call waits).
  const ours = heard.filter((update) => update.total === 3000);
  assert.ok(ours.length >= 2, `progress while it ran: ${JSON.stringify(heard)}`);
  for (const [i, update] of ours.entries()) {
    assert.ok(update.progress > 0 && update.progress <= 3000 && update.progress % 500 === 0, JSON.stringify(update));
    assert.equal(update.message, `${update.progress} of 3000 items created`);
    if (i > 0) assert.ok(update.progress > ours[i - 1].progress, `in increasing order: ${JSON.stringify(ours)}`);
  }
  const model = await codapSnapshot(page);
  assert.equal(model.dataContexts.find((d) => d.name === 'Class').items.length, 31 + 3000);
  const requests = await page.evaluate(() => window.codap.requestCount('create', 'dataContext[Class].item'));
  assert.equal(requests, 1 + 6, 'the 31 in one request, the 3,000 in six');
}

/** A REST caller that queued the call sees its last progress in the call's status, then the answer. */
async function restProgress(page, llm) {
  await page.evaluate(() => { window.codap.answerDelayMs = 150; });
  try {
    const items = Array.from({ length: 3000 }, (_, i) => ({ name: `q${i}`, age: i % 90, height: 100 + (i % 80) }));
    const queued = await llm.request('POST', '/request', { functionName: 'createItems', args: { dataContext: 'Class', items } });
    assert.equal(queued.status, 202, JSON.stringify(queued.body));
    const { requestId } = queued.body;
    const seen = [];
    const done = await eventually(async () => {
      const { body } = await llm.request('GET', `/requests/${requestId}`);
      if (body.progress) seen.push(body.progress);
      return ['completed', 'failed'].includes(body.status) && body;
    }, 'the queued creation to finish');
    assert.equal(done.status, 'completed', JSON.stringify(done).slice(0, 300));
    const ours = seen.filter((update) => update.total === 3000);
    assert.ok(ours.length > 0, `the status showed progress while it ran: ${JSON.stringify(seen)}`);
    assert.ok(ours.every((update, i) => i === 0 || update.progress >= ours[i - 1].progress), JSON.stringify(ours));
    assert.match(ours.at(-1).message, /^\d+ of 3000 items created$/);
  } finally {
    await page.evaluate(() => { window.codap.answerDelayMs = 0; });
  }
}

async function run(block, expected) {
  const context = await browser.newContext();
  try {
    if (block.includes('websocket')) await context.routeWebSocket(/\/api\/sessions\/[^/]+\/ws/, (ws) => ws.close());
    if (block.includes('sse')) await context.route(/\/api\/sessions\/[^/]+\/stream/, (route) => route.abort());
    const { page, plugin, code } = await openInCodap(context, host, relay);
    await until(plugin, (kind) => window.toolrelay.transport === kind && window.toolrelay.ready, expected);
    const connectorUrl = await plugin.evaluate(() => window.toolrelay.session.connectorUrl);
    const client = await mcpClient(connectorUrl);
    try {
      await eventually(async () => (await client.listTools()).tools.some((tool) => tool.name === 'getGraphImage'), 'the plugin tools over MCP');
      const llm = new Llm(relay.base, code);
      await pictures(page, client, llm, connectorUrl);
      await progress(page, client);
      await restProgress(page, llm);
    } finally {
      await client.close();
    }
  } finally {
    await context.close();
  }
}

test('over WebSocket: a graph as an image, and the progress of a long creation', () => run([], 'websocket'));

test('over polling (answers and progress by POST): the same', () => run(['websocket', 'sse'], 'polling'));
