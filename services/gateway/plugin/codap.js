// The link to CODAP: iframe-phone's postMessage protocol on the channel "data-interactive",
// spoken here directly (no library): the plugin says {type:"hello"} every 200 ms until the
// parent answers hello; then both sides exchange
//   {type:"data-interactive", content:{messageType:"call"|"returnValue", uuid, value}}.
// CODAP's own calls (codap-present, change notices) are acknowledged with {success:true}.

import { ToolError } from '../sdk/dispatcher.js';
import { randomId } from '../sdk/session.js';

/** The codes of the plugin's own tool failures (an answer's `error.code`). */
export const CodapErrorCode = Object.freeze({
  // CODAP refused a request or gave no answer.
  ERROR: 'codap_error',
  // The plugin is not (yet) connected to CODAP.
  UNAVAILABLE: 'codap_unavailable',
  // CODAP took too long to answer.
  TIMEOUT: 'codap_timeout',
});

const CHANNEL = 'data-interactive';
const HELLO_INTERVAL_MS = 200;
const HELLO_GIVE_UP_MS = 60000;
// CODAP can take long on big documents; iframe-phone's own 2 s timer is far too short.
const REQUEST_TIMEOUT_MS = 60000;
// Without an answer by then, the page is shown as "not inside CODAP" (it keeps listening).
const ABSENT_AFTER_MS = 3000;

export class CodapLink extends EventTarget {
  constructor(win = window) {
    super();
    this.window = win;
    this.connected = false;
    this.pending = new Map();
    this.queue = [];
    this.helloTimer = null;
  }

  /** True when the page has a parent window to talk to. */
  get framed() {
    return this.window.parent !== this.window;
  }

  start() {
    if (!this.framed) {
      this.emit('absent');
      return;
    }
    this.window.addEventListener('message', (event) => this.receive(event));
    const hello = () => this.post({ type: 'hello' });
    hello();
    this.helloTimer = this.window.setInterval(hello, HELLO_INTERVAL_MS);
    this.window.setTimeout(() => this.stopHello(), HELLO_GIVE_UP_MS);
    this.window.setTimeout(() => {
      if (!this.connected) this.emit('absent');
    }, ABSENT_AFTER_MS);
  }

  stopHello() {
    if (this.helloTimer) this.window.clearInterval(this.helloTimer);
    this.helloTimer = null;
  }

  post(message) {
    this.window.parent.postMessage(message, '*');
  }

  receive(event) {
    if (event.source !== this.window.parent) return;
    let data = event.data;
    if (typeof data === 'string') {
      try {
        data = JSON.parse(data);
      } catch {
        return;
      }
    }
    if (!data || typeof data !== 'object') return;
    if (data.type === 'hello') {
      if (!this.connected) {
        this.connected = true;
        this.stopHello();
        for (const message of this.queue.splice(0)) this.post(message);
        this.emit('connected');
      }
      return;
    }
    if (!this.connected || data.type !== CHANNEL || !data.content) return;
    const { messageType, uuid: id, value } = data.content;
    if (messageType === 'returnValue') {
      const waiting = this.pending.get(id);
      if (waiting) {
        this.pending.delete(id);
        clearTimeout(waiting.timer);
        waiting.resolve(value);
      }
    } else if (messageType === 'call') {
      // CODAP's notifications: acknowledge every one, then let listeners look at it.
      this.post({ type: CHANNEL, content: { messageType: 'returnValue', uuid: id, value: { success: true } } });
      this.emit('notification', value);
    }
  }

  /** Sends a request ({action, resource, values}, or an array of them) to CODAP. */
  request(request) {
    if (!this.connected) {
      return Promise.reject(new ToolError(
        CodapErrorCode.UNAVAILABLE,
        this.framed
          ? 'CODAP has not answered yet. Wait a moment and try again.'
          : 'This plugin is not running inside CODAP, so there is no CODAP document to work on. Ask the user to open CODAP with the plugin.',
      ));
    }
    return new Promise((resolve, reject) => {
      const id = randomId();
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new ToolError(CodapErrorCode.TIMEOUT, `CODAP did not answer within ${REQUEST_TIMEOUT_MS / 1000} s.`));
      }, REQUEST_TIMEOUT_MS);
      this.pending.set(id, { resolve, timer });
      this.post({ type: CHANNEL, content: { messageType: 'call', uuid: id, value: request } });
    });
  }

  emit(name, detail) {
    this.dispatchEvent(new CustomEvent(name, { detail }));
  }
}
