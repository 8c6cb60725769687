// The browser SDK's pure functions under plain node (no browser, nothing to install), in
// milliseconds: the argument checks and what a function says it does to data (dispatcher.js),
// which frames end a tab's session (transport.js), what each transport's opener reports
// through its callbacks and what the Transport does with its `{send, close}` (against stand-ins
// for WebSocket, EventSource, fetch and the timers), and the words <toolrelay-pairing> puts on
// the page (pairing-text.js); what a tool answers with (ToolResult, result.js) and reports
// while it runs (progress and log frames, progress.js), and the plugin's own pure parts (its
// graph pictures, graph-image.js, and its chunked item creation). The browser tests
// (tests/browser) cover the same code end to end, in seconds; these say which case broke.
//
//   node --test tests/node/sdk-unit.test.mjs

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { Dispatcher, ToolError, heldForConfirmation, hints, validate } from '../../services/gateway/sdk/dispatcher.js';
import { ErrorCode } from '../../services/gateway/sdk/errors.js';
import {
  LABEL_LISTED,
  LABEL_SHOWN,
  REACH,
  approvalText,
  clock,
  duration,
  escape,
  lifetime,
  reach,
  shortLabel,
  summarize,
} from '../../services/gateway/sdk/pairing-text.js';
import { Connection } from '../../services/gateway/sdk/connection.js';
import { LOG_LEVELS, PROGRESS_INTERVAL_MS, ProgressGate, callContext, logFrame, progressFrame } from '../../services/gateway/sdk/progress.js';
import { IMAGE_TYPES, ToolResult, answerOf, fromMcpResult, splitDataUri, toBase64 } from '../../services/gateway/sdk/result.js';
import { Transport, sessionEnd } from '../../services/gateway/sdk/transport.js';
import { openPolling } from '../../services/gateway/sdk/transport-polling.js';
import { openEventStream } from '../../services/gateway/sdk/transport-sse.js';
import { openWebSocket } from '../../services/gateway/sdk/transport-websocket.js';
import { MAX_WIDTH, describeGraph, fitted, fittedPng, leadingBytes, pngSize } from '../../services/gateway/plugin/graph-image.js';
import { ITEMS_PER_REQUEST, codapTools } from '../../services/gateway/plugin/tools.js';

// ---- dispatcher.js: validate ----

describe('validate', () => {
  const point = {
    type: 'object',
    required: ['x', 'y'],
    properties: { x: { type: 'number' }, y: { type: 'number' }, label: { type: 'string', minLength: 1 } },
    additionalProperties: false,
  };
  // [what, schema, value, the problems (in order)]
  const cases = [
    // Types, as JSON has them; an integer is a number, a number is not an integer.
    ['a string is a string', { type: 'string' }, 'a', []],
    ['a number is not a string', { type: 'string' }, 3, ['args must be string, not integer']],
    ['a fraction is a number, named so', { type: 'string' }, 1.5, ['args must be string, not number']],
    ['an integer is a number', { type: 'number' }, 3, []],
    ['2.0 is an integer', { type: 'integer' }, 2.0, []],
    ['1.5 is not an integer', { type: 'integer' }, 1.5, ['args must be integer, not number']],
    ['true is a boolean', { type: 'boolean' }, true, []],
    ['"true" is not a boolean', { type: 'boolean' }, 'true', ['args must be boolean, not string']],
    ['null is its own type', { type: 'object' }, null, ['args must be object, not null']],
    ['an array is not an object', { type: 'object' }, [1], ['args must be object, not array']],
    ['an object is not an array', { type: 'array' }, {}, ['args must be array, not object']],
    ['undefined is named', { type: 'string' }, undefined, ['args must be string, not undefined']],
    ['a list of types takes any of them', { type: ['string', 'null'] }, null, []],
    ['a list of types is named in full', { type: ['string', 'null'] }, 3, ['args must be string or null, not integer']],
    // A wrong type is the only problem told: nothing else is checked.
    ['a wrong type stops the other checks', { type: 'string', enum: ['a'], minLength: 5 }, 7, ['args must be string, not integer']],
    // enum: equal as JSON.
    ['a value in the enum', { enum: ['red', 'green'] }, 'green', []],
    ['a value outside the enum', { enum: ['red', 'green'] }, 'blue', ['args must be one of "red", "green"']],
    ['enum compares as JSON, not by identity', { enum: [[1, 2], { a: 1 }] }, { a: 1 }, []],
    ['enum tells 1 from "1"', { enum: [1] }, '1', ['args must be one of 1']],
    ['enum and a type together', { type: 'integer', enum: [1, 2] }, 3, ['args must be one of 1, 2']],
    // Bounds.
    ['minimum holds at the bound', { type: 'number', minimum: 0 }, 0, []],
    ['under the minimum', { type: 'number', minimum: 0 }, -1, ['args must be at least 0']],
    ['maximum holds at the bound', { type: 'number', maximum: 10 }, 10, []],
    ['over the maximum', { type: 'number', maximum: 10 }, 10.5, ['args must be at most 10']],
    ['bounds are for numbers only', { minimum: 5, maximum: 1 }, 'abc', []],
    ['minLength holds at the bound', { type: 'string', minLength: 2 }, 'ab', []],
    ['under minLength', { type: 'string', minLength: 2 }, 'a', ['args must have at least 2 character(s)']],
    ['minItems holds at the bound', { type: 'array', minItems: 1 }, [0], []],
    ['under minItems', { type: 'array', minItems: 1 }, [], ['args needs at least 1 item(s)']],
    // Objects: required, properties, additionalProperties, with the path to each value.
    ['a point', point, { x: 1, y: 2 }, []],
    ['a point without y', point, { x: 1 }, ['args.y is required']],
    ['a point without either', point, {}, ['args.x is required', 'args.y is required']],
    ['a point with a wrong x', point, { x: 'one', y: 2 }, ['args.x must be number, not string']],
    ['a point with an empty label', point, { x: 1, y: 2, label: '' }, ['args.label must have at least 1 character(s)']],
    ['a point with something more', point, { x: 1, y: 2, z: 3 }, ['args.z is not expected']],
    ['more properties are welcome by default', { type: 'object', properties: {} }, { z: 3 }, []],
    // Names every object has (`toString`, `constructor`) are arguments only when given.
    ['a required name every object has, not given', { type: 'object', required: ['toString'] }, {}, ['args.toString is required']],
    ['a required name every object has, given', { type: 'object', required: ['toString'] }, { toString: 1 }, []],
    ['an unexpected constructor', point, { x: 1, y: 2, constructor: 3 }, ['args.constructor is not expected']],
    ['an unexpected __proto__ from JSON', point, JSON.parse('{"x":1,"y":2,"__proto__":{"a":1}}'), ['args.__proto__ is not expected']],
    [
      'additionalProperties as a schema checks each one more',
      { type: 'object', properties: { id: { type: 'string' } }, additionalProperties: { type: 'number', maximum: 5 } },
      { id: 'a', q: 6, r: 's', s: 1 },
      ['args.q must be at most 5', 'args.r must be number, not string'],
    ],
    // Arrays: items, with the index in the path; nested all the way down.
    ['items are checked each', { type: 'array', items: { type: 'string' } }, ['a', 2, 'c', null], ['args[1] must be string, not integer', 'args[3] must be string, not null']],
    [
      'nested objects in arrays in objects',
      {
        type: 'object',
        properties: {
          rows: {
            type: 'array',
            minItems: 3,
            items: { type: 'object', required: ['id'], properties: { id: { type: 'integer' }, tags: { type: 'array', items: { enum: ['a', 'b'] } } } },
          },
        },
      },
      { rows: [{ id: 1, tags: ['a', 'c'] }, { tags: [] }] },
      ['args.rows needs at least 3 item(s)', 'args.rows[0].tags[1] must be one of "a", "b"', 'args.rows[1].id is required'],
    ],
    // anyOf: one form is enough; none is one problem, not the forms' own.
    ['anyOf: the first form', { anyOf: [{ type: 'string' }, { type: 'integer', minimum: 3 }] }, 'x', []],
    ['anyOf: the second form', { anyOf: [{ type: 'string' }, { type: 'integer', minimum: 3 }] }, 4, []],
    ['anyOf: no form', { anyOf: [{ type: 'string' }, { type: 'integer', minimum: 3 }] }, 2, ['args does not match any allowed form']],
    [
      'anyOf inside an object names its path',
      { type: 'object', properties: { when: { anyOf: [{ type: 'string' }, { type: 'null' }] } } },
      { when: 5 },
      ['args.when does not match any allowed form'],
    ],
    // No schema, or not an object: nothing to check.
    ['no schema', undefined, 3, []],
    ['a schema that is no object', true, 3, []],
    ['an empty schema takes anything', {}, { a: [1, null] }, []],
    // What the subset leaves out is not checked (the relay checks the manifest's schemas).
    ['keywords outside the subset are not checked', { type: 'string', maxLength: 1, pattern: '^x$' }, 'yyy', []],
  ];
  for (const [what, schema, value, problems] of cases) {
    test(what, () => assert.deepEqual(validate(schema, value), problems));
  }

  test('the path starts where the caller says', () => {
    assert.deepEqual(validate(point, { x: 1 }, 'point'), ['point.y is required']);
    assert.deepEqual(validate({ type: 'array', items: { type: 'string' } }, [1], 'list'), ['list[0] must be string, not integer']);
  });
});

// ---- dispatcher.js: heldForConfirmation, hints, and the annotations behind them ----

