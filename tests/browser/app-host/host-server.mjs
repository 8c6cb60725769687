// The backend of the test's MCP Apps host: its page (host.html with host.mjs, bundled by esbuild
// now), its sandbox proxy on a second origin (`localhost` where the page is `127.0.0.1`) served
// with the CSP the host builds from the resource's `_meta.ui.csp` (or with a fixed `frame-src`,
// as claude.ai serves every app), and `/mcp`, which passes the page's MCP traffic to the relay as
// a web host's servers do (claude.ai and ChatGPT reach MCP servers from their backends, not from
// the browser), noting every tool called.

import http from 'node:http';
import path from 'node:path';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const HERE = path.dirname(fileURLToPath(import.meta.url));
// Headers of the browser's request that belong to the page, not to a backend's request.
const BROWSER_ONLY = new Set(['host', 'origin', 'referer', 'cookie', 'connection']);

const PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Conversation</title>
<style>body { font-family: sans-serif; margin: 12px; } .turn { margin: 6px 0; color: #333; }</style>
<script type="module" src="/host.js"></script></head>
<body><p class="turn"><strong>You:</strong> open CODAP and graph height against age</p>
<div id="conversation"></div></body></html>`;

/** A source list of a CSP directive: the declared origins, nothing that could break out of it. */
function sources(domains) {
  return (Array.isArray(domains) ? domains : []).filter((domain) => typeof domain === 'string' && /^[a-z][a-z0-9+.-]*:\/\/[^\s;'",]+$/i.test(domain));
}

/**
 * The CSP for the app's document, as the spec has hosts build it from `_meta.ui.csp`; a host
 * that ignores `frameDomains` gives its own `frameSrc` instead.
 */
export function policyFor(csp = {}, frameSrc = null) {
  const resources = sources(csp.resourceDomains).join(' ');
  const connect = sources(csp.connectDomains).join(' ');
  const frames = frameSrc ?? sources(csp.frameDomains).join(' ');
  const bases = sources(csp.baseUriDomains).join(' ');
  return [
    "default-src 'none'",
    `script-src 'self' 'unsafe-inline' ${resources}`,
    `style-src 'self' 'unsafe-inline' ${resources}`,
    `img-src 'self' data: ${resources}`,
    `font-src 'self' data: ${resources}`,
    `media-src 'self' data: ${resources}`,
    `connect-src ${connect || "'none'"}`,
    `frame-src ${frames || "'none'"}`,
    "object-src 'none'",
    `base-uri ${bases || "'self'"}`,
  ].map((directive) => directive.trim()).join('; ');
}

/**
 * Starts the host's backend; `use(relay)` says which relay `/mcp` reaches (the relay is told the
 * host's `origin` first, as its APP_HOSTS); `stop()` ends it.
 */
export async function startAppHost() {
  const bundle = await build({
    entryPoints: [path.join(HERE, 'host.mjs')],
    bundle: true,
    format: 'esm',
    platform: 'browser',
    write: false,
    logLevel: 'warning',
  });
  const script = bundle.outputFiles[0].text;
  const sandbox = readFileSync(path.join(HERE, 'sandbox.html'), 'utf8');
  const toolCalls = [];
  const policies = [];
  let relayUrl = null;

  const server = http.createServer((request, response) => {
    const url = new URL(request.url, 'http://localhost');
    if (url.pathname === '/host.html') {
      response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(PAGE);
    } else if (url.pathname === '/host.js') {
      response.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8' }).end(script);
    } else if (url.pathname === '/sandbox.html') {
      let csp = {};
      try {
        csp = JSON.parse(url.searchParams.get('csp') ?? '{}') ?? {};
      } catch {
        csp = {};
      }
      const frameSrc = url.searchParams.get('frame-src');
      const policy = policyFor(csp, frameSrc && /^[a-z0-9 :'*.-]+$/i.test(frameSrc) ? frameSrc : null);
      policies.push(policy);
      response.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'content-security-policy': policy }).end(sandbox);
    } else if (url.pathname === '/mcp' && relayUrl) {
      forward(request, response);
    } else {
      response.writeHead(404).end('not found');
    }
  });

  function forward(request, response) {
    const chunks = [];
    request.on('data', (chunk) => chunks.push(chunk));
    request.on('end', () => {
      const body = Buffer.concat(chunks);
      try {
        const messages = [JSON.parse(body.toString() || 'null')].flat();
        for (const message of messages) {
          if (message?.method === 'tools/call') toolCalls.push({ name: message.params?.name, arguments: message.params?.arguments });
        }
      } catch {
        // not JSON: the relay answers it
      }
      const headers = Object.fromEntries(Object.entries(request.headers).filter(([name]) => !BROWSER_ONLY.has(name) && !name.startsWith('sec-')));
      const upstream = http.request(
        { hostname: relayUrl.hostname, port: relayUrl.port, path: '/mcp', method: request.method, headers: { ...headers, host: relayUrl.host } },
        (answer) => {
          response.writeHead(answer.statusCode, answer.headers);
          answer.pipe(response);
        },
      );
      upstream.on('error', () => response.writeHead(502).end());
      request.on('aborted', () => upstream.destroy());
      response.on('close', () => upstream.destroy());
      upstream.end(body);
    });
  }

  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    origin: `http://127.0.0.1:${port}`,
    use(relay) {
      relayUrl = new URL(relay.base);
    },
    page: `http://127.0.0.1:${port}/host.html`,
    sandbox: `http://localhost:${port}/sandbox.html`,
    toolCalls,
    policies,
    stop: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      }),
  };
}
