// The CODAP tool set: each function is a JSON Schema for the LLM and a handler that turns the
// arguments into CODAP Data Interactive API requests. Results are CODAP's own values (ids
// included); a request CODAP refuses becomes a failure with CODAP's message.
//
// Every function says whether it only reads (`readOnly`: true, false, or a function of the
// arguments): the "ask me before changing data" switch holds every call that is not read-only
// (creates, selections and layout changes included). `destructive` marks what changes or
// deletes what is there (updates, deletes, selections, codapRequest); creates say
// `destructive: false` (they only add). Hosts get both as MCP annotations (SDK `hints`).
//
// A graph's picture answers as an image the assistant can look at, with a sentence on what it
// shows (graph-image.js). Many items are created ITEMS_PER_REQUEST at a time, the call's
// progress reported after each request.

import { ToolError } from '../sdk/dispatcher.js';
import { CodapErrorCode } from './codap.js';
import { graphImage } from './graph-image.js';

// Items sent to CODAP in one request: a big data set goes in several, with progress between.
export const ITEMS_PER_REQUEST = 500;

const NAME = 'Name exactly as created (names may contain spaces; match case).';
const DATA_CONTEXT = { type: 'string', minLength: 1, description: `The data set (CODAP calls it a data context). ${NAME}` };
const COLLECTION = { type: 'string', minLength: 1, description: `A collection (a level of the data set's hierarchy). ${NAME}` };
const SEARCH = {
  type: 'string',
  description: 'Which rows: "*" for all (default), or a condition like "age>=18", "name==Ada", "height<1.5".',
};
const IDS = { type: 'array', items: { type: 'integer' }, minItems: 1 };
const FORMULA_HELP =
  'CODAP formula, e.g. "height / age", "round(weight / height^2, 1)", "if(age >= 18, \\"adult\\", \\"child\\")", ' +
  '"mean(height)". Use attribute names as written; wrap names with spaces in backticks (`arm span`).';
const ATTRIBUTE = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, description: 'Attribute (column) name.' },
    type: { type: 'string', enum: ['numeric', 'categorical', 'date', 'boundary', 'color', 'checkbox'], description: 'Optional; CODAP infers it from the values.' },
    formula: { type: 'string', description: `Makes the attribute computed. ${FORMULA_HELP}` },
    description: { type: 'string' },
    unit: { type: 'string', description: 'Unit shown with values, e.g. "cm".' },
    precision: { type: 'integer', minimum: 0, description: 'Decimal places shown.' },
  },
  required: ['name'],
  additionalProperties: false,
};
const ROW = {
  type: 'object',
  description: 'Values by attribute name, e.g. {"name": "Ada", "age": 36}.',
  additionalProperties: true,
};

function object(properties, required = []) {
  return { type: 'object', properties, required, additionalProperties: false };
}

function dc(name) {
  return `dataContext[${name}]`;
}

/** CODAP's answer as a result: its values (or the rest of the answer when it has none). */
function outcome(response) {
  if (Array.isArray(response)) return response.map(outcome);
  if (!response || typeof response !== 'object') {
    throw new ToolError(CodapErrorCode.ERROR, 'CODAP gave no answer to this request.');
  }
  // CODAP v3 answers some refusals without `success` (a dataDisplay of a component that is no
  // graph: `{values: {error}}`): an answer whose only value is an error is one too.
  const onlyError = response.success !== true && response.values && typeof response.values === 'object'
    && Object.keys(response.values).length === 1 && typeof response.values.error === 'string';
  if (response.success === false || onlyError) {
    const reason = response.values?.error || response.error || 'CODAP refused the request.';
    throw new ToolError(CodapErrorCode.ERROR, String(reason));
  }
  if (response.values !== undefined) return response.values;
  const { success, ...rest } = response;
  return rest;
}

/**
 * A few words on what a call did, in CODAP's terms, for the activity list of the pairing element:
 * "createGraph · Heights: Age × Height".
 */
