// A page paired with the relay: its session (created, redeemed from a claim an assistant
// minted, or resumed after a reload), its tools
// (registered on every connection, and again when they change), its transport (transport.js)
// and the running of each call: once, with its arguments checked, answered whatever happens.
//
// Events (CustomEvent, `detail` as shown):
//   code           {code, display, expiresAt, maxExpiresAt, connectorUrl, restored, claimed}
//   status         {state: connecting | asking | connected | disconnected | unreachable |
//                   refused | expired | ended | replaced, transport?, message?, code?,
//                   label?, expiresAt?}
//                  (asking: a claim waits for the person's answer, `answerClaim(connect)`;
//                  `label` is who opened it, as its MCP client says, `expiresAt` until when.
//                  refused: the relay would not redeem the claim; `code` is its error name)
//   registered     {tools}  the relay has the manifest
//   call-started   {requestId, name, args}
//   call-finished  {requestId, name, args, success, result?, error?}
//   expiry         {expiresAt}
//   approval-request  {callerId, label, via, address, expiresAt, sharedAddress}  a caller the
//                  person has not allowed uses the code: ask them (approve(callerId, allow));
//                  once per question (the relay's repeats after a reconnect are not events)
//   approval-closed   {callerId, outcome: allowed | declined | timeout | gone}  the question is
//                  over (`gone`: the relay no longer asks, or the session ended or changed)
//   callers        {allowed: [{callerId, label, via, address, since, sharedAddress}], refused}
//                  the callers the person allowed, and whether the session refuses new ones
//                  (after three denials: only a new code helps)
//
// Approvals (`approve` option): with 'ask' the relay holds the first use of the code by each
// caller the person has not allowed, and this page asks the person (<toolrelay-pairing> shows
// the question; a page of its own listens to `approval-request`); with 'auto' it does not ask.
//
// Claims (`claim` option, 32 hex digits; anything else is no claim): whoever has a claim link
// can send it to anyone, so a claim pairs without asking only where an assistant's app opened
// the page: framed `claimFrameDepth` levels below the top window (the CODAP plugin: 2, the app
// frames CODAP, which frames it), under a top-level page of one of the relay's known app hosts
// (`appHosts` of its discovery document; checked where the browser tells the ancestors' origins,
// `location.ancestorOrigins`). Anywhere else — a link opened in a tab, an unknown host, no
// discovery — the connection asks first: status `asking` with who opened the claim (`POST
// /api/sessions/claim/about`, which does not spend it); `answerClaim(true)` redeems it,
// `answerClaim(false)` leaves it unspent and pairs with a new session of the page's own. A
// session from a claim is kept for this tab only (session.js): a load without the claim never
// rejoins it, and a load with a claim never resumes the page's own kept session.

import { Dispatcher, ToolError, heldForConfirmation } from './dispatcher.js';
import { ErrorCode, ToolErrorCode } from './errors.js';
import { callContext } from './progress.js';
import { answerOf } from './result.js';
import { ClaimRefused, Sessions, isClaim } from './session.js';
import { Transport } from './transport.js';

// How long to wait before asking an unreachable relay for a session again.
const RETRY_PAIRING_MS = 5000;
// Closed questions remembered, so that a repeat that crossed the close is not asked again.
const REMEMBERED_CLOSES = 100;

/** `ABCDEFGH` as people read it: `ABCD-EFGH`. */
export function displayCode(code) {
  return `${code.slice(0, 4)}-${code.slice(4)}`;
}

/**
 * Whether this page runs where an assistant's app put it: framed at least `depth` levels below
 * the top window, and, where the browser tells the ancestors' origins, under a top-level page
 * of one of `appHosts` (origins). In any doubt (no hosts known, an origin not listed, a window
 * that cannot be compared) it says no.
 */
