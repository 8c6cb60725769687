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

import { ErrorCode } from './errors.js';
import { poll } from './transport-polling.js';
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
const OPEN = { websocket: openWebSocket, sse: openEventStream, polling: poll };
const ORDER = Object.keys(OPEN);

// The relay's refusals that mean this tab's session is no longer there for it.
const SESSION_GONE = new Set([ErrorCode.SESSION_NOT_FOUND, ErrorCode.INVALID_TOKEN, ErrorCode.TOKEN_REQUIRED, ErrorCode.INVALID_CODE]);
// The same, as the HTTP statuses polling sees.
const SESSION_GONE_STATUSES = new Set([401, 403, 404]);

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
   * @param {(call: object, signal: AbortSignal) => Promise<object>} run  runs a call (the
   *   signal is aborted if the caller cancels it); resolves with {success, result?, error?}
   */
  constructor(base, session, manifest, run) {
    super();
    this.base = base;
    this.session = session;
    this.manifest = manifest;
    this.run = run;
    this.kind = ORDER[0];
    this.failures = 0;
    this.backoff = BACKOFF_START_MS;
    this.stopped = false;
    this.socket = null;
    this.events = null;
    this.pollTimer = null;
    this.retryTimer = null;
    this.answers = new Map(); // requestId → answer (or a promise of it while running)
    this.running = new Map(); // requestId → the AbortController of a call running
    this.unsent = new Map(); // requestId → answer the relay has not acknowledged yet
    this.resends = new Map(); // requestId → {timer, wait}: when an unsent answer goes again
    this.polling = false;
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
    clearTimeout(this.pollTimer);
    for (const { timer } of this.resends.values()) clearTimeout(timer);
    this.resends.clear();
    if (this.socket) this.socket.close(1000, 'stopped');
    if (this.events) this.events.close();
    this.socket = null;
    this.events = null;
  }

  emit(name, detail) {
    this.dispatchEvent(new CustomEvent(name, { detail }));
  }

  connect() {
    if (this.stopped) return;
    this.emit('status', { state: 'connecting', transport: this.kind });
    OPEN[this.kind](this);
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
    for (const answer of [...this.unsent.values()]) this.send(answer);
  }

  /** The tools changed while connected: register them again on the live connection. */
  reregister() {
    const socket = this.socket;
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: 'register', tools: this.manifest() }));
    } else if (this.events || this.polling) {
      this.putManifest();
    }
    // Otherwise the next connection registers them.
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
        body: JSON.stringify({ tools: this.manifest() }),
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
    const running = this.run(call, controller.signal).then((answer) => {
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
    const socket = this.socket;
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: 'response', ...answer }));
      return;
    }
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
