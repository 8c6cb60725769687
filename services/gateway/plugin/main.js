// The plugin page: pairing banner, connection, activity, and the glue between the relay
// (transport.js), the tools (dispatcher.js, tools.js) and CODAP (codap.js).

import { CodapLink } from './codap.js';
import { Dispatcher, ToolError } from './dispatcher.js';
import { Sessions } from './session.js';
import { codapTools } from './tools.js';
import { Transport } from './transport.js';

const VERSION = '1.0.0';
const ACTIVITY_SHOWN = 20;
const BASE = location.origin;

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
}

function displayCode(code) {
  return `${code.slice(0, 4)}-${code.slice(4)}`;
}

function showSession(session) {
  ui.code.textContent = displayCode(session.code);
  setState('fresh');
  tick();
}

function tick() {
  const session = sessions.current;
  const state = document.body.dataset.state;
  if (!session || state === 'expired' || state === 'ended') return;
  const left = Math.max(0, Date.parse(session.expiresAt) - Date.now());
  if (left === 0) {
    expire('The pairing code has expired.');
    return;
  }
  const minutes = String(Math.floor(left / 60000)).padStart(2, '0');
  const seconds = String(Math.floor((left % 60000) / 1000)).padStart(2, '0');
  ui.countdown.textContent = `Expires in ${minutes}:${seconds}`;
}
setInterval(tick, 1000);

function expire(message) {
  if (transport) transport.stop();
  transport = null;
  sessions.forget();
  setState('expired');
  setLink('disconnected');
  ui.countdown.textContent = 'Expired. Press New code (r) to pair again.';
  announce(`Session expired. ${message} Press r for a new code.`);
}

function record(name, ok, detail) {
  ui.noActivity.hidden = true;
  const item = document.createElement('li');
  const label = document.createElement('span');
  label.textContent = name;
  const time = document.createElement('time');
  const now = new Date();
  time.dateTime = now.toISOString();
  time.textContent = now.toLocaleTimeString();
  const outcome = document.createElement('span');
  outcome.className = ok ? 'ok' : 'error';
  outcome.textContent = ok ? 'ok' : 'error';
  if (detail) outcome.title = detail;
  item.append(label, time, outcome);
  ui.activity.prepend(item);
  while (ui.activity.children.length > ACTIVITY_SHOWN) ui.activity.lastElementChild.remove();
}

function outsideNotice() {
  const here = `${BASE}/codap/`;
  ui.outside.textContent =
    `Not running inside CODAP. To let the assistant work on a CODAP document, open ` +
    `https://codap.concord.org/app/?di=${here} — you can still pair and try the relay here; CODAP tools will say that CODAP is not connected.`;
  ui.outside.hidden = false;
}

// ---- the prompt ----

function prompt(session) {
  const code = displayCode(session.code);
  const api = `${BASE}/api/sessions/${code}`;
  const lines = [
    'You can use tools in my CODAP document (data tables and graphs) through a relay.',
    `Pairing code: ${code}`,
    `Relay: ${BASE}`,
    `1. First GET ${api}/metadata: it lists the tools with the JSON Schema of their args.`,
    `2. Call a tool: POST ${api}/call with JSON {"functionName": "<name>", "args": {...}}. The answer is {"success": true, "result": ...} or an error that says what to fix.`,
    `3. A 202 answer means it is still running: GET ${api}/requests/<requestId> for the result. A 404 means the code expired: ask me for the new one.`,
  ];
  if (session.connectorUrl) lines.push(`MCP clients can connect to: ${session.connectorUrl}`);
  return lines.join('\n');
}

async function copy(text, what) {
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
    record(functionName, true);
    return { requestId, success: true, result: result ?? null };
  } catch (error) {
    const code = error.code || 'tool_error';
    record(functionName, false, error.message);
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

$('copy-prompt').addEventListener('click', () => sessions.current && copy(prompt(sessions.current), 'Prompt'));
$('copy-code').addEventListener('click', () => sessions.current && copy(displayCode(sessions.current.code), 'Code'));
ui.regenerate.addEventListener('click', regenerate);
ui.end.addEventListener('click', endSession);
document.addEventListener('keydown', (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.target instanceof HTMLInputElement || event.target instanceof HTMLTextAreaElement) return;
  if (event.key === 'c' && sessions.current && !$('copy-prompt').disabled) copy(prompt(sessions.current), 'Prompt');
  if (event.key === 'r') regenerate();
});

// ---- CODAP ----

codap.addEventListener('connected', async () => {
  ui.outside.hidden = true;
  try {
    await codap.request({
      action: 'update',
      resource: 'interactiveFrame',
      values: { name: 'toolrelay', title: 'AI assistant', version: VERSION, dimensions: { width: 380, height: 560 } },
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
  prompt: () => sessions.current && prompt(sessions.current),
};

setLink('disconnected');
pair(false);
