// The WebSocket transport: one socket per connection, carrying the calls, the answers, their
// acks and the relay's frames both ways (the first the Transport tries).

import { ErrorCode } from './errors.js';

/** Opens the WebSocket of `transport` (a Transport); reports back through its methods. */
export function openWebSocket(transport) {
  const base = transport.base.replace(/^http/, 'ws');
  let socket;
  try {
    socket = new WebSocket(`${base}/api/sessions/${transport.session.code}/ws?token=${encodeURIComponent(transport.session.token)}`);
  } catch {
    transport.failed(false);
    return;
  }
  transport.socket = socket;
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
        transport.connected();
        transport.emit('expiry', frame.expiresAt);
        socket.send(JSON.stringify({ type: 'register', ...transport.registration() }));
        break;
      case 'registered':
        transport.emit('registered', frame.tools);
        break;
      case 'tool-request':
        transport.handle(frame);
        break;
      case 'cancel':
        transport.cancel(frame.requestId);
        break;
      case 'approval-request':
      case 'approval-closed':
      case 'callers':
        transport.approvalFrame(frame);
        break;
      case 'heartbeat':
        transport.emit('expiry', frame.expiresAt);
        break;
      case 'ack':
        // The relay is done with the answer: stored, or refused for good (`error` says why;
        // request_not_found after a reconnect is expected: the call comes again, and its
        // answer with it).
        transport.settled(frame.requestId);
        if (frame.error && frame.error !== ErrorCode.REQUEST_NOT_FOUND) transport.emit('problem', frame.message);
        break;
      case 'expired':
        final = transport.ended(frame);
        break;
      case 'error':
        if (transport.ended(frame)) {
          final = true;
        } else if (frame.requestId) {
          // That answer could not be stored now: it goes again shortly.
          transport.interruptions += 1;
          transport.resendLater(frame.requestId);
        } else {
          transport.emit('problem', frame.message);
        }
        break;
      default:
    }
  };
  socket.onclose = () => {
    if (transport.socket === socket) transport.socket = null;
    if (!final) transport.failed(welcomed);
  };
}
