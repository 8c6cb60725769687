// The polling transport: asks for calls every second over plain HTTP (the Transport's last
// resort, for networks that let neither WebSocket nor a stream through).

const POLL_INTERVAL_MS = 1000;

/** Asks for `transport`'s calls now and again every second until it stops or fails. */
export async function poll(transport) {
  if (transport.stopped) return;
  try {
    // The calls running here: the relay answers with a cancel item for each one cancelled.
    const running = transport.runningIds();
    const query = running.length ? `?running=${running.map(encodeURIComponent).join(',')}` : '';
    const response = await fetch(transport.url(`/request${query}`), { headers: transport.auth() });
    if (transport.ended({ type: 'error', status: response.status, message: 'The session has ended.' })) return;
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    if (!transport.polling) {
      transport.polling = true;
      transport.connected();
      await transport.putManifest();
    } else {
      // An answer that could not go while the network was away goes now: a blip short
      // enough to miss every poll is no reconnection.
      for (const answer of [...transport.unsent.values()]) transport.send(answer);
    }
    // Calls, cancels, and the relay's frames about callers (told apart by `type`). The open
    // question is in every poll until it closes: one missing from this poll is over.
    let asked = null;
    for (const item of await response.json()) {
      if (item.type === 'cancel') transport.cancel(item.requestId);
      else if (!transport.approvalFrame(item)) transport.handle(item);
      if (item.type === 'approval-request') asked = item.callerId;
    }
    if (transport.polledQuestion && transport.polledQuestion !== asked) {
      transport.approvalFrame({ type: 'approval-closed', callerId: transport.polledQuestion, outcome: 'gone' });
    }
    transport.polledQuestion = asked;
    transport.pollTimer = setTimeout(() => poll(transport), POLL_INTERVAL_MS);
  } catch {
    const worked = transport.polling;
    transport.polling = false;
    transport.failed(worked);
  }
}
