// The server-sent events transport: calls and the relay's frames come down an EventSource,
// answers and the manifest go up over HTTP (the Transport's second choice). Like the other two
// openers it keeps no state of the Transport's: it is given its URL and the Transport's
// callbacks, reports through those, and returns `{send, close}` (transport.js says more).

/**
 * Opens an EventSource on `url` (the session's `…/stream?token=…`). Of the callbacks it uses:
 * `opened()` on the relay's `connected` event, then `expiry(expiresAt)` and `putManifest()`
 * (the tools go up over HTTP); for the relay's events `call(frame)`, `cancel(requestId)`,
 * `approval(frame)`, `expiry(expiresAt)` and `ended(frame)` (whether the event ends the session:
 * the stream is closed, and nothing else is reported); `interrupted()` for each plain error
 * (connection trouble); `failed(opened)` when the stream gives up or never got through.
 * `send` sends nothing (an event stream goes one way: the Transport answers over HTTP).
 */
export function openEventStream({ url }, on) {
  const events = new EventSource(url);
  let opened = false;
  events.addEventListener('connected', (event) => {
    opened = true;
    on.opened();
    const frame = JSON.parse(event.data);
    on.expiry(frame.expiresAt);
    on.putManifest();
  });
  events.addEventListener('tool-request', (event) => on.call(JSON.parse(event.data)));
  events.addEventListener('cancel', (event) => on.cancel(JSON.parse(event.data).requestId));
  // The relay's frames about callers (a tab that approves them): the event's name is the type.
  for (const type of ['approval-request', 'approval-closed', 'callers']) {
    events.addEventListener(type, (event) => on.approval({ ...JSON.parse(event.data), type }));
  }
  events.addEventListener('heartbeat', (event) => on.expiry(JSON.parse(event.data).expiresAt));
  events.addEventListener('expired', (event) => {
    if (on.ended({ ...JSON.parse(event.data), type: 'expired' })) events.close();
  });
  events.addEventListener('error', (event) => {
    // Named "error" events carry the relay's frames; plain ones are connection trouble.
    if (event.data && on.ended({ ...JSON.parse(event.data), type: 'error' })) {
      events.close();
      return;
    }
    if (!event.data) on.interrupted();
    if (events.readyState === EventSource.CLOSED || !opened) {
      // EventSource retries by itself (resuming with Last-Event-ID) while it can; when it
      // gives up or never got through, count a failure.
      events.close();
      on.failed(opened);
    }
  });
  return { send: () => false, close: () => events.close() };
}
