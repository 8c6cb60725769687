// The plugin page: pairing banner, connection, activity, and the glue between the relay
// (transport.js), the tools (dispatcher.js, tools.js) and CODAP (codap.js).

import { CodapLink } from './codap.js';
import { Dispatcher, ToolError } from './dispatcher.js';
import { Sessions } from './session.js';
import { codapTools } from './tools.js';
import { Transport } from './transport.js';

const VERSION = '1.1.0';
const ACTIVITY_SHOWN = 20;
// The plugin talks to the relay that served it; assistants are given the relay's public
// address (PUBLIC_BASE_URL, from its discovery document), which differs behind a proxy.
const BASE = location.origin;
let publicBase = BASE;
// The last hour of a session's maximum lifetime gets a warning.
const LIFETIME_WARNING_MS = 60 * 60 * 1000;
// How long a button says "Copied".
const COPIED_MS = 1500;
// Which kind of assistant the connect instructions show first.
const KIND_KEY = 'toolrelay-assistant-kind';

const $ = (id) => document.getElementById(id);
const ui = {
  code: $('code'),
  countdown: $('countdown'),
  dot: $('dot'),
  linkLabel: $('link-label'),
  outside: $('outside'),
  announcer: $('announcer'),
  activity: $('activity'),
  noActivity: $('no-activity'),
  confirm: $('confirm'),
  held: $('held'),
  heldText: $('held-text'),
  regenerate: $('regenerate'),
  end: $('end'),
  lifetime: $('lifetime'),
  lifetimeText: $('lifetime-text'),
  connectLocal: $('connect-local'),
};

const codap = new CodapLink();
const dispatcher = new Dispatcher();
for (const tool of codapTools(codap)) dispatcher.register(tool.id, tool.description, tool.functions);
window.mcpDispatcher = dispatcher;

const sessions = new Sessions(BASE);
let transport = null;
let handled = 0;
let linkState = 'disconnected';
// The relay has this connection's tools: the assistant can see and call them.
let registered = false;

// ---- what the user sees ----

function announce(text) {
  ui.announcer.textContent = text;
}

function setState(state) {
  document.body.dataset.state = state;
  // A code that no longer works is not offered for copying.
  const gone = state === 'expired' || state === 'ended';
  for (const id of ['copy-prompt', 'copy-code', 'end']) $(id).disabled = gone;
}

function setLink(state, transportName) {
  linkState = state;
  const labels = {
    connected: `Connected to the assistant (${transportName})`,
    idle: `Ready (${transportName}): waiting for the assistant`,
    disconnected: 'Disconnected: reconnecting…',
  };
  const label = labels[state];
  document.body.dataset.link = state;
  ui.dot.title = label;
  ui.dot.setAttribute('aria-label', label);
  ui.linkLabel.textContent = state === 'disconnected' ? 'Disconnected' : state === 'connected' ? 'Connected' : 'Ready';
  tick();
}

function displayCode(code) {
  return `${code.slice(0, 4)}-${code.slice(4)}`;
}

function showSession(session) {
  ui.code.textContent = displayCode(session.code);
  setState('fresh');
  showConnect(session);
  tick();
}

/** `ms` as m:ss, or h:mm:ss past an hour. */
function duration(ms) {
  const total = Math.floor(ms / 1000);
  const two = (n) => String(n).padStart(2, '0');
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  return hours > 0 ? `${hours}:${two(minutes)}:${two(total % 60)}` : `${two(minutes)}:${two(total % 60)}`;
}

/**
 * The session's time: while this tab is connected the session does not expire (its
 * heartbeats keep it alive), so there is nothing to count; once it is not, the idle time-out
 * really runs. The maximum lifetime holds either way: its last hour is announced.
 */
