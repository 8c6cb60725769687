// A page's connection to the relay: WebSocket first, server-sent events when WebSocket fails,
// 1-second polling when SSE fails too (transport-websocket.js, transport-sse.js and
// transport-polling.js each open one kind; this file holds what they share: the choice, the
// backoff, the session's end and the answers). Reconnects with jittered backoff. Calls are
// de-duplicated by requestId (the relay delivers at least once), and every result or error is
// kept until the relay has it: over WebSocket until an `ack` frame names it (sent again after
// an `error` frame naming its requestId, and after a reconnect), over HTTP until a POST is
// answered with anything but a 5xx or 429 (sent again after a short backoff). A call
// delivered again gets the answer it had, without running twice. A call the caller cancels
// (a `cancel` frame, SSE event or polling item naming it) has its AbortSignal aborted; its
// answer is not sent (the relay has the call's end already).
//
// Approvals: a tab that registers with `approves: true` is asked by the relay before a caller
// it has not allowed uses its code. The relay's `approval-request`, `approval-closed` and
// `callers` frames (SSE events, polling items) come out of the Transport as events of those
// names (`detail`: the frame); `approve` and `disconnectCaller` answer over the socket when it
// is open, else over HTTP. On every connection such a tab also reads the relay's list
// (`GET …/approvals`) and emits it as an `approvals` event: a question closed while the tab
// was away is then known to be over.
//
// The openers keep none of this: each is called as `open(where, callbacks)` with what it needs
// to connect (its URL; polling's headers too) and the callbacks it reports through (see
// `callbacks` below), and returns `{send(frame), close()}`. `send` says whether the frame went
// over the connection: only an open WebSocket carries frames up, and what it does not carry goes
// over HTTP from here (answers, a running call's progress and log frames, approvals, the
// manifest). `close` ends the connection for good.
// The connection, the backoff, the fallback, the answers and their acks are kept and changed in
// this file only.

import { ErrorCode } from './errors.js';
import { openPolling } from './transport-polling.js';
import { openEventStream } from './transport-sse.js';
import { openWebSocket } from './transport-websocket.js';

const BACKOFF_START_MS = 500;
const BACKOFF_MAX_MS = 10000;
// A transport that fails this many times in a row without ever working is given up for the next.
const FAILURES_BEFORE_FALLBACK = 2;
// Answers kept to answer a redelivered call again without running it twice.
const REMEMBERED_ANSWERS = 500;
// The first wait before an answer the relay could not store goes again; it doubles up to the
// most while the relay keeps failing.
const RESEND_START_MS = 250;
const RESEND_MAX_MS = 5000;

// How each transport connects, in the order they are tried.
const OPEN = { websocket: openWebSocket, sse: openEventStream, polling: openPolling };
const ORDER = Object.keys(OPEN);

// The relay's refusals that mean this tab's session is no longer there for it.
const SESSION_GONE = new Set([ErrorCode.SESSION_NOT_FOUND, ErrorCode.INVALID_TOKEN, ErrorCode.TOKEN_REQUIRED, ErrorCode.INVALID_CODE]);
// The same, as the HTTP statuses polling sees.
const SESSION_GONE_STATUSES = new Set([401, 403, 404]);
// The relay's frames about callers, emitted as events of the same names.
const APPROVAL_FRAMES = new Set(['approval-request', 'approval-closed', 'callers']);

/**
 * Whether what the relay said (a frame, or `{type: 'error', status}` for an HTTP refusal) ends
 * this tab's session for good, and how: 'replaced' (another tab took it over), 'expired' (it
 * ended, or its code or token is no longer valid), or null (keep going). An error naming a
 * call is about that answer, not the session. Every transport decides through this.
 */
export function sessionEnd(frame) {
  if (frame.type === 'expired') return 'expired';
  if (frame.type !== 'error' || frame.requestId) return null;
  if (frame.error === ErrorCode.REPLACED) return 'replaced';
  return SESSION_GONE.has(frame.error) || SESSION_GONE_STATUSES.has(frame.status) ? 'expired' : null;
}

function jittered(ms) {
  return ms * (0.5 + Math.random());
}

