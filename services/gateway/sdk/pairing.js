// <toolrelay-pairing>: what a person needs to pair a page with an assistant — the code, how to
// connect each kind of assistant, copy buttons, the countdown, a status dot, the activity
// list, End session and the "ask me before changes" switch (it holds every call of a tool not
// marked `readOnly`), and the questions about new callers: "An assistant wants to use this
// page — Allow / Deny" (at the top, focused, announced, counted in a badge and in the page's
// title; keys a and d answer it), the callers the person allowed (each with Disconnect), and,
// after three denials, New code. A connection it shows asks about new callers unless the page
// created it with `approve: 'auto'` (see connection.js); `data-approval` says whether a
// question is open (`pending`, else `none`). A session an assistant opened for the page (a
// claim, `connect({claim})`) needs no code: the element then says "Connected to your
// assistant" and shows no code, no prompt and no connect instructions (`data-mode="assistant"`,
// else `"code"`). A claim link opened outside an assistant's conversation (a tab, a host that
// shows no apps; see connection.js) is asked about first (`data-state="asking"`): "A
// conversation sent you this link. Connect this page to that assistant?", naming the assistant
// as its MCP client calls itself, with Connect (redeems the claim) and Not me (leaves it
// unspent and pairs with a code of the page's own) — announced, focused, and deaf to clicks
// for a moment as the question about a caller is. A refused claim (used, expired, unknown)
// says so and offers New code.
// Set its `connection` property to a Connection (connect() from toolrelay.js), and, to word
// the activity list in the page's own terms, `describeCall` to a function (name, args) → text.
//
// It renders into its own children (no shadow DOM), so the page's tests and styles reach it;
// its styles come from pairing.css next to this file. Children it has before it renders (a
// notice of the page's own, say) are kept at the top of its body. One per page: its parts
// have fixed ids.
//
// Attributes: heading (default "AI assistant"), level (of its heading, default 2), subject
// (what the copied prompt offers, default "the tools of a web page I have open"), page-name
// (what the question about a new caller calls the page, default "this page"), keys (c
// copies the prompt, r makes a new code), standalone (it is the whole page: header and main).

import { displayCode } from './connection.js';
import { ErrorCode } from './errors.js';
import { LABEL_LISTED, REACH, approvalText, clock, duration, escape, lifetime, reach, shortLabel, summarize } from './pairing-text.js';

// Exported here as before they moved to pairing-text.js: pages that import them from this file
// keep working.
export { approvalText, reach };

const ACTIVITY_SHOWN = 20;
// The last hour of a session's maximum lifetime gets a warning.
const LIFETIME_WARNING_MS = 60 * 60 * 1000;
// How long a button says "Copied".
const COPIED_MS = 1500;
// Which kind of assistant the connect instructions show first.
const KIND_KEY = 'toolrelay-assistant-kind';
// A question about a caller ignores answers this long after it appears: a key or click meant
// for what was there before does not allow anyone.
const APPROVAL_ARMING_MS = 500;
const STYLES = new URL('./pairing.css', import.meta.url).href;


