// What the browser tests stand on: the real toolrelay binary on an ephemeral port, a page that
// plays CODAP (codap-mock/, with the real iframe-phone from npm) on another origin, Debian's
// chromium driven by playwright-core, and an HTTP client playing the LLM.

import { spawn, execFile, execFileSync } from 'node:child_process';
import { createReadStream, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, '../..');
export const ARTIFACTS = path.join(REPO, 'test-artifacts');
const PATIENCE_MS = 15000;

/** The toolrelay binary cargo built (scripts/test.sh builds it first). */
function relayBinary() {
  if (process.env.TOOLRELAY_BIN) return process.env.TOOLRELAY_BIN;
  return debugBinary('toolrelay');
}

/** A debug binary of the workspace, in cargo's target directory (CARGO_TARGET_DIR included). */
function debugBinary(name) {
  const metadata = JSON.parse(
    execFileSync('cargo', ['metadata', '--no-deps', '--format-version', '1'], { cwd: REPO, encoding: 'utf8' }),
  );
  const binary = path.join(metadata.target_directory, 'debug', name);
  if (!existsSync(binary)) {
    throw new Error(`${binary} is missing: run cargo build --workspace --bins (scripts/test.sh does)`);
  }
  return binary;
}

/**
 * A TCP proxy in front of the relay whose network can fail on purpose: `cut()` drops every
 * connection through it and refuses new ones until `restore()`. A tab loaded through it sees a
 * real network blip; the LLM, talking to the relay directly, does not.
 */
export async function startBlipProxy(relay) {
  const target = new URL(relay.base);
  const sockets = new Set();
  let down = false;
  const server = net.createServer((client) => {
    if (down) {
      client.destroy();
      return;
    }
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      socket.on('error', () => {});
    }
    client.pipe(upstream);
    upstream.pipe(client);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    cut() {
      down = true;
      for (const socket of sockets) socket.destroy();
    },
    restore() {
      down = false;
    },
    close: () =>
      new Promise((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(resolve);
      }),
  };
}

/** A free loopback port (for redis-server, which cannot pick one itself and say which). */
function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

/**
 * A redis-server of the test's own on an ephemeral loopback port, nothing kept on disk;
 * `stop()` ends it.
 */
export async function startRedis() {
  const port = await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--maxmemory-policy', 'noeviction'], {
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const exited = new Promise((resolve) => child.on('exit', resolve));
  const deadline = Date.now() + PATIENCE_MS;
  for (;;) {
    const answered = await new Promise((resolve) => {
      const socket = net.connect(port, '127.0.0.1');
      socket.once('error', () => resolve(false));
      socket.once('data', (data) => {
        socket.destroy();
        resolve(data.toString().startsWith('+PONG'));
      });
      socket.once('connect', () => socket.write('PING\r\n'));
    });
    if (answered) break;
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`redis-server on port ${port} did not answer: run scripts/setup.sh --test, which installs it`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    async stop() {
      child.kill('SIGKILL');
      await exited;
    },
  };
}

/**
 * Starts toolrelay (one process) on an ephemeral port; `env` adds settings. In memory, or on
 * a Redis of its own when TOOLRELAY_TEST_STORE=redis (as the Rust suites).
 */
export async function startRelay(env = {}) {
  const redis = process.env.TOOLRELAY_TEST_STORE === 'redis' ? await startRedis() : null;
  const child = spawn(relayBinary(), [], {
    env: {
      ...process.env,
      LISTEN_ADDR: '127.0.0.1:0',
      GRPC_LISTEN_ADDR: '127.0.0.1:0',
      LOG_FORMAT: 'json',
      RUST_LOG: 'info',
      ...(redis ? { REDIS_URL: redis.url } : {}),
      ...env,
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines = readline.createInterface({ input: child.stdout });
  const listening = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('toolrelay did not start')), PATIENCE_MS);
    lines.on('line', (line) => {
      try {
        const entry = JSON.parse(line);
        if (entry.message === 'toolrelay listening') {
          clearTimeout(timer);
          resolve({ listen: entry.listen, grpc: entry.grpc });
        }
      } catch {
        // not a log line
      }
    });
    child.on('exit', (code) => reject(new Error(`toolrelay exited with ${code}`)));
  });
  let address;
  let grpc;
  try {
    ({ listen: address, grpc } = await listening);
  } catch (error) {
    child.kill('SIGKILL');
    await redis?.stop();
    throw error;
  }
  return {
    base: `http://${address}`,
    grpc,
    async stop() {
      child.kill('SIGTERM');
      await new Promise((resolve) => (child.exitCode !== null ? resolve() : child.on('exit', resolve)));
      await redis?.stop();
    },
  };
}

