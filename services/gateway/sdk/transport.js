// A page's connection to the relay: WebSocket first, server-sent events when WebSocket fails,
// 1-second polling when SSE fails too. Reconnects with jittered backoff. Calls are
// de-duplicated by requestId (the relay delivers at least once), and every result or error is
// posted back — again, if the relay asks again because an answer was lost.

import { ErrorCode } from './errors.js';

const BACKOFF_START_MS = 500;
const BACKOFF_MAX_MS = 10000;
const POLL_INTERVAL_MS = 1000;
// A transport that fails this many times in a row without ever working is given up for the next.
const FAILURES_BEFORE_FALLBACK = 2;
// Answers kept to answer a redelivered call again without running it twice.
const REMEMBERED_ANSWERS = 500;

const ORDER = ['websocket', 'sse', 'polling'];

function jittered(ms) {
  return ms * (0.5 + Math.random());
}

export class Transport extends EventTarget {
  /**
   * @param {string} base  the relay's origin
   * @param {{code: string, token: string}} session
   * @param {() => object[]} manifest  the tools to register
   * @param {(call: object) => Promise<object>} run  runs a call; resolves with {success, result?, error?}
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
    this.unsent = new Map(); // requestId → answer that could not be sent yet
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
    if (this.kind === 'websocket') this.openSocket();
    else if (this.kind === 'sse') this.openEvents();
    else this.poll();
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

  connected() {
    this.failures = 0;
    this.backoff = BACKOFF_START_MS;
    this.emit('status', { state: 'connected', transport: this.kind });
    // Answers that could not go out while the connection was down go now.
    for (const answer of [...this.unsent.values()]) this.send(answer);
  }

  // ---- WebSocket ----

  openSocket() {
    const base = this.base.replace(/^http/, 'ws');
    let socket;
    try {
      socket = new WebSocket(`${base}/api/sessions/${this.session.code}/ws?token=${encodeURIComponent(this.session.token)}`);
    } catch {
      this.failed(false);
      return;
    }
    this.socket = socket;
    let welcomed = false;
    let final = false;
    socket.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return;
      }
      switch (frame.type) {
        case 'welcome':
          welcomed = true;
          this.connected();
          this.emit('expiry', frame.expiresAt);
          socket.send(JSON.stringify({ type: 'register', tools: this.manifest() }));
          break;
        case 'registered':
          this.emit('registered', frame.tools);
          break;
        case 'tool-request':
          this.handle(frame);
          break;
        case 'heartbeat':
          this.emit('expiry', frame.expiresAt);
          break;
        case 'expired':
          final = true;
          this.emit('expired', frame.message);
          break;
        case 'error':
          if (frame.error === ErrorCode.REPLACED) {
            final = true;
            this.emit('replaced', frame.message);
          } else if ([ErrorCode.SESSION_NOT_FOUND, ErrorCode.INVALID_TOKEN, ErrorCode.TOKEN_REQUIRED, ErrorCode.INVALID_CODE].includes(frame.error)) {
            final = true;
            this.emit('expired', frame.message);
          } else {
            this.emit('problem', frame.message);
          }
          break;
        default:
      }
    };
    socket.onclose = () => {
      if (this.socket === socket) this.socket = null;
      if (!final) this.failed(welcomed);
    };
  }

  // ---- server-sent events ----

  openEvents() {
    const events = new EventSource(this.url(`/stream?token=${encodeURIComponent(this.session.token)}`));
    this.events = events;
    let opened = false;
    events.addEventListener('connected', (event) => {
      opened = true;
      this.connected();
      const frame = JSON.parse(event.data);
      this.emit('expiry', frame.expiresAt);
      this.putManifest();
    });
    events.addEventListener('tool-request', (event) => this.handle(JSON.parse(event.data)));
    events.addEventListener('heartbeat', (event) => this.emit('expiry', JSON.parse(event.data).expiresAt));
    events.addEventListener('expired', (event) => {
      events.close();
      this.emit('expired', JSON.parse(event.data).message);
    });
    events.addEventListener('error', (event) => {
      // Named "error" events carry the relay's frames; plain ones are connection trouble.
      if (!event.data) this.interruptions += 1;
      if (event.data) {
        const frame = JSON.parse(event.data);
        if (frame.error === ErrorCode.REPLACED) {
          events.close();
          this.emit('replaced', frame.message);
          return;
        }
      }
      if (events.readyState === EventSource.CLOSED || !opened) {
        // EventSource retries by itself (resuming with Last-Event-ID) while it can; when it
        // gives up or never got through, count a failure.
        events.close();
        if (this.events === events) this.events = null;
        this.failed(opened);
      }
    });
  }

  // ---- polling ----

  async poll() {
    if (this.stopped) return;
    try {
      const response = await fetch(this.url('/request'), { headers: this.auth() });
      if (response.status === 404 || response.status === 401 || response.status === 403) {
        this.emit('expired', 'The session has ended.');
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      if (!this.polling) {
        this.polling = true;
        this.connected();
        await this.putManifest();
      } else {
        // An answer that could not go while the network was away goes now: a blip short
        // enough to miss every poll is no reconnection.
        for (const answer of [...this.unsent.values()]) this.send(answer);
      }
      for (const call of await response.json()) this.handle(call);
      this.pollTimer = setTimeout(() => this.poll(), POLL_INTERVAL_MS);
    } catch {
      const worked = this.polling;
      this.polling = false;
      this.failed(worked);
    }
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
    const known = this.answers.get(id);
    if (known instanceof Promise) return; // running; its answer goes out when it is done
    if (known) {
      this.send(known);
      return;
    }
    const running = this.run(call).then((answer) => {
      this.remember(id, answer);
      this.send(answer);
      return answer;
    });
    this.answers.set(id, running);
  }

  remember(id, answer) {
    this.answers.set(id, answer);
    while (this.answers.size > REMEMBERED_ANSWERS) {
      this.answers.delete(this.answers.keys().next().value);
    }
  }

  async send(answer) {
    const socket = this.socket;
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: 'response', ...answer }));
      this.unsent.delete(answer.requestId);
      return;
    }
    try {
      const response = await fetch(this.url('/response'), {
        method: 'POST',
        headers: { ...this.auth(), 'content-type': 'application/json' },
        body: JSON.stringify(answer),
      });
      if (response.status >= 500) throw new Error(`HTTP ${response.status}`);
      // 4xx: the call is gone (expired, answered): nothing more to do.
      this.unsent.delete(answer.requestId);
    } catch {
      // Sent again when the connection is back (and when the relay hands the call out again).
      this.interruptions += 1;
      this.unsent.set(answer.requestId, answer);
    }
  }
}