function template(heading, level, standalone) {
  const h = `h${level}`;
  const sub = `h${Math.min(level + 1, 6)}`;
  const head = standalone ? 'header' : 'div';
  const body = standalone ? 'main' : 'div';
  return `
  <${head} class="bar">
    <${h} class="title">${escape(heading)}</${h}>
    <span id="approval-badge" class="badge" hidden></span>
    <span class="link">
      <span id="dot" class="dot" role="img" aria-label="Disconnected" title="Disconnected"></span>
      <span id="link-label">Connecting…</span>
    </span>
  </${head}>
  <${body} class="body">
    <section id="approval" class="approval" hidden aria-labelledby="approval-title" aria-describedby="approval-text">
      <${sub} id="approval-title">Allow this assistant?</${sub}>
      <p id="approval-text"></p>
      <p id="approval-more" class="quiet" hidden></p>
      <div class="actions">
        <button type="button" id="approval-allow" class="primary" aria-keyshortcuts="a">Allow <kbd>a</kbd></button>
        <button type="button" id="approval-deny" class="secondary" aria-keyshortcuts="d">Deny <kbd>d</kbd></button>
      </div>
    </section>
    <p id="refused-callers" class="notice" hidden>Three assistants were denied; this code no longer accepts new ones. <button type="button" id="refused-new" class="secondary small">New code</button></p>
    <section class="banner" aria-labelledby="code-label">
      <div class="assistant">
        <p id="assistant-title" class="assistant-title">Connected to your assistant</p>
        <p id="assistant-text" class="quiet">Your assistant opened this page from your conversation: no code needed.</p>
        <div id="claim-actions" class="actions claim-actions" hidden>
          <button type="button" id="claim-connect" class="primary">Connect</button>
          <button type="button" id="claim-decline" class="secondary">Not me</button>
        </div>
      </div>
      <div class="code-row">
        <p id="code-label" class="label">Pairing code</p>
        <p id="code" class="code">····-····</p>
        <button type="button" id="copy-code" class="secondary small" data-label="Copy code">Copy code</button>
      </div>
      <p id="countdown" class="countdown">Starting…</p>
      <p id="lifetime" class="notice" hidden><span id="lifetime-text"></span> <button type="button" id="lifetime-new" class="secondary small">New code</button></p>
      <div class="actions">
        <button type="button" id="copy-prompt" class="primary" data-label="Copy prompt">Copy prompt</button>
        <button type="button" id="regenerate" class="secondary">New code</button>
      </div>
      <details id="connect" class="connect" open>
        <summary>Connect your assistant</summary>
        <p id="connect-local" class="notice" hidden></p>
        <div class="kinds" role="tablist" aria-label="Kind of assistant">
          <button type="button" role="tab" id="tab-connector" class="kind" aria-controls="panel-connector" data-kind="connector">Claude · ChatGPT</button>
          <button type="button" role="tab" id="tab-gpt" class="kind" aria-controls="panel-gpt" data-kind="gpt">Custom GPT</button>
          <button type="button" role="tab" id="tab-agent" class="kind" aria-controls="panel-agent" data-kind="agent">HTTP agent</button>
        </div>
        <div role="tabpanel" id="panel-connector" class="panel" aria-labelledby="tab-connector">
          <ol>
            <li><span id="connector-where">Add a custom connector once</span> with this URL:
              <span class="url"><code id="mcp-url"></code><button type="button" class="secondary small" data-copy="mcp-url" data-label="Copy">Copy</button></span></li>
            <li>In the chat, give it the pairing code <strong class="code-inline"></strong>.</li>
          </ol>
          <p class="quiet">Or add just this session:
            <span class="url"><code id="session-url"></code><button type="button" class="secondary small" data-copy="session-url" data-label="Copy">Copy</button></span></p>
        </div>
        <div role="tabpanel" id="panel-gpt" class="panel" aria-labelledby="tab-gpt" hidden>
          <ol>
            <li>In your GPT's Configure → Actions, import from this URL:
              <span class="url"><code id="actions-url"></code><button type="button" class="secondary small" data-copy="actions-url" data-label="Copy">Copy</button></span></li>
            <li>In the chat, give it the pairing code <strong class="code-inline"></strong>.</li>
          </ol>
        </div>
        <div role="tabpanel" id="panel-agent" class="panel" aria-labelledby="tab-agent" hidden>
          <p>For an agent that can make HTTP requests: press <strong>Copy prompt</strong> and paste it into the agent. <span id="agent-elsewhere">(A plain chat cannot make requests: use a connector or a custom GPT there.)</span></p>
        </div>
      </details>
    </section>
    <section id="held" class="held" hidden aria-labelledby="held-title">
      <${sub} id="held-title">The assistant wants to change data</${sub}>
      <p id="held-text"></p>
      <div class="actions">
        <button type="button" id="allow" class="primary">Allow</button>
        <button type="button" id="deny" class="secondary">Deny</button>
      </div>
    </section>
    <section id="callers" class="callers" hidden aria-labelledby="callers-title">
      <${sub} id="callers-title">Allowed assistants</${sub}>
      <ul id="callers-list"></ul>
    </section>
    <section class="activity" aria-labelledby="activity-title">
      <${sub} id="activity-title">Activity</${sub}>
      <p id="no-activity" class="quiet">No calls yet.</p>
      <ol id="activity" tabindex="0" aria-labelledby="activity-title"></ol>
    </section>
    <section class="settings" aria-label="Settings">
      <label class="check"><input type="checkbox" id="confirm"> Ask me before changing or deleting data</label>
      <button type="button" id="end" class="danger">End session</button>
    </section>
  </${body}>
  <div id="announcer" class="visually-hidden" role="status" aria-live="polite"></div>
  <div id="alert" class="visually-hidden" role="alert"></div>`;
}

export class ToolrelayPairing extends HTMLElement {
  constructor() {
    super();
    this.conn = null;
    this.publicBase = null;
    this.linkState = 'disconnected';
    this.heldQueue = Promise.resolve();
    this.listeners = [];
    this.discovered = Promise.resolve();
    this.describeCall = null;
    // The page's own title while a question is open ("(1) " goes before it), else null.
    this.titleBase = null;
    this.armTimer = null;
    this.claimArmTimer = null;
    this.answering = false;
  }