const TYPES = { '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.css': 'text/css' };

/** Serves the CODAP stand-in (and iframe-phone, axe-core) on its own origin. */
export async function startCodapHost() {
  const files = {
    '/iframe-phone.js': path.join(HERE, 'node_modules/iframe-phone/dist/iframe-phone.js'),
    '/axe.min.js': path.join(HERE, 'node_modules/axe-core/axe.min.js'),
  };
  const server = http.createServer((request, response) => {
    const url = new URL(request.url, 'http://localhost');
    const file = files[url.pathname] ?? path.join(HERE, 'codap-mock', path.normalize(url.pathname).replace(/^(\.\.[/\\])+/, ''));
    if (!file.startsWith(HERE) || !existsSync(file)) {
      response.writeHead(404).end('not found');
      return;
    }
    response.writeHead(200, { 'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream' });
    createReadStream(file).pipe(response);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    origin: `http://127.0.0.1:${server.address().port}`,
    stop: () => new Promise((resolve) => server.close(resolve)),
  };
}

/** Debian's chromium, headless; `args` adds switches (e.g. `--enable-features=WebMCP`). */
export function launchBrowser(args = []) {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--disable-gpu', '--disable-component-update', '--no-first-run', ...args],
  });
}

/**
 * Debian's chromium with a profile of its own (a regular one, not the private-window kind
 * `launchBrowser()`'s contexts are) that lets frames of other sites keep storage: this
 * chromium blocks third-party storage unless the profile's cookie controls say otherwise.
 * Returns the profile's one context; `close()` also removes the profile.
 */
export async function launchWithThirdPartyStorage() {
  const profile = mkdtempSync(path.join(os.tmpdir(), 'toolrelay-profile-'));
  mkdirSync(path.join(profile, 'Default'));
  writeFileSync(path.join(profile, 'Default', 'Preferences'), JSON.stringify({ profile: { cookie_controls_mode: 0 } }));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--disable-gpu', '--disable-component-update', '--no-first-run'],
  });
  return {
    context,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/**
 * What every spec runs against: the CODAP stand-in, a relay that lets it in, and a browser.
 * If one fails to start, the ones already started are stopped.
 */
export async function startStack() {
  const stack = {};
  try {
    stack.host = await startCodapHost();
    stack.relay = await startRelay({ CORS_ORIGIN: stack.host.origin });
    stack.browser = await launchBrowser();
    return stack;
  } catch (error) {
    await stopStack(stack);
    throw error;
  }
}

/** Stops what startStack started. */
export async function stopStack({ host, relay, browser } = {}) {
  await browser?.close();
  await relay?.stop();
  await host?.stop();
}

/** Waits until `check` (run in `frame`) returns something truthy; returns it. */
export async function until(frame, check, arg, timeout = PATIENCE_MS) {
  const handle = await frame.waitForFunction(check, arg, { timeout, polling: 50 });
  return handle.jsonValue();
}

/**
 * Waits until `check` (run in this process; it may be async, e.g. read the clipboard) returns
 * something truthy; returns it. For what `until` cannot see: a page's promises, the relay.
 */
export async function eventually(check, what, timeout = PATIENCE_MS) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const result = await check();
    if (result) return result;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Logs what a page throws and nobody catches, which the test would otherwise never see. */
export function watchErrors(page) {
  page.on('pageerror', (error) => console.log('page error:', error.message));
}

/**
 * Runs `scenario(page, context)` on a new page in a browser context of its own, its errors
 * watched; closes the context however the scenario ends. Returns what the scenario returns.
 */
export async function inNewPage(browser, scenario) {
  const context = await browser.newContext();
  try {
    const page = await context.newPage();
    watchErrors(page);
    return await scenario(page, context);
  } finally {
    await context.close();
  }
}

/**
 * Opens the CODAP stand-in with the plugin, as CODAP does with `?di=`; returns both frames.
 * The plugin asks the person about each new caller unless `approve` is 'auto' (the suites about
 * other things call it by its code from Node without a person to answer: they pass 'auto').
 */
export async function openInCodap(context, host, relay, { approve = 'auto' } = {}) {
  const page = await context.newPage();
  watchErrors(page);
  const pluginUrl = approve === 'auto' ? `${relay.base}/codap/?approve=auto` : `${relay.base}/codap/`;
  await page.goto(`${host.origin}/index.html?di=${encodeURIComponent(pluginUrl)}`);
  const plugin = await pluginFrame(page, `${relay.base}/codap/`);
  await until(plugin, () => window.toolrelay?.session?.code && window.toolrelay.ready);
  return { page, plugin, code: await plugin.evaluate(() => window.toolrelay.session.code) };
}

/** The plugin's frame: found by URL prefix (CODAP's page URL contains the plugin URL in ?di=). */
export async function pluginFrame(page, pluginUrl) {
  const frame = await eventually(
    () => page.frames().find((f) => f !== page.mainFrame() && f.url().startsWith(pluginUrl)),
    'the plugin frame to appear',
  );
  await frame.waitForLoadState('domcontentloaded');
  return frame;
}

/** The CODAP stand-in's state (see codap-mock/README.md). */
export function codapSnapshot(page) {
  return page.evaluate(() => window.codap.snapshot());
}

/** The LLM: calls tools of a session over HTTP, as an assistant would. */
export class Llm {
  constructor(base, code) {
    this.base = base;
    this.code = code;
    this.sequence = 0;
  }

  async request(method, suffix, body) {
    const response = await fetch(`${this.base}/api/sessions/${this.code}${suffix}`, {
      method,
      headers: body ? { 'content-type': 'application/json' } : {},
      body: body ? JSON.stringify(body) : undefined,
    });
    return { status: response.status, body: await response.json() };
  }

  metadata() {
    return this.request('GET', '/metadata');
  }

  status() {
    return this.request('GET', '');
  }

  /** Calls a function and returns the relay's answer `{requestId, success, result?, error?}`. */
  async call(functionName, args = {}, requestId = undefined) {
    const id = requestId ?? `llm-${Date.now()}-${(this.sequence += 1)}`;
    const { status, body } = await this.request('POST', '/call', { requestId: id, functionName, args, timeoutMs: 30000 });
    if (status !== 200) throw new Error(`${functionName}: HTTP ${status} ${JSON.stringify(body)}`);
    return body;
  }

  /** Like call, but fails the test unless the tool succeeded; returns the result. */
  async ok(functionName, args = {}, requestId = undefined) {
    const answer = await this.call(functionName, args, requestId);
    if (!answer.success) throw new Error(`${functionName} failed: ${JSON.stringify(answer.error)}`);
    return answer.result;
  }
}

/** Where screenshots go (kept as test artefacts, ignored by git). */
export function artifact(name) {
  mkdirSync(ARTIFACTS, { recursive: true });
  return path.join(ARTIFACTS, name);
}

/**
 * Pages of a test's own on another origin (another loopback port): `pages` maps a path to its
 * HTML. For pages the relay does not serve, as the browser SDK's users' pages are.
 */
export async function startPageHost(pages) {
  const server = http.createServer((request, response) => {
    const page = pages[new URL(request.url, 'http://localhost').pathname];
    if (page === undefined) {
      response.writeHead(404).end('not found');
      return;
    }
    response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(page);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    origin: `http://127.0.0.1:${server.address().port}`,
    stop: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      }),
  };
}

