// A page paired with the relay: its session (created, redeemed from a claim an assistant
// minted, or resumed after a reload), its tools
// (registered on every connection, and again when they change), its transport (transport.js)
// and the running of each call: once, with its arguments checked, answered whatever happens.
//
// Events (CustomEvent, `detail` as shown):
//   code           {code, display, expiresAt, maxExpiresAt, connectorUrl, restored, claimed}
//   status         {state: connecting | connected | disconnected | unreachable | refused |
//                   expired | ended | replaced, transport?, message?, code?}
//                  (refused: the relay would not redeem the claim; `code` is its error name)
//   registered     {tools}  the relay has the manifest
//   call-started   {requestId, name, args}
//   call-finished  {requestId, name, args, success, result?, error?}
//   expiry         {expiresAt}

import { Dispatcher, ToolError, heldForConfirmation } from './dispatcher.js';
import { ErrorCode, ToolErrorCode } from './errors.js';
import { ClaimRefused, Sessions } from './session.js';
import { Transport } from './transport.js';

// How long to wait before asking an unreachable relay for a session again.
const RETRY_PAIRING_MS = 5000;

/** `ABCDEFGH` as people read it: `ABCD-EFGH`. */
export function displayCode(code) {
  return `${code.slice(0, 4)}-${code.slice(4)}`;
}

/** Where this module was served from: the relay, unless the page says otherwise. */
function defaultRelay() {
  try {
    return new URL(import.meta.url).origin;
  } catch {
    return location.origin;
  }
}

export class Connection extends EventTarget {
  /**
   * @param {object} options
   * @param {string} [options.relay]  the relay's URL (default: the one that served the SDK)
   * @param {object[]} [options.tools]  `{name, description, inputSchema, execute(args)}` or
   *   grouped `{id, description, functions:[…]}`
   * @param {string} [options.group]  the group flat tools join (default `page`)
   * @param {string} [options.storageKey]  localStorage prefix for the session (default per path)
   * @param {boolean} [options.resume]  reconnect to this page's session after a reload (default true)
   * @param {string} [options.claim]  a claim an assistant minted (MCP `open_codap`): redeemed
   *   for its session instead of creating one, so no code is needed. The same claim given again
   *   (the page loaded anew) reconnects to that session without redeeming it twice.
   * @param {(call: object, signal: AbortSignal) => Promise<boolean>} [options.confirm]  asked before a call of a
   *   function not marked read-only
   */
  constructor(options = {}) {
    super();
    this.base = String(options.relay ?? defaultRelay()).replace(/\/+$/, '');
    this.group = options.group ?? 'page';
    this.dispatcher = options.dispatcher ?? new Dispatcher();
    for (const tool of options.tools ?? []) this.dispatcher.add(tool, this.group);
    this.sessions = new Sessions(this.base, {
      prefix: options.storageKey ?? `toolrelay-session:${location.pathname}:`,
      remember: options.resume !== false,
    });
    this.confirm = options.confirm ?? null;
    this.claim = options.claim || null;
    this.transport = null;
    /** connecting | connected | disconnected | unreachable | refused | expired | ended | replaced */
    this.state = 'connecting';
    this.registered = false;
    this.handled = 0;
    this.retryTimer = null;
  }

  // ---- what a page reads ----

  get session() {
    return this.sessions.current;
  }

  get code() {
    return this.sessions.current?.code ?? null;
  }

  /** The transport in use: websocket, sse or polling. */
  get transportKind() {
    return this.transport?.kind ?? null;
  }

  /** The relay has this connection's tools: assistants can see and call them. */
  get ready() {
    return this.registered && this.state === 'connected';
  }

  /** How often the connection failed or dropped, or an answer could not go. */
  get interruptions() {
    return this.transport?.interruptions ?? 0;
  }

  emit(name, detail) {
    this.dispatchEvent(new CustomEvent(name, { detail }));
  }

  setState(state, extra = {}) {
    this.state = state;
    if (state !== 'connected') this.registered = false;
    this.emit('status', { state, transport: this.transportKind, ...extra });
  }

  // ---- tools ----

  /** Adds (or replaces) a tool; a connected page registers its tools again. */
  addTool(tool) {
    this.dispatcher.add(tool, this.group);
    this.transport?.reregister();
  }

  /** Removes a tool (by name) or a group (by id); a connected page registers again. */
  removeTool(name) {
    const removed = this.dispatcher.remove(name);
    if (removed) this.transport?.reregister();
    return removed;
  }

  // ---- pairing ----

