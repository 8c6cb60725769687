// A web host of MCP Apps, in the page, as claude.ai or ChatGPT render them: the MCP
// TypeScript SDK's client (reaching the server through the host's own backend, `/mcp` of the
// page's origin) and ext-apps' `AppBridge`, the host library. The app's HTML goes to a
// sandbox proxy on another origin (sandbox.html), which loads it in a frame under the CSP the
// host asked for (built from the resource's `_meta.ui.csp`), as the spec's "Sandbox proxy"
// section says. Bundled by esbuild when the test starts; the test drives it as `window.host`.

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { AppBridge, PostMessageTransport, RESOURCE_MIME_TYPE, getToolUiResourceUri } from '@modelcontextprotocol/ext-apps/app-bridge';

const HOST_INFO = { name: 'toolrelay-test-host', version: '1.0.0' };

/** What the test reads: the tool's result, the resource, and what each render saw. */
const host = {
  client: null,
  tools: [],
  result: null,
  resource: null,
  renders: [],

  /** Connects the MCP client to the server through this page's backend. */
  async connect() {
    this.client = new Client(HOST_INFO, {
      capabilities: { extensions: { 'io.modelcontextprotocol/ui': { mimeTypes: [RESOURCE_MIME_TYPE] } } },
    });
    await this.client.connect(new StreamableHTTPClientTransport(new URL('/mcp', location.href)));
    this.tools = (await this.client.listTools()).tools;
    return this.tools.map((tool) => tool.name);
  },

  /** Calls a tool with a UI, reads its `ui://` resource; returns the result's structured content. */
  async open(name) {
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
   * first, as a host re-rendering a conversation does). `csp` replaces the resource's own
   * (a host that grants less). Resolves once the app has initialized.
   */
  async render({ sandboxUrl, csp = this.resource.meta.csp, height = 200 } = {}) {
    await this.teardown();
    const record = { initialized: false, sizes: [], links: [], appInfo: null, csp };
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
    const bridge = new AppBridge(this.client, HOST_INFO, { openLinks: {}, serverTools: {}, serverResources: {}, logging: {} }, { hostContext });
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
    await bridge.connect(new PostMessageTransport(frame.contentWindow, frame.contentWindow));
    const url = new URL(sandboxUrl);
    url.searchParams.set('csp', JSON.stringify(csp ?? {}));
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