describe('heldForConfirmation', () => {
  // [what, fn, args, held]
  const cases = [
    ['an unmarked function is held', { name: 'f' }, {}, true],
    ['readOnly: true is not held', { readOnly: true }, {}, false],
    ['readOnly: false is held', { readOnly: false }, {}, true],
    ['only true counts, not truthy', { readOnly: 'yes' }, {}, true],
    ['no function at all is held', undefined, {}, true],
    ['a readOnly function of the arguments: read-only for these', { readOnly: (args) => args.mode === 'read' }, { mode: 'read' }, false],
    ['a readOnly function of the arguments: changing for these', { readOnly: (args) => args.mode === 'read' }, { mode: 'write' }, true],
    ['a readOnly function saying something truthy but not true', { readOnly: () => 1 }, {}, true],
  ];
  for (const [what, fn, args, held] of cases) {
    test(what, () => assert.equal(heldForConfirmation(fn, args), held));
  }

  test('a readOnly function gets {} for arguments that are null or left out', () => {
    const seen = [];
    const fn = {
      readOnly: (args) => {
        seen.push(args);
        return true;
      },
    };
    assert.equal(heldForConfirmation(fn, null), false);
    assert.equal(heldForConfirmation(fn), false);
    assert.deepEqual(seen, [{}, {}]);
  });
});

describe('hints', () => {
  // [what, fn, the hints]
  const cases = [
    ['nothing marked, nothing said', { name: 'f' }, {}],
    ['a title', { title: 'Add a row' }, { title: 'Add a row' }],
    ['a blank title is left out', { title: '   ' }, {}],
    ['a title that is no string is left out', { title: 5 }, {}],
    ['read-only', { readOnly: true, idempotent: true }, { readOnly: true, idempotent: true }],
    ['read-only is never destructive', { readOnly: true, destructive: true }, { readOnly: true }],
    ['not read-only, destructive', { readOnly: false, destructive: true }, { readOnly: false, destructive: true }],
    ['destructive: false is said too', { destructive: false }, { destructive: false }],
    ['a readOnly of the arguments is not read-only for hosts', { readOnly: () => true }, {}],
    ['a destructive of the arguments is destructive for hosts', { destructive: () => false }, { destructive: true }],
    ['untrusted content', { untrustedContent: true }, { untrustedContent: true }],
    ['idempotent: false is said', { idempotent: false }, { idempotent: false }],
    ['flags that are no booleans are left out', { readOnly: 'true', destructive: 1, idempotent: 'yes', untrustedContent: null }, {}],
  ];
  for (const [what, fn, expected] of cases) {
    test(what, () => assert.deepEqual(hints(fn), expected));
  }
});

describe('Dispatcher: tools given either way', () => {
  const manifestOf = (...tools) => {
    const dispatcher = new Dispatcher();
    for (const tool of tools) dispatcher.add(tool);
    return dispatcher.manifest();
  };

  test("a WebMCP tool's annotations become the hints", () => {
    const [group] = manifestOf({
      name: 'count',
      description: 'Counts',
      inputSchema: { type: 'object', properties: { by: { type: 'integer' } } },
      execute: () => 0,
      annotations: { title: 'Count', readOnlyHint: true, destructiveHint: true, idempotentHint: true, untrustedContentHint: false },
    });
    assert.deepEqual(group, {
      id: 'page',
      description: 'Tools of this page',
      functions: [
        {
          name: 'count',
          description: 'Counts',
          parameters: { type: 'object', properties: { by: { type: 'integer' } } },
          title: 'Count',
          readOnly: true,
          idempotent: true,
          untrustedContent: false,
        },
      ],
    });
  });

  test('marks of its own win over annotations', () => {
    const [group] = manifestOf({
      name: 'drop',
      execute: () => 0,
      readOnly: false,
      title: 'Drop it',
      annotations: { title: 'Other', readOnlyHint: true, destructiveHint: true },
    });
    assert.deepEqual(group.functions[0], {
      name: 'drop',
      description: '',
      parameters: { type: 'object', properties: {} },
      title: 'Drop it',
      readOnly: false,
      destructive: true,
    });
  });

  test('a group keeps its id and description; a function without parameters takes an empty object', () => {
    assert.deepEqual(manifestOf({ id: 'list', description: 'The list', functions: [{ name: 'clear', run: () => 0, destructive: () => true }] }), [
      { id: 'list', description: 'The list', functions: [{ name: 'clear', description: '', parameters: { type: 'object', properties: {} }, destructive: true }] },
    ]);
  });

  test('a function of the same name replaces the one before, wherever it was', () => {
    const dispatcher = new Dispatcher();
    dispatcher.add({ id: 'a', functions: [{ name: 'f', run: () => 1 }, { name: 'g', run: () => 2 }] });
    dispatcher.add({ name: 'f', description: 'new', execute: () => 3 });
    assert.deepEqual(dispatcher.names().sort(), ['f', 'g']);
    assert.equal(dispatcher.find(null, 'f').description, 'new');
    assert.equal(dispatcher.find('a', 'f'), null);
  });

  test('removing the last function of a group removes the group', () => {
    const dispatcher = new Dispatcher();
    dispatcher.add({ id: 'a', functions: [{ name: 'f', run: () => 1 }] });
    assert.equal(dispatcher.remove('f'), true);
    assert.deepEqual(dispatcher.manifest(), []);
    assert.equal(dispatcher.remove('f'), false);
  });

  // [what, tool, the message]
  const refused = [
    ['a name with a space', { name: 'add row', execute: () => 0 }, /name of 1 to 64 letters/],
    ['an empty name', { name: '', execute: () => 0 }, /name of 1 to 64 letters/],
    ['a name of 65 characters', { name: 'a'.repeat(65), execute: () => 0 }, /name of 1 to 64 letters/],
    ['no name', { execute: () => 0 }, /name of 1 to 64 letters/],
    ['no execute', { name: 'f' }, /The tool f needs an execute\(args\) function/],
  ];
  for (const [what, tool, message] of refused) {
    test(`refused: ${what}`, () => assert.throws(() => new Dispatcher().add(tool), { name: 'TypeError', message }));
  }
  test('a name of 64 letters, digits and _ is taken', () => {
    const dispatcher = new Dispatcher();
    dispatcher.add({ name: `A_9${'b'.repeat(61)}`, execute: () => 0 });
    assert.equal(dispatcher.names()[0].length, 64);
  });
});

describe('Dispatcher.call', () => {
  const dispatcher = new Dispatcher();
  const seen = [];
  dispatcher.add({
    name: 'add',
    inputSchema: { type: 'object', required: ['a', 'b'], properties: { a: { type: 'number' }, b: { type: 'number' } } },
    execute(args, { signal }) {
      seen.push({ args, aborted: signal.aborted, self: this.name });
      return args.a + args.b;
    },
  });

  test('runs the function with the arguments, its signal, and the tool as `this`', async () => {
    assert.equal(await dispatcher.call(null, 'add', { a: 2, b: 3 }), 5);
    assert.deepEqual(seen.at(-1), { args: { a: 2, b: 3 }, aborted: false, self: 'add' });
  });

  test('arguments that break the schema: invalid_arguments, every problem named', async () => {
    await assert.rejects(dispatcher.call(null, 'add', { a: 'x' }), (error) => {
      assert.ok(error instanceof ToolError);
      assert.equal(error.code, ErrorCode.INVALID_ARGUMENTS);
      assert.equal(error.message, 'Invalid arguments: args.b is required; args.a must be number, not string.');
      return true;
    });
  });

  test('null arguments are checked as {}', async () => {
    await assert.rejects(dispatcher.call(null, 'add', null), { code: ErrorCode.INVALID_ARGUMENTS, message: /args\.a is required; args\.b is required/ });
  });

  test('an unknown function: unknown_function', async () => {
    await assert.rejects(dispatcher.call(null, 'nope', {}), { code: ErrorCode.UNKNOWN_FUNCTION, message: 'This tab has no function nope.' });
  });

  test('a call cancelled before it starts does not run', async () => {
    const before = seen.length;
    await assert.rejects(dispatcher.call(null, 'add', { a: 1, b: 1 }, { signal: AbortSignal.abort() }), { name: 'AbortError' });
    assert.equal(seen.length, before);
  });
});

// ---- transport.js: the session's end ----

describe('sessionEnd', () => {
  // [what, frame, the end]
  const cases = [
    ['an expired frame', { type: 'expired', message: 'The session expired.' }, 'expired'],
    ['an expired frame, whatever else it says', { type: 'expired', requestId: 'r1' }, 'expired'],
    ['replaced by another tab', { type: 'error', error: ErrorCode.REPLACED }, 'replaced'],
    ['replaced wins over a status', { type: 'error', error: ErrorCode.REPLACED, status: 404 }, 'replaced'],
    ['the session is not found', { type: 'error', error: ErrorCode.SESSION_NOT_FOUND }, 'expired'],
    ['the token is not valid', { type: 'error', error: ErrorCode.INVALID_TOKEN }, 'expired'],
    ['no token', { type: 'error', error: ErrorCode.TOKEN_REQUIRED }, 'expired'],
    ['the code is not valid', { type: 'error', error: ErrorCode.INVALID_CODE }, 'expired'],
    ['HTTP 401', { type: 'error', status: 401 }, 'expired'],
    ['HTTP 403', { type: 'error', status: 403 }, 'expired'],
    ['HTTP 404', { type: 'error', status: 404 }, 'expired'],
    ['HTTP 200 (a poll that worked)', { type: 'error', status: 200 }, null],
    ['HTTP 500', { type: 'error', status: 500 }, null],
    ['HTTP 429', { type: 'error', status: 429 }, null],
    ['an error about something else', { type: 'error', error: ErrorCode.RATE_LIMITED }, null],
    ['an error naming a call is about its answer', { type: 'error', error: ErrorCode.SESSION_NOT_FOUND, requestId: 'r1' }, null],
    ['replaced, naming a call', { type: 'error', error: ErrorCode.REPLACED, requestId: 'r1' }, null],
    ['a 404 naming a call', { type: 'error', status: 404, requestId: 'r1' }, null],
    ['a frame of another type', { type: 'heartbeat', error: ErrorCode.REPLACED, status: 404 }, null],
    ['a frame without a type', { error: ErrorCode.SESSION_NOT_FOUND }, null],
  ];
  for (const [what, frame, end] of cases) {
    test(what, () => assert.equal(sessionEnd(frame), end));
  }
});