/**
 * An MCP client (Streamable HTTP, JSON-RPC over POST; answers may come as JSON or as an event
 * stream) for a session-scoped endpoint `/mcp/s/{handle}`, as a connector would use it.
 */
export class McpClient {
  constructor(url) {
    this.url = url;
    this.id = 0;
    this.session = null;
    this.notifications = [];
  }

  headers(extra = {}) {
    return {
      accept: 'application/json, text/event-stream',
      'content-type': 'application/json',
      ...(this.session ? { 'mcp-session-id': this.session } : {}),
      ...(this.protocol ? { 'mcp-protocol-version': this.protocol } : {}),
      ...extra,
    };
  }

  /** Sends one JSON-RPC request; returns its result (throws on an error). */
  async request(method, params = {}) {
    const id = (this.id += 1);
    const response = await fetch(this.url, { method: 'POST', headers: this.headers(), body: JSON.stringify({ jsonrpc: '2.0', id, method, params }) });
    if (!response.ok) throw new Error(`${method}: HTTP ${response.status} ${await response.text()}`);
    this.session = response.headers.get('mcp-session-id') ?? this.session;
    const type = response.headers.get('content-type') ?? '';
    const text = await response.text();
    const messages = type.includes('text/event-stream')
      ? text.split('\n').filter((line) => line.startsWith('data:')).map((line) => line.slice(5).trim()).filter(Boolean).map((data) => JSON.parse(data))
      : [JSON.parse(text)];
    const answer = messages.find((message) => message.id === id);
    if (!answer) throw new Error(`${method}: no answer in ${text}`);
    if (answer.error) throw new Error(`${method}: ${JSON.stringify(answer.error)}`);
    return answer.result;
  }