function tick() {
  const session = sessions.current;
  const state = document.body.dataset.state;
  if (!session || state === 'expired' || state === 'ended') return;
  const now = Date.now();
  const end = Date.parse(session.maxExpiresAt);
  const untilEnd = Number.isNaN(end) ? Infinity : end - now;
  const idleLeft = Date.parse(session.expiresAt) - now;
  if (untilEnd <= 0 || (linkState === 'disconnected' && idleLeft <= 0)) {
    expire('The pairing code has expired.');
    return;
  }
  ui.countdown.textContent =
    linkState === 'disconnected'
      ? `Not connected — expires in ${duration(Math.min(idleLeft, untilEnd))}`
      : 'Connected — stays open while this tab is open';
  const warn = untilEnd <= LIFETIME_WARNING_MS;
  if (warn && ui.lifetime.hidden) announce('This pairing code stops working within the hour. Press r for a new code.');
  ui.lifetime.hidden = !warn;
  // The warning carries its own New code button: the banner's is folded away once connected.
  if (warn) {
    ui.lifetimeText.textContent = `This code stops working in ${duration(untilEnd)} (a session lasts at most ${lifetime(session)}). Give your assistant a new one:`;
  }
}
setInterval(tick, 1000);

/** A session's maximum lifetime in words: "24 h", or "30 min" when configured under an hour. */
function lifetime(session) {
  const span = Date.parse(session.maxExpiresAt) - (session.createdAt || Date.now());
  if (!Number.isFinite(span) || span <= 0) return '24 h';
  return span < 3600000 ? `${Math.max(1, Math.round(span / 60000))} min` : `${Math.round(span / 3600000)} h`;
}

function expire(message) {
  if (transport) transport.stop();
  transport = null;
  sessions.forget();
  setState('expired');
  setLink('disconnected');
  ui.lifetime.hidden = true;
  ui.countdown.textContent = 'Expired. Press New code (r) to pair again.';
  announce(`Session expired. ${message} Press r for a new code.`);
}