describe('Transport: what it makes of frames (not connected)', () => {
  const transport = (options) => new Transport('http://relay.test', { code: 'ABCD1234', token: 't0k' }, () => [{ id: 'x' }], async () => ({}), options);
  const events = (target, names) => {
    const heard = [];
    for (const name of names) target.addEventListener(name, (event) => heard.push([name, event.detail]));
    return heard;
  };

  test('ended() emits the end with the frame\'s message and says so', () => {
    const t = transport();
    const heard = events(t, ['expired', 'replaced']);
    assert.equal(t.ended({ type: 'error', error: ErrorCode.REPLACED, message: 'Another tab took over.' }), true);
    assert.equal(t.ended({ type: 'expired', message: 'Gone.' }), true);
    assert.equal(t.ended({ type: 'error', error: ErrorCode.QUEUE_FULL, message: 'Busy.' }), false);
    assert.deepEqual(heard, [
      ['replaced', 'Another tab took over.'],
      ['expired', 'Gone.'],
    ]);
  });

  test('approvalFrame() emits the three frames about callers, and nothing else', () => {
    const t = transport();
    const heard = events(t, ['approval-request', 'approval-closed', 'callers', 'heartbeat']);
    const frames = [
      { type: 'approval-request', callerId: 'c1' },
      { type: 'approval-closed', callerId: 'c1', outcome: 'allowed' },
      { type: 'callers', allowed: [] },
    ];
    for (const frame of frames) assert.equal(t.approvalFrame(frame), true);
    assert.equal(t.approvalFrame({ type: 'heartbeat' }), false);
    assert.equal(t.approvalFrame(null), false);
    assert.deepEqual(
      heard,
      frames.map((frame) => [frame.type, frame]),
    );
  });

  test('the registration says whether the person approves, as a boolean', () => {
    assert.deepEqual(transport().registration(), { tools: [{ id: 'x' }], approves: false });
    assert.equal(transport({ approves: 1 }).registration().approves, true);
    let asks = false;
    const t = transport({ approves: () => (asks ? 'yes' : '') });
    assert.equal(t.registration().approves, false);
    asks = true;
    assert.equal(t.registration().approves, true);
  });

  test("the session's URLs and authorization", () => {
    const t = transport();
    assert.equal(t.url('/manifest'), 'http://relay.test/api/sessions/ABCD1234/manifest');
    assert.deepEqual(t.auth(), { authorization: 'Bearer t0k' });
  });
});

// ---- transport-*.js: the openers' callbacks and {send, close} ----

// Every callback an opener may report through; each call is heard as [name, ...arguments].
const CALLBACKS = ['opened', 'failed', 'closed', 'ended', 'expiry', 'registration', 'putManifest', 'registered', 'call']
  .concat(['cancel', 'approval', 'settled', 'retry', 'problem', 'interrupted', 'resend', 'runningIds', 'asked']);

function callbacks(answers = {}) {
  const heard = [];
  const given = {
    registration: () => ({ tools: ['x'], approves: false }),
    putManifest: async () => {},
    runningIds: () => [],
    ended: () => false,
    approval: () => false,
    ...answers,
  };
  const on = {};
  for (const name of CALLBACKS) {
    on[name] = (...args) => {
      heard.push([name, ...args]);
      return given[name]?.(...args);
    };
  }
  return { on, heard };
}

// Sets globals (WebSocket, EventSource, fetch, setTimeout…) for one test, and puts them back.
function stubGlobals(t, values) {
  const before = Object.fromEntries(Object.keys(values).map((name) => [name, Object.getOwnPropertyDescriptor(globalThis, name)]));
  Object.assign(globalThis, values);
  t.after(() => {
    for (const [name, descriptor] of Object.entries(before)) {
      if (descriptor) Object.defineProperty(globalThis, name, descriptor);
      else delete globalThis[name];
    }
  });
}

// A WebSocket class whose sockets the test drives from the relay's side.
function fakeWebSocket({ fails = false } = {}) {
  return class FakeSocket {
    static OPEN = 1;
    static made = [];
    constructor(url) {
      if (fails) throw new SyntaxError('Not a WebSocket URL.');
      this.url = url;
      this.readyState = 0;
      this.sent = [];
      this.closedWith = null;
      FakeSocket.made.push(this);
    }
    send(data) {
      this.sent.push(JSON.parse(data));
    }
    close(code, reason) {
      this.closedWith = [code, reason];
    }
    open() {
      this.readyState = 1;
    }
    receive(frame) {
      this.onmessage({ data: JSON.stringify(frame) });
    }
    drop() {
      this.readyState = 3;
      this.onclose({});
    }
  };
}

// An EventSource class whose streams the test drives from the relay's side.
function fakeEventSource() {
  return class FakeStream {
    static CLOSED = 2;
    static made = [];
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.listeners = new Map();
      FakeStream.made.push(this);
    }
    addEventListener(name, listener) {
      this.listeners.set(name, [...(this.listeners.get(name) ?? []), listener]);
    }
    close() {
      this.readyState = 2;
    }
    fire(name, data) {
      for (const listener of this.listeners.get(name) ?? []) listener(data === undefined ? {} : { data: JSON.stringify(data) });
    }
  };
}

// setTimeout and clearTimeout that wait for the test: `next()` runs the timer set first.
function fakeTimers(t) {
  const timers = new Map();
  let last = 0;
  stubGlobals(t, {
    setTimeout: (run, ms) => {
      last += 1;
      timers.set(last, { run, ms });
      return last;
    },
    clearTimeout: (id) => timers.delete(id),
  });
  return {
    timers,
    next() {
      const [id, { run }] = timers.entries().next().value;
      timers.delete(id);
      run();
    },
  };
}

// Lets the promises under way settle (a fake fetch answers at once).
const settle = async () => {
  for (let i = 0; i < 10; i += 1) await new Promise((resolve) => setImmediate(resolve));
};

describe('openWebSocket', () => {
  test('connects to its URL, and sends only while the socket is open', (t) => {
    const WebSocket = fakeWebSocket();
    stubGlobals(t, { WebSocket });
    const { on, heard } = callbacks();
    const connection = openWebSocket({ url: 'ws://relay.test/api/sessions/ABCD1234/ws?token=t0k' }, on);
    assert.deepEqual(Object.keys(connection).sort(), ['close', 'send']);
    const [socket] = WebSocket.made;
    assert.equal(socket.url, 'ws://relay.test/api/sessions/ABCD1234/ws?token=t0k');
    assert.equal(connection.send({ type: 'response', requestId: 'r1' }), false);
    socket.open();
    assert.equal(connection.send({ type: 'response', requestId: 'r1' }), true);
    assert.deepEqual(socket.sent, [{ type: 'response', requestId: 'r1' }]);
    connection.close();
    assert.deepEqual(socket.closedWith, [1000, 'stopped']);
    assert.deepEqual(heard, []);
  });

  test("reports the relay's frames, and registers when welcomed", (t) => {
    const WebSocket = fakeWebSocket();
    stubGlobals(t, { WebSocket });
    const { on, heard } = callbacks();
    openWebSocket({ url: 'ws://relay.test/ws' }, on);
    const [socket] = WebSocket.made;
    socket.open();
    socket.receive({ type: 'welcome', expiresAt: 5 });
    assert.deepEqual(socket.sent, [{ type: 'register', tools: ['x'], approves: false }]);
    const call = { type: 'tool-request', requestId: 'r1', args: {} };
    socket.receive({ type: 'registered', tools: ['x'] });
    socket.receive(call);
    socket.receive({ type: 'cancel', requestId: 'r1' });
    socket.receive({ type: 'callers', allowed: [] });
    socket.receive({ type: 'heartbeat', expiresAt: 6 });
    socket.receive({ type: 'ack', requestId: 'r1' });
    socket.receive({ type: 'ack', requestId: 'r2', error: ErrorCode.REQUEST_NOT_FOUND, message: 'Expected.' });
    socket.receive({ type: 'ack', requestId: 'r3', error: 'too_large', message: 'Too large.' });
    socket.receive({ type: 'error', error: 'queue_full', requestId: 'r4', message: 'Busy.' });
    socket.receive({ type: 'error', error: 'rate_limited', message: 'Slow down.' });
    assert.deepEqual(heard, [
      ['opened'],
      ['expiry', 5],
      ['registration'],
      ['registered', ['x']],
      ['call', call],
      ['cancel', 'r1'],
      ['approval', { type: 'callers', allowed: [] }],
      ['expiry', 6],
      ['settled', 'r1'],
      ['settled', 'r2'],
      ['settled', 'r3'],
      ['problem', 'Too large.'],
      ['ended', { type: 'error', error: 'queue_full', requestId: 'r4', message: 'Busy.' }],
      ['retry', 'r4'],
      ['ended', { type: 'error', error: 'rate_limited', message: 'Slow down.' }],
      ['problem', 'Slow down.'],
    ]);
  });

  test('a drop is a failure (that worked once it was welcomed); a close after the end is not', (t) => {
    const WebSocket = fakeWebSocket();
    stubGlobals(t, { WebSocket });
    const first = callbacks();
    openWebSocket({ url: 'ws://relay.test/ws' }, first.on);
    WebSocket.made[0].drop();
    assert.deepEqual(first.heard, [['failed', false]]);

    const second = callbacks();
    openWebSocket({ url: 'ws://relay.test/ws' }, second.on);
    WebSocket.made[1].open();
    WebSocket.made[1].receive({ type: 'welcome' });
    WebSocket.made[1].drop();
    assert.deepEqual(second.heard.at(-1), ['failed', true]);

    const third = callbacks({ ended: (frame) => frame.type === 'expired' });
    openWebSocket({ url: 'ws://relay.test/ws' }, third.on);
    WebSocket.made[2].open();
    WebSocket.made[2].receive({ type: 'expired', message: 'Gone.' });
    WebSocket.made[2].drop();
    assert.deepEqual(third.heard, [['ended', { type: 'expired', message: 'Gone.' }], ['closed']]);
  });

  test('a socket that cannot be made fails at once, and its handle sends nothing', (t) => {
    stubGlobals(t, { WebSocket: fakeWebSocket({ fails: true }) });
    const { on, heard } = callbacks();
    const connection = openWebSocket({ url: 'nonsense' }, on);
    assert.deepEqual(heard, [['failed', false]]);
    assert.equal(connection.send({ type: 'response' }), false);
    connection.close();
  });
});

