// WebMCP pages reach remote assistants: tools a page registers the WebMCP way
// (`document.modelContext.registerTool`, or the older `navigator.modelContext` with
// `provideContext`) are served through a toolrelay Connection as well.
//
// Follows the W3C Web Machine Learning community group's WebMCP draft (index.bs of
// webmachinelearning/webmcp as of 2026-06-17: `document.modelContext.registerTool(tool,
// {signal})` returning a promise, unregistering by AbortSignal, `toolchange` events) and what
// Chromium 156 does with --enable-features=WebMCP (verified 2026-11-26 on Debian's chromium
// 156, see tests/browser/specs/webmcp.test.mjs): `getTools()` lists {name, title, description,
// inputSchema, annotations, origin, window}, `executeTool(tool, input, {signal})` takes the
// input as an object (a JSON string is refused), passes the tool `{signal}` and resolves with
// the tool's result as a string (JSON, or the string it returned). Keeps what MCP-B's polyfill
// (@mcp-b/webmcp-polyfill) still accepts from earlier drafts: `navigator.modelContext` as an
// alias, `unregisterTool(name)`, and from the MCP-B global runtime `provideContext({tools})` /
// `clearContext()`; a context whose `executeTool` refuses an object gets the JSON string.
// Declarative (form) tools, resources, prompts, sampling and elicitation are not bridged.

import { fromMcpResult } from './result.js';

/**
 * What a tool's result becomes for the relay: one in MCP's shape (`{content, structuredContent?,
 * isError?}`) its content as is (result.js; `isError` a failed answer with that content, the
 * first text its message), anything else the result.
 */
function unwrap(result) {
  return fromMcpResult(result) ?? result;
}

/** `name` as the relay takes it: letters, digits and _, at most 64. */
export function relayName(name) {
  return String(name).replace(/[^A-Za-z0-9_]/g, '_').slice(0, 64) || 'tool';
}

/** A string answer that is JSON (what `executeTool` returns) as the value it holds. */
function parsed(value) {
  if (typeof value !== 'string') return value;
  try {
    return JSON.parse(value);
  } catch {
    return value;
  }
}


/**
 * A minimal model context, installed when the page has none: as Chromium 156's (registerTool
 * with an AbortSignal, toolchange events, getTools, executeTool(tool, input object, {signal})
 * resolving with a string), plus the MCP-B compatibility methods.
 */
class ModelContext extends EventTarget {
  constructor() {
    super();
    this.registered = new Map(); // name → tool
    this.provided = new Set(); // names registered by provideContext
    this.ontoolchange = null;
  }

  changed() {
    const event = new Event('toolchange');
    this.dispatchEvent(event);
    if (typeof this.ontoolchange === 'function') this.ontoolchange(event);
  }

  registerTool(tool, options = {}) {
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (!tool || typeof tool.name !== 'string' || tool.name === '') return Promise.reject(new TypeError('A tool needs a name.'));
    if (typeof tool.description !== 'string' || tool.description === '') return Promise.reject(new TypeError(`The tool ${tool.name} needs a description.`));
    if (typeof tool.execute !== 'function') return Promise.reject(new TypeError(`The tool ${tool.name} needs an execute function.`));
    if (this.registered.has(tool.name)) {
      return Promise.reject(new DOMException(`A tool named ${tool.name} is already registered.`, 'InvalidStateError'));
    }
    this.registered.set(tool.name, tool);
    signal?.addEventListener('abort', () => this.unregisterTool(tool.name), { once: true });
    this.changed();
    // Earlier drafts returned {unregister()}: the promise carries it too.
    return Object.assign(Promise.resolve(), { unregister: () => this.unregisterTool(tool.name) });
  }

  unregisterTool(nameOrTool) {
    const name = typeof nameOrTool === 'string' ? nameOrTool : nameOrTool?.name;
    if (this.registered.delete(name)) {
      this.provided.delete(name);
      this.changed();
    }
  }