export class Transport extends EventTarget {
  /**
   * @param {string} base  the relay's origin
   * @param {{code: string, token: string}} session
   * @param {() => object[]} manifest  the tools to register
   * @param {(call: object, signal: AbortSignal, notify: (frame: object) => void) => Promise<object>} run
   *   runs a call (the signal is aborted if the caller cancels it; `notify` sends its progress
   *   and log frames); resolves with {success, result?, content?, structuredContent?, error?}
   * @param {{approves?: boolean | (() => boolean)}} [options]  `approves`: whether the person
   *   allows each new caller in this tab (sent with every registration; default false)
   */
  constructor(base, session, manifest, run, options = {}) {
    super();
    this.base = base;
    this.session = session;
    this.manifest = manifest;
    this.run = run;
    const approves = options.approves ?? false;
    this.approves = typeof approves === 'function' ? () => Boolean(approves()) : () => Boolean(approves);
    this.kind = ORDER[0];
    this.failures = 0;
    this.backoff = BACKOFF_START_MS;
    this.stopped = false;
    this.connection = null; // the {send, close} of the connection under way (see the top)
    this.retryTimer = null;
    this.answers = new Map(); // requestId → answer (or a promise of it while running)
    this.running = new Map(); // requestId → the AbortController of a call running
    this.unsent = new Map(); // requestId → answer the relay has not acknowledged yet
    this.resends = new Map(); // requestId → {timer, wait}: when an unsent answer goes again
    this.polling = false; // polling works: a poll went through, and none has failed since
    this.polledQuestion = null; // the open question the last poll named, by callerId
    this.interruptions = 0; // connections that failed or dropped, and answers that could not go
  }

  url(path) {
    return `${this.base}/api/sessions/${this.session.code}${path}`;
  }

  start() {
    this.stopped = false;
    this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    for (const { timer } of this.resends.values()) clearTimeout(timer);
    this.resends.clear();
    if (this.connection) this.connection.close();
    this.connection = null;
  }

  emit(name, detail) {
    this.dispatchEvent(new CustomEvent(name, { detail }));
  }

  connect() {
    if (this.stopped) return;
    const kind = this.kind;
    this.emit('status', { state: 'connecting', transport: kind });
    // The opener's handle is kept as the connection unless the connection is over before the
    // opener returns (a WebSocket that cannot even be made fails at once).
    let connection = null;
    let over = false;
    const forget = () => {
      over = true;
      if (this.connection === connection) this.connection = null;
    };
    connection = OPEN[kind](this.where(kind), this.callbacks(kind, forget));
    if (!over) this.connection = connection;
  }

  /** What the opener of `kind` needs to connect: its URL, and polling's headers. */
  where(kind) {
    const token = encodeURIComponent(this.session.token);
    if (kind === 'websocket') return { url: this.url(`/ws?token=${token}`).replace(/^http/, 'ws') };
    if (kind === 'sse') return { url: this.url(`/stream?token=${token}`) };
    return { url: this.url('/request'), headers: this.auth() };
  }

  /**
   * The callbacks a connection of `kind` reports through (each opener's comment says which it
   * uses); `forget` drops that connection as the Transport's, once it is over. `opened()`: the
   * relay took the connection. `failed(everWorked)`: it failed or dropped, and is tried again.
   * `closed()`: it closed after the session ended, and is not. `ended(frame)`: whether the frame
   * ends the session (emitting the end). `registration()`: what a `register` frame says;
   * `putManifest()` registers over HTTP. `approval(frame)`: whether it was a frame about
   * callers. `settled(requestId)`: the relay acknowledged that answer; `retry(requestId)`: it
   * could not store it now. `interrupted()`: connection trouble the connection gets over by
   * itself. `resend()`: the unacknowledged answers go again now. `asked(callerId)`: the open
   * question a poll named. The rest say what the relay said, or ask for what a poll needs.
   */
  callbacks(kind, forget) {
    return {
      opened: () => {
        if (kind === 'polling') this.polling = true;
        this.connected();
      },
      failed: (everWorked) => {
        forget();
        if (kind === 'polling') this.polling = false;
        this.failed(everWorked);
      },
      closed: forget,
      ended: (frame) => this.ended(frame),
      expiry: (expiresAt) => this.emit('expiry', expiresAt),
      registration: () => this.registration(),
      putManifest: () => this.putManifest(),
      registered: (tools) => this.emit('registered', tools),
      call: (frame) => this.handle(frame),
      cancel: (requestId) => this.cancel(requestId),
      approval: (frame) => this.approvalFrame(frame),
      settled: (requestId) => this.settled(requestId),
      retry: (requestId) => {
        this.interruptions += 1;
        this.resendLater(requestId);
      },
      problem: (message) => this.emit('problem', message),
      interrupted: () => {
        this.interruptions += 1;
      },
      resend: () => this.resendUnsent(),
      runningIds: () => this.runningIds(),
      asked: (callerId) => this.asked(callerId),
    };
  }