describe('openEventStream', () => {
  test("connects to its URL, reports the relay's events, and sends nothing itself", (t) => {
    const EventSource = fakeEventSource();
    stubGlobals(t, { EventSource });
    const { on, heard } = callbacks();
    const connection = openEventStream({ url: 'http://relay.test/api/sessions/ABCD1234/stream?token=t0k' }, on);
    const [stream] = EventSource.made;
    assert.equal(stream.url, 'http://relay.test/api/sessions/ABCD1234/stream?token=t0k');
    stream.fire('connected', { expiresAt: 5 });
    stream.fire('tool-request', { requestId: 'r1', args: {} });
    stream.fire('cancel', { requestId: 'r1' });
    stream.fire('approval-request', { callerId: 'c1' });
    stream.fire('heartbeat', { expiresAt: 6 });
    stream.fire('error');
    assert.deepEqual(heard, [
      ['opened'],
      ['expiry', 5],
      ['putManifest'],
      ['call', { requestId: 'r1', args: {} }],
      ['cancel', 'r1'],
      ['approval', { callerId: 'c1', type: 'approval-request' }],
      ['expiry', 6],
      // The stream retries by itself: an interruption, not a failure.
      ['interrupted'],
    ]);
    assert.equal(connection.send({ type: 'response' }), false);
    connection.close();
    assert.equal(stream.readyState, EventSource.CLOSED);
  });

  test('fails when it never got through or gives up; closes itself when the session ends', (t) => {
    const EventSource = fakeEventSource();
    stubGlobals(t, { EventSource });
    const never = callbacks();
    openEventStream({ url: 'http://relay.test/stream' }, never.on);
    EventSource.made[0].fire('error');
    assert.deepEqual(never.heard, [['interrupted'], ['failed', false]]);
    assert.equal(EventSource.made[0].readyState, EventSource.CLOSED);

    const gaveUp = callbacks();
    openEventStream({ url: 'http://relay.test/stream' }, gaveUp.on);
    EventSource.made[1].fire('connected', {});
    EventSource.made[1].readyState = EventSource.CLOSED;
    EventSource.made[1].fire('error');
    assert.deepEqual(gaveUp.heard.slice(-2), [['interrupted'], ['failed', true]]);

    const ended = callbacks({ ended: () => true });
    openEventStream({ url: 'http://relay.test/stream' }, ended.on);
    EventSource.made[2].fire('connected', {});
    EventSource.made[2].fire('error', { error: ErrorCode.REPLACED, message: 'Replaced.' });
    assert.deepEqual(ended.heard.slice(-1), [['ended', { error: ErrorCode.REPLACED, message: 'Replaced.', type: 'error' }]]);
    assert.equal(EventSource.made[2].readyState, EventSource.CLOSED);
  });
});

describe('openPolling', () => {
  // A fetch that answers each poll with the next of `answers` ({status, items}, or an Error).
  const fakeFetch = (answers) => {
    const asked = [];
    const fetch = async (url, init) => {
      asked.push([url, init]);
      const answer = answers.shift();
      if (answer instanceof Error) throw answer;
      return { status: answer.status, ok: answer.status < 300, json: async () => answer.items };
    };
    return { fetch, asked };
  };

  test('opens on the first poll that works, reports its items, polls again, and stops when closed', async (t) => {
    const timers = fakeTimers(t);
    const call = { type: 'tool-request', requestId: 'r2', args: {} };
    const { fetch, asked } = fakeFetch([
      { status: 200, items: [{ type: 'cancel', requestId: 'r1' }, { type: 'approval-request', callerId: 'c1' }, call] },
      { status: 200, items: [] },
    ]);
    stubGlobals(t, { fetch });
    const headers = { authorization: 'Bearer t0k' };
    const { on, heard } = callbacks({ runningIds: () => ['r 1'], approval: (item) => item.type === 'approval-request' });
    const connection = openPolling({ url: 'http://relay.test/api/sessions/ABCD1234/request', headers }, on);
    await settle();
    assert.deepEqual(asked, [['http://relay.test/api/sessions/ABCD1234/request?running=r%201', { headers }]]);
    assert.deepEqual(heard, [
      ['runningIds'],
      ['ended', { type: 'error', status: 200, message: 'The session has ended.' }],
      ['opened'],
      ['putManifest'],
      ['cancel', 'r1'],
      ['approval', { type: 'approval-request', callerId: 'c1' }],
      ['approval', call],
      ['call', call],
      ['asked', 'c1'],
    ]);
    assert.deepEqual([...timers.timers.values()].map(({ ms }) => ms), [1000]);
    heard.length = 0;
    timers.next();
    await settle();
    // A later poll that works sends the unacknowledged answers again; it is no new connection.
    assert.deepEqual(heard, [['runningIds'], ['ended', { type: 'error', status: 200, message: 'The session has ended.' }], ['resend'], ['asked', null]]);
    assert.equal(connection.send({ type: 'response' }), false);
    connection.close();
    assert.equal(timers.timers.size, 0);
  });

  test('a poll that fails is a failure (that worked if an earlier poll did); the end stops it', async (t) => {
    const timers = fakeTimers(t);
    const { fetch } = fakeFetch([{ status: 200, items: [] }, { status: 503, items: [] }, new TypeError('offline'), { status: 404, items: [] }]);
    stubGlobals(t, { fetch });
    const worked = callbacks();
    openPolling({ url: 'http://relay.test/request', headers: {} }, worked.on);
    await settle();
    timers.next();
    await settle();
    assert.deepEqual(worked.heard.at(-1), ['failed', true]);

    const never = callbacks();
    openPolling({ url: 'http://relay.test/request', headers: {} }, never.on);
    await settle();
    assert.deepEqual(never.heard, [['runningIds'], ['failed', false]]);

    const ended = callbacks({ ended: (frame) => frame.status === 404 });
    openPolling({ url: 'http://relay.test/request', headers: {} }, ended.on);
    await settle();
    assert.deepEqual(ended.heard, [['runningIds'], ['ended', { type: 'error', status: 404, message: 'The session has ended.' }]]);
    assert.equal(timers.timers.size, 0);
  });
});

describe('Transport: the connection it keeps', () => {
  const transport = () => new Transport('https://relay.test', { code: 'ABCD1234', token: 't 0k' }, () => [{ id: 'x' }], async () => ({}));

  test('answers go over the open socket, else over HTTP; stop() closes the socket', async (t) => {
    fakeTimers(t);
    const WebSocket = fakeWebSocket();
    const posted = [];
    const fetch = async (url, init) => {
      posted.push([url, init.method, JSON.parse(init.body)]);
      return { status: 200, ok: true, json: async () => ({}) };
    };
    stubGlobals(t, { WebSocket, fetch });
    const tab = transport();
    tab.start();
    const [socket] = WebSocket.made;
    assert.equal(socket.url, 'wss://relay.test/api/sessions/ABCD1234/ws?token=t%200k');
    await tab.send({ requestId: 'r1', success: true });
    assert.deepEqual(posted, [['https://relay.test/api/sessions/ABCD1234/response', 'POST', { requestId: 'r1', success: true }]]);
    socket.open();
    await tab.send({ requestId: 'r2', success: true });
    assert.deepEqual(socket.sent, [{ type: 'response', requestId: 'r2', success: true }]);
    // Not acknowledged yet: it goes again with the next welcome, before the registration.
    socket.receive({ type: 'welcome', expiresAt: 5 });
    assert.deepEqual(socket.sent.slice(1), [
      { type: 'response', requestId: 'r2', success: true },
      { type: 'register', tools: [{ id: 'x' }], approves: false },
    ]);
    tab.stop();
    assert.deepEqual(socket.closedWith, [1000, 'stopped']);
    assert.equal(tab.connection, null);
  });

  test('a socket that cannot be made is not kept; two such failures fall back to SSE', (t) => {
    const timers = fakeTimers(t);
    const EventSource = fakeEventSource();
    stubGlobals(t, { WebSocket: fakeWebSocket({ fails: true }), EventSource });
    const tab = transport();
    const fallbacks = [];
    tab.addEventListener('fallback', (event) => fallbacks.push(event.detail));
    tab.start();
    assert.equal(tab.connection, null);
    timers.next();
    assert.deepEqual(fallbacks, [{ transport: 'sse' }]);
    assert.equal(tab.connection, null);
    timers.next();
    assert.equal(EventSource.made[0].url, 'https://relay.test/api/sessions/ABCD1234/stream?token=t%200k');
    assert.notEqual(tab.connection, null);
    tab.stop();
    assert.equal(EventSource.made[0].readyState, EventSource.CLOSED);
  });
});

// ---- pairing-text.js: the words of <toolrelay-pairing> ----

describe('duration', () => {
  const cases = [
    [0, '00:00'],
    [999, '00:00'],
    [1000, '00:01'],
    [59_999, '00:59'],
    [61_000, '01:01'],
    [3_599_999, '59:59'],
    [3_600_000, '1:00:00'],
    [36_062_000, '10:01:02'],
    [24 * 3_600_000, '24:00:00'],
  ];
  for (const [ms, text] of cases) {
    test(`${ms} ms is ${text}`, () => assert.equal(duration(ms), text));
  }
});