  /**
   * Pairs: with the claim it was given, else resumes this page's session when it can (or makes
   * a new one when `fresh`, which also leaves the claim behind).
   */
  async start(fresh = false) {
    this.stopTransport();
    clearTimeout(this.retryTimer);
    if (fresh) this.claim = null;
    this.setState('connecting');
    let opened;
    try {
      if (fresh) opened = { session: await this.sessions.create(), restored: false };
      else if (this.claim) opened = await this.sessions.openClaim(this.claim);
      else opened = await this.sessions.open();
    } catch (error) {
      // A refused claim stays refused (a rate limit passes): asking again would not help.
      if (error instanceof ClaimRefused && error.code !== ErrorCode.RATE_LIMITED) {
        this.setState('refused', { message: error.message, code: error.code });
        return;
      }
      // A browser tells a refused origin (CORS) and a network failure apart to nobody: say both.
      const message = error instanceof TypeError
        ? `Could not reach the relay at ${this.base}: ${error.message}. Either it is down, or it does not allow pages from ${globalThis.location?.origin ?? 'this origin'} (its CORS_ORIGIN).`
        : `Could not reach the relay: ${error.message}`;
      this.setState('unreachable', { message });
      this.retryTimer = setTimeout(() => this.start(fresh), RETRY_PAIRING_MS);
      return;
    }
    const { session, restored } = opened;
    this.handled = 0;
    this.emit('code', {
      code: session.code,
      display: displayCode(session.code),
      expiresAt: session.expiresAt,
      maxExpiresAt: session.maxExpiresAt,
      connectorUrl: session.connectorUrl,
      restored,
      claimed: Boolean(session.claimed),
    });
    this.startTransport(session);
  }

  startTransport(session) {
    const transport = new Transport(this.base, session, () => this.dispatcher.manifest(), (call, signal) => this.run(call, signal));
    this.transport = transport;
    const mine = (listener) => (event) => {
      if (this.transport === transport) listener(event.detail);
    };
    transport.addEventListener('status', mine(({ state }) => this.setState(state === 'connecting' ? 'connecting' : state)));
    transport.addEventListener('registered', mine((tools) => {
      this.registered = true;
      this.emit('registered', { tools });
    }));
    transport.addEventListener('fallback', mine((detail) => this.emit('fallback', detail)));
    transport.addEventListener('problem', mine((message) => this.emit('problem', { message })));
    transport.addEventListener('expiry', mine((expiresAt) => {
      this.sessions.setExpiry(expiresAt);
      this.emit('expiry', { expiresAt });
    }));
    transport.addEventListener('expired', mine((message) => this.expire(message || 'The session has ended.')));
    transport.addEventListener('replaced', mine((message) => {
      this.stopTransport();
      this.setState('replaced', { message: message || 'Another tab took over this session.' });
    }));
    transport.start();
  }

  stopTransport() {
    if (this.transport) this.transport.stop();
    this.transport = null;
  }

  /** The session is gone at the relay (expired, or its code no longer works). */
  expire(message) {
    this.stopTransport();
    this.sessions.forget();
    this.setState('expired', { message });
  }

  /** Ends this session and pairs again with a new code. */
  async regenerate() {
    this.stopTransport();
    await this.sessions.end();
    await this.start(true);
  }

  /** Ends the session at the relay: its code stops working at once. */
  async end() {
    clearTimeout(this.retryTimer);
    this.stopTransport();
    await this.sessions.end();
    this.setState('ended');
  }

  /** Disconnects, leaving the session for this page's next load to resume. */
  close() {
    clearTimeout(this.retryTimer);
    this.stopTransport();
    this.sessions.release();
    this.setState('disconnected');
  }

  // ---- calls ----

  /**
   * Runs one call (the transport sees that it runs once); always resolves with its answer.
   * `signal` is aborted when the caller cancels it: the tool sees it (`execute(args,
   * {signal})`), and the answer says `cancelled`.
   */
  async run(call, signal = new AbortController().signal) {
    const { requestId, toolId, functionName, args } = call;
    this.handled += 1;
    this.emit('call-started', { requestId, name: functionName, args });
    let answer;
    try {
      const fn = this.dispatcher.find(toolId, functionName);
      if (fn && this.confirm && heldForConfirmation(fn, args) && !(await this.confirm(call, signal))) {
        throw new ToolError(ToolErrorCode.DECLINED_BY_USER, 'The user declined this change. Ask them before trying again.');
      }
      const result = await this.dispatcher.call(toolId, functionName, args, { signal });
      // What cannot travel as JSON (a cycle, a BigInt) is a failure, not a lost answer.
      const json = JSON.stringify(result === undefined ? null : result);
      answer = { requestId, success: true, result: JSON.parse(json) };
    } catch (error) {
      const code = error?.code && typeof error.code === 'string' ? error.code : ToolErrorCode.TOOL_ERROR;
      const message = error?.message || String(error);
      answer = { requestId, success: false, error: { code, message } };
    }
    if (signal.aborted) {
      answer = { requestId, success: false, error: { code: ErrorCode.CANCELLED, message: 'The caller cancelled the call.' } };
    }
    this.emit('call-finished', { requestId, name: functionName, args, ...answer });
    return answer;
  }
}

/**
 * Pairs this page with the relay and serves `tools`: returns the Connection at once (its
 * `code` event says when the pairing code is there). With `claim` (from an assistant's
 * `open_codap`, say) the page is paired with that assistant's session and needs no code:
 *
 *   const relay = connect({ claim: new URL(location.href).searchParams.get('claim'), tools });
 *   relay.addEventListener('status', (event) => {
 *     if (event.detail.state === 'refused') show(event.detail.message); // used, expired, unknown
 *   });
 */
export function connect(options = {}) {
  const connection = new Connection(options);
  connection.start();
  return connection;
}