export function describeCall(name, args) {
  const a = args && typeof args === 'object' ? args : {};
  const words = (value) => (typeof value === 'string' || typeof value === 'number' ? String(value) : null);
  const axes = [a.xAttribute, a.yAttribute].map(words).filter(Boolean);
  const where = words(a.dataContext) ?? words(a.name) ?? words(a.title) ?? words(a.component) ?? words(a.text);
  const parts = [];
  if (where && axes.length) parts.push(`${where}: ${axes.join(' × ')}`);
  else if (where) parts.push(where);
  if (Array.isArray(a.items)) parts.push(`${a.items.length} item${a.items.length === 1 ? '' : 's'}`);
  if (Array.isArray(a.attributes)) parts.push(a.attributes.map((x) => x?.name ?? x).filter(words).join(', '));
  else if (words(a.attribute)) parts.push(String(a.attribute));
  if (words(a.formula)) parts.push(String(a.formula));
  const detail = parts.filter(Boolean).join(' · ');
  return detail ? `${name} · ${detail}` : name;
}

/** `values` (one request's answer) added to `merged`: lists joined, anything else replaced. */
function mergeValues(merged, values) {
  if (!values || typeof values !== 'object' || Array.isArray(values)) return merged;
  for (const [key, value] of Object.entries(values)) {
    merged[key] = Array.isArray(value) && Array.isArray(merged[key]) ? merged[key].concat(value) : value;
  }
  return merged;
}

/**
 * Creates `items` in data set `dataContext`, ITEMS_PER_REQUEST per request, reporting
 * `progress(created, all)` after each; answers as one request would (the ids joined). A
 * refusal after some were created says how many are in the data set.
 */
async function createItemsInChunks(ask, dataContext, items, { signal, progress }) {
  if (items.length <= ITEMS_PER_REQUEST) return ask('create', `${dc(dataContext)}.item`, items);
  const merged = {};
  let created = 0;
  for (let at = 0; at < items.length; at += ITEMS_PER_REQUEST) {
    signal?.throwIfAborted();
    const chunk = items.slice(at, at + ITEMS_PER_REQUEST);
    try {
      mergeValues(merged, await ask('create', `${dc(dataContext)}.item`, chunk));
    } catch (error) {
      if (created === 0) throw error;
      throw new ToolError(
        error?.code ?? CodapErrorCode.ERROR,
        `Created the first ${created} of ${items.length} items (they stay in ${dataContext}), then CODAP refused the next ones: ${error?.message ?? error}`,
      );
    }
    created += chunk.length;
    progress?.(created, items.length, `${created} of ${items.length} items created`);
  }
  return merged;
}

/** The graph a `dataDisplay[graph]` resource names, or null for any other resource. */
function dataDisplayOf(resource) {
  const match = /^dataDisplay\[(.+)\]$/.exec(resource);
  return match ? match[1] : null;
}