describe('lifetime', () => {
  const created = Date.UTC(2025, 0, 1, 12);
  const at = (ms) => new Date(created + ms).toISOString();
  const cases = [
    ['24 hours', { createdAt: created, maxExpiresAt: at(24 * 3_600_000) }, '24 h'],
    ['an hour', { createdAt: created, maxExpiresAt: at(3_600_000) }, '1 h'],
    ['30 minutes', { createdAt: created, maxExpiresAt: at(30 * 60_000) }, '30 min'],
    ['10 seconds is at least a minute', { createdAt: created, maxExpiresAt: at(10_000) }, '1 min'],
    ['just under an hour rounds to 60 min', { createdAt: created, maxExpiresAt: at(3_599_999) }, '60 min'],
    ['hours round to the nearest', { createdAt: created, maxExpiresAt: at(90 * 60_000) }, '2 h'],
    ['no maximum: 24 h', { createdAt: created, maxExpiresAt: null }, '24 h'],
    ['a maximum that is no time: 24 h', { createdAt: created, maxExpiresAt: 'soon' }, '24 h'],
    ['a maximum before the start: 24 h', { createdAt: created, maxExpiresAt: at(-60_000) }, '24 h'],
  ];
  for (const [what, session, text] of cases) {
    test(what, () => assert.equal(lifetime(session), text));
  }
  test('without createdAt it counts from now', () => {
    assert.equal(lifetime({ maxExpiresAt: new Date(Date.now() + 5 * 3_600_000 + 60_000).toISOString() }), '5 h');
    assert.equal(lifetime({ maxExpiresAt: new Date(Date.now() + 20 * 60_000 + 10_000).toISOString() }), '20 min');
  });
});

describe('summarize', () => {
  const cases = [
    ['the name', 'addItem', { name: 'milk' }, 'addItem · milk'],
    ['a name before a title', 'f', { name: 'n', title: 't', text: 'x' }, 'f · n'],
    ['a title when there is no name', 'f', { title: 't', text: 'x' }, 'f · t'],
    ['the text when there is neither', 'f', { text: 'x' }, 'f · x'],
    ['a number names too', 'setRow', { name: 0 }, 'setRow · 0'],
    ['an object does not name', 'f', { name: { a: 1 }, title: 't' }, 'f · t'],
    ['one item', 'addItems', { items: ['a'] }, 'addItems · 1 item'],
    ['three items', 'addItems', { items: [1, 2, 3] }, 'addItems · 3 items'],
    ['no items', 'addItems', { items: [] }, 'addItems · 0 items'],
    ['a name and items', 'addItems', { name: 'groceries', items: [1, 2] }, 'addItems · groceries · 2 items'],
    ['items that are no list', 'f', { items: 'abc' }, 'f'],
    ['nothing to name', 'clear', {}, 'clear'],
    ['no arguments', 'clear', undefined, 'clear'],
    ['arguments that are no object', 'clear', 'x', 'clear'],
  ];
  for (const [what, name, args, text] of cases) {
    test(what, () => assert.equal(summarize(name, args), text));
  }
});

describe('shortLabel', () => {
  test('the lengths are 60 and 100', () => {
    assert.equal(LABEL_SHOWN, 60);
    assert.equal(LABEL_LISTED, 100);
  });
  const cases = [
    ['a short label as it is', 'Claude', undefined, 'Claude'],
    ['white space collapsed and trimmed', '  Claude \n\t Desktop  ', undefined, 'Claude Desktop'],
    ['no label', undefined, undefined, 'an unnamed assistant'],
    ['null', null, undefined, 'an unnamed assistant'],
    ['only white space', ' \n ', undefined, 'an unnamed assistant'],
    ['a number', 42, undefined, '42'],
    ['exactly 60 characters stay', 'a'.repeat(60), undefined, 'a'.repeat(60)],
    ['61 characters are cut to 60 with …', 'b'.repeat(61), undefined, `${'b'.repeat(59)}…`],
    ['the length given', 'abcdefghij', 5, 'abcd…'],
    ['the listed length', 'c'.repeat(150), LABEL_LISTED, `${'c'.repeat(99)}…`],
  ];
  for (const [what, text, most, label] of cases) {
    test(what, () => assert.equal(shortLabel(text, most), label));
  }
});

describe('approvalText', () => {
  test('a caller, in the default page', () => {
    assert.equal(approvalText({ label: 'Claude', via: 'MCP' }), 'An assistant wants to use this page (says it is Claude, via MCP).');
  });
  test('the page named', () => {
    assert.equal(approvalText({ label: 'Claude', via: 'MCP' }, 'your CODAP document'), 'An assistant wants to use your CODAP document (says it is Claude, via MCP).');
  });
  test('a caller without a label', () => {
    assert.equal(approvalText({ via: 'HTTP' }), 'An assistant wants to use this page (says it is an unnamed assistant, via HTTP).');
  });
  test('a long label is cut to 60 characters', () => {
    assert.equal(approvalText({ label: 'x'.repeat(80), via: 'MCP' }), `An assistant wants to use this page (says it is ${'x'.repeat(59)}…, via MCP).`);
  });
  test('a caller known only by its address warns that everyone there is allowed', () => {
    assert.equal(
      approvalText({ label: 'agent', via: 'HTTP', sharedAddress: true, address: '203.0.113.7' }, 'the list'),
      'An assistant wants to use the list (says it is agent, via HTTP) — known only by its network address: allowing it allows everyone at 203.0.113.7.',
    );
  });
});

describe('clock', () => {
  // Times made in the local time zone, so the hours are the same wherever this runs; the
  // separator is the locale's.
  const local = (h, m) => new Date(2025, 5, 15, h, m, 42).toISOString();
  const cases = [
    ['a morning time, two digits each', local(7, 5), /^07\D05$/],
    ['an evening time, 24-hour', local(23, 59), /^23\D59$/],
    ['midnight is 00', local(0, 0), /^00\D00$/],
  ];
  for (const [what, iso, pattern] of cases) {
    test(what, () => assert.match(clock(iso), pattern));
  }
  for (const [what, value] of [
    ['undefined', undefined],
    ['null', null],
    ['not a time', 'yesterday'],
    ['an empty string', ''],
  ]) {
    test(`no time: ${what}`, () => assert.equal(clock(value), ''));
  }
});

describe('reach', () => {
  const cases = [
    // This computer.
    ['http://localhost:8080', 'this-computer'],
    ['https://LOCALHOST', 'this-computer'],
    ['http://relay.localhost:8080', 'this-computer'],
    ['http://127.0.0.1:8080', 'this-computer'],
    ['http://127.1.2.3', 'this-computer'],
    ['http://[::1]:8080', 'this-computer'],
    ['not a url', 'this-computer'],
    ['', 'this-computer'],
    [null, 'this-computer'],
    // This network.
    ['http://10.1.2.3:8080', 'this-network'],
    ['https://192.168.0.5', 'this-network'],
    ['http://172.16.0.1', 'this-network'],
    ['http://172.31.255.1', 'this-network'],
    ['http://169.254.1.1', 'this-network'],
    ['http://printer.local', 'this-network'],
    ['https://relay.corp.internal', 'this-network'],
    ['http://[fd12:3456::1]', 'this-network'],
    ['http://[fc00::1]', 'this-network'],
    ['http://[fe80::1]', 'this-network'],
    // Beyond: public over HTTPS, else plain http.
    ['http://172.15.0.1', 'not-https'],
    ['http://172.32.0.1', 'not-https'],
    ['http://relay.example.org', 'not-https'],
    ['https://relay.example.org', 'public'],
    ['https://relay.example.org:8443/base', 'public'],
    ['https://203.0.113.7', 'public'],
    ['https://[2001:db8::1]', 'public'],
    ['https://localhost.example.org', 'public'],
  ];
  for (const [base, where] of cases) {
    test(`${JSON.stringify(base)} → ${where}`, () => assert.equal(reach(base), where));
  }

  test('every reach has its words; only the public one needs no notice', () => {
    const reaches = [...new Set(cases.map(([, where]) => where))].sort();
    assert.deepEqual(Object.keys(REACH).sort(), reaches);
    for (const [where, words] of Object.entries(REACH)) {
      assert.deepEqual(Object.keys(words).sort(), ['agent', 'connector', 'mcp', 'notice'], where);
      for (const key of ['agent', 'connector', 'mcp']) assert.ok(words[key].length > 0, `${where}.${key}`);
      assert.equal(words.notice === '', where === 'public', `${where}.notice`);
    }
  });
});

describe('escape', () => {
  const cases = [
    ['plain text stays', 'AI assistant', 'AI assistant'],
    ['markup', '<b>"Tom" & Jerry</b>', '&lt;b&gt;&quot;Tom&quot; &amp; Jerry&lt;/b&gt;'],
    ['an entity is escaped again', '&amp;', '&amp;amp;'],
    ["a single quote is left (the markup's attributes are double-quoted)", "it's", "it's"],
    ['a number', 42, '42'],
    ['null', null, 'null'],
  ];
  for (const [what, text, html] of cases) {
    test(what, () => assert.equal(escape(text), html));
  }
});

// ---- result.js: what a tool answers with ----

// A PNG's first 24 bytes (signature, IHDR's length, name, width and height) and a few more, as
// base64: enough for a header to be read, not an image to decode.
function pngHead(width, height) {
  const bytes = new Uint8Array(33);
  bytes.set([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52]);
  const view = new DataView(bytes.buffer);
  view.setUint32(16, width);
  view.setUint32(20, height);
  bytes.set([8, 6, 0, 0, 0], 24);
  return bytes;
}