  connectedCallback() {
    if (this.rendered) return;
    this.rendered = true;
    if (![...document.querySelectorAll('link[rel="stylesheet"]')].some((link) => link.href === STYLES)) {
      document.head.append(Object.assign(document.createElement('link'), { rel: 'stylesheet', href: STYLES }));
    }
    const kept = [...this.childNodes];
    const level = Math.min(Math.max(Number(this.getAttribute('level')) || 2, 1), 5);
    this.innerHTML = template(this.getAttribute('heading') || 'AI assistant', level, this.hasAttribute('standalone'));
    const body = this.querySelector('.body');
    body.prepend(...kept);
    // The question about a caller comes first, above the page's own notices too.
    body.prepend(this.$('approval'));
    this.wire();
    this.dataset.state = 'fresh';
    this.dataset.mode = 'code';
    this.setLink('disconnected');
    this.timer = setInterval(() => this.tick(), 1000);
    if (this.conn) this.attach(this.conn);
  }

  disconnectedCallback() {
    clearInterval(this.timer);
    this.showCount(0);
  }

  $(id) {
    return this.querySelector(`#${id}`);
  }

  /** The Connection this element shows. */
  get connection() {
    return this.conn;
  }

  set connection(connection) {
    this.detach();
    this.conn = connection;
    if (this.rendered && connection) this.attach(connection);
  }

  get state() {
    return this.dataset.state;
  }

  get link() {
    return this.linkState;
  }

  // ---- following the connection ----

  attach(connection) {
    const on = (name, listener) => {
      const wrapped = (event) => listener(event.detail);
      connection.addEventListener(name, wrapped);
      this.listeners.push([name, wrapped]);
    };
    // The switch decides about every call but read-only ones (see Connection.run).
    this.confirmHook = (call, signal) => this.ask(call, signal);
    connection.confirm = this.confirmHook;
    // Shown here, new callers are asked about (unless the page said `approve: 'auto'`).
    connection.setApprovalUi?.(true);
    this.publicBase = connection.base;
    this.discovered = this.learnPublicBase(connection.base);
    on('code', (detail) => {
      this.showSession();
      this.showApprovals();
      this.showCallers();
      if (detail.claimed) this.announce(detail.restored ? 'Reconnecting to your assistant.' : 'Connected to your assistant.');
      else this.announce(detail.restored ? `Reconnecting to session ${detail.display}.` : `New pairing code ${detail.display}.`);
    });
    on('status', ({ state, transport, message }) => {
      if (state === 'connected') {
        this.setLink(connection.handled > 0 ? 'connected' : 'idle', transport);
        this.announce(`Connected to the relay over ${transport}.`);
      } else if (state === 'disconnected') {
        this.setLink('disconnected');
      } else if (state === 'asking') {
        this.askClaim(connection.pendingClaim ?? {});
      } else if (state === 'refused') {
        this.refused(message);
      } else if (state === 'unreachable') {
        this.$('countdown').textContent = message;
        this.announce('Could not reach the relay. Retrying in a few seconds.');
      } else if (state === 'expired') {
        this.expired(message);
      } else if (state === 'ended') {
        this.setState('ended');
        this.setLink('disconnected');
        this.$('countdown').textContent = `Session ended. Press New code${this.hasAttribute('keys') ? ' (r)' : ''} to pair again.`;
        this.announce('Session ended.');
      } else if (state === 'replaced') {
        this.setLink('disconnected');
        this.announce('Another tab took over this session.');
      }
    });
    on('fallback', ({ transport }) => this.announce(`Trying ${transport} instead.`));
    on('call-started', () => {
      if (connection.handled === 1) {
        this.setState('active');
        this.announce('The assistant made its first call.');
      }
      if (this.linkState === 'idle') this.setLink('connected', connection.transportKind ?? '');
    });
    on('call-finished', ({ name, args, success, error }) => this.record(name, args, success, error?.message, error?.code === ErrorCode.CANCELLED));
    on('approval-request', () => this.showApprovals());
    on('approval-closed', (detail) => this.approvalClosed(detail));
    on('callers', () => this.showCallers());
    if (connection.session) this.showSession();
    else if (connection.pendingClaim) this.askClaim(connection.pendingClaim);
    this.showApprovals();
    this.showCallers();
  }

  detach() {
    if (!this.conn) return;
    for (const [name, listener] of this.listeners) this.conn.removeEventListener(name, listener);
    this.listeners = [];
    if (this.conn.confirm === this.confirmHook) this.conn.confirm = null;
    this.conn.setApprovalUi?.(false);
  }

