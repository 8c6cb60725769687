// The WebSocket transport: one socket per connection, carrying the calls, the answers, their
// acks and the relay's frames both ways (the first the Transport tries). Like the other two
// openers it keeps no state of the Transport's: it is given its URL and the Transport's
// callbacks, reports through those, and returns `{send, close}` (transport.js says more).

import { ErrorCode } from './errors.js';

/**
 * Opens a WebSocket to `url` (the session's `…/ws?token=…`). Of the callbacks it uses:
 * `opened()` on the relay's welcome, then `expiry(expiresAt)` and `registration()` (what the
 * `register` frame it sends then says); for the relay's frames `registered(tools)`,
 * `call(frame)`, `cancel(requestId)`, `approval(frame)`, `expiry(expiresAt)`,
 * `settled(requestId)` (an ack), `retry(requestId)` (an answer the relay could not store now),
 * `problem(message)` and `ended(frame)` (whether the frame ends the session); and when the socket
 * closes, `closed()` after the session ended, else `failed(welcomed)`.
 * `send(frame)` sends while the socket is open.
 */
export function openWebSocket({ url }, on) {
  let socket;
  try {
    socket = new WebSocket(url);
  } catch {
    on.failed(false);
    // Nothing to send over or to close: the Transport does not keep this connection.
    return { send: () => false, close() {} };
  }
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
        on.opened();
        on.expiry(frame.expiresAt);
        socket.send(JSON.stringify({ type: 'register', ...on.registration() }));
        break;
      case 'registered':
        on.registered(frame.tools);
        break;
      case 'tool-request':
        on.call(frame);
        break;
      case 'cancel':
        on.cancel(frame.requestId);
        break;
      case 'approval-request':
      case 'approval-closed':
      case 'callers':
        on.approval(frame);
        break;
      case 'heartbeat':
        on.expiry(frame.expiresAt);
        break;
      case 'ack':
        // The relay is done with the answer: stored, or refused for good (`error` says why;
        // request_not_found after a reconnect is expected: the call comes again, and its
        // answer with it).
        on.settled(frame.requestId);
        if (frame.error && frame.error !== ErrorCode.REQUEST_NOT_FOUND) on.problem(frame.message);
        break;
      case 'expired':
        final = on.ended(frame);
        break;
      case 'error':
        if (on.ended(frame)) {
          final = true;
        } else if (frame.requestId) {
          // That answer could not be stored now: it goes again shortly.
          on.retry(frame.requestId);
        } else {
          on.problem(frame.message);
        }
        break;
      default:
    }
  };
  socket.onclose = () => {
    // A session that ended is not tried again; any other close is a failure to retry.
    if (final) on.closed();
    else on.failed(welcomed);
  };
  return {
    send(frame) {
      if (socket.readyState !== WebSocket.OPEN) return false;
      socket.send(JSON.stringify(frame));
      return true;
    },
    close: () => socket.close(1000, 'stopped'),
  };
}