describe('ToolResult: the items', () => {
  test('text, and a value that is no string as its text', () => {
    assert.deepEqual(ToolResult.text('hello').content, [{ type: 'text', text: 'hello' }]);
    assert.deepEqual(ToolResult.text(42).content, [{ type: 'text', text: '42' }]);
  });

  test('an image from a data: URI takes its type from it, and the data without the prefix', () => {
    const { content } = ToolResult.image('data:image/PNG;base64,iVBORw0KGgo=');
    assert.deepEqual(content, [{ type: 'image', data: 'iVBORw0KGgo=', mimeType: 'image/png' }]);
  });

  test('an image from base64 or bytes needs its type', () => {
    assert.deepEqual(ToolResult.image('R0lGODlh', 'image/gif').content, [{ type: 'image', data: 'R0lGODlh', mimeType: 'image/gif' }]);
    const bytes = new Uint8Array([0xff, 0xd8, 0xff, 0xe0]);
    assert.deepEqual(ToolResult.image(bytes, 'image/jpeg').content[0].data, Buffer.from(bytes).toString('base64'));
    assert.deepEqual(ToolResult.image(bytes.buffer, 'image/webp').content[0].mimeType, 'image/webp');
    assert.throws(() => ToolResult.image('R0lGODlh'), { name: 'TypeError', message: 'An image needs a mimeType.' });
  });

  test('the image types are PNG, JPEG, WebP and GIF; an SVG is told to become a PNG', () => {
    assert.deepEqual(IMAGE_TYPES, ['image/png', 'image/jpeg', 'image/webp', 'image/gif']);
    assert.throws(() => ToolResult.image('PHN2Zz4=', 'image/svg+xml'), /not image\/svg\+xml: draw the SVG on a canvas and send the PNG/);
    assert.throws(() => ToolResult.image('data:image/bmp;base64,Qk0=', undefined), /is image\/png, image\/jpeg, image\/webp, image\/gif, not image\/bmp\./);
  });

  test('data that is not base64 is refused, a percent-encoded data: URI too', () => {
    assert.throws(() => ToolResult.image('not base64!', 'image/png'), { message: 'An image data is not base64.' });
    assert.throws(() => ToolResult.image('abc', 'image/png'), { message: 'An image data is not base64.' });
    assert.throws(() => ToolResult.image('data:image/svg+xml,%3Csvg%3E'), { message: 'Only base64 data: URIs can be sent (…;base64,…).' });
    assert.throws(() => ToolResult.image({}), /base64 string, a data: URI or bytes, not object/);
    // Line breaks in base64 (as some encoders wrap it) are not part of the data.
    assert.equal(ToolResult.image('iVBO\nRw0K\r\nGgo=', 'image/png').content[0].data, 'iVBORw0KGgo=');
  });

  test('a sound is audio/…', () => {
    assert.deepEqual(ToolResult.audio('data:audio/wav;base64,UklGRg==').content, [{ type: 'audio', data: 'UklGRg==', mimeType: 'audio/wav' }]);
    assert.throws(() => ToolResult.audio('UklGRg==', 'image/png'), { message: 'A sound is audio/…, not image/png.' });
  });

  test('a resource link has a uri and a name, and what else is given', () => {
    assert.deepEqual(ToolResult.resourceLink({ uri: 'file:///a.csv', name: 'a.csv', mimeType: 'text/csv', size: 12 }).content, [
      { type: 'resource_link', uri: 'file:///a.csv', name: 'a.csv', mimeType: 'text/csv', size: 12 },
    ]);
    assert.throws(() => ToolResult.resourceLink({ uri: 'file:///a.csv' }), { message: 'A resource link needs a name.' });
    assert.throws(() => ToolResult.resourceLink({ name: 'a' }), { message: 'A resource link needs a uri.' });
  });

  test('an embedded resource has text or a blob, not both', () => {
    assert.deepEqual(ToolResult.resource({ uri: 'mem://notes', text: 'hi' }).content, [{ type: 'resource', resource: { uri: 'mem://notes', text: 'hi' } }]);
    assert.deepEqual(ToolResult.resource({ uri: 'mem://b', blob: new Uint8Array([1, 2, 3]) }).content, [
      { type: 'resource', resource: { uri: 'mem://b', mimeType: 'application/octet-stream', blob: 'AQID' } },
    ]);
    assert.throws(() => ToolResult.resource({ uri: 'mem://b', text: 'a', blob: 'AQID' }), { message: 'A resource has either text or blob.' });
    assert.throws(() => ToolResult.resource({ uri: 'mem://b' }), { message: 'A resource has either text or blob.' });
  });

  test('of() flattens results into their items; and() adds after; with() sets the rest', () => {
    const image = ToolResult.image('iVBORw0KGgo=', 'image/png');
    const both = ToolResult.of({ content: [image, { type: 'text', text: 'a graph' }], structuredContent: { n: 1 } });
    assert.deepEqual(both.content.map((item) => item.type), ['image', 'text']);
    assert.deepEqual(both.structuredContent, { n: 1 });
    const more = image.and(ToolResult.text('one'), { type: 'text', text: 'two' }).with({ structuredContent: { n: 2 }, result: [1] });
    assert.deepEqual(more.content.map((item) => item.text ?? item.type), ['image', 'one', 'two']);
    assert.deepEqual([more.structuredContent, more.result], [{ n: 2 }, [1]]);
    assert.deepEqual(image.content.length, 1, 'and() leaves the result it was called on as it was');
    assert.throws(() => ToolResult.of({ content: ['text'] }), /A content item is an object with a type, not "text"/);
    assert.throws(() => ToolResult.of({ content: {} }), { message: 'content is an array of content items.' });
    assert.throws(() => ToolResult.of({ structuredContent: [1] }), { message: 'structuredContent is a JSON object.' });
  });

  test('splitDataUri and toBase64', () => {
    assert.equal(splitDataUri('https://example.org/a.png'), null);
    assert.deepEqual(splitDataUri('data:;base64,QQ=='), { mimeType: 'text/plain', data: 'QQ==' });
    assert.throws(() => splitDataUri('data:image/png;base64'), /needs a comma/);
    const bytes = Uint8Array.from({ length: 70000 }, (_, i) => i % 256);
    assert.equal(toBase64(bytes), Buffer.from(bytes).toString('base64'), 'long arrays go in pieces');
  });
});

describe('answerOf: the answer frame', () => {
  test('a plain value is the result, as before; nothing is null', () => {
    assert.deepEqual(answerOf('r1', { a: 1 }), { requestId: 'r1', success: true, result: { a: 1 } });
    assert.deepEqual(answerOf('r1', undefined), { requestId: 'r1', success: true, result: null });
    const cycle = {};
    cycle.self = cycle;
    assert.throws(() => answerOf('r1', cycle), TypeError);
    assert.throws(() => answerOf('r1', 1n), TypeError);
  });

  test('a ToolResult is content, with structuredContent and result only when it has them', () => {
    const image = ToolResult.image('iVBORw0KGgo=', 'image/png').and(ToolResult.text('a graph'));
    assert.deepEqual(answerOf('r2', image), {
      requestId: 'r2',
      success: true,
      content: [{ type: 'image', data: 'iVBORw0KGgo=', mimeType: 'image/png' }, { type: 'text', text: 'a graph' }],
    });
    assert.deepEqual(answerOf('r3', ToolResult.text('x').with({ structuredContent: { k: 1 }, result: 0 })), {
      requestId: 'r3',
      success: true,
      content: [{ type: 'text', text: 'x' }],
      structuredContent: { k: 1 },
      result: 0,
    });
  });

  test('isError fails the call with its content, the first text its message', () => {
    const answer = answerOf('r4', ToolResult.of({ content: [ToolResult.image('iVBORw0KGgo=', 'image/png'), ToolResult.text('the axis is empty')], isError: true }));
    assert.equal(answer.success, false);
    assert.deepEqual(answer.error, { code: 'tool_error', message: 'the axis is empty' });
    assert.equal(answer.content.length, 2);
    assert.deepEqual(answerOf('r5', ToolResult.of({ isError: true })).error, { code: 'tool_error', message: 'The tool failed.' });
    assert.deepEqual(answerOf('r6', ToolResult.error('no such graph')), {
      requestId: 'r6',
      success: false,
      content: [{ type: 'text', text: 'no such graph' }],
      error: { code: 'tool_error', message: 'no such graph' },
    });
  });

  test("an MCP tool result (WebMCP's) passes through as content; anything else is no such result", () => {
    for (const value of [null, 'text', [1], { content: 'x' }, { result: 1 }]) assert.equal(fromMcpResult(value), null, JSON.stringify(value));
    const mcp = { content: [{ type: 'text', text: '3 items' }], structuredContent: { count: 3 } };
    assert.deepEqual(answerOf('w1', fromMcpResult(mcp)), { requestId: 'w1', success: true, ...mcp });
    const failed = answerOf('w2', fromMcpResult({ content: [{ type: 'text', text: 'out of stock' }], isError: true }));
    assert.deepEqual([failed.success, failed.error.message, failed.content.length], [false, 'out of stock', 1]);
    assert.throws(() => fromMcpResult({ content: [7] }), /A content item is an object with a type/);
  });
});

// ---- progress.js: what a running call reports ----

