// Every function of the CODAP plugin is either read-only or held by the "ask me before
// changing data" switch: the plugin's real tool set (plugin/tools.js) registered in the SDK's
// real dispatcher, each function run once with sample arguments against a CODAP stand-in that
// records what it is asked. A function marked read-only must only read; any other function is
// held (the SDK's own rule, heldForConfirmation); codapRequest is held unless its action is
// `get`. No browser needed: this runs in node.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Dispatcher, heldForConfirmation } from '../../../services/gateway/sdk/dispatcher.js';
import { codapTools } from '../../../services/gateway/plugin/tools.js';

const DC = 'People';
const COLL = 'People';

/** Arguments each function is tried with. A new function needs a line here. */
const SAMPLES = {
  listDataContexts: {},
  getDataContext: { dataContext: DC },
  createDataContext: { name: DC, collections: [{ name: COLL, attributes: [{ name: 'age' }] }] },
  deleteDataContext: { dataContext: DC },
  createCollection: { dataContext: DC, name: 'Kids', parent: COLL },
  deleteCollection: { dataContext: DC, collection: COLL },
  createAttributes: { dataContext: DC, collection: COLL, attributes: [{ name: 'height' }] },
  updateAttribute: { dataContext: DC, collection: COLL, attribute: 'age', changes: { unit: 'y' } },
  deleteAttribute: { dataContext: DC, collection: COLL, attribute: 'age' },
  createItems: { dataContext: DC, items: [{ age: 3 }] },
  getItems: { dataContext: DC },
  updateItems: { dataContext: DC, items: [{ id: 1, values: { age: 4 } }] },
  deleteItems: { dataContext: DC, itemIds: [1, 2] },
  countItems: { dataContext: DC },
  getCases: { dataContext: DC, collection: COLL },
  countCases: { dataContext: DC, collection: COLL },
  updateCases: { dataContext: DC, collection: COLL, cases: [{ id: 1, values: { age: 4 } }] },
  deleteCases: { dataContext: DC, collection: COLL, caseIds: [1] },
  selectCases: { dataContext: DC, caseIds: [1] },
  getSelection: { dataContext: DC },
  createCaseTable: { dataContext: DC },
  createGraph: { dataContext: DC, xAttribute: 'age' },
  createMap: { dataContext: DC },
  createSlider: { name: 'scale' },
  createText: { text: 'hello' },
  listComponents: {},
  updateComponent: { component: 1, changes: { title: 'New' } },
  deleteComponent: { component: 1 },
  getGraphImage: { graph: 1 },
  evaluateFormula: { formula: '1 + 1' },
  codapRequest: { action: 'get', resource: 'globalList' },
};

const PIXEL = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg==';

/** A request that leaves the document as it was. */
function reads(request) {
  return request.action === 'get' || (request.action === 'notify' && request.resource === 'formulaEngine');
}

/** The plugin's tools in the SDK's dispatcher, over a CODAP stand-in that records requests. */
function plugin() {
  const sent = [];
  const codap = {
    async request(request) {
      const requests = Array.isArray(request) ? request : [request];
      sent.push(...requests);
      // A graph's picture is a PNG (1×1 here), as CODAP gives it; anything else an empty list.
      const answer = (one) => (one.resource.startsWith('dataDisplay[') ? { success: true, values: { exportDataUri: PIXEL } } : { success: true, values: [] });
      return Array.isArray(request) ? requests.map(answer) : answer(request);
    },
  };
  const dispatcher = new Dispatcher();
  for (const tool of codapTools(codap)) dispatcher.register(tool.id, tool.description, tool.functions);
  return { dispatcher, sent };
}

test('every plugin function is read-only or held by the switch', async () => {
  const { dispatcher, sent } = plugin();
  const names = dispatcher.names();
  assert.ok(names.length >= 30, `the plugin has its tools: ${names}`);
  const unclassified = names.filter((name) => !['boolean', 'function'].includes(typeof dispatcher.find(null, name).readOnly));
  assert.deepEqual(unclassified, [], 'every function says whether it only reads (readOnly)');
  const untried = names.filter((name) => !(name in SAMPLES));
  assert.deepEqual(untried, [], 'every function has sample arguments here');

  const neither = [];
  for (const name of names) {
    const fn = dispatcher.find(null, name);
    const args = SAMPLES[name];
    sent.length = 0;
    await dispatcher.call(null, name, args);
    assert.ok(sent.length > 0, `${name} asks CODAP something`);
    const held = heldForConfirmation(fn, args);
    // Not held means it must only read.
    if (!held && !sent.every(reads)) neither.push(`${name} ${JSON.stringify(sent)}`);
  }
  assert.deepEqual(neither, [], 'functions that change the document but are not held');
});

test('codapRequest is held unless its action is get', () => {
  const { dispatcher } = plugin();
  const fn = dispatcher.find(null, 'codapRequest');
  const actions = fn.parameters.properties.action.enum;
  assert.deepEqual(actions, ['get', 'create', 'update', 'delete', 'notify']);
  for (const action of actions) {
    assert.equal(heldForConfirmation(fn, { action, resource: 'component' }), action !== 'get', action);
  }
  const webView = { action: 'create', resource: 'component', values: { type: 'webView', URL: 'https://example.com/' } };
  assert.equal(heldForConfirmation(fn, webView), true, 'a web view is not created unasked');
});