  provideContext({ tools = [] } = {}) {
    for (const name of this.provided) this.registered.delete(name);
    this.provided.clear();
    for (const tool of tools) {
      this.registered.set(tool.name, tool);
      this.provided.add(tool.name);
    }
    this.changed();
  }

  clearContext() {
    this.registered.clear();
    this.provided.clear();
    this.changed();
  }

  async getTools() {
    return [...this.registered.values()].map(({ name, title, description, inputSchema, annotations }) => ({
      name,
      title,
      description,
      inputSchema: inputSchema ?? { type: 'object', properties: {} },
      annotations,
    }));
  }

  /** As Chromium 156: the input an object (a string is refused), the result a string. */
  async executeTool(toolOrName, input = {}, { signal } = {}) {
    const name = typeof toolOrName === 'string' ? toolOrName : toolOrName?.name;
    const tool = this.registered.get(name);
    if (!tool) throw new DOMException(`No tool named ${name}.`, 'NotFoundError');
    if (input === null || typeof input !== 'object') throw new TypeError('executeTool takes the input as an object, not a JSON string.');
    signal?.throwIfAborted();
    const result = await tool.execute(input, { signal: signal ?? new AbortController().signal });
    return typeof result === 'string' ? result : String(JSON.stringify(result));
  }
}

/** The page's model context, or one installed on `document` and `navigator` (the same object). */
function modelContext() {
  const existing = globalThis.document?.modelContext ?? globalThis.navigator?.modelContext;
  if (existing) return { context: existing, ours: existing instanceof ModelContext };
  const context = new ModelContext();
  for (const target of [globalThis.document, globalThis.navigator]) {
    if (target) Object.defineProperty(target, 'modelContext', { value: context, configurable: true });
  }
  return { context, ours: true };
}

/**
 * Watches a context that cannot list or run its tools (registerTool, unregisterTool,
 * provideContext, clearContext only, as browsers before Chromium 156 had): its methods are
 * wrapped so that every tool registered from now on is remembered here, then passed on to the
 * original method.
 * Tools registered before cannot be seen. Returns the remembered tools (name → tool) and a
 * function that puts the original methods back.
 */
function watchRegistrations(context, changed) {
  const seen = new Map(); // name → tool
  const provided = new Set(); // names given by provideContext
  const originals = {};
  const forget = (name) => {
    if (seen.delete(name)) {
      provided.delete(name);
      changed();
    }
  };
  const wrap = (method, wrapper) => {
    const original = context[method];
    if (typeof original !== 'function') return;
    originals[method] = Object.prototype.hasOwnProperty.call(context, method) ? { own: original } : {};
    Object.defineProperty(context, method, {
      value: (...args) => wrapper((...again) => original.apply(context, again), ...args),
      configurable: true,
      writable: true,
    });
  };

  wrap('registerTool', (original, tool, options = {}) => {
    const result = original(tool, options);
    const { signal } = options ?? {};
    if (tool && typeof tool.name === 'string' && typeof tool.execute === 'function' && !signal?.aborted) {
      const { name } = tool;
      seen.set(name, tool);
      provided.delete(name);
      signal?.addEventListener?.('abort', () => seen.get(name) === tool && forget(name), { once: true });
      // The context refused it (a duplicate, a bad tool): not registered, so not bridged.
      Promise.resolve(result).catch(() => seen.get(name) === tool && forget(name));
      changed();
    }
    return result;
  });
  wrap('unregisterTool', (original, nameOrTool) => {
    const result = original(nameOrTool);
    forget(typeof nameOrTool === 'string' ? nameOrTool : nameOrTool?.name);
    return result;
  });
  wrap('provideContext', (original, options = {}) => {
    const result = original(options);
    for (const name of provided) seen.delete(name);
    provided.clear();
    for (const tool of options?.tools ?? []) {
      if (!tool || typeof tool.name !== 'string' || typeof tool.execute !== 'function') continue;
      seen.set(tool.name, tool);
      provided.add(tool.name);
    }
    changed();
    return result;
  });
  wrap('clearContext', (original, ...args) => {
    const result = original(...args);
    seen.clear();
    provided.clear();
    changed();
    return result;
  });

  const restore = () => {
    for (const [method, { own }] of Object.entries(originals)) {
      if (own) Object.defineProperty(context, method, { value: own, configurable: true, writable: true });
      else delete context[method];
    }
  };
  return { seen, restore };
}

