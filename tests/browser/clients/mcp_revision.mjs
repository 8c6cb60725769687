// An MCP client made of the official TypeScript SDK (@modelcontextprotocol/sdk), asking for one
// protocol revision, for the end-to-end tests (tests/tests/mcp_eras.rs): it connects to URL,
// lists the tools, calls encodePlantUML, ends its session and prints one JSON line:
// {protocolVersion, headers, tools, isError, structured}, where `headers` is the
// MCP-Protocol-Version header of every request after `initialize`.
//
// The SDK's `initialize` offers its newest handshake revision (2025-11-25); a client built for
// an older revision offers that one instead, which is what this does to the message.
//
// Usage: node mcp_revision.mjs URL REVISION

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [url, revision] = process.argv.slice(2);
const headers = [];
const transport = new StreamableHTTPClientTransport(new URL(url), {
  fetch: (input, init) => {
    const body = typeof init?.body === 'string' ? JSON.parse(init.body) : null;
    if (body?.method !== 'initialize') {
      headers.push(new Headers(init?.headers).get('mcp-protocol-version'));
    }
    return fetch(input, init);
  },
});
const send = transport.send.bind(transport);
transport.send = (message, options) =>
  send(
    message.method === 'initialize'
      ? { ...message, params: { ...message.params, protocolVersion: revision } }
      : message,
    options,
  );

const client = new Client({ name: 'toolrelay-test', version: '1.0.0' });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((tool) => tool.name);
const result = await client.callTool({
  name: 'encodePlantUML',
  arguments: { plantumlCode: '@startuml\nA -> B\n@enduml' },
});
await transport.terminateSession();
await client.close();
process.stdout.write(
  `${JSON.stringify({
    protocolVersion: transport.protocolVersion,
    headers,
    tools,
    isError: Boolean(result.isError),
    structured: result.structuredContent ?? null,
  })}\n`,
);
