// A tab made of the SDK's own transport (services/gateway/sdk/transport.js) under node, for
// the end-to-end tests: it connects like a page does (WebSocket first), registers the
// manifest it is given, and serves `echo`. It prints one JSON line per event the test counts:
// `{"ran": requestId}` each time a call runs, `{"status": state}` when its connection changes,
// `{"registered": tools}` when the relay has its tools. It stops when its stdin closes.
//
// Usage: node --experimental-websocket sdk_tab.mjs <relay base URL> <code> <token> <manifest JSON> <ms a call takes>

import { Transport } from '../../services/gateway/sdk/transport.js';

const [base, code, token, manifest, runMs] = process.argv.slice(2);
const tools = JSON.parse(manifest);
const runTime = Number(runMs ?? 0);
const print = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);

const transport = new Transport(base, { code, token }, () => tools, async (call) => {
  print({ ran: call.requestId });
  // A tool that takes a moment: calls are under way in the tab whenever the relay fails.
  if (runTime > 0) await new Promise((resolve) => setTimeout(resolve, runTime));
  return { requestId: call.requestId, success: true, result: { text: call.args.text } };
});
transport.addEventListener('status', (event) => print({ status: event.detail.state }));
transport.addEventListener('registered', (event) => print({ registered: event.detail }));
transport.start();

process.stdin.on('end', () => {
  transport.stop();
  process.exit(0);
});
process.stdin.resume();