  /** The relay's public address, from its discovery document (it differs behind a proxy). */
  async learnPublicBase(base) {
    try {
      const discovery = this.conn?.discover
        ? await this.conn.discover()
        : await (await fetch(`${base}/.well-known/codap-mcp.json`)).json();
      if (typeof discovery?.mcpEndpoint === 'string' && discovery.mcpEndpoint.endsWith('/mcp')) {
        this.publicBase = discovery.mcpEndpoint.slice(0, -'/mcp'.length);
      }
    } catch {
      // The relay's own address stands in.
    }
    if (this.conn?.session) this.showConnect(this.conn.session);
  }

  // ---- what the user sees ----

  announce(text) {
    this.$('announcer').textContent = text;
  }

  emitState() {
    this.dispatchEvent(new CustomEvent('pairing-state', { bubbles: true, detail: { state: this.dataset.state, link: this.linkState } }));
  }

  setState(state) {
    this.dataset.state = state;
    // A code that no longer works (or none yet, while a claim is asked about) is not offered.
    const gone = state === 'expired' || state === 'ended' || state === 'refused' || state === 'asking';
    for (const id of ['copy-prompt', 'copy-code', 'end']) this.$(id).disabled = gone;
    this.emitState();
  }

  setLink(state, transportName) {
    this.linkState = state;
    const labels = {
      connected: `Connected to the assistant (${transportName})`,
      idle: `Ready (${transportName}): waiting for the assistant`,
      disconnected: 'Disconnected: reconnecting…',
    };
    const label = labels[state];
    this.dataset.link = state;
    this.$('dot').title = label;
    this.$('dot').setAttribute('aria-label', label);
    this.$('link-label').textContent = state === 'disconnected' ? 'Disconnected' : state === 'connected' ? 'Connected' : 'Ready';
    this.emitState();
    this.tick();
  }

  /** In assistant mode (a session from a claim) the code is never put on the page. */
  get assistantMode() {
    return this.dataset.mode === 'assistant';
  }

  setMode(mode) {
    this.dataset.mode = mode;
    this.$('assistant-title').textContent = 'Connected to your assistant';
    this.$('assistant-title').removeAttribute('tabindex');
    this.$('assistant-text').textContent = 'Your assistant opened this page from your conversation: no code needed.';
    this.$('claim-actions').hidden = true;
    if (mode === 'assistant') {
      this.$('code').textContent = '····-····';
      for (const code of this.querySelectorAll('.code-inline')) code.textContent = '';
    }
  }

  showSession() {
    const session = this.conn.session;
    this.setMode(session.claimed ? 'assistant' : 'code');
    this.setState('fresh');
    if (!this.assistantMode) {
      this.$('code').textContent = displayCode(session.code);
      this.showConnect(session);
    }
    this.tick();
  }

  /**
   * A claim link opened outside an assistant's conversation (status `asking`): whoever has the
   * link can send it, so the person says whether it is theirs before it is redeemed. The
   * question is announced and focused (not its Connect button: Enter pressed for something
   * else connects nobody), and its buttons ignore clicks for a moment.
   */
  askClaim({ label }) {
    this.setMode('assistant');
    this.setState('asking');
    const page = this.pageName;
    const title = this.$('assistant-title');
    title.textContent = `A conversation sent you this link. Connect ${page} to that assistant?`;
    const who = label ? `It says it is ${shortLabel(label)}.` : 'It did not say what it is.';
    this.$('assistant-text').textContent = `${who} Connect only if you asked your assistant to open ${page}; if not, press Not me.`;
    this.$('claim-actions').hidden = false;
    this.$('countdown').textContent = 'Nothing is connected until you answer.';
    const buttons = [this.$('claim-connect'), this.$('claim-decline')];
    for (const button of buttons) button.setAttribute('aria-disabled', 'true');
    clearTimeout(this.claimArmTimer);
    this.claimArmTimer = setTimeout(() => {
      this.claimArmTimer = null;
      for (const button of buttons) button.removeAttribute('aria-disabled');
    }, APPROVAL_ARMING_MS);
    this.$('alert').textContent = `${title.textContent} ${this.$('assistant-text').textContent}`;
    title.tabIndex = -1;
    title.scrollIntoView({ block: 'nearest' });
    const active = document.activeElement;
    const typing = active && !this.contains(active) && (active instanceof HTMLInputElement || active instanceof HTMLTextAreaElement || active.isContentEditable);
    if (!typing) title.focus();
  }

  /** The person answers the question about the claim: Connect (true) or Not me. */
  answerClaim(connect) {
    if (this.claimArmTimer || !this.conn?.pendingClaim) return;
    this.$('claim-actions').hidden = true;
    this.$('alert').textContent = '';
    this.$('assistant-title').textContent = connect ? 'Connecting to your assistant…' : 'Not connected to that assistant';
    this.$('assistant-text').textContent = connect ? '' : `${this.pageName[0].toUpperCase()}${this.pageName.slice(1)} gets a code of its own.`;
    this.announce(connect ? 'Connecting to the assistant that sent the link.' : 'Not connected to that assistant: pairing with a code of its own instead.');
    this.conn.answerClaim(connect);
  }