/** The tool groups, with handlers bound to a CodapLink. */
export function codapTools(codap) {
  const ask = async (action, resource, values) => outcome(await codap.request(values === undefined ? { action, resource } : { action, resource, values }));

  const attrs = (attributes = []) => attributes.map((a) => ({ ...a }));

  return [
    {
      id: 'dataContexts',
      description: 'Data sets (CODAP calls them data contexts): list, inspect, create, delete.',
      functions: [
        {
          name: 'listDataContexts',
          readOnly: true,
          description: 'Lists the data sets in the document: [{name, title, id}].',
          parameters: object({}),
          run: () => ask('get', 'dataContextList'),
        },
        {
          name: 'getDataContext',
          readOnly: true,
          description: 'Describes a data set: its collections (levels) and their attributes (columns), with formulas.',
          parameters: object({ dataContext: DATA_CONTEXT }, ['dataContext']),
          run: ({ dataContext }) => ask('get', dc(dataContext)),
        },
        {
          name: 'createDataContext',
          readOnly: false,
          destructive: false,
          description:
            'Creates a data set with its collections and attributes. Most data sets need ONE collection, e.g. ' +
            '{"name": "People", "collections": [{"name": "People", "attributes": [{"name": "name"}, {"name": "age", "type": "numeric"}]}]}. ' +
            'For a hierarchy list the parent collection first and give the child "parent". Then add rows with createItems.',
          parameters: object(
            {
              name: { type: 'string', minLength: 1, description: 'Name of the new data set; use it in later calls.' },
              title: { type: 'string', description: 'Title shown to people (default: the name).' },
              description: { type: 'string' },
              collections: {
                type: 'array',
                minItems: 1,
                items: object(
                  {
                    name: { type: 'string', minLength: 1 },
                    title: { type: 'string' },
                    parent: { type: 'string', description: 'Name of the parent collection, for a child level.' },
                    attributes: { type: 'array', items: ATTRIBUTE },
                  },
                  ['name'],
                ),
              },
            },
            ['name', 'collections'],
          ),
          run: ({ name, title, description, collections }) =>
            ask('create', 'dataContext', {
              name,
              title: title ?? name,
              description,
              collections: collections.map((c) => ({ name: c.name, title: c.title ?? c.name, parent: c.parent, attrs: attrs(c.attributes) })),
            }),
        },
        {
          name: 'deleteDataContext',
          readOnly: false,
          description: 'Deletes a data set with all its data, tables and graphs of it. Cannot be undone by you.',
          parameters: object({ dataContext: DATA_CONTEXT }, ['dataContext']),
          destructive: true,
          run: ({ dataContext }) => ask('delete', dc(dataContext)),
        },
      ],
    },
    {
      id: 'collections',
      description: 'Collections: the levels of a data set (e.g. Classes above Students).',
      functions: [
        {
          name: 'createCollection',
          readOnly: false,
          destructive: false,
          description: 'Adds a collection (level) to a data set. With "parent" it becomes a child level of that collection.',
          parameters: object(
            {
              dataContext: DATA_CONTEXT,
              name: { type: 'string', minLength: 1 },
              title: { type: 'string' },
              parent: { type: 'string', description: 'Parent collection name.' },
              attributes: { type: 'array', items: ATTRIBUTE },
            },
            ['dataContext', 'name'],
          ),
          run: ({ dataContext, name, title, parent, attributes }) =>
            ask('create', `${dc(dataContext)}.collection`, [{ name, title: title ?? name, parent, attrs: attrs(attributes) }]),
        },
        {
          name: 'deleteCollection',
          readOnly: false,
          description: 'Deletes a collection and its attributes.',
          parameters: object({ dataContext: DATA_CONTEXT, collection: COLLECTION }, ['dataContext', 'collection']),
          destructive: true,
          run: ({ dataContext, collection }) => ask('delete', `${dc(dataContext)}.collection[${collection}]`),
        },
      ],
    },
    {
      id: 'attributes',
      description: 'Attributes: the columns of a collection, plain or computed by a formula.',
      functions: [
        {
          name: 'createAttributes',
          readOnly: false,
          destructive: false,
          description: `Adds attributes (columns) to a collection; give "formula" for a computed one. ${FORMULA_HELP}`,
          parameters: object(
            { dataContext: DATA_CONTEXT, collection: COLLECTION, attributes: { type: 'array', minItems: 1, items: ATTRIBUTE } },
            ['dataContext', 'collection', 'attributes'],
          ),
          run: ({ dataContext, collection, attributes }) =>
            ask('create', `${dc(dataContext)}.collection[${collection}].attribute`, attrs(attributes)),
        },
        {
          name: 'updateAttribute',
          readOnly: false,
          description: 'Changes an attribute: rename it, set or change its formula, type, unit or precision.',
          parameters: object(
            {
              dataContext: DATA_CONTEXT,
              collection: COLLECTION,
              attribute: { type: 'string', minLength: 1, description: 'The attribute to change.' },
              changes: {
                type: 'object',
                properties: ATTRIBUTE.properties,
                additionalProperties: false,
                description: 'Only what changes, e.g. {"formula": "height / 100"} or {"name": "new name"}.',
              },
            },
            ['dataContext', 'collection', 'attribute', 'changes'],
          ),
          destructive: true,
          run: ({ dataContext, collection, attribute, changes }) =>
            ask('update', `${dc(dataContext)}.collection[${collection}].attribute[${attribute}]`, changes),
        },
        {
          name: 'deleteAttribute',
          readOnly: false,
          description: 'Deletes an attribute (column) and its values.',
          parameters: object(
            { dataContext: DATA_CONTEXT, collection: COLLECTION, attribute: { type: 'string', minLength: 1 } },
            ['dataContext', 'collection', 'attribute'],
          ),
          destructive: true,
          run: ({ dataContext, collection, attribute }) =>
            ask('delete', `${dc(dataContext)}.collection[${collection}].attribute[${attribute}]`),
        },
      ],
    },
    {
      id: 'items',
      description:
        'Items: the rows of a data set. An item has values for the attributes of ALL its collections; CODAP groups items into cases per collection. Add and change data with items.',
      functions: [
        {
          name: 'createItems',
          readOnly: false,
          description: 'Adds rows. Each item gives values by attribute name across all collections, e.g. [{"name": "Ada", "age": 36}]. Returns the new ids.',
          parameters: object({ dataContext: DATA_CONTEXT, items: { type: 'array', minItems: 1, items: ROW } }, ['dataContext', 'items']),
          destructive: false,
          run: ({ dataContext, items }, context = {}) => createItemsInChunks(ask, dataContext, items, context),
        },
        {
          name: 'getItems',
          readOnly: true,
          description: 'Reads rows: [{id, values}], formula values included.',
          parameters: object(
            { dataContext: DATA_CONTEXT, search: SEARCH, limit: { type: 'integer', minimum: 1, description: 'At most this many rows.' } },
            ['dataContext'],
          ),
          run: async ({ dataContext, search = '*', limit }) => {
            const items = await ask('get', `${dc(dataContext)}.itemSearch[${search}]`);
            return Array.isArray(items) && limit ? items.slice(0, limit) : items;
          },
        },
        {
          name: 'updateItems',
          readOnly: false,
          description: 'Changes values of rows by item id: [{"id": 12, "values": {"age": 37}}].',
          parameters: object(
            {
              dataContext: DATA_CONTEXT,
              items: { type: 'array', minItems: 1, items: object({ id: { type: 'integer' }, values: ROW }, ['id', 'values']) },
            },
            ['dataContext', 'items'],
          ),
          destructive: true,
          run: ({ dataContext, items }) => ask('update', `${dc(dataContext)}.item`, items),
        },
        {
          name: 'deleteItems',
          readOnly: false,
          description: 'Deletes rows, by item ids or by a search condition.',
          parameters: {
            ...object({ dataContext: DATA_CONTEXT, itemIds: IDS, search: SEARCH }, ['dataContext']),
            anyOf: [{ required: ['itemIds'] }, { required: ['search'] }],
          },
          destructive: true,
          run: async ({ dataContext, itemIds, search }) => {
            if (search) return ask('delete', `${dc(dataContext)}.itemSearch[${search}]`);
            const requests = itemIds.map((id) => ({ action: 'delete', resource: `${dc(dataContext)}.itemByID[${id}]` }));
            return outcome(await codap.request(requests));
          },
        },
        {
          name: 'countItems',
          readOnly: true,
          description: 'Counts the rows of a data set.',
          parameters: object({ dataContext: DATA_CONTEXT }, ['dataContext']),
          run: ({ dataContext }) => ask('get', `${dc(dataContext)}.itemCount`),
        },
      ],
    },
    {
      id: 'cases',
      description: 'Cases: the rows of one collection (in a hierarchy, a parent case groups child cases).',
      functions: [
        {
          name: 'getCases',
          readOnly: true,
          description: 'Reads the cases of a collection: [{id, parent, values, children}], formula values included.',
          parameters: object(
            {
              dataContext: DATA_CONTEXT,
              collection: COLLECTION,
              search: SEARCH,
              limit: { type: 'integer', minimum: 1 },
              offset: { type: 'integer', minimum: 0 },
            },
            ['dataContext', 'collection'],
          ),
          run: async ({ dataContext, collection, search = '*', limit, offset = 0 }) => {
            const cases = await ask('get', `${dc(dataContext)}.collection[${collection}].caseSearch[${search}]`);
            if (!Array.isArray(cases)) return cases;
            return cases.slice(offset, limit ? offset + limit : undefined);
          },
        },
        {
          name: 'countCases',
          readOnly: true,
          description: 'Counts the cases of a collection.',
          parameters: object({ dataContext: DATA_CONTEXT, collection: COLLECTION }, ['dataContext', 'collection']),
          run: ({ dataContext, collection }) => ask('get', `${dc(dataContext)}.collection[${collection}].caseCount`),
        },
        {
          name: 'updateCases',
          readOnly: false,
          description: 'Changes values of cases by case id: [{"id": 40, "values": {"age": 37}}].',
          parameters: object(
            {
              dataContext: DATA_CONTEXT,
              collection: COLLECTION,
              cases: { type: 'array', minItems: 1, items: object({ id: { type: 'integer' }, values: ROW }, ['id', 'values']) },
            },
            ['dataContext', 'collection', 'cases'],
          ),
          destructive: true,
          run: ({ dataContext, collection, cases }) => ask('update', `${dc(dataContext)}.collection[${collection}].case`, cases),
        },
        {
          name: 'deleteCases',
          readOnly: false,
          description: 'Deletes cases (and, for a parent case, its children) by case id.',
          parameters: object({ dataContext: DATA_CONTEXT, collection: COLLECTION, caseIds: IDS }, ['dataContext', 'collection', 'caseIds']),
          destructive: true,
          run: async ({ dataContext, collection, caseIds }) => {
            const requests = caseIds.map((id) => ({ action: 'delete', resource: `${dc(dataContext)}.collection[${collection}].caseByID[${id}]` }));
            return outcome(await codap.request(requests));
          },
        },
      ],
    },
    {
      id: 'selection',
      description: 'The selected cases, shown highlighted in every table and graph.',
      functions: [
        {
          name: 'selectCases',
          readOnly: false,
          destructive: true,
          description: 'Selects cases by id (replacing the selection, or adding to it with extend).',
          parameters: object({ dataContext: DATA_CONTEXT, caseIds: { type: 'array', items: { type: 'integer' } }, extend: { type: 'boolean' } }, ['dataContext', 'caseIds']),
          run: ({ dataContext, caseIds, extend }) => ask(extend ? 'update' : 'create', `${dc(dataContext)}.selectionList`, caseIds),
        },
        {
          name: 'getSelection',
          readOnly: true,
          description: 'The selected cases: [{collectionName, collectionID, caseID}].',
          parameters: object({ dataContext: DATA_CONTEXT }, ['dataContext']),
          run: ({ dataContext }) => ask('get', `${dc(dataContext)}.selectionList`),
        },
      ],
    },
    {
      id: 'components',
      description: 'What the document shows: case tables, graphs, maps, sliders, text.',
      functions: [
        {
          name: 'createCaseTable',
          readOnly: false,
          destructive: false,
          description: 'Shows a data set as a case table.',
          parameters: object({ dataContext: DATA_CONTEXT, title: { type: 'string' } }, ['dataContext']),
          run: ({ dataContext, title }) => ask('create', 'component', { type: 'caseTable', dataContext, title }),
        },
        {
          name: 'createGraph',
          readOnly: false,
          destructive: false,
          description: 'Makes a graph of a data set with its axes set, e.g. {"dataContext": "People", "xAttribute": "age", "yAttribute": "height"}. Returns its id.',
          parameters: object(
            {
              dataContext: DATA_CONTEXT,
              xAttribute: { type: 'string', description: 'Attribute on the horizontal axis.' },
              yAttribute: { type: 'string', description: 'Attribute on the vertical axis.' },
              legendAttribute: { type: 'string', description: 'Attribute that colours the points.' },
              title: { type: 'string' },
            },
            ['dataContext'],
          ),
          run: ({ dataContext, xAttribute, yAttribute, legendAttribute, title }) =>
            ask('create', 'component', {
              type: 'graph',
              dataContext,
              xAttributeName: xAttribute,
              yAttributeName: yAttribute,
              legendAttributeName: legendAttribute,
              title,
            }),
        },
        {
          name: 'createMap',
          readOnly: false,
          destructive: false,
          description: 'Shows a data set with latitude/longitude (or boundary) attributes on a map.',
          parameters: object({ dataContext: DATA_CONTEXT, title: { type: 'string' } }, ['dataContext']),
          run: ({ dataContext, title }) => ask('create', 'component', { type: 'map', dataContext, title }),
        },
        {
          name: 'createSlider',
          readOnly: false,
          destructive: false,
          description: 'Adds a slider: a named global value usable in formulas (e.g. "height * scale").',
          parameters: object(
            {
              name: { type: 'string', minLength: 1, description: 'The value\'s name in formulas.' },
              value: { type: 'number' },
              lowerBound: { type: 'number' },
              upperBound: { type: 'number' },
              title: { type: 'string' },
            },
            ['name'],
          ),
          run: ({ name, value, lowerBound, upperBound, title }) =>
            ask('create', 'component', { type: 'slider', name, title: title ?? name, value, lowerBound, upperBound }),
        },
        {
          name: 'createText',
          readOnly: false,
          destructive: false,
          description: 'Adds a text box, e.g. to explain a graph.',
          parameters: object({ text: { type: 'string' }, title: { type: 'string' } }, ['text']),
          run: ({ text, title }) => ask('create', 'component', { type: 'text', text, title }),
        },
        {
          name: 'listComponents',
          readOnly: true,
          description: 'Lists the components of the document: [{id, name, title, type}].',
          parameters: object({}),
          run: () => ask('get', 'componentList'),
        },
        {
          name: 'updateComponent',
          readOnly: false,
          description: 'Changes a component (by id or name), e.g. {"title": "Height by age"} or a graph\'s {"xAttributeName": "weight"}.',
          parameters: object(
            { component: { type: ['integer', 'string'] }, changes: { type: 'object', additionalProperties: true } },
            ['component', 'changes'],
          ),
          destructive: true,
          run: ({ component, changes }) => ask('update', `component[${component}]`, changes),
        },
        {
          name: 'deleteComponent',
          readOnly: false,
          description: 'Removes a component (by id or name) from the document; its data stays.',
          parameters: object({ component: { type: ['integer', 'string'] } }, ['component']),
          destructive: true,
          run: ({ component }) => ask('delete', `component[${component}]`),
        },
      ],
    },
    {
      id: 'analysis',
      description: 'Images of graphs and formula evaluation.',
      functions: [
        {
          name: 'getGraphImage',
          readOnly: true,
          description:
            'Shows you a graph (by id or name): a PNG image of it (at most 1024 px wide) and a sentence on what it plots (plot type, attributes, number of cases).',
          parameters: object({ graph: { type: ['integer', 'string'] } }, ['graph']),
          run: ({ graph }) => graphImage(ask, graph),
        },
        {
          name: 'evaluateFormula',
          readOnly: true,
          description: `Evaluates a formula for some records without changing the document. ${FORMULA_HELP}`,
          parameters: object(
            { formula: { type: 'string', minLength: 1 }, records: { type: 'array', items: ROW, description: 'Values to evaluate with; default one empty record.' } },
            ['formula'],
          ),
          run: ({ formula, records }) =>
            ask('notify', 'formulaEngine', { request: 'evalExpression', source: formula, records: records ?? [{}] }),
        },
      ],
    },
    {
      id: 'codap',
      description: 'Any other CODAP Data Interactive API request.',
      functions: [
        {
          name: 'codapRequest',
          // Only `get` reads; create, update, delete and notify change the document.
          readOnly: ({ action }) => action === 'get',
          description:
            'Sends one request of the CODAP Data Interactive Plugin API: {action: get|create|update|delete|notify, resource, values}, e.g. {"action": "get", "resource": "globalList"}. Use the specific tools when one fits.',
          parameters: object(
            {
              action: { type: 'string', enum: ['get', 'create', 'update', 'delete', 'notify'] },
              resource: { type: 'string', minLength: 1 },
              values: { description: 'Values for create, update and notify.' },
            },
            ['action', 'resource'],
          ),
          destructive: (args) => args.action === 'update' || args.action === 'delete',
          // A graph's picture is an image here too, as getGraphImage gives it.
          run: ({ action, resource, values }) =>
            action === 'get' && dataDisplayOf(resource) !== null ? graphImage(ask, dataDisplayOf(resource)) : ask(action, resource, values),
        },
      ],
    },
  ];
}
