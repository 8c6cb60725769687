// What a running tool tells the caller before it answers: its progress (`progress` frames,
// which MCP clients get as notifications/progress and REST callers in the call's status) and
// log lines (`log` frames, MCP notifications/message). A tool gets both in its second
// argument, `execute(args, {signal, progress, log})`.
//
// Progress only goes up (MCP requires it): a value not above the highest one given is
// dropped. At most one frame goes per PROGRESS_INTERVAL_MS per call (4 a second); what comes
// in between is merged, the last kept and sent when the interval is over. A call that ends
// drops what is waiting: its answer says more.

export const PROGRESS_INTERVAL_MS = 250;

// MCP's logging levels (RFC 5424's), least severe first.
export const LOG_LEVELS = Object.freeze(['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency']);

/** The `progress` frame for call `requestId`; throws on a progress that is no finite number. */
export function progressFrame(requestId, progress, total, message) {
  if (typeof progress !== 'number' || !Number.isFinite(progress)) throw new TypeError(`progress is a finite number, not ${progress}.`);
  if (total !== undefined && total !== null && (typeof total !== 'number' || !Number.isFinite(total))) {
    throw new TypeError(`total is a finite number, not ${total}.`);
  }
  const frame = { type: 'progress', requestId, progress };
  if (total !== undefined && total !== null) frame.total = total;
  if (message !== undefined && message !== null) frame.message = String(message);
  return frame;
}

/** The `log` frame (about call `requestId`, when given); throws on a level MCP does not have. */
export function logFrame(level, data, logger, requestId) {
  if (!LOG_LEVELS.includes(level)) throw new TypeError(`A log level is one of ${LOG_LEVELS.join(', ')}, not ${level}.`);
  const frame = { type: 'log', level, data: JSON.parse(JSON.stringify(data === undefined ? null : data)) };
  if (logger !== undefined && logger !== null) frame.logger = String(logger);
  if (requestId !== undefined && requestId !== null) frame.requestId = requestId;
  return frame;
}

/**
 * One call's progress on its way out: `offer(frame)` sends it now, later (merged) or not at
 * all (not above the highest), `close()` ends it. `send(frame)` sends a frame; the clock and
 * timers are given so tests can drive them.
 */
export class ProgressGate {
  constructor(send, {
    now = () => performance.now(),
    // Wrapped: a browser's setTimeout called as a method of anything but the window throws.
    setTimer = (run, ms) => setTimeout(run, ms),
    clearTimer = (timer) => clearTimeout(timer),
    interval = PROGRESS_INTERVAL_MS,
  } = {}) {
    this.sendFrame = send;
    this.now = now;
    this.setTimer = setTimer;
    this.clearTimer = clearTimer;
    this.interval = interval;
    this.highest = -Infinity; // the highest progress sent or waiting
    this.sentAt = -Infinity; // when the last frame went
    this.waiting = null; // the frame to send when the interval is over
    this.timer = null;
    this.closed = false;
  }

  /** Says whether the frame will go (now or merged into the next). */
  offer(frame) {
    if (this.closed || !(frame.progress > this.highest)) return false;
    this.highest = frame.progress;
    const wait = this.sentAt + this.interval - this.now();
    if (wait <= 0 && this.timer === null) {
      this.send(frame);
      return true;
    }
    this.waiting = frame;
    this.timer ??= this.setTimer(() => {
      this.timer = null;
      const waiting = this.waiting;
      this.waiting = null;
      if (waiting && !this.closed) this.send(waiting);
    }, Math.max(0, wait));
    return true;
  }

  send(frame) {
    this.sentAt = this.now();
    this.sendFrame(frame);
  }

  /** The call is over: what waits is dropped, and nothing more goes. */
  close() {
    this.closed = true;
    this.waiting = null;
    if (this.timer !== null) this.clearTimer(this.timer);
    this.timer = null;
  }
}

/**
 * What a tool of call `requestId` gets besides its signal: `progress(progress, total?,
 * message?)` and `log(level, data, logger?)`, sending through `send(frame)` (the transport's),
 * and `close()` for the runner when the call is over. Both say nothing once it is.
 */
export function callContext(requestId, send, options = {}) {
  const gate = new ProgressGate(send, options);
  let over = false;
  return {
    progress(progress, total, message) {
      return gate.offer(progressFrame(requestId, progress, total, message));
    },
    log(level, data, logger) {
      const frame = logFrame(level, data, logger, requestId);
      if (over) return false;
      send(frame);
      return true;
    },
    close() {
      over = true;
      gate.close();
    },
  };
}
