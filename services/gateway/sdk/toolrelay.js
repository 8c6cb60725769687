// toolrelay's browser SDK: give a web page tools that assistants (ChatGPT, Claude, a backend)
// call through the relay that serves this file. No build step and nothing to install:
//
//   import { connect } from 'https://relay.example.org/sdk/toolrelay.js';
//   const relay = connect({ tools: [{ name, description, inputSchema, execute(args) { … } }] });
//   relay.addEventListener('code', (event) => show(event.detail.display));
//
// Or, in a page an assistant opened for the person (an MCP App frames it with `?claim=`),
// `connect({ claim, tools })`: paired with that assistant, no code — at once inside the app
// host's conversation, after asking the person anywhere else (connection.js says more).
//
// Layout: connection.js pairs and runs calls, transport.js carries them (WebSocket → SSE →
// polling, one file each: transport-websocket.js, transport-sse.js, transport-polling.js),
// session.js keeps the session across reloads, dispatcher.js checks arguments, result.js makes
// answers with content (`ToolResult`: images, text, audio, resources), progress.js a running
// call's progress and log frames, pairing.js is the <toolrelay-pairing> element (its words made
// in pairing-text.js), webmcp.js bridges WebMCP pages.
//
// A tool may answer with content, and report while it runs:
//
//   execute: async (args, { signal, progress, log }) => {
//     progress(1, 2, 'drawing');
//     return ToolResult.image(canvas.toDataURL('image/png')).and(ToolResult.text('A bar chart of …'));
//   }

export { connect, Connection, displayCode, underAppHost } from './connection.js';
export { Dispatcher, ToolError, validate } from './dispatcher.js';
export { ErrorCode, ToolErrorCode } from './errors.js';
export { LOG_LEVELS, PROGRESS_INTERVAL_MS } from './progress.js';
export { IMAGE_TYPES, ToolResult } from './result.js';
export { ClaimRefused, Sessions, isClaim } from './session.js';
export { Transport } from './transport.js';
export { bridgeWebMCP } from './webmcp.js';
