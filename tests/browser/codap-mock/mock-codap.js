/*
 * mock-codap.js — a mock CODAP parent page for browser tests.
 *
 * Plays CODAP's role towards a Data Interactive plugin: embeds the plugin
 * (URL from the `di` query parameter) in an iframe, talks to it through the
 * real iframe-phone library (global `iframePhone`, loaded before this file),
 * answers Data Interactive API requests from an in-memory model and exposes
 * that model to tests on `window.codap`.
 *
 * Plain ES2017, no build step, no dependencies besides iframe-phone.
 */
(function () {
  'use strict';

  // ---------------------------------------------------------------------------
  // Small utilities
  // ---------------------------------------------------------------------------

  /** An error whose message is sent back to the plugin as {success:false}. */
  class ApiError extends Error {}

  function fail(message) {
    throw new ApiError(message);
  }

  function ok(values) {
    return values === undefined ? { success: true } : { success: true, values: values };
  }

  function errorResponse(message) {
    return { success: false, values: { error: message } };
  }

  /** JSON deep copy (drops undefined and functions); never throws. */
  function clone(value) {
    if (value === undefined) return undefined;
    try {
      return JSON.parse(JSON.stringify(value));
    } catch (e) {
      return String(value);
    }
  }

  function isObj(v) {
    return v !== null && typeof v === 'object' && !Array.isArray(v);
  }

  function asList(values) {
    return Array.isArray(values) ? values : [values];
  }

  /** One increasing counter for every id (contexts, collections, attributes, items, cases, ...). */
  let lastId = 0;
  function newId() {
    lastId += 1;
    return lastId;
  }

  /** Finds by exact name first, then by numeric id. */
  function findByNameOrId(list, key) {
    if (key === undefined || key === null) return undefined;
    const s = String(key);
    let found = list.find(function (x) { return x.name === s; });
    if (!found && /^\s*-?\d+\s*$/.test(s)) {
      const n = Number(s);
      found = list.find(function (x) { return x.id === n; });
    }
    return found;
  }

  function isMissing(v) {
    return v === '' || v === null || v === undefined;
  }

  /** Number value of v, or NaN (numeric strings count as numbers, as in CODAP). */
  function toNumber(v) {
    if (typeof v === 'number') return v;
    if (typeof v === 'boolean') return v ? 1 : 0;
    if (typeof v === 'string') {
      const s = v.trim();
      if (s === '') return NaN;
      const n = Number(s);
      return isFinite(n) ? n : NaN;
    }
    return NaN;
  }

  function toStr(v) {
    return v === null || v === undefined ? '' : String(v);
  }

  /** How a value is stored in an item: primitives as given, missing as "". */
  function storedValue(v) {
    if (v === null || v === undefined) return '';
    if (typeof v === 'object') return JSON.stringify(v);
    if (typeof v === 'number' && !isFinite(v)) return '';
    return v;
  }

  /** Compares two values: numerically when both are numbers, else as strings. */
  function compareValues(a, b, op) {
    const x = toNumber(a);
    const y = toNumber(b);
    const numeric = !isMissing(a) && !isMissing(b) && !isNaN(x) && !isNaN(y);
    const l = numeric ? x : toStr(a);
    const r = numeric ? y : toStr(b);
    switch (op) {
      case '=': case '==': return l === r;
      case '!=': case '<>': return l !== r;
      case '<': return l < r;
      case '<=': return l <= r;
      case '>': return l > r;
      case '>=': return l >= r;
      default: throw new Error('unknown comparison: ' + op);
    }
  }

  function truthy(v) {
    if (typeof v === 'boolean') return v;
    if (typeof v === 'number') return v !== 0 && !isNaN(v);
    if (typeof v === 'string') return v !== '' && v.toLowerCase() !== 'false';
    return !!v;
  }

  // ---------------------------------------------------------------------------
  // Formula engine: tokenizer, recursive-descent parser, evaluator.
  // Grammar (lowest precedence first):
  //   or  := and (('or' | '||') and)*
  //   and := cmp (('and' | '&&') cmp)*
  //   cmp := add (('<' | '>' | '<=' | '>=' | '=' | '==' | '!=' | '<>') add)?
  //   add := mul (('+' | '-') mul)*
  //   mul := unary (('*' | '/' | '%') unary)*
  //   unary := ('-' | '+' | '!' | 'not') unary | pow
  //   pow := primary ('^' unary)?            (right associative)
  //   primary := number | "string" | 'string' | name | `any name` | name(args) | (or)
  // ---------------------------------------------------------------------------

  const SINGLE_OPS = '+-*/^%()<>=!,';
  const DOUBLE_OPS = ['<=', '>=', '!=', '<>', '==', '&&', '||'];

  function tokenize(src) {
    const tokens = [];
    let i = 0;
    while (i < src.length) {
      const c = src[i];
      if (/\s/.test(c)) { i += 1; continue; }
      if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(src[i + 1] || ''))) {
        const m = /^(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?/.exec(src.slice(i));
        tokens.push({ t: 'num', v: parseFloat(m[0]) });
        i += m[0].length;
        continue;
      }
      if (c === '"' || c === "'" || c === '`') {
        let j = i + 1;
        let text = '';
        while (j < src.length && src[j] !== c) {
          if (src[j] === '\\' && j + 1 < src.length) { j += 1; }
          text += src[j];
          j += 1;
        }
        if (j >= src.length) throw new Error('unterminated ' + (c === '`' ? 'name' : 'string'));
        tokens.push(c === '`' ? { t: 'name', v: text, quoted: true, start: i, end: j + 1 }
          : { t: 'str', v: text });
        i = j + 1;
        continue;
      }
      const two = src.substr(i, 2);
      if (DOUBLE_OPS.indexOf(two) >= 0) { tokens.push({ t: 'op', v: two }); i += 2; continue; }
      if (SINGLE_OPS.indexOf(c) >= 0) { tokens.push({ t: 'op', v: c }); i += 1; continue; }
      let j = i;
      while (j < src.length && !/\s/.test(src[j]) && SINGLE_OPS.indexOf(src[j]) < 0 &&
             '"\'`&|'.indexOf(src[j]) < 0) {
        j += 1;
      }
      if (j === i) throw new Error('unexpected character "' + c + '"');
      tokens.push({ t: 'name', v: src.slice(i, j), start: i, end: j });
      i = j;
    }
    return tokens;
  }

  function parseFormula(src) {
    const tokens = tokenize(String(src));
    let pos = 0;
    const peek = function () { return tokens[pos]; };
    const isOp = function (v) { const t = tokens[pos]; return !!t && t.t === 'op' && t.v === v; };
    const isWord = function (w) {
      const t = tokens[pos];
      return !!t && t.t === 'name' && !t.quoted && t.v.toLowerCase() === w;
    };
    const expectOp = function (v) {
      if (!isOp(v)) throw new Error('expected "' + v + '"');
      pos += 1;
    };

    function parseOr() {
      let left = parseAnd();
      while (isOp('||') || isWord('or')) { pos += 1; left = { t: 'or', a: left, b: parseAnd() }; }
      return left;
    }
    function parseAnd() {
      let left = parseCmp();
      while (isOp('&&') || isWord('and')) { pos += 1; left = { t: 'and', a: left, b: parseCmp() }; }
      return left;
    }
    function parseCmp() {
      const left = parseAdd();
      const t = peek();
      if (t && t.t === 'op' && ['<', '>', '<=', '>=', '=', '==', '!=', '<>'].indexOf(t.v) >= 0) {
        pos += 1;
        return { t: 'cmp', op: t.v, a: left, b: parseAdd() };
      }
      return left;
    }
    function parseAdd() {
      let left = parseMul();
      while (isOp('+') || isOp('-')) {
        const op = tokens[pos].v; pos += 1;
        left = { t: 'bin', op: op, a: left, b: parseMul() };
      }
      return left;
    }
    function parseMul() {
      let left = parseUnary();
      while (isOp('*') || isOp('/') || isOp('%')) {
        const op = tokens[pos].v; pos += 1;
        left = { t: 'bin', op: op, a: left, b: parseUnary() };
      }
      return left;
    }
    function parseUnary() {
      if (isOp('-')) { pos += 1; return { t: 'neg', a: parseUnary() }; }
      if (isOp('+')) { pos += 1; return parseUnary(); }
      if (isOp('!') || isWord('not')) { pos += 1; return { t: 'not', a: parseUnary() }; }
      return parsePow();
    }
    function parsePow() {
      const base = parsePrimary();
      if (isOp('^')) { pos += 1; return { t: 'bin', op: '^', a: base, b: parseUnary() }; }
      return base;
    }
    function parsePrimary() {
      const t = peek();
      if (!t) throw new Error('unexpected end of formula');
      if (t.t === 'num' || t.t === 'str') { pos += 1; return { t: 'lit', v: t.v }; }
      if (t.t === 'op' && t.v === '(') {
        pos += 1;
        const inner = parseOr();
        expectOp(')');
        return inner;
      }
      if (t.t === 'name') {
        pos += 1;
        if (!t.quoted && isOp('(')) {
          pos += 1;
          const args = [];
          if (!isOp(')')) {
            args.push(parseOr());
            while (isOp(',')) { pos += 1; args.push(parseOr()); }
          }
          expectOp(')');
          return { t: 'call', fn: t.v, args: args };
        }
        if (!t.quoted && t.v === 'true') return { t: 'lit', v: true };
        if (!t.quoted && t.v === 'false') return { t: 'lit', v: false };
        return { t: 'name', v: t.v };
      }
      throw new Error('unexpected "' + t.v + '"');
    }

    if (tokens.length === 0) throw new Error('empty formula');
    const ast = parseOr();
    if (pos < tokens.length) throw new Error('unexpected "' + tokens[pos].v + '"');
    return ast;
  }

  const formulaCache = new Map();
  function compileFormula(src) {
    const key = String(src);
    if (!formulaCache.has(key)) {
      try {
        formulaCache.set(key, { ast: parseFormula(key) });
      } catch (e) {
        formulaCache.set(key, { error: e.message });
      }
    }
    const entry = formulaCache.get(key);
    if (entry.error) throw new Error(entry.error);
    return entry.ast;
  }

  /** Rewrites references to an attribute in a formula (used when it is renamed). */
  function renameInFormula(src, oldName, newName) {
    let tokens;
    try { tokens = tokenize(String(src)); } catch (e) { return src; }
    const plain = /^[^\s+\-*\/^%()<>=!,"'`&|0-9.][^\s+\-*\/^%()<>=!,"'`&|]*$/.test(newName) &&
      ['and', 'or', 'not', 'true', 'false'].indexOf(newName.toLowerCase()) < 0;
    const replacement = plain ? newName : '`' + newName.replace(/`/g, '\\`') + '`';
    let out = String(src);
    tokens.forEach(function (t, i) {
      const next = tokens[i + 1];
      const isCall = !t.quoted && next && next.t === 'op' && next.v === '(';
      t.rename = t.t === 'name' && t.v === oldName && !isCall;
    });
    tokens.filter(function (t) { return t.rename; }).reverse().forEach(function (t) {
      out = out.slice(0, t.start) + replacement + out.slice(t.end);
    });
    return out;
  }

  function num(v) {
    const n = toNumber(v);
    if (isNaN(n)) throw new Error('not a number: ' + toStr(v));
    return n;
  }

  function finite(n) {
    if (typeof n !== 'number' || !isFinite(n)) throw new Error('result is not a finite number');
    return n;
  }

  function arithmetic(op, a, b) {
    if (op === '+' && !isMissing(a) && !isMissing(b) && (isNaN(toNumber(a)) || isNaN(toNumber(b)))) {
      return toStr(a) + toStr(b); // string concatenation
    }
    if (isMissing(a) || isMissing(b)) return '';
    const x = num(a);
    const y = num(b);
    switch (op) {
      case '+': return finite(x + y);
      case '-': return finite(x - y);
      case '*': return finite(x * y);
      case '/': return finite(x / y);
      case '%': return finite(x % y);
      case '^': return finite(Math.pow(x, y));
      default: throw new Error('unknown operator ' + op);
    }
  }

  /** Functions taking already-evaluated arguments. Missing input gives "". */
  function mathFn(fn) {
    return function (args) {
      if (args.length === 0 || isMissing(args[0])) return '';
      return finite(fn.apply(null, args.map(function (a) { return isMissing(a) ? undefined : num(a); })));
    };
  }
  const SIMPLE_FUNCTIONS = {
    round: mathFn(function (x, digits) {
      const d = digits === undefined ? 0 : Math.trunc(digits);
      const f = Math.pow(10, d);
      // toPrecision removes binary noise first, so round(2.345, 2) is 2.35
      return Math.sign(x) * Math.round(Number((Math.abs(x) * f).toPrecision(15))) / f;
    }),
    abs: mathFn(Math.abs),
    sqrt: mathFn(function (x) {
      if (x < 0) throw new Error('sqrt of a negative number');
      return Math.sqrt(x);
    }),
    floor: mathFn(Math.floor),
    ceil: mathFn(Math.ceil),
    exp: mathFn(Math.exp),
    ln: mathFn(Math.log),
    log: mathFn(Math.log10),
    pow: mathFn(Math.pow)
  };

  /** Aggregate functions: the argument is evaluated once per case in scope. */
  const AGGREGATES = {
    mean: function (nums) { return nums.length ? nums.reduce(function (s, x) { return s + x; }, 0) / nums.length : ''; },
    sum: function (nums) { return nums.reduce(function (s, x) { return s + x; }, 0); },
    min: function (nums) { return nums.length ? Math.min.apply(null, nums) : ''; },
    max: function (nums) { return nums.length ? Math.max.apply(null, nums) : ''; },
    median: function (nums) {
      if (!nums.length) return '';
      const s = nums.slice().sort(function (a, b) { return a - b; });
      const mid = Math.floor(s.length / 2);
      return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
    }
  };

  function callFunction(node, ctx) {
    const name = node.fn.toLowerCase();
    const args = node.args;
    if (name === 'if') {
      if (args.length < 2) throw new Error('if() needs a condition and a value');
      if (truthy(evaluateNode(args[0], ctx))) return evaluateNode(args[1], ctx);
      return args.length > 2 ? evaluateNode(args[2], ctx) : '';
    }
    if (name === 'count') {
      const subs = ctx.scope();
      if (args.length === 0) return subs.length;
      return subs.filter(function (sub) {
        const v = evaluateNode(args[0], sub);
        return !isMissing(v) && v !== false;
      }).length;
    }
    if (AGGREGATES[name] && args.length === 1) {
      const nums = [];
      ctx.scope().forEach(function (sub) {
        const v = evaluateNode(args[0], sub);
        const n = toNumber(v);
        if (!isMissing(v) && !isNaN(n)) nums.push(n);
      });
      return AGGREGATES[name](nums);
    }
    const evaluated = args.map(function (a) { return evaluateNode(a, ctx); });
    if ((name === 'min' || name === 'max') && evaluated.length > 1) {
      if (evaluated.some(isMissing)) return '';
      return Math[name].apply(null, evaluated.map(num));
    }
    if (SIMPLE_FUNCTIONS[name]) return SIMPLE_FUNCTIONS[name](evaluated);
    throw new Error('unknown function: ' + node.fn);
  }

  /**
   * ctx = { lookup(name) -> value (throws if unknown), scope() -> [ctx per case] }
   */
  function evaluateNode(node, ctx) {
    switch (node.t) {
      case 'lit': return node.v;
      case 'name': return ctx.lookup(node.v);
      case 'neg': {
        const a = evaluateNode(node.a, ctx);
        return isMissing(a) ? '' : -num(a);
      }
      case 'not': return !truthy(evaluateNode(node.a, ctx));
      case 'and': return truthy(evaluateNode(node.a, ctx)) && truthy(evaluateNode(node.b, ctx));
      case 'or': return truthy(evaluateNode(node.a, ctx)) || truthy(evaluateNode(node.b, ctx));
      case 'cmp': return compareValues(evaluateNode(node.a, ctx), evaluateNode(node.b, ctx), node.op);
      case 'bin': return arithmetic(node.op, evaluateNode(node.a, ctx), evaluateNode(node.b, ctx));
      case 'call': return callFunction(node, ctx);
      default: throw new Error('bad formula node');
    }
  }

  function normalizeResult(v) {
    if (v === undefined || v === null) return '';
    if (typeof v === 'number' && !isFinite(v)) return '';
    return v;
  }

  /** Global values (sliders) and constants, used when a name is not an attribute. */
  function globalLookup(name) {
    const g = model.globals.find(function (x) { return x.name === name; });
    if (g) return g.value;
    if (name === 'pi' || name === 'π') return Math.PI;
    throw new Error('undefined name: ' + name);
  }

  // ---------------------------------------------------------------------------
  // The model (what tests inspect as window.codap.model)
  // ---------------------------------------------------------------------------

  const model = {
    dataContexts: [],
    components: [],
    globals: [],
    interactiveFrame: {
      id: newId(),
      name: '',
      title: '',
      version: '',
      dimensions: { width: 400, height: 640 },
      preventBringToFront: false,
      savedState: null
    }
  };

  /** Internal per-data-context state for stable case ids (not part of the model). */
  const caseIdState = new Map();
  function caseStateFor(dc) {
    if (!caseIdState.has(dc.id)) {
      caseIdState.set(dc.id, { idByKey: new Map(), keyById: new Map(), lastItemCases: {} });
    }
    return caseIdState.get(dc.id);
  }

  function findDataContext(key) {
    const dc = findByNameOrId(model.dataContexts, key);
    if (!dc) fail('dataContext not found: ' + key);
    return dc;
  }

  function findCollection(dc, key) {
    const c = findByNameOrId(dc.collections, key);
    if (!c) fail('collection not found: ' + key);
    return c;
  }

  function allAttributes(dc) {
    const list = [];
    dc.collections.forEach(function (c) { c.attrs.forEach(function (a) { list.push(a); }); });
    return list;
  }

  function findAttributeInDC(dc, name) {
    return allAttributes(dc).find(function (a) { return a.name === name; });
  }

  function findAttribute(collection, key) {
    const a = findByNameOrId(collection.attrs, key);
    if (!a) fail('attribute not found: ' + key);
    return a;
  }

  /** Keeps each collection's `parent` (name of the collection above it) in sync. */
  function relinkCollections(dc) {
    dc.collections.forEach(function (c, i) {
      c.parent = i > 0 ? dc.collections[i - 1].name : null;
    });
  }

  // ---------------------------------------------------------------------------
  // Case derivation. Cases are computed from items, as in CODAP: the leaf
  // collection has one case per item; a parent collection has one case per
  // distinct combination of its own (and its ancestors') non-formula values.
  // Case ids are kept stable through a key -> id map; when a group's values
  // change (e.g. a parent case is edited) the old id follows its items.
  // ---------------------------------------------------------------------------

  function buildView(dc) {
    const st = caseStateFor(dc);
    const cols = dc.collections;
    const leafLevel = cols.length - 1;
    const view = {
      dc: dc,
      leafLevel: leafLevel,
      levels: cols.map(function () { return []; }),
      itemCases: {},          // itemId -> [case group per level]
      attrs: {},              // name -> {attr, level}
      byId: new Map(),        // case id -> case group
      memo: new Map(),
      evaluating: new Set()
    };
    cols.forEach(function (c, k) {
      c.attrs.forEach(function (a) { view.attrs[a.name] = { attr: a, level: k }; });
    });

    function groupItems(items, level, parent) {
      const col = cols[level];
      const isLeaf = level === leafLevel;
      const byKey = new Map();
      const groups = [];
      items.forEach(function (item) {
        let key;
        if (isLeaf) {
          key = 'item:' + item.id;
        } else {
          const own = col.attrs
            .filter(function (a) { return !a.formula; })
            .map(function (a) { return [a.id, toStr(item.values[a.name])]; })
            .filter(function (p) { return p[1] !== ''; });
          key = (parent ? parent.key : '') + '|' + col.id + ':' + JSON.stringify(own);
        }
        let g = byKey.get(key);
        if (!g) {
          g = { key: key, id: 0, level: level, collection: col, parent: parent, items: [], children: [] };
          byKey.set(key, g);
          groups.push(g);
          view.levels[level].push(g);
          if (parent) parent.children.push(g);
        }
        g.items.push(item);
      });
      groups.forEach(function (g) {
        g.items.forEach(function (it) {
          if (!view.itemCases[it.id]) view.itemCases[it.id] = [];
          view.itemCases[it.id][level] = g;
        });
        if (!isLeaf) groupItems(g.items, level + 1, g);
      });
    }
    if (leafLevel >= 0) groupItems(dc.items, 0, null);

    // Assign ids: known keys keep their id; a new key may inherit the id its
    // items had before if that old group no longer exists.
    const presentKeys = new Set();
    view.levels.forEach(function (l) { l.forEach(function (g) { presentKeys.add(g.key); }); });
    const claimed = new Set();
    const pending = [];
    view.levels.forEach(function (l) {
      l.forEach(function (g) {
        const id = st.idByKey.get(g.key);
        if (id !== undefined && !claimed.has(id)) {
          g.id = id;
          claimed.add(id);
        } else {
          pending.push(g);
        }
      });
    });
    pending.forEach(function (g) {
      let candidate;
      for (let i = 0; i < g.items.length; i++) {
        const prev = st.lastItemCases[g.items[i].id];
        const x = prev ? prev[g.collection.id] : undefined;
        if (x === undefined || (candidate !== undefined && x !== candidate)) { candidate = null; break; }
        candidate = x;
      }
      let id;
      if (candidate && !claimed.has(candidate) && !presentKeys.has(st.keyById.get(candidate))) {
        id = candidate;
      } else {
        id = newId();
      }
      const oldKey = st.keyById.get(id);
      if (oldKey !== undefined && oldKey !== g.key) st.idByKey.delete(oldKey);
      st.idByKey.set(g.key, id);
      st.keyById.set(id, g.key);
      g.id = id;
      claimed.add(id);
    });

    const itemCaseIds = {};
    view.levels.forEach(function (l) {
      l.forEach(function (g) {
        view.byId.set(g.id, g);
        g.items.forEach(function (it) {
          if (!itemCaseIds[it.id]) itemCaseIds[it.id] = {};
          itemCaseIds[it.id][g.collection.id] = g.id;
        });
      });
    });
    st.lastItemCases = itemCaseIds;

    /** Evaluation context for a record (an item) seen from a collection level. */
    view.ctxFor = function (item, maxLevel, scopeItems) {
      return {
        lookup: function (name) {
          const entry = view.attrs[name];
          if (entry) {
            if (entry.level > maxLevel) throw new Error('attribute ' + name + ' is in a child collection');
            return view.valueOf(entry.attr, entry.level, item);
          }
          return globalLookup(name);
        },
        scope: function () {
          return scopeItems.map(function (it) { return view.ctxFor(it, leafLevel, dc.items); });
        }
      };
    };

    /** Value of an attribute for an item (formula attributes are computed). */
    view.valueOf = function (attr, level, item) {
      if (!attr.formula) {
        const v = item.values[attr.name];
        return v === undefined || v === null ? '' : v;
      }
      const group = level < leafLevel ? view.itemCases[item.id][level] : null;
      const memoKey = attr.id + (group ? ':case' + group.id : ':item' + item.id);
      if (view.memo.has(memoKey)) return view.memo.get(memoKey);
      if (view.evaluating.has(memoKey)) throw new Error('circular formula');
      view.evaluating.add(memoKey);
      let result;
      try {
        // A parent-level formula sees its case's items as aggregate scope;
        // a leaf-level formula aggregates over all items of the context.
        const ctx = group ? view.ctxFor(group.items[0], level, group.items)
          : view.ctxFor(item, level, dc.items);
        result = normalizeResult(evaluateNode(compileFormula(attr.formula), ctx));
      } catch (e) {
        result = '';
      } finally {
        view.evaluating.delete(memoKey);
      }
      view.memo.set(memoKey, result);
      return result;
    };

    /** Values of a case: its collection's attributes only. */
    view.caseValues = function (g) {
      const values = {};
      g.collection.attrs.forEach(function (a) { values[a.name] = view.valueOf(a, g.level, g.items[0]); });
      return values;
    };

    /** Values of a case including all its ancestors' attributes (for searches). */
    view.caseLookup = function (g) {
      return function (name) {
        const entry = view.attrs[name];
        if (!entry || entry.level > g.level) fail('attribute not found: ' + name);
        return view.valueOf(entry.attr, entry.level, g.items[0]);
      };
    };

    /** All attribute values of an item, formula values included. */
    view.itemValues = function (item) {
      const values = {};
      cols.forEach(function (c, k) {
        c.attrs.forEach(function (a) { values[a.name] = view.valueOf(a, k, item); });
      });
      return values;
    };

    view.caseObject = function (g) {
      return {
        id: g.id,
        parent: g.parent ? g.parent.id : undefined,
        collection: { name: g.collection.name, id: g.collection.id },
        values: view.caseValues(g),
        children: g.children.map(function (c) { return c.id; })
      };
    };

    view.caseIndex = function (g) {
      return view.levels[g.level].indexOf(g);
    };

    view.findCase = function (key, collection) {
      const n = Number(key);
      const g = view.byId.get(n);
      if (!g || (collection && g.collection !== collection)) fail('case not found: ' + key);
      return g;
    };

    return view;
  }

  function levelOf(dc, collection) {
    return dc.collections.indexOf(collection);
  }

  // ---------------------------------------------------------------------------
  // Search queries: "*", attr==value, attr!=value, attr<value, <=, >, >=
  // ---------------------------------------------------------------------------

  function unquote(s) {
    const t = String(s).trim();
    if (t.length >= 2 && (t[0] === '"' || t[0] === "'" || t[0] === '`') && t[t.length - 1] === t[0]) {
      return t.slice(1, -1);
    }
    return t;
  }

  function parseQuery(query) {
    const q = String(query === undefined ? '' : query).trim();
    if (q === '*') return null;
    const m = /^(.*?)\s*(==|!=|<=|>=|<|>|=)\s*(.*)$/.exec(q);
    if (!m || unquote(m[1]) === '') fail('invalid search query: ' + q);
    return { attr: unquote(m[1]), op: m[2], value: unquote(m[3]) };
  }

  /** lookup(name) must fail with "attribute not found" for unknown names. */
  function matchesQuery(parsed, lookup) {
    if (!parsed) return true;
    return compareValues(lookup(parsed.attr), parsed.value, parsed.op);
  }

  // ---------------------------------------------------------------------------
  // Request handling context: collects change notifications for one message
  // ---------------------------------------------------------------------------

  function changed(batch, dc, operation) {
    buildView(dc); // refresh stable case ids right after the change
    batch.push({
      action: 'notify',
      resource: 'dataContextChangeNotice[' + dc.name + ']',
      values: [{ operation: operation }]
    });
  }

  function documentChanged(batch, operation) {
    batch.push({ action: 'notify', resource: 'documentChangeNotice', values: { operation: operation } });
  }

  // ---------------------------------------------------------------------------
  // Resource parsing: "dataContext[My data].collection[People].attribute[age]"
  // ---------------------------------------------------------------------------

  function parseResource(resource) {
    if (typeof resource !== 'string' || resource.trim() === '') fail('missing resource');
    const s = resource.trim();
    const parts = [];
    let i = 0;
    while (i < s.length) {
      let j = i;
      while (j < s.length && s[j] !== '[' && s[j] !== '.') j += 1;
      const type = s.slice(i, j);
      if (type === '') fail('Unsupported resource: ' + resource);
      let key;
      if (s[j] === '[') {
        let depth = 1;
        let k = j + 1;
        while (k < s.length && depth > 0) {
          if (s[k] === '[') depth += 1;
          else if (s[k] === ']') depth -= 1;
          k += 1;
        }
        if (depth > 0) fail('unbalanced brackets in resource: ' + resource);
        key = s.slice(j + 1, k - 1);
        j = k;
      }
      parts.push({ type: type, key: key });
      if (j < s.length) {
        if (s[j] !== '.') fail('Unsupported resource: ' + resource);
        j += 1;
      }
      i = j;
    }
    return parts;
  }

  // ---------------------------------------------------------------------------
  // interactiveFrame
  // ---------------------------------------------------------------------------

  function handleInteractiveFrame(action, values) {
    const frame = model.interactiveFrame;
    if (action === 'get') {
      const out = clone(frame);
      if (out.savedState === undefined) out.savedState = null;
      return ok(out);
    }
    if (action === 'update') {
      if (!isObj(values)) fail('update interactiveFrame needs an object of values');
      Object.keys(values).forEach(function (k) {
        if (k !== 'id') frame[k] = clone(values[k]);
      });
      if (isObj(values.dimensions) && iframeEl) {
        if (values.dimensions.width) iframeEl.style.width = Number(values.dimensions.width) + 'px';
        if (values.dimensions.height) iframeEl.style.height = Number(values.dimensions.height) + 'px';
      }
      return ok();
    }
    return null;
  }

  // ---------------------------------------------------------------------------
  // Data contexts, collections and attributes
  // ---------------------------------------------------------------------------

  function makeAttribute(spec) {
    return {
      id: newId(),
      name: String(spec.name),
      title: spec.title !== undefined ? String(spec.title) : String(spec.name),
      type: spec.type !== undefined ? String(spec.type) : '',
      formula: spec.formula ? String(spec.formula) : '',
      description: spec.description !== undefined ? String(spec.description) : '',
      unit: spec.unit !== undefined ? String(spec.unit) : '',
      precision: spec.precision !== undefined ? spec.precision : null,
      editable: spec.editable !== undefined ? !!spec.editable : true,
      hidden: spec.hidden !== undefined ? !!spec.hidden : false
    };
  }

  function attributeInfo(a) {
    return {
      name: a.name, title: a.title, id: a.id, type: a.type, formula: a.formula,
      description: a.description, unit: a.unit, precision: a.precision,
      editable: a.editable, hidden: a.hidden
    };
  }

  function collectionInfo(c) {
    return {
      name: c.name,
      title: c.title,
      id: c.id,
      description: c.description,
      parent: c.parent || undefined,
      attrs: c.attrs.map(attributeInfo)
    };
  }

  function dataContextInfo(dc) {
    return {
      name: dc.name,
      title: dc.title,
      id: dc.id,
      description: dc.description,
      collections: dc.collections.map(collectionInfo)
    };
  }

  /** Checks attribute specs; `taken` is a Set of names already used in the context. */
  function validateAttributeSpecs(specs, taken) {
    specs.forEach(function (spec) {
      if (!isObj(spec)) fail('attribute must be an object with a name');
      if (spec.name === undefined || spec.name === null || String(spec.name).trim() === '') {
        fail('attribute name required');
      }
      const name = String(spec.name);
      if (taken.has(name)) fail('attribute already exists: ' + name);
      taken.add(name);
      if (spec.formula) {
        try { compileFormula(spec.formula); } catch (e) { /* kept; its values become "" */ }
      }
    });
  }

  /**
   * Validates collection specs against a context (which may still be empty).
   * mode 'append': a collection without parent goes below the previous one
   * (used for the `collections` list of `create dataContext`); mode 'top': it
   * becomes the new top-level collection (used for `create ...collection`).
   */
  function validateCollectionSpecs(dc, specs) {
    const names = new Set(dc.collections.map(function (c) { return c.name; }));
    const attrNames = new Set(allAttributes(dc).map(function (a) { return a.name; }));
    specs.forEach(function (spec) {
      if (!isObj(spec)) fail('collection must be an object with a name');
      if (spec.name === undefined || spec.name === null || String(spec.name).trim() === '') {
        fail('collection name required');
      }
      const name = String(spec.name);
      if (names.has(name)) fail('collection already exists: ' + name);
      if (spec.parent !== undefined && spec.parent !== null && spec.parent !== '') {
        const p = String(spec.parent);
        const known = names.has(p) || dc.collections.some(function (c) { return String(c.id) === p; });
        if (!known) fail('parent collection not found: ' + p);
      }
      names.add(name);
      const attrs = spec.attrs !== undefined ? spec.attrs : spec.attributes;
      if (attrs !== undefined && !Array.isArray(attrs)) fail('attrs of collection ' + name + ' must be an array');
      validateAttributeSpecs(attrs || [], attrNames);
    });
  }

  function insertCollection(dc, spec, mode) {
    const col = {
      id: newId(),
      name: String(spec.name),
      title: spec.title !== undefined ? String(spec.title) : String(spec.name),
      description: spec.description !== undefined ? String(spec.description) : '',
      parent: null,
      attrs: []
    };
    const attrs = spec.attrs !== undefined ? spec.attrs : spec.attributes;
    (attrs || []).forEach(function (a) { col.attrs.push(makeAttribute(a)); });
    const hasParent = spec.parent !== undefined && spec.parent !== null && spec.parent !== '';
    if (hasParent) {
      const parent = findByNameOrId(dc.collections, spec.parent);
      dc.collections.splice(dc.collections.indexOf(parent) + 1, 0, col);
    } else if (mode === 'append') {
      dc.collections.push(col);
    } else {
      dc.collections.unshift(col);
    }
    relinkCollections(dc);
    // Existing items get "" for the new stored attributes.
    dc.items.forEach(function (item) {
      col.attrs.forEach(function (a) { if (!a.formula) item.values[a.name] = ''; });
    });
    return col;
  }

  function handleDataContextList(action) {
    if (action !== 'get') return null;
    return ok(model.dataContexts.map(function (dc) { return { name: dc.name, title: dc.title, id: dc.id }; }));
  }

  function createDataContext(values, batch) {
    if (!isObj(values)) fail('create dataContext needs an object of values');
    if (values.name === undefined || values.name === null || String(values.name).trim() === '') {
      fail('dataContext name required');
    }
    const name = String(values.name);
    if (model.dataContexts.some(function (d) { return d.name === name; })) {
      fail('dataContext already exists: ' + name);
    }
    const specs = values.collections === undefined ? [] : values.collections;
    if (!Array.isArray(specs)) fail('collections must be an array');
    const dc = {
      id: newId(),
      name: name,
      title: values.title !== undefined ? String(values.title) : name,
      description: values.description !== undefined ? String(values.description) : '',
      collections: [],
      items: [],
      selectedItemIDs: []
    };
    validateCollectionSpecs(dc, specs);
    specs.forEach(function (spec) { insertCollection(dc, spec, 'append'); });
    model.dataContexts.push(dc);
    buildView(dc);
    documentChanged(batch, 'dataContextCountChanged');
    return ok({ name: dc.name, id: dc.id, title: dc.title });
  }

  function handleDataContext(action, dcKey, rest, values, batch) {
    if (dcKey === undefined) {
      if (rest.length === 0 && action === 'create') return createDataContext(values, batch);
      return null;
    }
    const dc = findDataContext(dcKey);
    if (rest.length === 0) {
      if (action === 'get') return ok(dataContextInfo(dc));
      if (action === 'update') {
        if (!isObj(values)) fail('update dataContext needs an object of values');
        if (values.title !== undefined) dc.title = String(values.title);
        if (values.description !== undefined) dc.description = String(values.description);
        changed(batch, dc, 'updateDataContext');
        return ok();
      }
      if (action === 'delete') {
        model.dataContexts.splice(model.dataContexts.indexOf(dc), 1);
        caseIdState.delete(dc.id);
        // As in CODAP, the tables, graphs and maps showing it close with it.
        model.components = model.components.filter(function (c) { return c.dataContext !== dc.name; });
        documentChanged(batch, 'dataContextCountChanged');
        return ok();
      }
      return null;
    }
    const head = rest[0];
    const tail = rest.slice(1);
    switch (head.type) {
      case 'collectionList':
        if (action !== 'get' || head.key !== undefined || tail.length) return null;
        return ok(dc.collections.map(function (c) { return { name: c.name, title: c.title, id: c.id }; }));
      case 'collection':
        return handleCollection(action, dc, head.key, tail, values, batch);
      case 'item': case 'itemByID': case 'itemSearch': case 'itemCount':
        if (tail.length) return null;
        return handleItems(action, dc, head, values, batch);
      case 'selectionList':
        if (tail.length || head.key !== undefined) return null;
        return handleSelection(action, dc, values, batch);
      default:
        return null;
    }
  }

  function handleCollection(action, dc, colKey, rest, values, batch) {
    if (colKey === undefined) {
      if (rest.length || action !== 'create') return null;
      if (values === undefined || values === null) fail('create collection needs values');
      const specs = asList(values);
      validateCollectionSpecs(dc, specs);
      const created = specs.map(function (spec) { return insertCollection(dc, spec, 'top'); });
      changed(batch, dc, 'createCollection');
      return ok(created.map(function (c) { return { name: c.name, id: c.id }; }));
    }
    const col = findCollection(dc, colKey);
    if (rest.length === 0) {
      if (action === 'get') return ok(collectionInfo(col));
      if (action === 'update') {
        if (!isObj(values)) fail('update collection needs an object of values');
        if (values.name !== undefined && String(values.name) !== col.name) {
          const newName = String(values.name);
          if (dc.collections.some(function (c) { return c.name === newName; })) fail('collection already exists: ' + newName);
          col.name = newName;
          relinkCollections(dc);
        }
        if (values.title !== undefined) col.title = String(values.title);
        if (values.description !== undefined) col.description = String(values.description);
        changed(batch, dc, 'updateCollection');
        return ok();
      }
      if (action === 'delete') {
        deleteCollection(dc, col);
        changed(batch, dc, 'deleteCollection');
        return ok();
      }
      return null;
    }
    const head = rest[0];
    const tail = rest.slice(1);
    if (tail.length) return null;
    switch (head.type) {
      case 'attributeList':
        if (action !== 'get' || head.key !== undefined) return null;
        return ok(col.attrs.map(function (a) { return { name: a.name, title: a.title, id: a.id }; }));
      case 'attribute':
        return handleAttribute(action, dc, col, head.key, values, batch);
      case 'caseCount': case 'caseByIndex': case 'caseByID': case 'caseSearch': case 'allCases': case 'case':
        return handleCases(action, dc, col, head, values, batch);
      default:
        return null;
    }
  }

  function deleteCollection(dc, col) {
    dc.collections.splice(dc.collections.indexOf(col), 1);
    relinkCollections(dc);
    if (dc.collections.length === 0) {
      dc.items = [];
      dc.selectedItemIDs = [];
    } else {
      dc.items.forEach(function (item) {
        col.attrs.forEach(function (a) { delete item.values[a.name]; });
      });
    }
  }

  function handleAttribute(action, dc, col, attrKey, values, batch) {
    if (attrKey === undefined) {
      if (action !== 'create') return null;
      if (values === undefined || values === null) fail('create attribute needs values');
      const specs = asList(values);
      validateAttributeSpecs(specs, new Set(allAttributes(dc).map(function (a) { return a.name; })));
      const created = specs.map(function (spec) {
        const a = makeAttribute(spec);
        col.attrs.push(a);
        if (!a.formula) dc.items.forEach(function (item) { item.values[a.name] = ''; });
        return a;
      });
      changed(batch, dc, 'createAttributes');
      return ok({ attrs: created.map(attributeInfo) });
    }
    const attr = findAttribute(col, attrKey);
    if (action === 'get') return ok(attributeInfo(attr));
    if (action === 'update') {
      if (!isObj(values)) fail('update attribute needs an object of values');
      updateAttribute(dc, col, attr, values);
      changed(batch, dc, 'updateAttributes');
      return ok({ attrs: [attributeInfo(attr)] });
    }
    if (action === 'delete') {
      col.attrs.splice(col.attrs.indexOf(attr), 1);
      dc.items.forEach(function (item) { delete item.values[attr.name]; });
      // As in CODAP, a collection left without attributes disappears (unless it is the only one).
      if (col.attrs.length === 0 && dc.collections.length > 1) deleteCollection(dc, col);
      changed(batch, dc, 'deleteAttributes');
      return ok();
    }
    return null;
  }

  function updateAttribute(dc, col, attr, values) {
    if (values.name !== undefined && String(values.name) !== attr.name) {
      const newName = String(values.name);
      if (newName.trim() === '') fail('attribute name required');
      if (findAttributeInDC(dc, newName)) fail('attribute already exists: ' + newName);
      dc.items.forEach(function (item) {
        if (Object.prototype.hasOwnProperty.call(item.values, attr.name)) {
          item.values[newName] = item.values[attr.name];
          delete item.values[attr.name];
        }
      });
      // Formulas and graphs that refer to the old name follow the rename (as in CODAP).
      allAttributes(dc).forEach(function (a) {
        if (a.formula) a.formula = renameInFormula(a.formula, attr.name, newName);
      });
      model.components.forEach(function (c) {
        if (c.dataContext !== dc.name) return;
        GRAPH_ATTRS.forEach(function (k) { if (c[k] === attr.name) c[k] = newName; });
      });
      if (attr.title === attr.name && values.title === undefined) attr.title = newName;
      attr.name = newName;
    }
    if (values.formula !== undefined) {
      const newFormula = values.formula ? String(values.formula) : '';
      if (attr.formula && !newFormula) {
        // Removing a formula keeps the computed values as stored values (as CODAP does).
        const view = buildView(dc);
        const level = levelOf(dc, col);
        const computed = dc.items.map(function (item) { return view.valueOf(attr, level, item); });
        dc.items.forEach(function (item, i) { item.values[attr.name] = computed[i]; });
      } else if (newFormula) {
        dc.items.forEach(function (item) { delete item.values[attr.name]; });
      }
      attr.formula = newFormula;
    }
    ['title', 'type', 'description', 'unit'].forEach(function (k) {
      if (values[k] !== undefined) attr[k] = String(values[k]);
    });
    if (values.precision !== undefined) attr.precision = values.precision;
    if (values.editable !== undefined) attr.editable = !!values.editable;
    if (values.hidden !== undefined) attr.hidden = !!values.hidden;
  }

  // ---------------------------------------------------------------------------
  // Items (flat rows; stored values only, formula values are computed)
  // ---------------------------------------------------------------------------

  function itemSpecValues(dc, spec, index) {
    if (!isObj(spec)) fail('item ' + index + ' must be an object of attribute values');
    const keys = Object.keys(spec);
    if (isObj(spec.values) && keys.every(function (k) { return k === 'values' || k === 'id'; }) &&
        !findAttributeInDC(dc, 'values')) {
      return spec.values; // {values: {...}} form
    }
    return spec;
  }

  function makeItem(dc, given) {
    const item = { id: newId(), values: {} };
    allAttributes(dc).forEach(function (a) {
      if (a.formula) return;
      item.values[a.name] = Object.prototype.hasOwnProperty.call(given, a.name) ? storedValue(given[a.name]) : '';
    });
    return item;
  }

  /** Applies {attr: value} to an item; formula and unknown attributes are ignored. */
  function applyItemValues(dc, item, given, allowed) {
    Object.keys(given).forEach(function (name) {
      const a = findAttributeInDC(dc, name);
      if (!a || a.formula) return;
      if (allowed && allowed.indexOf(a) < 0) return;
      item.values[name] = storedValue(given[name]);
    });
  }

  function findItemByID(dc, key) {
    const n = Number(key);
    const item = dc.items.find(function (it) { return it.id === n; });
    if (!item) fail('item not found: ' + key);
    return item;
  }

  function findItemByIndex(dc, key) {
    const s = String(key).trim();
    if (!/^\d+$/.test(s)) fail('item index must be a non-negative integer: ' + key);
    const item = dc.items[Number(s)];
    if (!item) fail('item index out of range: ' + key);
    return item;
  }

  function deleteItems(dc, items) {
    const ids = new Set(items.map(function (it) { return it.id; }));
    dc.items = dc.items.filter(function (it) { return !ids.has(it.id); });
    dc.selectedItemIDs = dc.selectedItemIDs.filter(function (id) { return !ids.has(id); });
    return items.map(function (it) { return it.id; });
  }

  function itemSearch(dc, query) {
    const parsed = parseQuery(query);
    const view = buildView(dc);
    if (parsed && !view.attrs[parsed.attr]) fail('attribute not found: ' + parsed.attr);
    return { view: view, items: dc.items.filter(function (item) {
      return matchesQuery(parsed, function (name) {
        const e = view.attrs[name];
        return view.valueOf(e.attr, e.level, item);
      });
    }) };
  }

  function handleItems(action, dc, head, values, batch) {
    const type = head.type;
    const key = head.key;

    if (type === 'itemCount') {
      if (action !== 'get' || key !== undefined) return null;
      return ok(dc.items.length);
    }

    if (type === 'item' && key === undefined) {
      if (action === 'create') {
        if (values === undefined || values === null) fail('create item needs values');
        const specs = asList(values).map(function (spec, i) { return itemSpecValues(dc, spec, i); });
        const items = specs.map(function (given) { return makeItem(dc, given); });
        items.forEach(function (it) { dc.items.push(it); });
        const view = buildView(dc);
        changed(batch, dc, 'createCases');
        const leaf = view.leafLevel;
        return ok({
          itemIDs: items.map(function (it) { return it.id; }),
          caseIDs: leaf >= 0 ? items.map(function (it) { return view.itemCases[it.id][leaf].id; }) : []
        });
      }
      if (action === 'update') {
        if (values === undefined || values === null) fail('update item needs values');
        const updates = asList(values).map(function (u, i) {
          if (!isObj(u) || u.id === undefined) fail('item update ' + i + ' needs an id');
          return { item: findItemByID(dc, u.id), values: isObj(u.values) ? u.values : {} };
        });
        updates.forEach(function (u) { applyItemValues(dc, u.item, u.values); });
        changed(batch, dc, 'updateCases');
        return ok();
      }
      return null;
    }

    if (type === 'item' || type === 'itemByID') {
      const item = type === 'item' ? findItemByIndex(dc, key) : findItemByID(dc, key);
      if (action === 'get') {
        const view = buildView(dc);
        return ok({ id: item.id, values: view.itemValues(item) });
      }
      if (action === 'update') {
        if (!isObj(values)) fail('update item needs an object of attribute values');
        const given = isObj(values.values) && !findAttributeInDC(dc, 'values') ? values.values : values;
        applyItemValues(dc, item, given);
        changed(batch, dc, 'updateCases');
        return ok();
      }
      if (action === 'delete') {
        deleteItems(dc, [item]);
        changed(batch, dc, 'deleteCases');
        return ok();
      }
      return null;
    }

    if (type === 'itemSearch') {
      if (action === 'get') {
        const found = itemSearch(dc, key);
        return ok(found.items.map(function (item) { return { id: item.id, values: found.view.itemValues(item) }; }));
      }
      if (action === 'delete') {
        const found = itemSearch(dc, key);
        const ids = deleteItems(dc, found.items);
        if (ids.length) changed(batch, dc, 'deleteCases');
        return ok(ids);
      }
      return null;
    }
    return null;
  }

  // ---------------------------------------------------------------------------
  // Cases (derived per collection from the items)
  // ---------------------------------------------------------------------------

  function parseCaseUpdates(values) {
    if (values === undefined || values === null) fail('update case needs values');
    return asList(values).map(function (u, i) {
      if (!isObj(u) || u.id === undefined) fail('case update ' + i + ' needs an id');
      if (!isObj(u.values)) fail('case update ' + i + ' needs values');
      return u;
    });
  }

  function handleCases(action, dc, col, head, values, batch) {
    const view = buildView(dc);
    const level = levelOf(dc, col);
    const cases = view.levels[level] || [];
    const type = head.type;
    const key = head.key;

    if (type === 'caseCount') {
      if (action !== 'get' || key !== undefined) return null;
      return ok(cases.length);
    }

    if (type === 'caseByIndex') {
      if (action !== 'get') return null;
      const s = String(key === undefined ? '' : key).trim();
      if (!/^\d+$/.test(s)) fail('case index must be a non-negative integer: ' + key);
      const g = cases[Number(s)];
      if (!g) fail('case index out of range: ' + key);
      return ok({ case: view.caseObject(g), caseIndex: Number(s) });
    }

    if (type === 'caseByID') {
      if (key === undefined) return null;
      // Look in this collection first, then anywhere in the context (CODAP is lenient too).
      const g = view.byId.get(Number(key));
      if (!g) fail('case not found: ' + key);
      if (action === 'get') return ok({ case: view.caseObject(g), caseIndex: view.caseIndex(g) });
      if (action === 'update') {
        if (!isObj(values)) fail('update case needs values');
        const given = isObj(values.values) ? values.values : values;
        applyCaseValues(dc, g, given);
        changed(batch, dc, 'updateCases');
        return ok();
      }
      if (action === 'delete') {
        deleteItems(dc, g.items);
        changed(batch, dc, 'deleteCases');
        return ok();
      }
      return null;
    }

    if (type === 'caseSearch') {
      if (action !== 'get') return null;
      const parsed = parseQuery(key);
      if (parsed) {
        const e = view.attrs[parsed.attr];
        if (!e || e.level > level) fail('attribute not found: ' + parsed.attr);
      }
      return ok(cases
        .filter(function (g) { return matchesQuery(parsed, view.caseLookup(g)); })
        .map(view.caseObject));
    }

    if (type === 'allCases') {
      if (key !== undefined) return null;
      if (action === 'get') {
        return ok({
          collection: { name: col.name, id: col.id },
          cases: cases.map(function (g, i) { return { case: view.caseObject(g), caseIndex: i }; })
        });
      }
      if (action === 'delete') {
        const items = [];
        cases.forEach(function (g) { g.items.forEach(function (it) { items.push(it); }); });
        deleteItems(dc, items);
        changed(batch, dc, 'deleteCases');
        return ok();
      }
      return null;
    }

    if (type === 'case' && key === undefined) {
      if (action === 'update') {
        const updates = parseCaseUpdates(values).map(function (u) {
          return { group: view.findCase(u.id), values: u.values };
        });
        updates.forEach(function (u) { applyCaseValues(dc, u.group, u.values); });
        changed(batch, dc, 'updateCases');
        return ok();
      }
      if (action === 'create') {
        // Creates one item per case: its values plus those of its parent case.
        if (values === undefined || values === null) fail('create case needs values');
        const specs = asList(values).map(function (spec, i) {
          if (!isObj(spec)) fail('case ' + i + ' must be an object');
          let base = {};
          if (spec.parent !== undefined && spec.parent !== null) {
            const parent = view.byId.get(Number(spec.parent));
            if (!parent || parent.level !== level - 1) fail('parent case not found: ' + spec.parent);
            base = clone(parent.items[0].values);
            dc.collections.slice(level).forEach(function (c) {
              c.attrs.forEach(function (a) { delete base[a.name]; });
            });
          }
          const own = isObj(spec.values) ? spec.values : {};
          col.attrs.forEach(function (a) {
            if (Object.prototype.hasOwnProperty.call(own, a.name)) base[a.name] = own[a.name];
          });
          return base;
        });
        const items = specs.map(function (given) { return makeItem(dc, given); });
        items.forEach(function (it) { dc.items.push(it); });
        const after = buildView(dc);
        changed(batch, dc, 'createCases');
        return ok(items.map(function (it) {
          return { id: after.itemCases[it.id][level].id, itemID: it.id };
        }));
      }
      return null;
    }
    return null;
  }

  /** Sets a case's own attribute values on every item of the case. */
  function applyCaseValues(dc, g, given) {
    g.items.forEach(function (item) { applyItemValues(dc, item, given, g.collection.attrs); });
  }

  // ---------------------------------------------------------------------------
  // Selection (stored per item, as in CODAP v3: a case is selected when all
  // of its items are; selecting a parent case selects its children)
  // ---------------------------------------------------------------------------

  function selectionList(dc) {
    const view = buildView(dc);
    const selected = new Set(dc.selectedItemIDs);
    const out = [];
    view.levels.forEach(function (cases) {
      cases.forEach(function (g) {
        if (g.items.length && g.items.every(function (it) { return selected.has(it.id); })) {
          out.push({ collectionName: g.collection.name, collectionID: g.collection.id, caseID: g.id });
        }
      });
    });
    return out;
  }

  function handleSelection(action, dc, values, batch) {
    if (action === 'get') return ok(selectionList(dc));
    if (action === 'create' || action === 'update') {
      if (values === undefined || values === null) fail('selectionList needs an array of case ids');
      const view = buildView(dc);
      const ids = asList(values).map(function (v) {
        const n = Number(isObj(v) ? (v.caseID !== undefined ? v.caseID : v.id) : v);
        if (!isFinite(n)) fail('invalid case id: ' + JSON.stringify(v));
        return n;
      });
      const itemIds = action === 'create' ? new Set() : new Set(dc.selectedItemIDs);
      ids.forEach(function (id) {
        const g = view.byId.get(id);
        if (g) g.items.forEach(function (it) { itemIds.add(it.id); });
      });
      dc.selectedItemIDs = dc.items.map(function (it) { return it.id; }).filter(function (id) { return itemIds.has(id); });
      changed(batch, dc, 'selectCases');
      return ok();
    }
    return null;
  }

  // ---------------------------------------------------------------------------
  // Globals (slider values)
  // ---------------------------------------------------------------------------

  function findGlobal(key) {
    const g = findByNameOrId(model.globals, key);
    if (!g) fail('global not found: ' + key);
    return g;
  }

  function globalValueOf(v, fallback) {
    if (v === undefined || v === null || v === '') return fallback;
    const n = toNumber(v);
    if (isNaN(n)) fail('global value must be a number: ' + v);
    return n;
  }

  function setGlobalValue(g, value) {
    g.value = value;
    model.components.forEach(function (c) {
      if (c.type === 'slider' && c.globalValueName === g.name) c.value = value;
    });
  }

  function handleGlobal(action, key, values) {
    if (key === undefined) {
      if (action !== 'create') return null;
      if (!isObj(values) || values.name === undefined || String(values.name).trim() === '') fail('global name required');
      const name = String(values.name);
      if (model.globals.some(function (g) { return g.name === name; })) fail('global already exists: ' + name);
      const g = { id: newId(), name: name, value: globalValueOf(values.value, 0) };
      model.globals.push(g);
      return ok({ name: g.name, value: g.value, id: g.id });
    }
    const g = findGlobal(key);
    if (action === 'get') return ok({ name: g.name, value: g.value, id: g.id });
    if (action === 'update') {
      if (!isObj(values) || values.value === undefined) fail('update global needs {value}');
      setGlobalValue(g, globalValueOf(values.value, 0));
      return ok();
    }
    return null;
  }

  // ---------------------------------------------------------------------------
  // Components: caseTable, graph, map, slider, text, webView
  // ---------------------------------------------------------------------------

  const COMPONENT_TYPES = ['caseTable', 'graph', 'map', 'slider', 'text', 'webView'];
  const GRAPH_ATTRS = ['xAttributeName', 'yAttributeName', 'y2AttributeName', 'legendAttributeName'];

  function findComponent(key) {
    const c = findByNameOrId(model.components, key);
    if (!c) fail('component not found: ' + key);
    return c;
  }

  function componentInfo(c) {
    return { id: c.id, name: c.name, title: c.title, type: c.type };
  }

  // A graph's size when it is made without one (CODAP gives every component one).
  const GRAPH_SIZE = { width: 640, height: 480 };

  /** Validates a component's data context, size and graph attributes (after merging). */
  function validateComponent(c) {
    if (c.dimensions !== undefined) {
      const d = c.dimensions;
      if (!isObj(d) || !(toNumber(d.width) >= 1) || !(toNumber(d.height) >= 1) || toNumber(d.width) > 8000 || toNumber(d.height) > 8000) {
        fail('dimensions need a width and a height of 1 to 8000 pixels');
      }
      c.dimensions = { width: Math.round(toNumber(d.width)), height: Math.round(toNumber(d.height)) };
    }
    let dc = null;
    if (c.dataContext !== undefined && c.dataContext !== null && c.dataContext !== '') {
      dc = findDataContext(c.dataContext);
      c.dataContext = dc.name;
    } else if (c.type === 'caseTable') {
      fail('dataContext required for caseTable');
    }
    if (c.type === 'graph') {
      GRAPH_ATTRS.forEach(function (k) {
        const name = c[k];
        if (name === undefined || name === null || name === '') return;
        if (!dc) fail('dataContext required for graph attribute ' + k);
        if (!findAttributeInDC(dc, String(name))) fail('attribute not found: ' + name);
      });
    }
    return dc;
  }

  function createComponent(values) {
    if (!isObj(values)) fail('create component needs an object of values');
    const type = values.type;
    if (COMPONENT_TYPES.indexOf(type) < 0) fail('Unsupported component type: ' + type);
    const c = clone(values);
    c.id = newId();
    if (type === 'graph' && c.dimensions === undefined) c.dimensions = clone(GRAPH_SIZE);
    if (type === 'slider') {
      const name = values.name !== undefined && String(values.name).trim() !== '' ? String(values.name)
        : 'v' + (model.globals.length + 1);
      if (model.globals.some(function (g) { return g.name === name; })) fail('global already exists: ' + name);
      c.name = name;
      c.globalValueName = name;
      c.lowerBound = globalValueOf(values.lowerBound, 0);
      c.upperBound = globalValueOf(values.upperBound, 12);
      c.value = globalValueOf(values.value, 0.5);
      if (c.title === undefined) c.title = name;
    }
    const dc = validateComponent(c);
    if (c.name === undefined || c.name === null || c.name === '') {
      c.name = type === 'caseTable' ? dc.name : type + '-' + c.id;
    }
    c.name = String(c.name);
    if (c.title === undefined || c.title === null) {
      c.title = type === 'caseTable' ? dc.title : type === 'graph' ? 'Graph'
        : type === 'map' ? 'Map' : type === 'text' ? 'Text' : c.name;
    }
    if (type === 'text' && c.text === undefined) c.text = '';
    if (type === 'slider') {
      model.globals.push({ id: newId(), name: c.name, value: c.value });
    }
    model.components.push(c);
    return ok(componentInfo(c));
  }

  function handleComponent(action, key, values) {
    if (key === undefined) {
      if (action === 'create') return createComponent(values);
      return null;
    }
    const c = findComponent(key);
    if (action === 'get') return ok(c.type === 'graph' ? Object.assign(clone(c), { plotType: plotType(c) }) : clone(c));
    if (action === 'update') {
      if (!isObj(values)) fail('update component needs an object of values');
      if (values.type !== undefined && values.type !== c.type) fail('component type cannot be changed');
      const merged = Object.assign(clone(c), clone(values));
      merged.id = c.id;
      validateComponent(merged);
      if (c.type === 'slider') {
        const g = model.globals.find(function (x) { return x.name === c.globalValueName; });
        if (merged.name !== c.name) {
          if (model.globals.some(function (x) { return x.name === merged.name && x !== g; })) {
            fail('global already exists: ' + merged.name);
          }
        }
        merged.value = globalValueOf(merged.value, 0);
        if (g) {
          g.name = String(merged.name);
          merged.globalValueName = g.name;
          setGlobalValue(g, merged.value);
        }
      }
      Object.keys(c).forEach(function (k) { delete c[k]; });
      Object.assign(c, merged);
      return ok();
    }
    if (action === 'delete') {
      model.components.splice(model.components.indexOf(c), 1);
      if (c.type === 'slider') {
        model.globals = model.globals.filter(function (g) { return g.name !== c.globalValueName; });
      }
      return ok();
    }
    return null;
  }

  // ---------------------------------------------------------------------------
  // dataDisplay: a PNG of a graph, drawn on a canvas
  // ---------------------------------------------------------------------------

  /** Whether attribute `name` of `dc` holds numbers (its type, else its values). */
  function isNumeric(dc, name) {
    const attr = findAttributeInDC(dc, name);
    if (!attr) return false;
    if (attr.type) return attr.type === 'numeric';
    const view = buildView(dc);
    const entry = view.attrs[name];
    const values = dc.items.map(function (item) { return view.valueOf(entry.attr, entry.level, item); })
      .filter(function (v) { return v !== '' && v !== null && v !== undefined; });
    return values.length > 0 && values.every(function (v) { return !isNaN(toNumber(v)); });
  }

  /** CODAP v3's plot type for a graph's axes (graph-types.ts PlotTypes). */
  function plotType(c) {
    const dc = c.dataContext ? findByNameOrId(model.dataContexts, c.dataContext) : null;
    const x = dc && c.xAttributeName ? (isNumeric(dc, c.xAttributeName) ? 'n' : 'c') : '';
    const y = dc && c.yAttributeName ? (isNumeric(dc, c.yAttributeName) ? 'n' : 'c') : '';
    if (x === 'n' && y === 'n') return 'scatterPlot';
    if (x === 'n' || y === 'n') return 'dotPlot';
    if (x || y) return 'dotChart';
    return 'casePlot';
  }

  /**
   * A real PNG of the graph at its size (`dimensions`), as CODAP's exportDataUri: axes, their
   * names and the points, drawn on a canvas.
   */
  function graphImage(c) {
    const width = c.dimensions.width;
    const height = c.dimensions.height;
    const canvas = document.createElement('canvas');
    canvas.width = width;
    canvas.height = height;
    const g = canvas.getContext('2d');
    g.fillStyle = '#ffffff';
    g.fillRect(0, 0, width, height);
    g.strokeStyle = '#333333';
    g.lineWidth = 1;
    const left = Math.min(40, width / 4), top = Math.min(20, height / 8);
    const right = width - Math.min(15, width / 10), bottom = height - Math.min(35, height / 5);
    g.beginPath();
    g.moveTo(left, top);
    g.lineTo(left, bottom);
    g.lineTo(right, bottom);
    g.stroke();
    g.fillStyle = '#333333';
    g.font = '11px sans-serif';
    if (c.xAttributeName) g.fillText(String(c.xAttributeName), (left + right) / 2 - 20, height - 10);
    if (c.yAttributeName) g.fillText(String(c.yAttributeName), 4, Math.max(11, top - 6));

    const dc = c.dataContext ? findByNameOrId(model.dataContexts, c.dataContext) : null;
    if (dc && (c.xAttributeName || c.yAttributeName)) {
      const view = buildView(dc);
      const xa = c.xAttributeName ? view.attrs[c.xAttributeName] : null;
      const ya = c.yAttributeName ? view.attrs[c.yAttributeName] : null;
      const points = [];
      dc.items.forEach(function (item) {
        const x = xa ? toNumber(view.valueOf(xa.attr, xa.level, item)) : 0;
        const y = ya ? toNumber(view.valueOf(ya.attr, ya.level, item)) : 0;
        if (!isNaN(x) && !isNaN(y)) points.push([x, y]);
      });
      const range = function (vals) {
        let lo = vals.reduce(function (a, b) { return Math.min(a, b); });
        let hi = vals.reduce(function (a, b) { return Math.max(a, b); });
        if (lo === hi) { lo -= 1; hi += 1; }
        return [lo, hi];
      };
      if (points.length) {
        const xr = range(points.map(function (p) { return p[0]; }));
        const yr = range(points.map(function (p) { return p[1]; }));
        g.fillStyle = '#e6805b';
        points.forEach(function (p) {
          const px = left + 8 + (p[0] - xr[0]) / (xr[1] - xr[0]) * (right - left - 16);
          const py = bottom - 8 - (p[1] - yr[0]) / (yr[1] - yr[0]) * (bottom - top - 16);
          g.beginPath();
          g.arc(px, py, 4, 0, 2 * Math.PI);
          g.fill();
        });
      }
    }
    return canvas.toDataURL('image/png');
  }

  function handleDataDisplay(action, key) {
    if (action !== 'get' || key === undefined) return null;
    const c = findComponent(key);
    // CODAP v3 (data-display-handler.ts) answers a component that has no picture without
    // `success` at all: only `values: {error}`.
    if (c.type !== 'graph') return { values: { error: 'Data display not found' } };
    return ok({ exportDataUri: graphImage(c) });
  }

  // ---------------------------------------------------------------------------
  // formulaEngine: evalExpression over given records
  // ---------------------------------------------------------------------------

  function handleFormulaEngine(action, values) {
    if (action !== 'notify') return null;
    if (!isObj(values) || values.request !== 'evalExpression') {
      fail('formulaEngine supports only {request: "evalExpression", source, records}');
    }
    if (values.source === undefined || values.source === null) fail('evalExpression needs a source');
    let ast;
    try {
      ast = compileFormula(values.source);
    } catch (e) {
      fail('formula error: ' + e.message);
    }
    const records = values.records === undefined ? [{}] : values.records;
    if (!Array.isArray(records)) fail('records must be an array');
    const recordCtx = function (record) {
      return {
        lookup: function (name) {
          if (isObj(record) && Object.prototype.hasOwnProperty.call(record, name)) {
            const v = record[name];
            return v === null || v === undefined ? '' : v;
          }
          return globalLookup(name);
        },
        scope: function () { return records.map(recordCtx); }
      };
    };
    return ok(records.map(function (record) {
      try {
        return normalizeResult(evaluateNode(ast, recordCtx(record)));
      } catch (e) {
        return '';
      }
    }));
  }

  // ---------------------------------------------------------------------------
  // Request dispatch
  // ---------------------------------------------------------------------------

  const ACTIONS = ['create', 'get', 'update', 'delete', 'notify'];

  function dispatch(request, batch) {
    if (!isObj(request)) fail('request must be an object {action, resource, values}');
    const action = request.action;
    const resource = request.resource;
    const values = request.values;
    if (typeof action !== 'string' || ACTIONS.indexOf(action) < 0) {
      fail('Unsupported action: ' + action);
    }
    const parts = parseResource(resource);
    const head = parts[0];
    const rest = parts.slice(1);
    let result = null;
    switch (head.type) {
      case 'interactiveFrame':
        if (head.key === undefined && !rest.length) result = handleInteractiveFrame(action, values);
        break;
      case 'dataContextList':
        if (head.key === undefined && !rest.length) result = handleDataContextList(action);
        break;
      case 'dataContext':
        result = handleDataContext(action, head.key, rest, values, batch);
        break;
      case 'componentList':
        if (action === 'get' && head.key === undefined && !rest.length) {
          result = ok(model.components.map(componentInfo));
        }
        break;
      case 'component':
        if (!rest.length) result = handleComponent(action, head.key, values);
        break;
      case 'dataDisplay':
        if (!rest.length) result = handleDataDisplay(action, head.key);
        break;
      case 'global':
        if (!rest.length) result = handleGlobal(action, head.key, values);
        break;
      case 'globalList':
        if (action === 'get' && head.key === undefined && !rest.length) {
          result = ok(model.globals.map(function (g) { return { name: g.name, value: g.value, id: g.id }; }));
        }
        break;
      case 'formulaEngine':
        if (head.key === undefined && !rest.length) result = handleFormulaEngine(action, values);
        break;
      default:
        break;
    }
    if (!result) fail('Unsupported resource: ' + resource);
    return result;
  }

  function handleOne(request, batch) {
    try {
      return dispatch(request, batch);
    } catch (e) {
      if (e instanceof ApiError) return errorResponse(e.message);
      return errorResponse('Internal error: ' + (e && e.message ? e.message : String(e)));
    }
  }

  // ---------------------------------------------------------------------------
  // Test-facing API on window.codap
  // ---------------------------------------------------------------------------

  const codap = {
    model: model,
    log: [],
    notifications: { sent: 0, acknowledged: 0, codapPresentAcknowledged: false, codapPresentResponse: null, list: [] },
    connected: false,
    pluginUrl: null,
    error: null,
    startError: null,
    answerDelayMs: 0,
    snapshot: snapshot,
    requestCount: requestCount,
    /**
     * Lets tests act as a CODAP user: runs a request directly (not logged, not
     * counted) and sends the plugin the resulting change notifications.
     */
    handleRequest: function (request) {
      const result = runRequest(request);
      result.notifications.forEach(sendNotification);
      return clone(result.response);
    }
  };
  window.codap = codap;

  /** Deep, JSON-serialisable copy of the model plus derived cases per collection. */
  function snapshot() {
    const snap = clone(model);
    snap.dataContexts.forEach(function (sdc, i) {
      const dc = model.dataContexts[i];
      const view = buildView(dc);
      sdc.cases = {};
      dc.collections.forEach(function (c, k) {
        sdc.cases[c.name] = view.levels[k].map(function (g) {
          return { id: g.id, parentId: g.parent ? g.parent.id : null, values: view.caseValues(g) };
        });
      });
      sdc.selection = clone(selectionList(dc));
    });
    return clone(snap);
  }

  /** How many requests (array elements counted one by one) match action and resource prefix. */
  function requestCount(action, resourcePrefix) {
    let n = 0;
    codap.log.forEach(function (entry) {
      asList(entry.request).forEach(function (r) {
        if (!isObj(r)) return;
        if (action !== undefined && action !== null && r.action !== action) return;
        if (resourcePrefix !== undefined && resourcePrefix !== null &&
            (typeof r.resource !== 'string' || r.resource.indexOf(resourcePrefix) !== 0)) return;
        n += 1;
      });
    });
    return n;
  }

  function runRequest(request) {
    const batch = [];
    let req = request;
    let response;
    try {
      if (typeof req === 'string') {
        try { req = JSON.parse(req); } catch (e) { /* handled below as invalid */ }
      }
      response = Array.isArray(req)
        ? req.map(function (r) { return handleOne(r, batch); })
        : handleOne(req, batch);
    } catch (e) {
      response = errorResponse('Internal error: ' + (e && e.message ? e.message : String(e)));
    }
    return { response: response, notifications: batch };
  }

  // ---------------------------------------------------------------------------
  // Connection to the plugin through iframe-phone
  // ---------------------------------------------------------------------------

  let rpc = null;
  let iframeEl = null;
  let codapPresentSent = false;

  function sendNotification(message) {
    if (!rpc) return;
    const record = { message: clone(message), acknowledged: false, response: null, timedOut: false, at: Date.now() };
    codap.notifications.list.push(record);
    codap.notifications.sent += 1;
    rpc.call(message, function (response) {
      if (response === undefined) { record.timedOut = true; return; }
      record.response = clone(response);
      if (response && response.success === true && !record.acknowledged) {
        record.acknowledged = true;
        codap.notifications.acknowledged += 1;
      }
      updateStatus();
    });
  }

  function onConnected() {
    codap.connected = true;
    updateStatus();
    if (codapPresentSent || !rpc) return;
    codapPresentSent = true;
    rpc.call({ message: 'codap-present' }, function (response) {
      if (response === undefined) return; // iframe-phone timeout; a late answer still counts
      codap.notifications.codapPresentResponse = clone(response);
      if (response && response.success === true) codap.notifications.codapPresentAcknowledged = true;
      updateStatus();
    });
  }

  function handlePluginRequest(request, callback) {
    onConnected();
    const result = runRequest(request);
    codap.log.push({ request: clone(request), response: clone(result.response), at: Date.now() });
    updateStatus();
    const answer = function () {
      callback(result.response);
      result.notifications.forEach(sendNotification);
    };
    // A CODAP busy with a big document answers late (the change is made at once).
    if (codap.answerDelayMs > 0) setTimeout(answer, codap.answerDelayMs);
    else answer();
  }

  let statusEl = null;
  function updateStatus() {
    if (!statusEl) return;
    statusEl.textContent = (codap.connected ? 'connected' : 'waiting for plugin') +
      ' · requests: ' + codap.log.length +
      ' · data contexts: ' + model.dataContexts.length +
      ' · components: ' + model.components.length +
      (codap.error ? ' · error: ' + codap.error : '');
  }

  /**
   * `?storage=blocked`: this browser keeps no storage for frames of other sites. Embedded in
   * another site's page, `localStorage` then throws (as Chromium's does when third-party storage
   * is blocked); the real CODAP reads it while starting, so it stops there: it never loads the
   * plugin and never sends it a message (a grey box). As a tab of its own it has storage.
   * (Without the parameter the stand-in carries on where the browser itself gives it no
   * storage, so the plugin's own behaviour there can be tested.) Says whether it blocked.
   */
  function blockThirdPartyStorage(params) {
    if (params.get('storage') !== 'blocked' || window.top === window) return false;
    Object.defineProperty(window, 'localStorage', {
      configurable: true,
      get: function () {
        throw new DOMException("Failed to read the 'localStorage' property from 'Window': Access is denied for this document.", 'SecurityError');
      }
    });
    return true;
  }

  /** What the real CODAP reads first while starting: its saved preferences. */
  function readPreferences() {
    return window.localStorage.getItem('codap-preferences');
  }

  function start() {
    statusEl = document.getElementById('status');
    const params = new URLSearchParams(window.location.search);
    if (blockThirdPartyStorage(params)) {
      try {
        readPreferences();
      } catch (e) {
        // Left uncaught in CODAP: nothing after this runs. Noted for tests, then thrown on.
        codap.startError = e.name + ': ' + e.message;
        throw e;
      }
    }
    const di = params.get('di');
    if (!di) {
      codap.error = 'no ?di=<plugin URL> given';
      updateStatus();
      return;
    }
    let pluginUrl;
    try {
      pluginUrl = new URL(di, window.location.href);
    } catch (e) {
      codap.error = 'invalid di URL: ' + di;
      updateStatus();
      return;
    }
    codap.pluginUrl = pluginUrl.href;
    if (typeof window.iframePhone === 'undefined') {
      codap.error = 'iframe-phone library not loaded';
      updateStatus();
      return;
    }
    const container = document.getElementById('plugin-container') || document.body;
    iframeEl = document.createElement('iframe');
    iframeEl.id = 'plugin';
    iframeEl.setAttribute('allow', 'clipboard-read; clipboard-write');
    iframeEl.style.width = model.interactiveFrame.dimensions.width + 'px';
    iframeEl.style.height = model.interactiveFrame.dimensions.height + 'px';
    iframeEl.style.border = '1px solid #999';
    iframeEl.src = pluginUrl.href;
    container.appendChild(iframeEl);

    // Create the endpoint right away so the plugin's first "hello" is answered.
    const phone = new window.iframePhone.ParentEndpoint(iframeEl.contentWindow, pluginUrl.origin, onConnected);
    rpc = new window.iframePhone.IframePhoneRpcEndpoint(
      handlePluginRequest, 'data-interactive', iframeEl.contentWindow, pluginUrl.origin, phone);
    updateStatus();
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
