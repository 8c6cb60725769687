// window.mcpDispatcher: the registry of the tab's tools and the one way to call them. Every
// call is checked against the function's JSON Schema before it runs.

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
    for (const name of schema.required || []) {
      if (!(name in value)) problems.push(`${path}.${name} is required`);
    }
    const properties = schema.properties || {};
    for (const [name, item] of Object.entries(value)) {
      if (properties[name]) check(properties[name], item, `${path}.${name}`, problems);
      else if (schema.additionalProperties === false) problems.push(`${path}.${name} is not expected`);
      else if (typeof schema.additionalProperties === 'object') check(schema.additionalProperties, item, `${path}.${name}`, problems);
    }
  }
  if (schema.anyOf && !schema.anyOf.some((option) => validate(option, value, path).length === 0)) {
    problems.push(`${path} does not match any allowed form`);
  }
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
    /** toolId → {description, functions: {name → {description, parameters, destructive, run}}} */
    this.tools = {};
  }

  register(id, description, functions) {
    const entry = { description, functions: {} };
    for (const fn of functions) entry.functions[fn.name] = fn;
    this.tools[id] = entry;
  }

  /** The grouped manifest the relay takes. */
  manifest() {
    return Object.entries(this.tools).map(([id, tool]) => ({
      id,
      description: tool.description,
      functions: Object.values(tool.functions).map((fn) => ({
        name: fn.name,
        description: fn.description,
        parameters: fn.parameters,
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

  /** Runs a function after checking its arguments; throws ToolError on failure. */
  async call(toolId, name, args = {}) {
    const fn = this.find(toolId, name);
    if (!fn) throw new ToolError('unknown_function', `This tab has no function ${name}.`);
    const problems = validate(fn.parameters, args ?? {});
    if (problems.length) throw new ToolError('invalid_arguments', `Invalid arguments: ${problems.join('; ')}.`);
    return fn.run(args ?? {});
  }
}