export function underAppHost(appHosts, { depth = 1, win = globalThis.window } = {}) {
  const known = new Set();
  for (const host of Array.isArray(appHosts) ? appHosts : []) {
    try {
      known.add(new URL(host).origin);
    } catch {
      // Not an origin: it names nothing.
    }
  }
  if (!known.size || !win) return false;
  try {
    let frame = win;
    for (let level = 0; level < Math.max(1, depth); level += 1) {
      if (frame === frame.top) return false;
      frame = frame.parent;
    }
    const ancestors = win.location.ancestorOrigins;
    if (ancestors && !known.has(ancestors[ancestors.length - 1])) return false;
    return true;
  } catch {
    return false;
  }
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
   * @param {string} [options.claim]  a claim an assistant minted (MCP `open_codap`, 32 hex
   *   digits; anything else is ignored): redeemed for its session instead of creating one, so
   *   no code is needed — at once inside an app host's conversation, else once the person says
   *   yes (status `asking`, `answerClaim`). The same claim given again in the same tab (a
   *   reload) reconnects to that session without asking or redeeming it twice.
   * @param {number} [options.claimFrameDepth]  how many frames below the app host's page an app
   *   puts this page (default 1; the CODAP plugin: 2): a claim pairs without asking only there
   * @param {(call: object, signal: AbortSignal) => Promise<boolean>} [options.confirm]  asked before a call of a
   *   function not marked read-only
   * @param {'ask' | 'auto'} [options.approve]  'ask': the person allows each new caller in this
   *   page before its first call runs (the page shows `approval-request` events, as
   *   <toolrelay-pairing> does); 'auto': callers are not asked about. Default: 'ask' while a
   *   <toolrelay-pairing> shows this connection, 'auto' without one (nobody would see the
   *   question). Pass 'auto' to opt out with the element too.
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
    if (options.approve !== undefined && options.approve !== 'ask' && options.approve !== 'auto') {
      throw new TypeError(`approve is 'ask' or 'auto', not ${JSON.stringify(options.approve)}`);
    }
    this.approveOption = options.approve ?? null;
    this.approvalUi = false;
    /** The questions open about callers, by callerId: {frame, seenAt}, oldest first. */
    this.approvalRequests = new Map();
    /** Questions the relay has closed, by callerId → expiresAt: a late repeat is not asked again. */
    this.closedApprovals = new Map();
    /** The callers the person allowed, and whether the session refuses new ones. */
    this.callers = { allowed: [], refused: false };
    this.claim = isClaim(options.claim) ? options.claim : null;
    this.claimFrameDepth = options.claimFrameDepth ?? 1;
    /** The open question about the claim: {label, expiresAt, resolve}, or null. */
    this.claimQuestion = null;
    this.discovery = null;
    this.attempt = 0;
    this.transport = null;
    /** connecting | asking | connected | disconnected | unreachable | refused | expired | ended | replaced */
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

  /**
   * 'ask' (the relay holds each new caller until the person allows it here) or 'auto' (it
   * does not ask): the `approve` option, else 'ask' while a UI shows the questions.
   */
  get approvalMode() {
    return this.approveOption ?? (this.approvalUi ? 'ask' : 'auto');
  }

  /** The oldest open question about a caller (an `approval-request`'s detail), or null. */
  get pendingApproval() {
    return this.approvalRequests.values().next().value?.frame ?? null;
  }

  /** The question about the claim while one is open (status `asking`): {label, expiresAt}, or null. */
  get pendingClaim() {
    const question = this.claimQuestion;
    return question ? { label: question.label, expiresAt: question.expiresAt } : null;
  }

  /** Every open question about a caller, oldest first. */
  get pendingApprovals() {
    return [...this.approvalRequests.values()].map((entry) => entry.frame);
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

  // ---- approving callers ----

  /**
   * A UI that shows the questions about callers (<toolrelay-pairing>) shows this connection
   * (`shown`) or no longer does: without an `approve` option, the page asks while one does.
   */
  setApprovalUi(shown) {
    const before = this.approvalMode;
    this.approvalUi = Boolean(shown);
    if (this.approvalMode !== before) this.transport?.reregister();
  }

  /**
   * The person's answer about caller `callerId` (from `approval-request`): allow it (true) or
   * deny it. Over the open WebSocket, else `POST /api/sessions/{code}/approvals/{callerId}`.
   * Resolves with the outcome, `allowed` or `declined`, or null when the relay no longer asks
   * about that caller; the question is closed either way. Throws when the answer could not go
   * (the question stays open: answer again).
   */
  async approve(callerId, allow) {
    if (!this.transport) throw new Error('Not connected to the relay.');
    const { outcome, confirmed } = await this.transport.approve(callerId, Boolean(allow));
    this.closeApproval(callerId, outcome ?? 'gone', confirmed);
    return outcome;
  }

  /**
   * Disconnects a caller the person allowed: its handle stops working, and its next use of
   * the code asks again. Over the open WebSocket, else
   * `DELETE /api/sessions/{code}/approvals/{callerId}`. Throws when that could not go.
   */
  async disconnectCaller(callerId) {
    if (!this.transport) throw new Error('Not connected to the relay.');
    await this.transport.disconnectCaller(callerId);
    // The relay's next `callers` says the same.
    const allowed = this.callers.allowed.filter((caller) => caller.callerId !== callerId);
    if (allowed.length !== this.callers.allowed.length) this.setCallers({ ...this.callers, allowed });
  }

  /** A question from the relay: asked once (its repeats, after a reconnect, only refresh it). */
  approvalRequested(frame) {
    if (!frame?.callerId) return;
    const detail = {
      callerId: frame.callerId,
      label: frame.label || 'an unnamed assistant',
      via: frame.via || 'the relay',
      address: frame.address || '',
      expiresAt: frame.expiresAt ?? frame.at ?? null,
      sharedAddress: Boolean(frame.sharedAddress),
    };
    // The same question again (it has the same expiry) after the relay closed it: a repeat
    // that crossed the close (a poll under way, say).
    if (detail.expiresAt && this.closedApprovals.get(detail.callerId) === detail.expiresAt) return;
    const known = this.approvalRequests.has(detail.callerId);
    this.approvalRequests.set(detail.callerId, { frame: detail, seenAt: performance.now() });
    if (!known) this.emit('approval-request', detail);
  }

  /**
   * The question about `callerId` is over (if it was open); `confirmed`: the relay said so (an
   * answer only sent over the socket is not: if the relay asks again, the question shows again).
   */
  closeApproval(callerId, outcome, confirmed = true) {
    const entry = this.approvalRequests.get(callerId);
    if (!entry) return;
    this.approvalRequests.delete(callerId);
    if (confirmed && entry.frame.expiresAt) {
      this.closedApprovals.delete(callerId);
      this.closedApprovals.set(callerId, entry.frame.expiresAt);
      while (this.closedApprovals.size > REMEMBERED_CLOSES) this.closedApprovals.delete(this.closedApprovals.keys().next().value);
    }
    this.emit('approval-closed', { callerId, outcome });
  }

  /** The relay's list of allowed callers (a `callers` frame). */
  setCallers(frame) {
    const allowed = (Array.isArray(frame?.allowed) ? frame.allowed : []).filter((caller) => caller?.callerId).map((caller) => ({
      callerId: caller.callerId,
      label: caller.label || 'an unnamed assistant',
      via: caller.via || 'the relay',
      address: caller.address || '',
      since: caller.since ?? caller.at ?? null,
      sharedAddress: Boolean(caller.sharedAddress),
    }));
    this.callers = { allowed, refused: Boolean(frame?.refused) };
    // A caller allowed (in another tab of the session, say) is no longer asked about.
    for (const caller of allowed) this.closeApproval(caller.callerId, 'allowed');
    this.emit('callers', { allowed: [...allowed], refused: this.callers.refused });
  }

  /**
   * What the relay said on a (re)connection (`approvals`): its callers, and its open
   * questions; a question heard of before and no longer open closed while the page was away.
   */
  approvalsRead({ pending, allowed, refused, askedAt }) {
    const open = new Set(pending.map((frame) => frame.callerId));
    for (const [callerId, entry] of [...this.approvalRequests]) {
      if (!open.has(callerId) && entry.seenAt < askedAt) this.closeApproval(callerId, 'gone');
    }
    for (const frame of pending) this.approvalRequested(frame);
    this.setCallers({ allowed, refused });
  }

  /** The session ended or changed: its questions and callers are not this page's any more. */
  forgetApprovals() {
    for (const callerId of [...this.approvalRequests.keys()]) this.closeApproval(callerId, 'gone');
    this.closedApprovals.clear();
    if (this.callers.allowed.length || this.callers.refused) this.setCallers({ allowed: [], refused: false });
  }

  // ---- pairing ----

  /**
   * The relay's discovery document (`/.well-known/codap-mcp.json`), or null when it could not
   * be read; read once (a failure is asked again next time).
   */
  discover() {
    this.discovery ??= fetch(`${this.base}/.well-known/codap-mcp.json`)
      .then((response) => (response.ok ? response.json() : null))
      .catch(() => null)
      .then((discovery) => {
        if (!discovery) this.discovery = null;
        return discovery;
      });
    return this.discovery;
  }

  /**
   * The person's answer to the question about the claim (status `asking`): connect (true)
   * redeems it and pairs with the assistant's session; false leaves it unspent and pairs with
   * a new session of this page's own. Returns false when no question was open.
   */
  answerClaim(connect) {
    const question = this.claimQuestion;
    if (!question) return false;
    this.claimQuestion = null;
    question.resolve(Boolean(connect));
    return true;
  }

  /** Drops an open question about the claim unanswered (the connection starts over or stops). */
  dropClaimQuestion() {
    const question = this.claimQuestion;
    this.claimQuestion = null;
    question?.resolve(null);
  }

  /**
   * The claim's session: the one this tab already holds for it, else redeemed — once the
   * person says yes, where the page is not inside an app host's conversation. Resolves with
   * what `Sessions.open` does, with `{declined: true}` when the person said no, or with null
   * when the question was dropped unanswered.
   */
  async openClaim(claim) {
    const kept = await this.sessions.resumeClaim(claim);
    if (kept) return kept;
    const discovery = await this.discover();
    if (!underAppHost(discovery?.appHosts, { depth: this.claimFrameDepth })) {
      const about = await this.sessions.describeClaim(claim);
      const connect = await new Promise((resolve) => {
        this.claimQuestion = { label: about.label, expiresAt: about.expiresAt, resolve };
        this.setState('asking', { label: about.label, expiresAt: about.expiresAt });
      });
      if (connect === null) return null;
      if (!connect) return { declined: true };
      this.setState('connecting');
    }
    return this.sessions.redeemClaim(claim);
  }

  /**
   * Pairs: with the claim it was given (never resuming this page's own kept session), else
   * resumes this page's session when it can (or makes a new one when `fresh`, which also
   * leaves the claim behind).
   */
  async start(fresh = false) {
    this.stopTransport();
    this.forgetApprovals();
    this.dropClaimQuestion();
    clearTimeout(this.retryTimer);
    const attempt = (this.attempt += 1);
    if (fresh) this.claim = null;
    this.setState('connecting');
    let opened;
    try {
      if (fresh) opened = { session: await this.sessions.create(), restored: false };
      else if (this.claim) opened = await this.openClaim(this.claim);
      else opened = await this.sessions.open();
      // Not for this page's assistant: the claim stays unspent, the page pairs on its own.
      if (opened?.declined && attempt === this.attempt) {
        this.claim = null;
        opened = { session: await this.sessions.create(), restored: false };
      }
    } catch (error) {
      if (attempt !== this.attempt) return;
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
    // Started over (or stopped) meanwhile: that start pairs.
    if (!opened || attempt !== this.attempt) return;
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
    const transport = new Transport(this.base, session, () => this.dispatcher.manifest(), (call, signal, notify) => this.run(call, signal, notify), {
      approves: () => this.approvalMode === 'ask',
    });
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
    transport.addEventListener('approval-request', mine((frame) => this.approvalRequested(frame)));
    transport.addEventListener('approval-closed', mine(({ callerId, outcome }) => this.closeApproval(callerId, outcome || 'gone')));
    transport.addEventListener('callers', mine((frame) => this.setCallers(frame)));
    transport.addEventListener('approvals', mine((read) => this.approvalsRead(read)));
    transport.addEventListener('expired', mine((message) => this.expire(message || 'The session has ended.')));
    transport.addEventListener('replaced', mine((message) => {
      this.stopTransport();
      this.forgetApprovals();
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
    this.forgetApprovals();
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
    this.attempt += 1;
    this.dropClaimQuestion();
    this.stopTransport();
    this.forgetApprovals();
    await this.sessions.end();
    this.setState('ended');
  }

  /** Disconnects, leaving the session for this page's next load to resume. */
  close() {
    clearTimeout(this.retryTimer);
    this.attempt += 1;
    this.dropClaimQuestion();
    this.stopTransport();
    this.forgetApprovals();
    this.sessions.release();
    this.setState('disconnected');
  }

  // ---- calls ----

  /**
   * Runs one call (the transport sees that it runs once); always resolves with its answer.
   * `signal` is aborted when the caller cancels it: the tool sees it (`execute(args,
   * {signal, progress, log})`), and the answer says `cancelled`. `notify(frame)` sends the
   * tool's `progress` and `log` frames while it runs (progress.js). A tool returning a
   * ToolResult answers with content (result.js), anything else with a result.
   */
  async run(call, signal = new AbortController().signal, notify = () => {}) {
    const { requestId, toolId, functionName, args } = call;
    this.handled += 1;
    this.emit('call-started', { requestId, name: functionName, args });
    const context = callContext(requestId, notify);
    let answer;
    try {
      const fn = this.dispatcher.find(toolId, functionName);
      if (fn && this.confirm && heldForConfirmation(fn, args) && !(await this.confirm(call, signal))) {
        throw new ToolError(ToolErrorCode.DECLINED_BY_USER, 'The user declined this change. Ask them before trying again.');
      }
      const value = await this.dispatcher.call(toolId, functionName, args, { signal, progress: context.progress, log: context.log });
      // What cannot travel as JSON (a cycle, a BigInt) is a failure, not a lost answer.
      answer = answerOf(requestId, value);
    } catch (error) {
      const code = error?.code && typeof error.code === 'string' ? error.code : ToolErrorCode.TOOL_ERROR;
      const message = error?.message || String(error);
      answer = { requestId, success: false, error: { code, message } };
    } finally {
      context.close();
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
 * `open_codap`, say) the page is paired with that assistant's session and needs no code —
 * after asking the person, unless an app host's conversation framed the page (<toolrelay-pairing>
 * asks; a page without one answers `asking` itself, or it waits for ever):
 *
 *   const relay = connect({ claim: new URL(location.href).searchParams.get('claim'), tools });
 *   relay.addEventListener('status', (event) => {
 *     const { state, label, message } = event.detail;
 *     if (state === 'asking') relay.answerClaim(confirm(`Connect this page to the assistant that sent the link (${label ?? 'unnamed'})?`));
 *     if (state === 'refused') show(message); // used, expired, unknown
 *   });
 *
 * A page that shows no <toolrelay-pairing> but asks the person about new callers itself:
 *
 *   const relay = connect({ tools, approve: 'ask' });
 *   relay.addEventListener('approval-request', (event) => {
 *     const { callerId, label, via } = event.detail;
 *     relay.approve(callerId, confirm(`Allow ${label} (via ${via}) to use this page?`));
 *   });
 */
export function connect(options = {}) {
  const connection = new Connection(options);
  connection.start();
  return connection;
}