  /** The relay would not redeem the claim (or its session is gone): say why, offer a code. */
  refused(message) {
    this.setMode('assistant');
    this.setState('refused');
    this.setLink('disconnected');
    this.$('assistant-title').textContent = 'Not connected to your assistant';
    this.$('assistant-text').textContent = message;
    this.$('countdown').textContent = `Or press New code${this.hasAttribute('keys') ? ' (r)' : ''} to pair with a code instead.`;
    this.announce(`Not connected to your assistant. ${message}`);
  }

  /**
   * The session's time: while this page is connected the session does not expire (its
   * heartbeats keep it alive), so there is nothing to count; once it is not, the idle time-out
   * really runs. The maximum lifetime holds either way: its last hour is announced.
   */
  tick() {
    const session = this.conn?.session;
    const state = this.dataset.state;
    if (!session || state === 'expired' || state === 'ended' || state === 'refused') return;
    const now = Date.now();
    const end = Date.parse(session.maxExpiresAt);
    const untilEnd = Number.isNaN(end) ? Infinity : end - now;
    const idleLeft = Date.parse(session.expiresAt) - now;
    if (untilEnd <= 0 || (this.linkState === 'disconnected' && idleLeft <= 0)) {
      this.conn.expire('The pairing code has expired.');
      return;
    }
    this.$('countdown').textContent =
      this.linkState === 'disconnected'
        ? `Not connected — expires in ${duration(Math.min(idleLeft, untilEnd))}`
        : `Connected — stays open while this ${this.hasAttribute('standalone') ? 'tab' : 'page'} is open`;
    const warn = untilEnd <= LIFETIME_WARNING_MS;
    const notice = this.$('lifetime');
    if (warn && notice.hidden) this.announce('This pairing code stops working within the hour. Press New code for a new one.');
    notice.hidden = !warn;
    // The warning carries its own New code button: the banner's is folded away once connected.
    this.$('lifetime-new').hidden = this.assistantMode;
    if (warn) {
      this.$('lifetime-text').textContent = this.assistantMode
        ? `This session ends in ${duration(untilEnd)} (a session lasts at most ${lifetime(session)}). Then ask your assistant to open it again.`
        : `This code stops working in ${duration(untilEnd)} (a session lasts at most ${lifetime(session)}). Give your assistant a new one:`;
    }
  }

  expired(message) {
    this.setState('expired');
    this.setLink('disconnected');
    this.$('lifetime').hidden = true;
    this.$('countdown').textContent = this.assistantMode
      ? `This session has ended. Ask your assistant to open it again, or press New code${this.hasAttribute('keys') ? ' (r)' : ''} to pair with a code.`
      : `Expired. Press New code${this.hasAttribute('keys') ? ' (r)' : ''} to pair again.`;
    this.announce(`Session expired. ${message} Press ${this.hasAttribute('keys') ? 'r' : 'New code'} for a new code.`);
  }

  record(name, args, ok, reason, cancelled = false) {
    this.$('no-activity').hidden = true;
    const item = document.createElement('li');
    item.className = ok ? 'done' : cancelled ? 'cancelled' : 'failed';
    const what = document.createElement('span');
    what.className = 'what';
    what.textContent = (this.describeCall ?? summarize)(name, args);
    what.title = what.textContent;
    const time = document.createElement('time');
    const now = new Date();
    time.dateTime = now.toISOString();
    time.textContent = now.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' });
    const outcome = document.createElement('span');
    outcome.className = ok ? 'ok' : cancelled ? 'cancelled' : 'error';
    outcome.textContent = ok ? 'ok' : cancelled ? 'cancelled' : 'error';
    item.append(what, time, outcome);
    if (!ok && !cancelled && reason) {
      const why = document.createElement('span');
      why.className = 'reason';
      why.textContent = reason.length > 160 ? `${reason.slice(0, 157)}…` : reason;
      item.append(why);
    }
    const list = this.$('activity');
    list.prepend(item);
    while (list.children.length > ACTIVITY_SHOWN) list.lastElementChild.remove();
  }

  // ---- connecting an assistant ----

  showKind(kind) {
    for (const tab of this.querySelectorAll('.kind')) {
      const selected = tab.dataset.kind === kind;
      tab.setAttribute('aria-selected', String(selected));
      tab.tabIndex = selected ? 0 : -1;
      this.$(tab.getAttribute('aria-controls')).hidden = !selected;
    }
    try {
      localStorage.setItem(KIND_KEY, kind);
    } catch {
      // Private browsing: the choice is not remembered.
    }
  }

