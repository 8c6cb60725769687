// The polling transport: asks for calls every second over plain HTTP (the Transport's last
// resort, for networks that let neither WebSocket nor a stream through). Like the other two
// openers it keeps no state of the Transport's: it is given its URL, headers and the Transport's
// callbacks, reports through those, and returns `{send, close}` (transport.js says more).

const POLL_INTERVAL_MS = 1000;

/**
 * Asks `url` (the session's `…/request`, sent with `headers`) for calls now and again every
 * second until it is closed or fails. Of the callbacks it uses: `runningIds()` before each poll;
 * `ended(frame)` with each poll's status (whether it ends the session: polling stops, and
 * nothing else is reported); `opened()` then `putManifest()` (awaited) after the first poll that
 * worked, `resend()` after each later one; for the poll's items `cancel(requestId)`,
 * `approval(frame)` (whether the item was one) and `call(frame)`; `asked(callerId)` with the
 * open question the poll named (null: none); `failed(worked)` when a poll fails.
 * `send` sends nothing (the Transport answers over HTTP).
 */
export function openPolling({ url, headers }, on) {
  let closed = false;
  let working = false; // a poll worked, and none has failed since
  let timer = null;
  async function poll() {
    if (closed) return;
    try {
      // The calls running here: the relay answers with a cancel item for each one cancelled.
      const running = on.runningIds();
      const query = running.length ? `?running=${running.map(encodeURIComponent).join(',')}` : '';
      const response = await fetch(`${url}${query}`, { headers });
      if (on.ended({ type: 'error', status: response.status, message: 'The session has ended.' })) return;
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      if (!working) {
        working = true;
        on.opened();
        await on.putManifest();
      } else {
        // An answer that could not go while the network was away goes now: a blip short
        // enough to miss every poll is no reconnection.
        on.resend();
      }
      // Calls, cancels, and the relay's frames about callers (told apart by `type`). The open
      // question is in every poll until it closes: the Transport closes one missing from a poll.
      let asked = null;
      for (const item of await response.json()) {
        if (item.type === 'cancel') on.cancel(item.requestId);
        else if (!on.approval(item)) on.call(item);
        if (item.type === 'approval-request') asked = item.callerId;
      }
      on.asked(asked);
      timer = setTimeout(poll, POLL_INTERVAL_MS);
    } catch {
      const worked = working;
      working = false;
      on.failed(worked);
    }
  }
  poll();
  return {
    send: () => false,
    close() {
      // A poll under way finishes; the next one does not start.
      closed = true;
      clearTimeout(timer);
    },
  };
}
