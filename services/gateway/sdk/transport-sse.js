// The server-sent events transport: calls and the relay's frames come down an EventSource,
// answers and the manifest go up over HTTP (the Transport's second choice).

/** Opens the event stream of `transport` (a Transport); reports back through its methods. */
export function openEventStream(transport) {
  const events = new EventSource(transport.url(`/stream?token=${encodeURIComponent(transport.session.token)}`));
  transport.events = events;
  let opened = false;
  events.addEventListener('connected', (event) => {
    opened = true;
    transport.connected();
    const frame = JSON.parse(event.data);
    transport.emit('expiry', frame.expiresAt);
    transport.putManifest();
  });
  events.addEventListener('tool-request', (event) => transport.handle(JSON.parse(event.data)));
  events.addEventListener('cancel', (event) => transport.cancel(JSON.parse(event.data).requestId));
  // The relay's frames about callers (a tab that approves them): the event's name is the type.
  for (const type of ['approval-request', 'approval-closed', 'callers']) {
    events.addEventListener(type, (event) => transport.approvalFrame({ ...JSON.parse(event.data), type }));
  }
  events.addEventListener('heartbeat', (event) => transport.emit('expiry', JSON.parse(event.data).expiresAt));
  events.addEventListener('expired', (event) => {
    if (transport.ended({ ...JSON.parse(event.data), type: 'expired' })) events.close();
  });
  events.addEventListener('error', (event) => {
    // Named "error" events carry the relay's frames; plain ones are connection trouble.
    if (event.data && transport.ended({ ...JSON.parse(event.data), type: 'error' })) {
      events.close();
      return;
    }
    if (!event.data) transport.interruptions += 1;
    if (events.readyState === EventSource.CLOSED || !opened) {
      // EventSource retries by itself (resuming with Last-Event-ID) while it can; when it
      // gives up or never got through, count a failure.
      events.close();
      if (transport.events === events) transport.events = null;
      transport.failed(opened);
    }
  });
}