test('the changes the switch was missing are held', () => {
  const { dispatcher } = plugin();
  for (const name of ['updateComponent', 'createCaseTable', 'createGraph', 'createText', 'selectCases', 'createItems']) {
    assert.equal(heldForConfirmation(dispatcher.find(null, name), SAMPLES[name]), true, name);
  }
  for (const name of ['listDataContexts', 'getItems', 'getCases', 'listComponents', 'evaluateFormula']) {
    assert.equal(heldForConfirmation(dispatcher.find(null, name), SAMPLES[name]), false, name);
  }
});

test('unmarked functions count as changing data', () => {
  assert.equal(heldForConfirmation({ name: 'anything' }, {}), true);
  assert.equal(heldForConfirmation({ name: 'reader', readOnly: true }, {}), false);
  const dispatcher = new Dispatcher();
  dispatcher.add({ name: 'webmcpRead', inputSchema: { type: 'object' }, annotations: { readOnlyHint: true }, execute: () => 1 });
  dispatcher.add({ name: 'webmcpWrite', inputSchema: { type: 'object' }, execute: () => 1 });
  assert.equal(heldForConfirmation(dispatcher.find(null, 'webmcpRead')), false);
  assert.equal(heldForConfirmation(dispatcher.find(null, 'webmcpWrite')), true);
});

/**
 * What every plugin function tells hosts it does (MCP annotations, from the manifest the SDK
 * registers): `read` only reads, `create` only adds (neither read-only nor destructive),
 * `change` updates or deletes what is there. A new function needs a line here.
 */
const CLASSES = {
  listDataContexts: 'read',
  getDataContext: 'read',
  createDataContext: 'create',
  deleteDataContext: 'change',
  createCollection: 'create',
  deleteCollection: 'change',
  createAttributes: 'create',
  updateAttribute: 'change',
  deleteAttribute: 'change',
  createItems: 'create',
  getItems: 'read',
  updateItems: 'change',
  deleteItems: 'change',
  countItems: 'read',
  getCases: 'read',
  countCases: 'read',
  updateCases: 'change',
  deleteCases: 'change',
  selectCases: 'change',
  getSelection: 'read',
  createCaseTable: 'create',
  createGraph: 'create',
  createMap: 'create',
  createSlider: 'create',
  createText: 'create',
  listComponents: 'read',
  updateComponent: 'change',
  deleteComponent: 'change',
  getGraphImage: 'read',
  evaluateFormula: 'read',
  codapRequest: 'change',
};

/** The class a manifest entry says, as MCP's defaults read it (unmarked changes data). */
function classOf(entry) {
  if (entry.readOnly === true) return 'read';
  if (entry.destructive === false) return 'create';
  return 'change';
}

test('every plugin function is classified for hosts as the table says', () => {
  const { dispatcher } = plugin();
  const manifest = dispatcher.manifest().flatMap((tool) => tool.functions);
  const names = manifest.map((entry) => entry.name);
  assert.deepEqual(names.filter((name) => !(name in CLASSES)), [], 'functions with no class in the table');
  assert.deepEqual(Object.keys(CLASSES).filter((name) => !names.includes(name)), [], 'the table names functions that are gone');
  const wrong = manifest
    .filter((entry) => classOf(entry) !== CLASSES[entry.name])
    .map((entry) => `${entry.name}: ${classOf(entry)}, expected ${CLASSES[entry.name]}`);
  assert.deepEqual(wrong, []);
  // Explicit, not by default: each says readOnly, and every non-read says destructive.
  for (const entry of manifest) {
    assert.equal(typeof entry.readOnly === 'boolean' || entry.name === 'codapRequest', true, entry.name);
    if (entry.readOnly !== true) assert.equal(typeof entry.destructive, 'boolean', entry.name);
    else assert.equal('destructive' in entry, false, `${entry.name}: read-only and destructive are exclusive`);
  }
});

test('the SDK passes a definition\'s hints and WebMCP\'s annotations into the manifest', () => {
  const dispatcher = new Dispatcher();
  dispatcher.add({ name: 'count', title: 'Count rows', readOnly: true, idempotent: true, inputSchema: { type: 'object' }, execute: () => 1 });
  dispatcher.add({ name: 'webmcpRead', inputSchema: { type: 'object' }, annotations: { readOnlyHint: true, title: 'Read it', untrustedContentHint: true }, execute: () => 1 });
  dispatcher.add({ name: 'append', destructive: false, inputSchema: { type: 'object' }, execute: () => 1 });
  dispatcher.add({ name: 'anything', inputSchema: { type: 'object' }, execute: () => 1 });
  const entries = Object.fromEntries(dispatcher.manifest()[0].functions.map((entry) => [entry.name, entry]));
  assert.deepEqual(
    { title: entries.count.title, readOnly: entries.count.readOnly, idempotent: entries.count.idempotent },
    { title: 'Count rows', readOnly: true, idempotent: true },
  );
  assert.equal(entries.webmcpRead.readOnly, true);
  assert.equal(entries.webmcpRead.title, 'Read it');
  assert.equal(entries.webmcpRead.untrustedContent, true);
  assert.equal(entries.append.destructive, false);
  assert.deepEqual(Object.keys(entries.anything).sort(), ['description', 'name', 'parameters'], 'unmarked stays unmarked');
});
