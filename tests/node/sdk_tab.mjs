// A tab made of the SDK's own transport (services/gateway/sdk/transport.js) and dispatcher
// (sdk/dispatcher.js) under node, for the end-to-end tests: it connects like a page does
// (WebSocket first, or the transport it is told), registers the manifest it is given, and
// serves `echo` through the dispatcher, which hands the tool the call's AbortSignal. It prints
// one JSON line per event the test counts: `{"ran": requestId}` each time a call runs,
// `{"aborted": requestId}` when a running call's signal is aborted (its caller cancelled it),
// `{"status": state}` when its connection changes, `{"registered": tools}` when the relay has
// its tools. It stops when its stdin closes.
//
// Usage: node --experimental-websocket sdk_tab.mjs <relay base URL> <code> <token> <manifest JSON>
//          <ms a call takes> [websocket|sse|polling]

import { Dispatcher } from '../../services/gateway/sdk/dispatcher.js';
import { Transport } from '../../services/gateway/sdk/transport.js';

// Node 20 has no EventSource: the npm package `eventsource` (the browser tests' packages, which
// scripts/setup.sh --test installs) stands in for the browser's.
if (!globalThis.EventSource) {
  globalThis.EventSource = (await import('../browser/node_modules/eventsource/dist/index.js')).EventSource;
}

const [base, code, token, manifest, runMs, kind] = process.argv.slice(2);
const tools = JSON.parse(manifest);
const runTime = Number(runMs ?? 0);
const print = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);

const dispatcher = new Dispatcher();
dispatcher.add({
  name: 'echo',
  inputSchema: { type: 'object' },
  // A tool that takes a moment (calls are under way in the tab whenever the relay fails), and
  // stops when its call is cancelled.
  execute: (args, { signal }) =>
    new Promise((resolve, reject) => {
      const done = () => resolve({ text: args.text });
      const timer = runTime > 0 ? setTimeout(done, runTime) : setImmediate(done);
      signal.addEventListener('abort', () => {
        clearTimeout(timer);
        clearImmediate(timer);
        reject(signal.reason);
      });
    }),
});

const transport = new Transport(base, { code, token }, () => tools, async (call, signal) => {
  print({ ran: call.requestId });
  signal.addEventListener('abort', () => print({ aborted: call.requestId }));
  try {
    const result = await dispatcher.call(null, 'echo', call.args, { signal });
    return { requestId: call.requestId, success: true, result };
  } catch (error) {
    return { requestId: call.requestId, success: false, error: { code: 'tool_error', message: String(error?.message ?? error) } };
  }
});
if (kind) transport.kind = kind;
transport.addEventListener('status', (event) => print({ status: event.detail.state }));
transport.addEventListener('registered', (event) => print({ registered: event.detail }));
transport.start();

process.stdin.on('end', () => {
  transport.stop();
  process.exit(0);
});
process.stdin.resume();