  /** The connect instructions for the session, with every URL from the public address. */
  showConnect(session) {
    const base = this.publicBase;
    const where = REACH[reach(base)];
    const cloud = where === REACH.public;
    this.$('mcp-url').textContent = `${base}/mcp`;
    this.$('actions-url').textContent = `${base}/openapi/actions.json`;
    this.$('session-url').textContent = session.connectorUrl || `${base}/mcp`;
    for (const code of this.querySelectorAll('.code-inline')) code.textContent = displayCode(session.code);
    this.$('connect-local').hidden = cloud;
    this.$('connect-local').textContent = where.notice;
    // Instructions that cannot work are not shown: a custom GPT calls from OpenAI's servers.
    this.$('tab-gpt').hidden = !cloud;
    this.$('tab-connector').textContent = cloud ? 'Claude · ChatGPT' : 'Desktop client';
    this.$('connector-where').textContent = where.connector;
    this.$('agent-elsewhere').textContent = where.agent;
    let kind = null;
    try {
      kind = localStorage.getItem(KIND_KEY);
    } catch {
      kind = null;
    }
    if (!['connector', 'gpt', 'agent'].includes(kind) || (kind === 'gpt' && !cloud)) kind = 'connector';
    this.showKind(kind);
  }

  /**
   * The prompt for an agent that can make HTTP requests (assistants with a connector need only
   * the code): short enough to paste, and every URL the public one.
   */
  prompt() {
    const session = this.conn?.session;
    if (!session || this.assistantMode) return null;
    const base = this.publicBase;
    const code = displayCode(session.code);
    const { mcp } = REACH[reach(base)];
    const api = `${base}/api/sessions/${code}`;
    const subject = this.getAttribute('subject') || 'the tools of a web page I have open';
    return [
      `For an AI agent that can make HTTP requests: you can use ${subject} through a relay.`,
      `Pairing code: ${code}`,
      `Relay: ${base}`,
      `1. First GET ${api}/metadata: it lists the tools with the JSON Schema of their args.`,
      `2. Call a tool: POST ${api}/call with JSON {"functionName": "<name>", "args": {...}}. The answer is {"success": true, "result": ...} or an error that says what to fix.`,
      `3. A 202 answer means it is still running: GET ${api}/requests/<requestId> for the result. A 404 means the code expired: ask me for the new one.`,
      ...(this.conn.approvalMode === 'ask'
        ? ['The first time you use the code I am asked once, in my browser tab, to allow you: your first call (or connect_session) waits until I answer.']
        : []),
      `With MCP instead (${mcp}): connect to ${base}/mcp and call connect_session with the code; or connect to this session alone: ${session.connectorUrl || `${base}/mcp`}`,
    ].join('\n');
  }

  /** Shows "Copied" on the button that copied, for a moment. */
  acknowledge(button) {
    if (!button) return;
    clearTimeout(button.copiedTimer);
    button.classList.add('done');
    button.textContent = 'Copied ✓';
    button.copiedTimer = setTimeout(() => {
      button.classList.remove('done');
      button.textContent = button.dataset.label;
      const key = button.getAttribute('aria-keyshortcuts');
      if (key) button.append(' ', Object.assign(document.createElement('kbd'), { textContent: key }));
    }, COPIED_MS);
  }