/** A few words on what a call did: "createGraph · Heights: Age × Height". */
function summarize(name, args) {
  const a = args && typeof args === 'object' ? args : {};
  const words = (value) => (typeof value === 'string' || typeof value === 'number' ? String(value) : null);
  const axes = [a.xAttribute, a.yAttribute].map(words).filter(Boolean);
  const where = words(a.dataContext) ?? words(a.name) ?? words(a.title) ?? words(a.component);
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

function record(name, args, ok, reason) {
  ui.noActivity.hidden = true;
  const item = document.createElement('li');
  item.className = ok ? 'done' : 'failed';
  const what = document.createElement('span');
  what.className = 'what';
  what.textContent = summarize(name, args);
  what.title = what.textContent;
  const time = document.createElement('time');
  const now = new Date();
  time.dateTime = now.toISOString();
  time.textContent = now.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' });
  const outcome = document.createElement('span');
  outcome.className = ok ? 'ok' : 'error';
  outcome.textContent = ok ? 'ok' : 'error';
  item.append(what, time, outcome);
  if (!ok && reason) {
    const why = document.createElement('span');
    why.className = 'reason';
    why.textContent = reason.length > 160 ? `${reason.slice(0, 157)}…` : reason;
    item.append(why);
  }
  ui.activity.prepend(item);
  while (ui.activity.children.length > ACTIVITY_SHOWN) ui.activity.lastElementChild.remove();
}

function outsideNotice() {
  const plugin = `${publicBase}/codap/`;
  const codapUrl = `https://codap.concord.org/app/?di=${encodeURIComponent(plugin)}`;
  ui.outside.replaceChildren(
    'Not running inside CODAP. ',
    Object.assign(document.createElement('a'), { href: codapUrl, target: '_blank', rel: 'noopener', textContent: 'Open CODAP with this plugin' }),
    ' to let the assistant work on a CODAP document. You can still pair and try the relay here; CODAP tools will say that CODAP is not connected.',
  );
  ui.outside.hidden = false;
}

// ---- connecting an assistant ----

/** Who can reach the relay at `base`: cloud assistants need a public HTTPS address. */
function reach(base) {
  let url;
  try {
    url = new URL(base);
  } catch {
    return 'this-computer';
  }
  const host = url.hostname.replace(/^\[|\]$/g, '').toLowerCase();
  if (host === 'localhost' || host.endsWith('.localhost') || /^127\./.test(host) || host === '::1') return 'this-computer';
  const privateNet =
    /^10\./.test(host) ||
    /^192\.168\./.test(host) ||
    /^172\.(1[6-9]|2\d|3[01])\./.test(host) ||
    /^169\.254\./.test(host) ||
    host.endsWith('.local') ||
    host.endsWith('.internal') ||
    /^f[cd][0-9a-f]{2}:/.test(host) ||
    /^fe80:/.test(host);
  if (privateNet) return 'this-network';
  return url.protocol === 'https:' ? 'public' : 'not-https';
}

/**
 * What the connect instructions and the prompt say, by who can reach the relay: cloud
 * assistants (ChatGPT, claude.ai) call from their own servers and only over HTTPS, so for any
 * other address they are not offered, and the notice says why.
 */
const REACH = {
  public: {
    notice: '',
    connector: 'Add a custom connector once (Claude: Settings → Connectors; ChatGPT: Settings → Apps & Connectors, developer mode)',
    agent: '(A plain chat cannot make requests: use a connector or a custom GPT there.)',
    mcp: 'Claude, ChatGPT connectors',
  },
  'this-computer': {
    notice:
      'This relay is only reachable from this computer; ChatGPT and claude.ai cannot call it — use a desktop client or deploy the relay.',
    connector: 'In a desktop client on this computer (Cursor, Claude Code, a local agent), add an MCP server (Streamable HTTP)',
    agent: '(The agent has to run on this computer. A plain chat cannot make requests.)',
    mcp: 'an MCP client on this computer',
  },
  'this-network': {
    notice:
      'This relay is only reachable on this network; ChatGPT and claude.ai cannot call it — use a desktop client on this network or deploy the relay.',
    connector: 'In a desktop client on this network (Cursor, Claude Code, a local agent), add an MCP server (Streamable HTTP)',
    agent: '(The agent has to run on this network. A plain chat cannot make requests.)',
    mcp: 'an MCP client on this network',
  },
  'not-https': {
    notice:
      'This relay\'s address is plain http; ChatGPT and claude.ai only call https addresses — put the relay behind HTTPS (PUBLIC_BASE_URL) or use a desktop client.',
    connector: 'In a desktop client (Cursor, Claude Code, a local agent), add an MCP server (Streamable HTTP)',
    agent: '(A plain chat cannot make requests.)',
    mcp: 'a desktop MCP client',
  },
};

function showKind(kind) {
  for (const tab of document.querySelectorAll('.kind')) {
    const selected = tab.dataset.kind === kind;
    tab.setAttribute('aria-selected', String(selected));
    tab.tabIndex = selected ? 0 : -1;
    $(tab.getAttribute('aria-controls')).hidden = !selected;
  }
  try {
    localStorage.setItem(KIND_KEY, kind);
  } catch {
    // Private browsing: the choice is not remembered.
  }
}

/** The connect instructions for the session, with every URL from the public address. */
function showConnect(session) {
  const where = REACH[reach(publicBase)];
  const cloud = where === REACH.public;
  $('mcp-url').textContent = `${publicBase}/mcp`;
  $('actions-url').textContent = `${publicBase}/openapi/actions.json`;
  $('session-url').textContent = session.connectorUrl || `${publicBase}/mcp`;
  for (const code of document.querySelectorAll('.code-inline')) code.textContent = displayCode(session.code);
  ui.connectLocal.hidden = cloud;
  ui.connectLocal.textContent = where.notice;
  // Instructions that cannot work are not shown: a custom GPT calls from OpenAI's servers.
  $('tab-gpt').hidden = !cloud;
  $('tab-connector').textContent = cloud ? 'Claude · ChatGPT' : 'Desktop client';
  $('connector-where').textContent = where.connector;
  $('agent-elsewhere').textContent = where.agent;
  let kind = null;
  try {
    kind = localStorage.getItem(KIND_KEY);
  } catch {
    kind = null;
  }
  if (!['connector', 'gpt', 'agent'].includes(kind) || (kind === 'gpt' && !cloud)) kind = 'connector';
  showKind(kind);
}

for (const tab of document.querySelectorAll('.kind')) {
  tab.addEventListener('click', () => showKind(tab.dataset.kind));
  tab.addEventListener('keydown', (event) => {
    if (event.key !== 'ArrowRight' && event.key !== 'ArrowLeft') return;
    const tabs = [...document.querySelectorAll('.kind')].filter((t) => !t.hidden);
    const next = tabs[(tabs.indexOf(tab) + (event.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length];
    showKind(next.dataset.kind);
    next.focus();
    event.preventDefault();
  });
}
for (const button of document.querySelectorAll('[data-copy]')) {
  button.addEventListener('click', () => copy($(button.dataset.copy).textContent, 'URL', button));
}

/** The relay's public address, from its discovery document. */
async function learnPublicBase() {
  try {
    const response = await fetch(`${BASE}/.well-known/codap-mcp.json`);
    const discovery = await response.json();
    if (typeof discovery.mcpEndpoint === 'string' && discovery.mcpEndpoint.endsWith('/mcp')) {
      publicBase = discovery.mcpEndpoint.slice(0, -'/mcp'.length);
    }
  } catch {
    // The page's own origin stands in.
  }
}

// ---- the prompt ----

/**
 * The prompt for an agent that can make HTTP requests (assistants with a connector need only
 * the code): short enough to paste, and every URL the public one.
 */
function prompt(session) {
  const code = displayCode(session.code);
  const { mcp } = REACH[reach(publicBase)];
  const api = `${publicBase}/api/sessions/${code}`;
  const lines = [
    'For an AI agent that can make HTTP requests: you can use tools in my CODAP document (data tables and graphs) through a relay.',
    `Pairing code: ${code}`,
    `Relay: ${publicBase}`,
    `1. First GET ${api}/metadata: it lists the tools with the JSON Schema of their args.`,
    `2. Call a tool: POST ${api}/call with JSON {"functionName": "<name>", "args": {...}}. The answer is {"success": true, "result": ...} or an error that says what to fix.`,
    `3. A 202 answer means it is still running: GET ${api}/requests/<requestId> for the result. A 404 means the code expired: ask me for the new one.`,
    `With MCP instead (${mcp}): connect to ${publicBase}/mcp and call connect_session with the code; or connect to this session alone: ${session.connectorUrl || `${publicBase}/mcp`}`,
  ];
  return lines.join('\n');
}

/** Shows "Copied" on the button that copied, for a moment. */
function acknowledge(button) {
  if (!button) return;
  clearTimeout(button.copiedTimer);
  button.classList.add('done');
  button.textContent = 'Copied ✓';
  button.copiedTimer = setTimeout(() => {
    button.classList.remove('done');
    button.innerHTML = button.dataset.label + (button.getAttribute('aria-keyshortcuts') ? ` <kbd>${button.getAttribute('aria-keyshortcuts')}</kbd>` : '');
  }, COPIED_MS);
}

async function copy(text, what, button) {
  let copied = false;
  try {
    await navigator.clipboard.writeText(text);
    copied = true;
  } catch {
    const area = document.createElement('textarea');
    area.value = text;
    area.setAttribute('readonly', '');
    area.style.position = 'fixed';
    area.style.opacity = '0';
    document.body.append(area);
    area.select();
    copied = document.execCommand('copy');
    area.remove();
  }
  if (copied) {
    if (document.body.dataset.state === 'fresh') setState('copied');
    acknowledge(button);
    announce(`${what} copied. Paste it into your assistant.`);
  } else {
    announce(`Could not copy the ${what.toLowerCase()}; select it and copy by hand.`);
  }
}

// ---- calls ----

let heldQueue = Promise.resolve();

/** Asks the user about a call that changes or deletes data; resolves true when allowed. */
function askUser(call) {
  const ask = () =>
    new Promise((resolve) => {
      ui.heldText.textContent = `${call.functionName} ${JSON.stringify(call.args)}`;
      ui.held.hidden = false;
      announce(`The assistant wants to run ${call.functionName}. Allow or deny.`);
      const decide = (allowed) => {
        ui.held.hidden = true;
        $('allow').onclick = null;
        $('deny').onclick = null;
        resolve(allowed);
      };
      $('allow').onclick = () => decide(true);
      $('deny').onclick = () => decide(false);
      $('allow').focus();
    });
  // One question at a time.
  const answer = heldQueue.then(ask);
  heldQueue = answer.catch(() => false);
  return answer;
}

async function run(call) {
  const { requestId, toolId, functionName, args } = call;
  handled += 1;
  if (handled === 1) {
    setState('active');
    announce('The assistant made its first call.');
  }
  if (linkState === 'idle') setLink('connected', transport?.kind ?? '');
  try {
    const fn = dispatcher.find(toolId, functionName);
    const destructive = typeof fn?.destructive === 'function' ? fn.destructive(args ?? {}) : fn?.destructive;
    if (destructive && ui.confirm.checked && !(await askUser(call))) {
      throw new ToolError('declined_by_user', 'The user declined this change. Ask them before trying again.');
    }
    const result = await dispatcher.call(toolId, functionName, args);
    record(functionName, args, true);
    return { requestId, success: true, result: result ?? null };
  } catch (error) {
    const code = error.code || 'tool_error';
    record(functionName, args, false, error.message);
    return { requestId, success: false, error: { code, message: error.message } };
  }
}

// ---- pairing ----

function connect(session) {
  transport = new Transport(BASE, session, () => dispatcher.manifest(), run);
  transport.addEventListener('status', (event) => {
    const { state, transport: name } = event.detail;
    if (state === 'connected') {
      setLink(handled > 0 ? 'connected' : 'idle', name);
      announce(`Connected to the relay over ${name}.`);
    } else if (state === 'disconnected') {
      registered = false;
      setLink('disconnected');
    }
  });
  transport.addEventListener('registered', () => {
    registered = true;
  });
  transport.addEventListener('fallback', (event) => announce(`Trying ${event.detail.transport} instead.`));
  transport.addEventListener('expiry', (event) => sessions.setExpiry(event.detail));
  transport.addEventListener('expired', (event) => expire(event.detail || 'The session has ended.'));
  transport.addEventListener('replaced', () => {
    transport.stop();
    setLink('disconnected');
    announce('Another tab took over this session.');
  });
  transport.start();
}

async function pair(fresh) {
  if (transport) transport.stop();
  transport = null;
  try {
    const { session, restored } = fresh ? { session: await sessions.create(), restored: false } : await sessions.open();
    showSession(session);
    if (restored) announce(`Reconnecting to session ${displayCode(session.code)}.`);
    else announce(`New pairing code ${displayCode(session.code)}.`);
    connect(session);
  } catch (error) {
    ui.countdown.textContent = `Could not reach the relay: ${error.message}`;
    announce('Could not reach the relay. Retrying in a few seconds.');
    setTimeout(() => pair(fresh), 5000);
  }
}

async function regenerate() {
  await sessions.end();
  handled = 0;
  await pair(true);
}

async function endSession() {
  if (transport) transport.stop();
  transport = null;
  await sessions.end();
  setState('ended');
  setLink('disconnected');
  ui.countdown.textContent = 'Session ended. Press New code (r) to pair again.';
  announce('Session ended.');
}

$('copy-prompt').addEventListener('click', (event) => sessions.current && copy(prompt(sessions.current), 'Prompt', event.currentTarget));
$('copy-code').addEventListener('click', (event) => sessions.current && copy(displayCode(sessions.current.code), 'Code', event.currentTarget));
ui.regenerate.addEventListener('click', regenerate);
$('lifetime-new').addEventListener('click', regenerate);
ui.end.addEventListener('click', endSession);
document.addEventListener('keydown', (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.target instanceof HTMLInputElement || event.target instanceof HTMLTextAreaElement) return;
  if (event.key === 'c' && sessions.current && !$('copy-prompt').disabled) copy(prompt(sessions.current), 'Prompt', $('copy-prompt'));
  if (event.key === 'r') regenerate();
});

// ---- CODAP ----

codap.addEventListener('connected', async () => {
  ui.outside.hidden = true;
  try {
    await codap.request({
      action: 'update',
      resource: 'interactiveFrame',
      values: { name: 'toolrelay', title: 'AI assistant', version: VERSION, dimensions: { width: 360, height: 500 } },
    });
  } catch {
    // The frame keeps its defaults.
  }
});
codap.addEventListener('absent', outsideNotice);
codap.start();

// For tests and curious developers.
window.toolrelay = {
  get session() {
    return sessions.current;
  },
  get transport() {
    return transport?.kind ?? null;
  },
  get codapConnected() {
    return codap.connected;
  },
  get ready() {
    return registered && linkState !== 'disconnected';
  },
  /** How often the connection to the relay failed or dropped, or an answer could not go. */
  get interruptions() {
    return transport?.interruptions ?? 0;
  },
  prompt: () => sessions.current && prompt(sessions.current),
};

setLink('disconnected');
learnPublicBase().then(() => {
  // The notice (if CODAP was found absent meanwhile) links the public address too.
  if (!ui.outside.hidden) outsideNotice();
  pair(false);
});