/**
 * Runs tools through `context.executeTool` with the input as an object, as Chromium 156 takes
 * it; a context that refuses the object on the first call (a TypeError or, from one that
 * parses what it is given, a SyntaxError) is given the JSON string from then on.
 */
function executor(context) {
  let form = null; // 'object' or 'string', once a call has told
  return async (tool, args, signal) => {
    const input = args ?? {};
    if (form === 'string') return context.executeTool(tool, JSON.stringify(input), { signal });
    try {
      const result = await context.executeTool(tool, input, { signal });
      form = 'object';
      return result;
    } catch (error) {
      if (form !== null || !(error instanceof TypeError || error instanceof SyntaxError)) throw error;
      const result = await context.executeTool(tool, JSON.stringify(input), { signal });
      form = 'string';
      return result;
    }
  };
}

/**
 * Serves the page's WebMCP tools through `connection` (from `connect()`), now and as they come
 * and go. Returns a function that stops the bridge.
 */
export function bridgeWebMCP(connection) {
  const { context, ours } = modelContext();
  const bridged = new Set();
  const lists = ours || (typeof context.getTools === 'function' && typeof context.executeTool === 'function');
  // A context that cannot list its tools: only registrations made from now on are seen.
  const watched = lists ? null : watchRegistrations(context, () => onChange());
  const execute = lists ? executor(context) : null;

  // The relay takes names of letters, digits and _ (WebMCP's often have - or .). The
  // dispatcher reads the annotations: not marked `readOnlyHint` counts as changing data (the
  // "ask me" switch holds it); content from outside (`untrustedContentHint`) makes the tool
  // open-world, and the relay marks its MCP results `_meta["toolrelay/untrustedContent"]`.
  const asTool = (tool, run) => ({
    name: relayName(tool.name),
    title: tool.title,
    description: tool.description || tool.title || tool.name,
    inputSchema: tool.inputSchema ?? { type: 'object', properties: {} },
    annotations: tool.annotations,
    readOnly: tool.annotations?.readOnlyHint === true,
    execute: async (args, { signal } = {}) =>
      unwrap(parsed(await run(args ?? {}, signal ?? new AbortController().signal))),
  });

  /** Makes the bridged set what the context holds now. */
  async function sync() {
    let tools;
    if (watched) {
      tools = [...watched.seen.values()].map((tool) => asTool(tool, (args, signal) => tool.execute(args, { signal })));
    } else {
      tools = (await context.getTools()).map((tool) => asTool(tool, (args, signal) => execute(tool, args, signal)));
    }
    const names = new Set(tools.map((tool) => tool.name));
    let changed = false;
    for (const name of bridged) {
      if (!names.has(name)) {
        connection.dispatcher.remove(name);
        bridged.delete(name);
        changed = true;
      }
    }
    for (const tool of tools) {
      connection.dispatcher.add(tool, connection.group);
      bridged.add(tool.name);
      changed = true;
    }
    if (changed) connection.transport?.reregister();
  }

  const onChange = () => {
    sync().catch((error) => connection.emit('problem', { message: `WebMCP tools could not be read: ${error.message}` }));
  };
  context.addEventListener?.('toolchange', onChange);
  onChange();
  return () => {
    context.removeEventListener?.('toolchange', onChange);
    watched?.restore();
    for (const name of bridged) connection.dispatcher.remove(name);
    bridged.clear();
    connection.transport?.reregister();
  };
}
