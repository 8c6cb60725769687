// A web host of MCP Apps, in the page, as claude.ai or ChatGPT render them: an MCP client
// (reaching the server through the host's own backend, `/mcp` of the page's origin) and
// ext-apps' `AppBridge`, the host library. The app's HTML goes to a sandbox proxy on another
// origin (sandbox.html), which loads it in a frame under the CSP the host asked for (built from
// the resource's `_meta.ui.csp`, or fixed, as some hosts do), as the spec's "Sandbox proxy"
// section says. Bundled by esbuild when the test starts; the test drives it as `window.host`.
//
// Three hosts, chosen by `connect(kind)`:
// * `ext-apps-2.0.4`: the AppBridge of @modelcontextprotocol/ext-apps 2.0.4 with the MCP
//   TypeScript SDK 2's client. Its wire is version 1's (`notifications/message`, `tools/call`
//   both ways, capabilities only in `ui/initialize`): the renames are not in any release yet.
// * `ext-apps-1.7.5`: the AppBridge of ext-apps 1.7.5 (npm alias `ext-apps-v1`) with SDK 1's
//   client, a version-1 host.
// * `ext-apps-2-wire`: the 2.0.4 AppBridge behind a shim that speaks ext-apps 2's wire as the
//   ext-apps repository's BREAKING.md gives it: MCP `initialize` answered with the host's
//   capabilities under `extensions["io.modelcontextprotocol/ui"]`, logs as `ui/log`, the
//   host's calls to the view's own tools as `ui/call-view-tool` / `ui/list-view-tools`.

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport as StreamableHTTPClientTransportV1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import * as extApps2 from '@modelcontextprotocol/ext-apps/app-bridge';
import * as extApps1 from 'ext-apps-v1/app-bridge';

const HOST_INFO = { name: 'toolrelay-test-host', version: '1.0.0' };
const EXTENSION = 'io.modelcontextprotocol/ui';
const HOST_CAPABILITIES = { openLinks: {}, serverTools: {}, serverResources: {}, logging: {} };

const KINDS = {
  'ext-apps-2.0.4': { library: extApps2, sdk: 2, wire: 1 },
  'ext-apps-1.7.5': { library: extApps1, sdk: 1, wire: 1 },
  'ext-apps-2-wire': { library: extApps2, sdk: 2, wire: 2 },
};

/**
 * The transport between a bridge and the sandbox, noting every method the app sends. With
 * `wire: 2` it also plays ext-apps 2's wire in front of a bridge that speaks version 1's.
 */
class Wire {
  constructor(inner, { wire, record, capabilities }) {
    this.inner = inner;
    this.wire = wire;
    this.record = record;
    this.capabilities = capabilities;
    inner.onmessage = (message, extra) => this.receive(message, extra);
    inner.onclose = () => this.onclose?.();
    inner.onerror = (error) => this.onerror?.(error);
  }

  start() {
    return this.inner.start();
  }

  close() {
    return this.inner.close();
  }

  send(message, options) {
    if (this.wire === 2 && message.method === 'tools/call') message = { ...message, method: 'ui/call-view-tool' };
    if (this.wire === 2 && message.method === 'tools/list') message = { ...message, method: 'ui/list-view-tools' };
    return this.inner.send(message, options);
  }

  receive(message, extra) {
    if (typeof message?.method === 'string' && !message.method.startsWith('ui/notifications/sandbox-')) {
      this.record.received.push(message.method);
    }
    if (message?.method === 'ui/log' || message?.method === 'notifications/message') this.record.logs.push({ method: message.method, ...message.params });
    if (this.wire === 2) {
      if (message.method === 'initialize' && message.id !== undefined) {
        this.record.initialize = message.params;
        this.inner.send({
          jsonrpc: '2.0',
          id: message.id,
          result: {
            protocolVersion: message.params?.protocolVersion,
            capabilities: { tools: {}, resources: {}, logging: {}, extensions: { [EXTENSION]: this.capabilities } },
            serverInfo: HOST_INFO,
          },
        });
        return;
      }
      if (message.method === 'notifications/initialized') return;
      // The bridge underneath knows logs by version 1's name.
      if (message.method === 'ui/log') message = { ...message, method: 'notifications/message' };
    }
    this.onmessage?.(message, extra);
  }
}