  /** The connection failed or dropped: try again later, or move to the next transport. */
  failed(everWorked) {
    if (this.stopped) return;
    this.interruptions += 1;
    this.emit('status', { state: 'disconnected', transport: this.kind });
    this.failures = everWorked ? 0 : this.failures + 1;
    if (this.failures >= FAILURES_BEFORE_FALLBACK && this.kind !== ORDER[ORDER.length - 1]) {
      this.kind = ORDER[ORDER.indexOf(this.kind) + 1];
      this.failures = 0;
      this.backoff = BACKOFF_START_MS;
      this.emit('fallback', { transport: this.kind });
    }
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => this.connect(), jittered(this.backoff));
    this.backoff = Math.min(this.backoff * 2, BACKOFF_MAX_MS);
  }

  /** Emits the session's end when `frame` says it is gone (see sessionEnd); says whether it did. */
  ended(frame) {
    const end = sessionEnd(frame);
    if (end) this.emit(end, frame.message);
    return end !== null;
  }

  connected() {
    this.failures = 0;
    this.backoff = BACKOFF_START_MS;
    this.emit('status', { state: 'connected', transport: this.kind });
    // Answers that could not go out while the connection was down go now.
    this.resendUnsent();
    if (this.approves()) this.readApprovals();
  }

  /** Sends every answer the relay has not acknowledged yet again now. */
  resendUnsent() {
    for (const answer of [...this.unsent.values()]) this.send(answer);
  }

  /** What every registration says: the tools, and whether the person approves callers here. */
  registration() {
    return { tools: this.manifest(), approves: this.approves() };
  }

  /** The tools (or whether the person approves) changed: register again on the live connection. */
  reregister() {
    if (this.connection?.send({ type: 'register', ...this.registration() })) return;
    // Over HTTP while an event stream is open (or opening: the connection is SSE's until it
    // fails, the kind changing only then) or while polling works. Otherwise the next connection
    // registers them.
    if ((this.kind === 'sse' && this.connection) || this.polling) this.putManifest();
  }

  // ---- approvals ----

  /**
   * Emits a frame about callers (`approval-request`, `approval-closed`, `callers`) as the event
   * of its name; says whether `frame` was one.
   */
  approvalFrame(frame) {
    if (!frame || !APPROVAL_FRAMES.has(frame.type)) return false;
    this.emit(frame.type, frame);
    return true;
  }

  /**
   * Reads the relay's list of callers and its open question, emitted as `approvals`
   * `{pending: [frame…], allowed, refused, askedAt}` (`askedAt`: performance.now() when asked;
   * a question heard of before then and not in `pending` is over). Nothing when it fails.
   */
  async readApprovals() {
    const askedAt = performance.now();
    try {
      const response = await fetch(this.url('/approvals'), { headers: this.auth() });
      if (!response.ok || this.stopped) return;
      const body = await response.json();
      const pending = (Array.isArray(body.pending) ? body.pending : [body.pending]).filter((frame) => frame?.callerId);
      this.emit('approvals', {
        pending: pending.map((frame) => ({ ...frame, type: 'approval-request' })),
        allowed: Array.isArray(body.allowed) ? body.allowed : [],
        refused: Boolean(body.refused),
        askedAt,
      });
    } catch {
      // The relay's frames say the same as they come.
    }
  }

  /**
   * A poll named the open question about `callerId` (null: none). The relay names it in every
   * poll until it closes, so one the last poll named and this one does not is over.
   */
  asked(callerId) {
    if (this.polledQuestion && this.polledQuestion !== callerId) {
      this.approvalFrame({ type: 'approval-closed', callerId: this.polledQuestion, outcome: 'gone' });
    }
    this.polledQuestion = callerId;
  }

  /**
   * The person's answer about caller `callerId`: over the open socket, else
   * `POST …/approvals/{callerId}`. Resolves with `{outcome, confirmed}`: the outcome (`allowed`
   * or `declined`, or null when the relay no longer asks about that caller), and whether the
   * relay said so (over HTTP; a socket's frame may be lost with the socket, and the relay
   * then asks again). Throws when the answer could not go.
   */
  async approve(callerId, allow) {
    if (this.connection?.send({ type: 'approval', callerId, allow })) {
      return { outcome: allow ? 'allowed' : 'declined', confirmed: false };
    }
    const response = await fetch(this.url(`/approvals/${encodeURIComponent(callerId)}`), {
      method: 'POST',
      headers: { ...this.auth(), 'content-type': 'application/json' },
      body: JSON.stringify({ allow }),
    });
    const body = await response.json().catch(() => ({}));
    if (response.ok) {
      const outcome = body.outcome === 'allowed' || body.outcome === 'declined' ? body.outcome : allow ? 'allowed' : 'declined';
      return { outcome, confirmed: true };
    }
    if (response.status === 409 || response.status === 404) return { outcome: null, confirmed: true };
    throw new Error(body.message || `The relay answered ${response.status}.`);
  }

  /**
   * Disconnects the allowed caller `callerId` (its handle stops working; its next use of the
   * code asks again): over the open socket, else `DELETE …/approvals/{callerId}`. Throws when
   * that could not go.
   */
  async disconnectCaller(callerId) {
    if (this.connection?.send({ type: 'disconnect-caller', callerId })) return;
    const response = await fetch(this.url(`/approvals/${encodeURIComponent(callerId)}`), {
      method: 'DELETE',
      headers: this.auth(),
    });
    // 404: that caller is not allowed (any more): nothing to disconnect.
    if (!response.ok && response.status !== 404) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.message || `The relay answered ${response.status}.`);
    }
  }

  // ---- calls and answers ----

  auth() {
    return { authorization: `Bearer ${this.session.token}` };
  }

  async putManifest() {
    try {
      const response = await fetch(this.url('/manifest'), {
        method: 'PUT',
        headers: { ...this.auth(), 'content-type': 'application/json' },
        body: JSON.stringify(this.registration()),
      });
      const body = await response.json();
      if (response.ok) this.emit('registered', body.tools);
      else this.emit('problem', body.message);
    } catch {
      this.emit('problem', 'The tools could not be registered; retrying with the connection.');
    }
  }

  /** A call from the relay: run it once, answer it (again, when asked again). */
  handle(call) {
    const id = call.requestId;
    const known = this.answers.get(id) ?? this.unsent.get(id);
    if (known instanceof Promise) return; // running; its answer goes out when it is done
    if (known) {
      this.send(known);
      return;
    }
    const controller = new AbortController();
    this.running.set(id, controller);
    const running = this.run(call, controller.signal, (frame) => this.notify(frame)).then((answer) => {
      this.running.delete(id);
      this.remember(id, answer);
      // A cancelled call's answer would be refused: the call has its end already.
      if (!controller.signal.aborted) this.send(answer);
      return answer;
    });
    this.answers.set(id, running);
  }

  /** The caller cancelled the call `id`: abort it if it runs here (nothing otherwise). */
  cancel(id) {
    const controller = this.running.get(id);
    if (!controller || controller.signal.aborted) return;
    controller.abort(new DOMException('The caller cancelled the call.', 'AbortError'));
    this.emit('cancelled', { requestId: id });
  }

  /** The calls running here, by requestId (a polling tab tells the relay, to learn of cancels). */
  runningIds() {
    return [...this.running.keys()];
  }

  remember(id, answer) {
    this.answers.set(id, answer);
    while (this.answers.size > REMEMBERED_ANSWERS) {
      this.answers.delete(this.answers.keys().next().value);
    }
  }

  /** Sends an answer; it is kept until the relay has it (see the top of this file). */
  async send(answer) {
    const id = answer.requestId;
    this.unsent.set(id, answer);
    if (this.connection?.send({ type: 'response', ...answer })) return;
    try {
      const response = await fetch(this.url('/response'), {
        method: 'POST',
        headers: { ...this.auth(), 'content-type': 'application/json' },
        body: JSON.stringify(answer),
      });
      if (response.status >= 500 || response.status === 429) throw new Error(`HTTP ${response.status}`);
      // 2xx: stored; other 4xx: the call is gone (expired, answered): nothing more to do.
      this.settled(id);
    } catch {
      // Sent again shortly (and when the connection is back, or the relay hands the call out again).
      this.interruptions += 1;
      this.resendLater(id);
    }
  }

  /**
   * Sends a frame about a call under way (`progress`, `log`): over the open socket, else by
   * `POST …/response` as answers go (the relay tells them apart by `type`). Never kept or sent
   * again: a lost one is a missed update, and the answer follows. Nothing goes while no
   * connection is up.
   */
  async notify(frame) {
    if (this.stopped || this.connection?.send(frame)) return;
    if (!((this.kind === 'sse' && this.connection) || this.polling)) return;
    try {
      await fetch(this.url('/response'), {
        method: 'POST',
        headers: { ...this.auth(), 'content-type': 'application/json' },
        body: JSON.stringify(frame),
      });
    } catch {
      // A missed update; the connection's own trouble shows elsewhere.
    }
  }

  /** The relay has the answer to `id` (or refused it for good): it is not sent again. */
  settled(id) {
    this.unsent.delete(id);
    clearTimeout(this.resends.get(id)?.timer);
    this.resends.delete(id);
  }

  /** Sends the unsent answer to `id` again after a backoff that grows while it keeps failing. */
  resendLater(id) {
    if (this.stopped || !this.unsent.has(id)) return;
    const entry = this.resends.get(id) ?? { timer: null, wait: RESEND_START_MS };
    clearTimeout(entry.timer);
    entry.timer = setTimeout(() => {
      const answer = this.unsent.get(id);
      if (answer && !this.stopped) this.send(answer);
    }, jittered(entry.wait));
    entry.wait = Math.min(entry.wait * 2, RESEND_MAX_MS);
    this.resends.set(id, entry);
  }
}