  async copy(text, what, button) {
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
      if (this.dataset.state === 'fresh') this.setState('copied');
      this.acknowledge(button);
      this.announce(`${what} copied. Paste it into your assistant.`);
    } else {
      this.announce(`Could not copy the ${what.toLowerCase()}; select it and copy by hand.`);
    }
  }

  // ---- asking before changes ----

  /**
   * Asks the user about a call that changes or deletes data; resolves true when allowed. A
   * call its caller cancels (`signal`) is not asked about any more: the question goes.
   */
  ask(call, signal) {
    if (!this.$('confirm').checked) return Promise.resolve(true);
    const ask = () =>
      new Promise((resolve) => {
        if (signal?.aborted) {
          resolve(false);
          return;
        }
        this.$('held-text').textContent = `${call.functionName} ${JSON.stringify(call.args)}`;
        this.$('held').hidden = false;
        this.announce(`The assistant wants to run ${call.functionName}. Allow or deny.`);
        const decide = (allowed) => {
          this.$('held').hidden = true;
          this.$('allow').onclick = null;
          this.$('deny').onclick = null;
          resolve(allowed);
        };
        this.$('allow').onclick = () => decide(true);
        this.$('deny').onclick = () => decide(false);
        signal?.addEventListener('abort', () => decide(false), { once: true });
        this.$('allow').focus();
      });
    // One question at a time.
    const answer = this.heldQueue.then(ask);
    this.heldQueue = answer.catch(() => false);
    return answer;
  }

  // ---- asking about new callers ----

  /** What the question about a caller calls the page: the `page-name` attribute. */
  get pageName() {
    return this.getAttribute('page-name') || 'this page';
  }

  /**
   * Shows the oldest open question about a caller (at the top, in view), or hides the box when
   * none is open. A new question is announced, takes the focus (unless the person is typing
   * in a field of the page) and ignores answers for a moment (APPROVAL_ARMING_MS).
   */
  showApprovals() {
    const pending = this.conn?.pendingApprovals ?? [];
    const first = pending[0] ?? null;
    const box = this.$('approval');
    const shownBefore = box.hidden ? null : box.dataset.callerId;
    this.showCount(pending.length);
    this.dataset.approval = first ? 'pending' : 'none';
    if (!first) {
      box.hidden = true;
      delete box.dataset.callerId;
      this.$('alert').textContent = '';
      return;
    }
    const text = approvalText(first, this.pageName);
    this.$('approval-text').textContent = text;
    const more = this.$('approval-more');
    more.hidden = pending.length < 2;
    more.textContent = `${pending.length - 1} more waiting after this one.`;
    box.dataset.callerId = first.callerId;
    box.hidden = false;
    if (shownBefore === first.callerId) return;
    this.arm();
    this.$('alert').textContent = `${text} Press a to allow or d to deny.`;
    box.scrollIntoView({ block: 'nearest' });
    const active = document.activeElement;
    const typing = active && !this.contains(active) && (active instanceof HTMLInputElement || active instanceof HTMLTextAreaElement || active.isContentEditable);
    if (!typing) this.$('approval-allow').focus();
  }

  /** Answers to the question just shown are ignored for a moment. */
  arm() {
    const buttons = [this.$('approval-allow'), this.$('approval-deny')];
    for (const button of buttons) button.setAttribute('aria-disabled', 'true');
    clearTimeout(this.armTimer);
    this.armTimer = setTimeout(() => {
      this.armTimer = null;
      for (const button of buttons) button.removeAttribute('aria-disabled');
    }, APPROVAL_ARMING_MS);
  }

  /** How many questions are open: a badge, and "(n) " before the page's title. */
  showCount(count) {
    const badge = this.$('approval-badge');
    if (badge) {
      badge.hidden = count === 0;
      badge.textContent = `${count} waiting`;
      badge.title = count === 1 ? 'An assistant is waiting for you to allow it' : `${count} assistants are waiting for you to allow them`;
    }
    const prefix = /^\(\d+\) /;
    if (count > 0) {
      // A title the page set meanwhile is the new one to restore.
      if (this.titleBase === null || !prefix.test(document.title)) this.titleBase = document.title.replace(prefix, '');
      document.title = `(${count}) ${this.titleBase}`;
    } else if (this.titleBase !== null) {
      if (prefix.test(document.title)) document.title = this.titleBase;
      this.titleBase = null;
    }
  }

  /** The person answers the question shown: allow (true) or deny the caller. */
  async answerApproval(allow) {
    const box = this.$('approval');
    const callerId = box.dataset.callerId;
    if (box.hidden || !callerId || this.armTimer || this.answering || !this.conn) return;
    this.answering = true;
    box.setAttribute('aria-busy', 'true');
    try {
      const outcome = await this.conn.approve(callerId, allow);
      if (outcome === null) this.announce('That question had already been closed.');
    } catch (error) {
      this.announce(`Your answer did not reach the relay (${error.message}). Answer again.`);
    } finally {
      this.answering = false;
      box.removeAttribute('aria-busy');
      this.showApprovals();
    }
  }

  approvalClosed({ outcome }) {
    const said = {
      allowed: `Allowed: the assistant can use ${this.pageName} now.`,
      declined: 'Denied: the assistant was refused.',
      timeout: 'Not answered in time: the assistant was refused. It may ask again.',
    }[outcome];
    if (said) this.announce(said);
    this.showApprovals();
  }

  /** The callers the person allowed (each with Disconnect), and whether the code refuses more. */
  showCallers() {
    const { allowed, refused } = this.conn?.callers ?? { allowed: [], refused: false };
    const items = allowed.map((caller) => {
      const item = document.createElement('li');
      const who = document.createElement('span');
      who.className = 'who';
      const since = clock(caller.since);
      who.textContent = `${shortLabel(caller.label, LABEL_LISTED)} via ${caller.via}${since ? ` — since ${since}` : ''}${caller.sharedAddress ? ` · everyone at ${caller.address}` : ''}`;
      const disconnect = document.createElement('button');
      disconnect.type = 'button';
      disconnect.className = 'secondary small';
      disconnect.textContent = 'Disconnect';
      disconnect.setAttribute('aria-label', `Disconnect ${shortLabel(caller.label, LABEL_LISTED)} via ${caller.via}`);
      disconnect.dataset.callerId = caller.callerId;
      disconnect.addEventListener('click', () => this.disconnectCaller(caller, disconnect));
      item.append(who, disconnect);
      return item;
    });
    this.$('callers-list').replaceChildren(...items);
    this.$('callers').hidden = items.length === 0;
    const notice = this.$('refused-callers');
    const newlyRefused = refused && notice.hidden;
    notice.hidden = !refused;
    if (newlyRefused) {
      this.announce('Three assistants were denied; this code no longer accepts new ones. Press New code for a new one.');
      notice.scrollIntoView({ block: 'nearest' });
    }
  }

  async disconnectCaller(caller, button) {
    button.disabled = true;
    try {
      await this.conn.disconnectCaller(caller.callerId);
      this.announce(`${shortLabel(caller.label, LABEL_LISTED)} is disconnected: it has to be allowed again.`);
    } catch (error) {
      button.disabled = false;
      this.announce(`Could not disconnect ${shortLabel(caller.label, LABEL_LISTED)} (${error.message}). Try again.`);
    }
  }

  // ---- controls ----

  wire() {
    const keys = this.hasAttribute('keys');
    if (keys) {
      for (const [id, key] of [['copy-prompt', 'c'], ['regenerate', 'r']]) {
        const button = this.$(id);
        button.setAttribute('aria-keyshortcuts', key);
        button.append(' ', Object.assign(document.createElement('kbd'), { textContent: key }));
      }
    }
    for (const tab of this.querySelectorAll('.kind')) {
      tab.addEventListener('click', () => this.showKind(tab.dataset.kind));
      tab.addEventListener('keydown', (event) => {
        if (event.key !== 'ArrowRight' && event.key !== 'ArrowLeft') return;
        const tabs = [...this.querySelectorAll('.kind')].filter((t) => !t.hidden);
        const next = tabs[(tabs.indexOf(tab) + (event.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length];
        this.showKind(next.dataset.kind);
        next.focus();
        event.preventDefault();
      });
    }
    for (const button of this.querySelectorAll('[data-copy]')) {
      button.addEventListener('click', () => this.copy(this.$(button.dataset.copy).textContent, 'URL', button));
    }
    const regenerate = () => this.conn?.regenerate();
    this.$('copy-prompt').addEventListener('click', (event) => this.conn?.session && this.copy(this.prompt(), 'Prompt', event.currentTarget));
    this.$('copy-code').addEventListener('click', (event) => this.conn?.session && !this.assistantMode && this.copy(displayCode(this.conn.session.code), 'Code', event.currentTarget));
    this.$('regenerate').addEventListener('click', regenerate);
    this.$('lifetime-new').addEventListener('click', regenerate);
    this.$('end').addEventListener('click', () => this.conn?.end());
    this.$('refused-new').addEventListener('click', regenerate);
    this.$('claim-connect').addEventListener('click', () => this.answerClaim(true));
    this.$('claim-decline').addEventListener('click', () => this.answerClaim(false));
    this.$('approval-allow').addEventListener('click', () => this.answerApproval(true));
    this.$('approval-deny').addEventListener('click', () => this.answerApproval(false));
    // a and d answer an open question about a caller (with or without the `keys` attribute).
    document.addEventListener('keydown', (event) => {
      if (this.$('approval').hidden || event.repeat || event.ctrlKey || event.metaKey || event.altKey) return;
      const target = event.target;
      if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement || target?.isContentEditable) return;
      if (event.key !== 'a' && event.key !== 'd') return;
      event.preventDefault();
      this.answerApproval(event.key === 'a');
    });
    if (!keys) return;
    document.addEventListener('keydown', (event) => {
      if (event.ctrlKey || event.metaKey || event.altKey) return;
      const target = event.target;
      if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement || target?.isContentEditable) return;
      if (event.key === 'c' && this.conn?.session && !this.assistantMode && !this.$('copy-prompt').disabled) this.copy(this.prompt(), 'Prompt', this.$('copy-prompt'));
      // An assistant's session is not thrown away by a stray key while it works.
      if (event.key === 'r' && (!this.assistantMode || ['expired', 'ended', 'refused'].includes(this.dataset.state))) regenerate();
    });
  }
}

if (!customElements.get('toolrelay-pairing')) customElements.define('toolrelay-pairing', ToolrelayPairing);