describe('progress and log frames', () => {
  test('a progress frame: total and message only when given', () => {
    assert.deepEqual(progressFrame('r1', 40, 100, '40 of 100 cases'), { type: 'progress', requestId: 'r1', progress: 40, total: 100, message: '40 of 100 cases' });
    assert.deepEqual(progressFrame('r1', 0.5), { type: 'progress', requestId: 'r1', progress: 0.5 });
    for (const bad of [NaN, Infinity, '3', undefined]) assert.throws(() => progressFrame('r1', bad), TypeError, String(bad));
    assert.throws(() => progressFrame('r1', 1, 'ten'), { message: 'total is a finite number, not ten.' });
  });

  test("a log frame: MCP's levels only, its data as JSON", () => {
    assert.deepEqual(LOG_LEVELS, ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency']);
    assert.deepEqual(logFrame('warning', { rows: 3 }, 'import', 'r1'), { type: 'log', level: 'warning', data: { rows: 3 }, logger: 'import', requestId: 'r1' });
    assert.deepEqual(logFrame('info', undefined), { type: 'log', level: 'info', data: null });
    assert.throws(() => logFrame('warn', 'x'), /A log level is one of debug, .*, not warn\./);
  });
});

/** A clock and timers the test moves by hand. */
function manualClock() {
  let now = 0;
  const timers = [];
  return {
    now: () => now,
    setTimer: (run, ms) => {
      const timer = { at: now + ms, run };
      timers.push(timer);
      return timer;
    },
    clearTimer: (timer) => timers.splice(timers.indexOf(timer), 1),
    pending: () => timers.length,
    /** Moves to `to` ms, running the timers due on the way. */
    advance(to) {
      for (;;) {
        timers.sort((a, b) => a.at - b.at);
        if (!timers.length || timers[0].at > to) break;
        const timer = timers.shift();
        now = timer.at;
        timer.run();
      }
      now = to;
    },
  };
}

describe('ProgressGate', () => {
  const gate = () => {
    const clock = manualClock();
    const sent = [];
    const progress = new ProgressGate((frame) => sent.push([clock.now(), frame.progress]), clock);
    const offer = (value) => progress.offer({ type: 'progress', requestId: 'r1', progress: value });
    return { clock, sent, progress, offer };
  };

  test('the first goes at once; what comes within 250 ms is merged, the last sent when they are over', () => {
    const { clock, sent, offer } = gate();
    assert.equal(PROGRESS_INTERVAL_MS, 250);
    assert.equal(offer(1), true);
    clock.advance(10);
    offer(2);
    clock.advance(100);
    offer(3);
    assert.deepEqual(sent, [[0, 1]]);
    clock.advance(249);
    assert.deepEqual(sent, [[0, 1]]);
    clock.advance(250);
    assert.deepEqual(sent, [[0, 1], [250, 3]]);
    // A quiet while later, the next goes at once again.
    clock.advance(900);
    offer(4);
    assert.deepEqual(sent.at(-1), [900, 4]);
  });

  test('a value not above the highest given is dropped, sent or waiting', () => {
    const { clock, sent, offer } = gate();
    offer(10);
    assert.equal(offer(10), false, 'equal to the last sent');
    assert.equal(offer(5), false, 'below the last sent');
    assert.equal(offer(30), true);
    assert.equal(offer(20), false, 'below the one waiting');
    clock.advance(1000);
    assert.deepEqual(sent.map(([, value]) => value), [10, 30]);
  });

  test('a flood is at most 4 frames a second, in order, ending with the last value', () => {
    const { clock, sent, offer } = gate();
    for (let at = 0; at < 1000; at += 1) {
      clock.advance(at);
      offer(at + 1);
    }
    const inTheSecond = sent.filter(([when]) => when < 1000);
    assert.equal(inTheSecond.length, 4, JSON.stringify(sent));
    clock.advance(5000);
    assert.deepEqual(sent.at(-1)[1], 1000, 'the last value is sent once its interval is over');
    const gaps = sent.slice(1).map(([when], i) => when - sent[i][0]);
    assert.ok(gaps.every((gap) => gap >= 250), `frames are 250 ms apart at least: ${gaps}`);
    assert.ok(sent.every(([, value], i) => i === 0 || value > sent[i - 1][1]), 'in increasing order');
  });

  test("its own timers call the browser's as functions (called as a method they throw: Illegal invocation)", (t) => {
    const { setTimeout: realSet, clearTimeout: realClear } = globalThis;
    const strict = (real) => function (...args) {
      if (this !== undefined && this !== globalThis) throw new TypeError('Illegal invocation');
      return real(...args);
    };
    stubGlobals(t, { setTimeout: strict(realSet), clearTimeout: strict(realClear) });
    const sent = [];
    const progress = new ProgressGate((frame) => sent.push(frame.progress));
    progress.offer({ progress: 1 });
    assert.equal(progress.offer({ progress: 2 }), true, 'merged: waits on a timer');
    progress.close();
    assert.deepEqual(sent, [1]);
  });

  test('close() drops what waits and sends nothing more', () => {
    const { clock, sent, progress, offer } = gate();
    offer(1);
    offer(2);
    assert.equal(clock.pending(), 1);
    progress.close();
    assert.equal(clock.pending(), 0);
    clock.advance(1000);
    assert.equal(offer(3), false);
    assert.deepEqual(sent, [[0, 1]]);
  });
});

describe('callContext', () => {
  test("progress and log go out as the call's frames until it is closed", () => {
    const clock = manualClock();
    const sent = [];
    const context = callContext('r9', (frame) => sent.push(frame), clock);
    assert.equal(context.progress(1, 4, 'one'), true);
    assert.equal(context.log('info', 'reading'), true);
    assert.deepEqual(sent, [
      { type: 'progress', requestId: 'r9', progress: 1, total: 4, message: 'one' },
      { type: 'log', level: 'info', data: 'reading', requestId: 'r9' },
    ]);
    context.close();
    assert.equal(context.progress(2, 4), false);
    assert.equal(context.log('info', 'late'), false);
    assert.equal(sent.length, 2);
    assert.throws(() => context.log('loud', 'x'), TypeError, 'a wrong level is a mistake to see, even late');
  });
});

// ---- connection.js: a call run, answered with content and reporting on the way ----

describe('Connection.run', () => {
  const connection = (t, tools) => {
    stubGlobals(t, { addEventListener: () => {} });
    return new Connection({ relay: 'https://relay.test', storageKey: 'test:', tools });
  };
  const call = (functionName, args = {}) => ({ requestId: `r-${functionName}`, toolId: null, functionName, args });

  test('a ToolResult answers with content; progress and log go through notify while it runs', async (t) => {
    const relay = connection(t, [
      {
        name: 'draw',
        inputSchema: { type: 'object' },
        execute: async (args, { progress, log }) => {
          progress(1, 2, 'half');
          log('notice', { drawn: 1 }, 'draw');
          return ToolResult.image('iVBORw0KGgo=', 'image/png').and(ToolResult.text('a dot'));
        },
      },
    ]);
    const frames = [];
    const finished = [];
    relay.addEventListener('call-finished', (event) => finished.push(event.detail));
    const answer = await relay.run(call('draw'), new AbortController().signal, (frame) => frames.push(frame));
    assert.deepEqual(answer, {
      requestId: 'r-draw',
      success: true,
      content: [{ type: 'image', data: 'iVBORw0KGgo=', mimeType: 'image/png' }, { type: 'text', text: 'a dot' }],
    });
    assert.deepEqual(frames, [
      { type: 'progress', requestId: 'r-draw', progress: 1, total: 2, message: 'half' },
      { type: 'log', level: 'notice', data: { drawn: 1 }, logger: 'draw', requestId: 'r-draw' },
    ]);
    assert.equal(finished[0].content.length, 2, 'call-finished carries the content');
  });

  test('a plain value is the result; a tool that reports after it answered reports nothing', async (t) => {
    let late;
    const relay = connection(t, [{ name: 'count', inputSchema: { type: 'object' }, execute: (args, context) => ((late = context), 3) }]);
    const frames = [];
    assert.deepEqual(await relay.run(call('count'), undefined, (frame) => frames.push(frame)), { requestId: 'r-count', success: true, result: 3 });
    assert.equal(late.progress(1), false);
    assert.equal(late.log('info', 'late'), false);
    assert.deepEqual(frames, []);
  });

  test("a call the relay sends runs with the transport's notify: its progress goes over the socket before its answer", async (t) => {
    fakeTimers(t);
    const WebSocket = fakeWebSocket();
    stubGlobals(t, { WebSocket });
    const relay = connection(t, [
      { name: 'slow', inputSchema: { type: 'object' }, execute: async (args, { progress }) => (progress(1, 2), ToolResult.text('done')) },
    ]);
    relay.startTransport({ code: 'ABCD1234', token: 't0k' });
    const [socket] = WebSocket.made;
    socket.open();
    socket.receive({ type: 'tool-request', requestId: 'w1', toolId: null, functionName: 'slow', args: {} });
    await settle();
    assert.deepEqual(socket.sent, [
      { type: 'progress', requestId: 'w1', progress: 1, total: 2 },
      { type: 'response', requestId: 'w1', success: true, content: [{ type: 'text', text: 'done' }] },
    ]);
    relay.stopTransport();
  });

  test('a bad content item or a bad progress fails the call with a reason', async (t) => {
    const relay = connection(t, [
      { name: 'svg', inputSchema: { type: 'object' }, execute: () => ToolResult.image('PHN2Zz4=', 'image/svg+xml') },
      { name: 'nan', inputSchema: { type: 'object' }, execute: (args, { progress }) => progress(NaN) },
    ]);
    const svg = await relay.run(call('svg'));
    assert.equal(svg.success, false);
    assert.match(svg.error.message, /not image\/svg\+xml/);
    assert.deepEqual((await relay.run(call('nan'))).error, { code: 'tool_error', message: 'progress is a finite number, not NaN.' });
  });
});

describe('Transport.notify: progress and log frames on their way', () => {
  const transport = () => new Transport('https://relay.test', { code: 'ABCD1234', token: 't0k' }, () => [], async () => ({}));
  const frame = { type: 'progress', requestId: 'r1', progress: 1 };

  test('over the open socket; else posted where answers go (SSE, polling that works); else dropped', async (t) => {
    fakeTimers(t);
    const WebSocket = fakeWebSocket();
    const EventSource = fakeEventSource();
    const posted = [];
    const fetch = async (url, init) => {
      posted.push([url, init.method, init.headers.authorization, JSON.parse(init.body)]);
      return { status: 200, ok: true, json: async () => ({}) };
    };
    stubGlobals(t, { WebSocket, EventSource, fetch });
    const tab = transport();
    tab.start();
    await tab.notify(frame);
    assert.deepEqual(posted, [], 'a socket not open yet: dropped, not posted');
    const [socket] = WebSocket.made;
    socket.open();
    await tab.notify(frame);
    assert.deepEqual(socket.sent, [frame]);
    tab.stop();
    const sse = transport();
    sse.kind = 'sse';
    sse.start();
    await sse.notify(frame);
    assert.deepEqual(posted, [['https://relay.test/api/sessions/ABCD1234/response', 'POST', 'Bearer t0k', frame]]);
    sse.stop();
    await sse.notify(frame);
    assert.equal(posted.length, 1, 'a stopped transport sends nothing');
    const polling = transport();
    polling.polling = true;
    await polling.notify({ type: 'log', level: 'info', data: 'x' });
    assert.deepEqual(posted.at(-1)[3], { type: 'log', level: 'info', data: 'x' });
  });

  test('a call run by the Transport is given notify, so its frames go out over the connection', async (t) => {
    fakeTimers(t);
    const WebSocket = fakeWebSocket();
    stubGlobals(t, { WebSocket });
    const tab = new Transport('https://relay.test', { code: 'ABCD1234', token: 't0k' }, () => [], async (call, signal, notify) => {
      notify({ type: 'progress', requestId: call.requestId, progress: 1 });
      return { requestId: call.requestId, success: true, result: 1 };
    });
    tab.start();
    const [socket] = WebSocket.made;
    socket.open();
    tab.handle({ requestId: 'c1', functionName: 'f', args: {} });
    await settle();
    assert.deepEqual(socket.sent, [
      { type: 'progress', requestId: 'c1', progress: 1 },
      { type: 'response', requestId: 'c1', success: true, result: 1 },
    ]);
    tab.stop();
  });
});

// ---- the plugin: graph pictures (graph-image.js) and many items (tools.js) ----

describe('graph pictures', () => {
  test("a PNG's size from its header; anything else is no PNG", () => {
    assert.deepEqual(pngSize(pngHead(640, 480)), { width: 640, height: 480 });
    assert.deepEqual(pngSize(leadingBytes(toBase64(pngHead(1600, 2)), 24)), { width: 1600, height: 2 });
    const jpeg = pngHead(1, 1);
    jpeg[0] = 0xff;
    assert.equal(pngSize(jpeg), null);
    assert.equal(pngSize(pngHead(1, 1).subarray(0, 20)), null);
  });

  test('fitted: at most 1024 wide, aspect kept, never smaller than it was asked', () => {
    assert.equal(MAX_WIDTH, 1024);
    assert.deepEqual(fitted({ width: 640, height: 480 }), { width: 640, height: 480 });
    assert.deepEqual(fitted({ width: 1024, height: 10 }), { width: 1024, height: 10 });
    assert.deepEqual(fitted({ width: 1600, height: 500 }), { width: 1024, height: 320 });
    assert.deepEqual(fitted({ width: 3000, height: 1 }), { width: 1024, height: 1 });
  });

  test('a PNG at most 1024 wide goes as it is, read from its header (no canvas)', async () => {
    const data = toBase64(pngHead(640, 480));
    assert.deepEqual(await fittedPng(`data:image/png;base64,${data}`), { data, width: 640, height: 480, original: { width: 640, height: 480 } });
  });

  test('the sentence: plot, attributes, legend, cases, size', () => {
    const graph = { plotType: 'scatterPlot', xAttributeName: 'Age', yAttributeName: 'Height', title: 'Graph' };
    assert.equal(describeGraph(graph, { cases: 31, width: 640, height: 480 }), 'Scatter plot of Height against Age, 31 cases (PNG 640×480)');
    assert.equal(
      describeGraph({ ...graph, title: 'Class', legendAttributeName: 'Sex' }, { cases: 1, width: 1024, height: 320, original: { width: 1600, height: 500 } }),
      'Class: Scatter plot of Height against Age, coloured by Sex, 1 case (PNG 1024×320, scaled down from 1600×500)',
    );
    assert.equal(describeGraph({ plotType: 'dotPlot', yAttributeName: 'Height' }, { width: 2, height: 3 }), 'Dot plot of Height (PNG 2×3)');
    assert.equal(describeGraph(null, { width: 2, height: 3 }), 'Graph (PNG 2×3)', 'a CODAP that says nothing about the graph');
  });
});

/** The plugin's tools over a CODAP stand-in that answers `answer(request)` and records requests. */
function pluginTools(answer) {
  const sent = [];
  const codap = {
    async request(request) {
      sent.push(request);
      return Array.isArray(request) ? request.map(answer) : answer(request);
    },
  };
  const dispatcher = new Dispatcher();
  for (const tool of codapTools(codap)) dispatcher.register(tool.id, tool.description, tool.functions);
  return { dispatcher, sent };
}

describe('the plugin: many items, a graph picture, CODAP v3 refusals', () => {
  const items = (count) => Array.from({ length: count }, (_, i) => ({ n: i }));
  let nextId = 0;
  const created = (request) => ({ success: true, values: { itemIDs: request.values.map(() => (nextId += 1)), caseIDs: request.values.map(() => nextId + 1000) } });

  test(`${ITEMS_PER_REQUEST} items or fewer go in one request, without progress`, async () => {
    const { dispatcher, sent } = pluginTools(created);
    const frames = [];
    const result = await dispatcher.call(null, 'createItems', { dataContext: 'D', items: items(ITEMS_PER_REQUEST) }, { progress: (...args) => frames.push(args) });
    assert.equal(sent.length, 1);
    assert.equal(result.itemIDs.length, ITEMS_PER_REQUEST);
    assert.deepEqual(frames, []);
  });

  test('more go 500 a request, progress after each (created, all), the ids joined in order', async () => {
    const { dispatcher, sent } = pluginTools(created);
    const frames = [];
    const result = await dispatcher.call(null, 'createItems', { dataContext: 'D', items: items(1201) }, { progress: (...args) => frames.push(args) });
    assert.deepEqual(sent.map((request) => [request.resource, request.values.length]), [['dataContext[D].item', 500], ['dataContext[D].item', 500], ['dataContext[D].item', 201]]);
    assert.deepEqual(frames, [
      [500, 1201, '500 of 1201 items created'],
      [1000, 1201, '1000 of 1201 items created'],
      [1201, 1201, '1201 of 1201 items created'],
    ]);
    assert.equal(result.itemIDs.length, 1201);
    assert.equal(result.caseIDs.length, 1201);
    assert.ok(result.itemIDs.every((id, i) => i === 0 || id > result.itemIDs[i - 1]));
  });

  test('a refusal after some requests went says how many items are in the data set; a cancel stops between requests', async () => {
    let requests = 0;
    const { dispatcher } = pluginTools((request) => ((requests += 1) === 2 ? { success: false, values: { error: 'attribute not found: m' } } : created(request)));
    await assert.rejects(dispatcher.call(null, 'createItems', { dataContext: 'D', items: items(1500) }), {
      code: 'codap_error',
      message: 'Created the first 500 of 1500 items (they stay in D), then CODAP refused the next ones: attribute not found: m',
    });
    const first = pluginTools(() => ({ success: false, values: { error: 'dataContext not found: D' } }));
    await assert.rejects(first.dispatcher.call(null, 'createItems', { dataContext: 'D', items: items(600) }), { message: 'dataContext not found: D' });
    const controller = new AbortController();
    const stopped = pluginTools((request) => (controller.abort(), created(request)));
    await assert.rejects(stopped.dispatcher.call(null, 'createItems', { dataContext: 'D', items: items(1500) }, { signal: controller.signal }), { name: 'AbortError' });
    assert.equal(stopped.sent.length, 1);
  });

  test('getGraphImage: an image and its sentence, from the picture, the graph and its case count', async () => {
    const png = `data:image/png;base64,${toBase64(pngHead(640, 480))}`;
    const answers = {
      'dataDisplay[7]': { exportDataUri: png },
      'component[7]': { id: 7, type: 'graph', title: 'Graph', dataContext: 'Class', plotType: 'scatterPlot', xAttributeName: 'age', yAttributeName: 'height', hiddenCases: [99] },
      'dataContext[Class]': { collections: [{ name: 'Schools', attrs: [{ name: 'school' }] }, { name: 'Kids', attrs: [{ name: 'age' }, { name: 'height' }] }] },
      'dataContext[Class].collection[Kids].caseCount': 32,
    };
    const { dispatcher, sent } = pluginTools((request) => ({ success: true, values: answers[request.resource] }));
    const answer = answerOf('g1', await dispatcher.call(null, 'getGraphImage', { graph: 7 }));
    assert.deepEqual(answer.content, [
      { type: 'image', data: png.slice('data:image/png;base64,'.length), mimeType: 'image/png' },
      { type: 'text', text: 'Scatter plot of height against age, 31 cases (PNG 640×480)' },
    ]);
    assert.deepEqual(answer.structuredContent, {
      graph: 7, title: 'Graph', plotType: 'scatterPlot', xAttribute: 'age', yAttribute: 'height', cases: 31,
      mimeType: 'image/png', width: 640, height: 480, originalWidth: 640, originalHeight: 480,
    });
    assert.ok(sent.every((request) => request.action === 'get'), 'it only reads');
    // codapRequest's `get dataDisplay[…]` is the same picture.
    const raw = answerOf('g2', await dispatcher.call(null, 'codapRequest', { action: 'get', resource: 'dataDisplay[7]' }));
    assert.deepEqual(raw.content, answer.content);
  });

  test("a graph CODAP cannot describe still gives its picture; CODAP's refusals are the failure", async () => {
    const png = `data:image/png;base64,${toBase64(pngHead(10, 20))}`;
    const bare = pluginTools((request) => (request.resource.startsWith('dataDisplay') ? { success: true, values: { exportDataUri: png } } : { success: false, values: { error: 'no' } }));
    assert.equal((await bare.dispatcher.call(null, 'getGraphImage', { graph: 'g' })).content[1].text, 'Graph (PNG 10×20)');
    // Real CODAP: an unknown component is success:false; a component that is no graph (v3)
    // answers {values: {error}} without `success`.
    const unknown = pluginTools(() => ({ success: false, values: { error: 'Component not found' } }));
    await assert.rejects(unknown.dispatcher.call(null, 'getGraphImage', { graph: 'nope' }), { code: 'codap_error', message: 'Component not found' });
    const table = pluginTools(() => ({ values: { error: 'Data display not found' } }));
    await assert.rejects(table.dispatcher.call(null, 'getGraphImage', { graph: 'table' }), { code: 'codap_error', message: 'Data display not found' });
    const empty = pluginTools(() => ({ success: false }));
    await assert.rejects(empty.dispatcher.call(null, 'getGraphImage', { graph: 3 }), { message: 'CODAP refused the request.' });
  });
});
