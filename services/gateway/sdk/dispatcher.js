// The registry of a page's tools and the one way to call them (the CODAP plugin exposes it as
// window.mcpDispatcher). Every call is checked against the function's JSON Schema before it
// runs. Tools come grouped ({id, description, functions:[{name, description, parameters,
// run}]}) or flat ({name, description, inputSchema, execute}); flat ones join a group.

import { ErrorCode } from './errors.js';

/** The ways `value` breaks `schema` (a practical subset of JSON Schema), as messages. */
export function validate(schema, value, path = 'args') {
  const problems = [];
  check(schema, value, path, problems);
  return problems;
}

function typeOf(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number';
  return typeof value;
}

function matchesType(expected, value) {
  const actual = typeOf(value);
  return expected === actual || (expected === 'number' && actual === 'integer');
}

function check(schema, value, path, problems) {
  if (!schema || typeof schema !== 'object') return;
  if (schema.type) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((type) => matchesType(type, value))) {
      problems.push(`${path} must be ${types.join(' or ')}, not ${typeOf(value)}`);
      return;
    }
  }
  if (schema.enum && !schema.enum.some((option) => JSON.stringify(option) === JSON.stringify(value))) {
    problems.push(`${path} must be one of ${schema.enum.map((o) => JSON.stringify(o)).join(', ')}`);
  }
  if (typeof value === 'number') {
    if (schema.minimum !== undefined && value < schema.minimum) problems.push(`${path} must be at least ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) problems.push(`${path} must be at most ${schema.maximum}`);
  }
  if (typeof value === 'string' && schema.minLength !== undefined && value.length < schema.minLength) {
    problems.push(`${path} must have at least ${schema.minLength} character(s)`);
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems) problems.push(`${path} needs at least ${schema.minItems} item(s)`);
    if (schema.items) value.forEach((item, i) => check(schema.items, item, `${path}[${i}]`, problems));
  }
  if (typeOf(value) === 'object') {
    // Own properties only: `constructor` or `toString` is on every object, but not an argument.
    for (const name of schema.required || []) {
      if (!Object.hasOwn(value, name)) problems.push(`${path}.${name} is required`);
    }
    const properties = schema.properties || {};
    for (const [name, item] of Object.entries(value)) {
      if (Object.hasOwn(properties, name)) check(properties[name], item, `${path}.${name}`, problems);
      else if (schema.additionalProperties === false) problems.push(`${path}.${name} is not expected`);
      else if (typeof schema.additionalProperties === 'object') check(schema.additionalProperties, item, `${path}.${name}`, problems);
    }
  }
  if (schema.anyOf && !schema.anyOf.some((option) => validate(option, value, path).length === 0)) {
    problems.push(`${path} does not match any allowed form`);
  }
}

/**
 * Whether a call of `fn` with `args` waits for the person when they asked to be asked before
 * changes: every call but those of a function marked read-only (`readOnly: true`, or a
 * function of the arguments saying so for these). Unmarked functions count as changing data.
 */
export function heldForConfirmation(fn, args = {}) {
  const readOnly = typeof fn?.readOnly === 'function' ? fn.readOnly(args ?? {}) : fn?.readOnly;
  return readOnly !== true;
}

/** A tool failure with a stable code, passed to the LLM as {code, message}. */
export class ToolError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

export class Dispatcher {
  constructor() {
    /** toolId → {description, functions: {name → {description, parameters, title, readOnly, destructive, idempotent, run}}} */
    this.tools = {};
  }

  register(id, description, functions) {
    const entry = { description, functions: {} };
    for (const fn of functions) entry.functions[fn.name] = fn;
    this.tools[id] = entry;
  }

  /**
   * Adds a tool given either way: a group `{id, functions}` or a flat `{name, inputSchema,
   * execute}` (which joins the group `group`). A function of the same name is replaced.
   */
  add(tool, group = 'page', groupDescription = 'Tools of this page') {
    if (Array.isArray(tool.functions)) {
      for (const fn of tool.functions) this.remove(fn.name);
      this.register(tool.id, tool.description ?? '', tool.functions.map(normalised));
      return;
    }
    this.remove(tool.name);
    if (!this.tools[group]) this.tools[group] = { description: groupDescription, functions: {} };
    this.tools[group].functions[tool.name] = normalised(tool);
  }

  /** Removes a group by id, or a function by name; says whether anything went. */
  remove(name) {
    if (this.tools[name]) {
      delete this.tools[name];
      return true;
    }
    for (const [id, tool] of Object.entries(this.tools)) {
      if (!tool.functions[name]) continue;
      delete tool.functions[name];
      if (Object.keys(tool.functions).length === 0) delete this.tools[id];
      return true;
    }
    return false;
  }

  /** Every function's name. */
  names() {
    return Object.values(this.tools).flatMap((tool) => Object.keys(tool.functions));
  }

  /** The grouped manifest the relay takes, with what each function does to data. */
  manifest() {
    return Object.entries(this.tools).map(([id, tool]) => ({
      id,
      description: tool.description,
      functions: Object.values(tool.functions).map((fn) => ({
        name: fn.name,
        description: fn.description,
        parameters: fn.parameters,
        ...hints(fn),
      })),
    }));
  }

  /** The function called `name` (in tool `toolId`, when given). */
  find(toolId, name) {
    if (toolId && this.tools[toolId]) return this.tools[toolId].functions[name] || null;
    for (const tool of Object.values(this.tools)) {
      if (tool.functions[name]) return tool.functions[name];
    }
    return null;
  }

  /**
   * Runs a function after checking its arguments; throws ToolError on failure. `context.signal`
   * (an AbortSignal) is passed to the function as `execute(args, {signal, progress, log})`: it
   * is aborted when the caller cancels the call. `context.progress` and `context.log` report
   * while it runs (progress.js); without them they do nothing.
   */
  async call(toolId, name, args = {}, context = {}) {
    const fn = this.find(toolId, name);
    if (!fn) throw new ToolError(ErrorCode.UNKNOWN_FUNCTION, `This tab has no function ${name}.`);
    const problems = validate(fn.parameters, args ?? {});
    if (problems.length) throw new ToolError(ErrorCode.INVALID_ARGUMENTS, `Invalid arguments: ${problems.join('; ')}.`);
    const signal = context.signal ?? new AbortController().signal;
    signal.throwIfAborted();
    const progress = context.progress ?? (() => false);
    const log = context.log ?? (() => false);
    return fn.run(args ?? {}, { signal, progress, log });
  }
}

/**
 * What a function tells hosts it does to data (SPEC §4): `title`, `readOnly`, `destructive`,
 * `idempotent` and `untrustedContent` (its results may hold content from outside the page's
 * own data: WebMCP's `untrustedContentHint`) as booleans, left out when unmarked. A `readOnly` that depends on the arguments
 * is not read-only for hosts (some calls change data); a `destructive` that does is destructive.
 */
export function hints(fn) {
  const out = {};
  if (typeof fn.title === 'string' && fn.title.trim()) out.title = fn.title;
  if (typeof fn.readOnly === 'boolean') out.readOnly = fn.readOnly;
  if (out.readOnly !== true) {
    if (typeof fn.destructive === 'boolean') out.destructive = fn.destructive;
    else if (typeof fn.destructive === 'function') out.destructive = true;
  }
  if (typeof fn.idempotent === 'boolean') out.idempotent = fn.idempotent;
  if (typeof fn.untrustedContent === 'boolean') out.untrustedContent = fn.untrustedContent;
  return out;
}

/** A function as the dispatcher keeps it: `parameters` and `run`, whatever it was given as. */
function normalised(fn) {
  if (typeof fn.name !== 'string' || !/^[A-Za-z0-9_]{1,64}$/.test(fn.name)) {
    throw new TypeError(`A tool needs a name of 1 to 64 letters, digits or _: ${JSON.stringify(fn.name)}`);
  }
  const run = fn.run ?? fn.execute;
  if (typeof run !== 'function') throw new TypeError(`The tool ${fn.name} needs an execute(args) function.`);
  return {
    name: fn.name,
    description: fn.description ?? '',
    parameters: fn.parameters ?? fn.inputSchema ?? { type: 'object', properties: {} },
    // WebMCP tools say it with MCP's annotations; unmarked stays undefined (changes data).
    title: fn.title ?? fn.annotations?.title,
    readOnly: fn.readOnly ?? fn.annotations?.readOnlyHint,
    destructive: fn.destructive ?? fn.annotations?.destructiveHint,
    idempotent: fn.idempotent ?? fn.annotations?.idempotentHint,
    untrustedContent: fn.untrustedContent ?? fn.annotations?.untrustedContentHint,
    run: (args, options) => run.call(fn, args, options),
  };
}