  async notify(method, params = {}) {
    await fetch(this.url, { method: 'POST', headers: this.headers(), body: JSON.stringify({ jsonrpc: '2.0', method, params }) });
  }

  /** initialize, then initialized: a session with the server. */
  async connect() {
    const result = await this.request('initialize', {
      protocolVersion: '2025-06-18',
      capabilities: {},
      clientInfo: { name: 'toolrelay-browser-tests', version: '1.0.0' },
    });
    this.protocol = result.protocolVersion;
    await this.notify('notifications/initialized');
    return result;
  }

  /** Opens the server's own event stream; what arrives on it is kept in `notifications`. */
  async listen() {
    this.listening = new AbortController();
    const response = await fetch(this.url, { headers: this.headers({ accept: 'text/event-stream' }), signal: this.listening.signal });
    if (!response.ok) throw new Error(`GET ${this.url}: HTTP ${response.status}`);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = '';
    (async () => {
      for (;;) {
        const { value, done } = await reader.read().catch(() => ({ done: true }));
        if (done) return;
        buffered += decoder.decode(value, { stream: true });
        const lines = buffered.split('\n');
        buffered = lines.pop();
        for (const line of lines) {
          if (!line.startsWith('data:')) continue;
          try {
            this.notifications.push(JSON.parse(line.slice(5).trim()));
          } catch {
            // a keep-alive
          }
        }
      }
    })();
  }

  close() {
    this.listening?.abort();
  }

  async listTools() {
    return (await this.request('tools/list')).tools;
  }

  callTool(name, args = {}) {
    return this.request('tools/call', { name, arguments: args });
  }
}

/**
 * Calls a tool of a session over gRPC (`Relay/Call`), with the independent Python client
 * (grpcio and the relay's reflection; scripts/setup.sh --test installs them); returns the
 * RequestState as JSON.
 */
export function grpcCall(relay, code, functionName, args, requestId = '') {
  return python('grpc_call.py', [relay.grpc, code, functionName, JSON.stringify(args), requestId]);
}

/**
 * Calls a tool on a session-scoped MCP endpoint with the official MCP Python SDK (an
 * independent client); returns {tools, isError, structured, text, content}.
 */
export function officialMcpCall(url, name, args) {
  return python('mcp_call.py', [url, name, JSON.stringify(args)]);
}

/**
 * Calls a tool on a session-scoped MCP endpoint with rmcp's client (the `mcp-call` binary of
 * the tests crate); returns the CallToolResult as JSON.
 */
export function rmcpCall(url, name, args) {
  return new Promise((resolve, reject) => {
    execFile(debugBinary('mcp-call'), [url, name, JSON.stringify(args)], { encoding: 'utf8', timeout: 60000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`mcp-call: ${error.message} ${stderr}`));
      else resolve(JSON.parse(stdout));
    });
  });
}

/**
 * Connects rmcp's client to `url` and waits (at most `seconds`) for
 * notifications/tools/list_changed. Resolves once connected, with `changed`: a promise of the
 * tool names listed after the notification.
 */
export function rmcpWatchListChanged(url, seconds = 10) {
  const child = spawn(debugBinary('mcp-call'), ['--watch-list-changed', url, String(seconds)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (chunk) => { stderr += chunk; });
  const lines = readline.createInterface({ input: child.stdout });
  const exited = new Promise((resolve) => child.on('close', (code) => resolve(code)));
  return new Promise((resolveReady, rejectReady) => {
    let ready = false;
    let tools = null;
    lines.on('line', (line) => {
      const message = JSON.parse(line);
      if (message.ready) {
        ready = true;
        resolveReady({ changed: exited.then((code) => (code === 0 && tools ? tools : Promise.reject(new Error(`mcp-call --watch-list-changed: exit ${code} ${stderr}`)))) });
      } else if (message.tools) {
        tools = message.tools;
      }
    });
    exited.then((code) => { if (!ready) rejectReady(new Error(`mcp-call --watch-list-changed: exit ${code} before connecting ${stderr}`)); });
  });
}

/** Runs one of tests/python's scripts in the test venv; returns the JSON it prints. */
function python(script, args) {
  const interpreter = process.env.TOOLRELAY_TEST_PYTHON ?? path.join(process.env.HOME ?? '', '.cache/toolrelay/test-venv/bin/python');
  return new Promise((resolve, reject) => {
    execFile(interpreter, [path.join(REPO, 'tests/python', script), ...args], { encoding: 'utf8', timeout: 60000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${script}: ${error.message} ${stderr}`));
      else resolve(JSON.parse(stdout));
    });
  });
}