/** What the test reads: the tool's result, the resource, and what each render saw. */
const host = {
  kind: null,
  client: null,
  tools: [],
  result: null,
  resource: null,
  renders: [],

  /** Connects an MCP client of this host's kind to the server through this page's backend. */
  async connect(kind = 'ext-apps-2.0.4') {
    this.kind = KINDS[kind];
    if (!this.kind) throw new Error(`no host ${kind}`);
    const endpoint = new URL('/mcp', location.href);
    const capabilities = { extensions: { [EXTENSION]: { mimeTypes: [this.kind.library.RESOURCE_MIME_TYPE] } } };
    if (this.kind.sdk === 2) {
      this.client = new Client(HOST_INFO, { capabilities });
      await this.client.connect(new StreamableHTTPClientTransport(endpoint));
    } else {
      this.client = new ClientV1(HOST_INFO, { capabilities });
      await this.client.connect(new StreamableHTTPClientTransportV1(endpoint));
    }
    this.tools = (await this.client.listTools()).tools;
    return this.tools.map((tool) => tool.name);
  },

  /** Calls a tool with a UI, reads its `ui://` resource; returns the result's structured content. */
  async open(name) {
    const { getToolUiResourceUri, RESOURCE_MIME_TYPE } = this.kind.library;
    const tool = this.tools.find((candidate) => candidate.name === name);
    if (!tool) throw new Error(`no tool ${name}`);
    const uri = getToolUiResourceUri(tool);
    if (!uri) throw new Error(`${name} names no UI resource`);
    this.result = await this.client.callTool({ name, arguments: {} });
    const { contents } = await this.client.readResource({ uri });
    const content = contents.find((item) => item.uri === uri) ?? contents[0];
    if (content?.mimeType !== RESOURCE_MIME_TYPE) throw new Error(`${uri} is ${content?.mimeType}, not ${RESOURCE_MIME_TYPE}`);
    this.resource = { uri, html: content.text, meta: content._meta?.ui ?? {} };
    return { structured: this.result.structuredContent, meta: this.resource.meta };
  },

  /**
   * Renders the app for the last result in a new sandbox proxy (the one before is torn down
   * first, as a host re-rendering a conversation does). `csp` replaces the resource's own (a
   * host that grants less); `frameSrc` fixes the app's `frame-src` whatever it declares (as
   * claude.ai does); `wait` goes to the app as `codap-wait` (its deadlines, shortened for the
   * test). Resolves once the app has initialized.
   */
  async render({ sandboxUrl, csp = this.resource.meta.csp, frameSrc = null, wait = null, height = 200 } = {}) {
    await this.teardown();
    const { AppBridge, PostMessageTransport } = this.kind.library;
    const record = { initialized: false, sizes: [], links: [], appInfo: null, csp, received: [], logs: [], appToolCalls: [], initialize: null };
    const frame = document.createElement('iframe');
    frame.id = `app-${this.renders.length}`;
    frame.title = 'MCP App';
    frame.setAttribute('sandbox', 'allow-scripts allow-same-origin allow-forms');
    frame.style.cssText = `width: 100%; height: ${height}px; border: 1px solid #ccc;`;
    document.getElementById('conversation').append(frame);
    const hostContext = {
      theme: 'light',
      platform: 'web',
      displayMode: 'inline',
      availableDisplayModes: ['inline'],
      containerDimensions: { maxHeight: 800 },
      locale: 'en-GB',
    };
    const bridge = new AppBridge(this.client, HOST_INFO, HOST_CAPABILITIES, { hostContext });
    bridge.onopenlink = async ({ url }) => {
      record.links.push(url);
      return {};
    };
    bridge.addEventListener('sizechange', ({ width, height: wanted }) => {
      record.sizes.push({ width, height: wanted });
      if (typeof wanted === 'number') frame.style.height = `${wanted}px`;
    });
    const initialized = new Promise((resolve) => {
      bridge.addEventListener('initialized', () => {
        record.initialized = true;
        record.appInfo = bridge.getAppVersion();
        bridge.sendToolInput({ arguments: {} });
        bridge.sendToolResult(this.result);
        resolve();
      });
    });
    bridge.addEventListener('sandboxready', () => {
      bridge.sendSandboxResourceReady({ html: this.resource.html, csp, permissions: this.resource.meta.permissions });
    });
    const transport = new Wire(new PostMessageTransport(frame.contentWindow, frame.contentWindow), { wire: this.kind.wire, record, capabilities: HOST_CAPABILITIES });
    await bridge.connect(transport);
    // The app may call the server's tools only where they are visible to apps (the spec's
    // `visibility`); calls go through this host's MCP client, as the bridge's own would.
    bridge.oncalltool = async (params) => {
      record.appToolCalls.push(params.name);
      const tool = this.tools.find((candidate) => candidate.name === params.name);
      const visibility = tool?._meta?.ui?.visibility ?? ['model', 'app'];
      if (!tool || !visibility.includes('app')) throw new Error(`${params.name} is not a tool for apps`);
      return this.client.callTool(params);
    };
    const url = new URL(sandboxUrl);
    url.searchParams.set('csp', JSON.stringify(csp ?? {}));
    if (frameSrc) url.searchParams.set('frame-src', frameSrc);
    if (wait) url.searchParams.set('codap-wait', wait);
    frame.src = url.href;
    this.current = { bridge, frame, record, hostContext };
    this.renders.push(record);
    await initialized;
    return this.renders.length - 1;
  },

  /**
   * Tells the app it goes (ui/resource-teardown) and waits for its answer (up to 15 s, a deadline for a busy machine), as hosts
   * do; then removes it. The render's `teardown` says whether the app answered.
   */
  async teardown() {
    if (!this.current) return;
    const { bridge, frame, record } = this.current;
    this.current = null;
    record.teardown = await Promise.race([
      bridge.teardownResource({}).then(() => 'answered', () => 'refused'),
      new Promise((resolve) => setTimeout(() => resolve('no answer'), 15000)),
    ]);
    await bridge.close();
    frame.remove();
  },

  /** The host's context changes (ui/notifications/host-context-changed): theme, size… */
  changeContext(changes) {
    this.current.hostContext = { ...this.current.hostContext, ...changes };
    this.current.bridge.setHostContext(this.current.hostContext);
  },

  /** A later turn of the model: a tool call through the same MCP client. */
  call(name, args) {
    return this.client.callTool({ name, arguments: args });
  },
};

window.host = host;
