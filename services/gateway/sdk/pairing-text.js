// The words <toolrelay-pairing> (pairing.js) puts on the page, worked out without the page:
// durations and times, a session's lifetime, what a call did, what a caller says it is and the
// question about it, and who can reach the relay with what the connect instructions say for
// each. None of it touches the DOM, so node checks it without a browser
// (tests/node/sdk-unit.test.mjs); pairing.js imports it from here.

// A caller's name, as it says it, is cut to this many characters; in the list of allowed
// callers, where the relay may put words of its own before it ("Opened from your conversation
// in …"), to this many.
export const LABEL_SHOWN = 60;
export const LABEL_LISTED = 100;

/** `ms` as m:ss, or h:mm:ss past an hour. */
export function duration(ms) {
  const total = Math.floor(ms / 1000);
  const two = (n) => String(n).padStart(2, '0');
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  return hours > 0 ? `${hours}:${two(minutes)}:${two(total % 60)}` : `${two(minutes)}:${two(total % 60)}`;
}

/** A session's maximum lifetime in words: "24 h", or "30 min" when configured under an hour. */
export function lifetime(session) {
  const span = Date.parse(session.maxExpiresAt) - (session.createdAt || Date.now());
  if (!Number.isFinite(span) || span <= 0) return '24 h';
  return span < 3600000 ? `${Math.max(1, Math.round(span / 60000))} min` : `${Math.round(span / 3600000)} h`;
}

/**
 * A few words on what a call did, unless the page describes its calls itself (`describeCall`):
 * the function and what it names, e.g. "addItem · milk".
 */
export function summarize(name, args) {
  const a = args && typeof args === 'object' ? args : {};
  const words = (value) => (typeof value === 'string' || typeof value === 'number' ? String(value) : null);
  const parts = [words(a.name) ?? words(a.title) ?? words(a.text)];
  if (Array.isArray(a.items)) parts.push(`${a.items.length} item${a.items.length === 1 ? '' : 's'}`);
  const detail = parts.filter(Boolean).join(' · ');
  return detail ? `${name} · ${detail}` : name;
}

/** What a caller says it is (not proof), cut to a length the prompt can show. */
export function shortLabel(text, most = LABEL_SHOWN) {
  const label = String(text ?? '').replace(/\s+/g, ' ').trim() || 'an unnamed assistant';
  return label.length > most ? `${label.slice(0, most - 1)}…` : label;
}

/** The question about a caller, in words (from an `approval-request`'s detail). */
export function approvalText(request, pageName = 'this page') {
  const text = `An assistant wants to use ${pageName} (says it is ${shortLabel(request.label)}, via ${request.via})`;
  return request.sharedAddress
    ? `${text} — known only by its network address: allowing it allows everyone at ${request.address}.`
    : `${text}.`;
}

/** `iso` as HH:MM in the person's time, or '' when it is no time. */
export function clock(iso) {
  const time = new Date(iso ?? NaN);
  return Number.isNaN(time.getTime()) ? '' : time.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
}

/** Who can reach the relay at `base`: cloud assistants need a public HTTPS address. */
export function reach(base) {
  let url;
  try {
    url = new URL(base);
  } catch {
    return 'this-computer';
  }
  const host = url.hostname.replace(/^\[|\]$/g, '').toLowerCase();
  if (host === 'localhost' || host.endsWith('.localhost') || /^127\./.test(host) || host === '::1') return 'this-computer';
  const privateNet =
    /^10\./.test(host) ||
    /^192\.168\./.test(host) ||
    /^172\.(1[6-9]|2\d|3[01])\./.test(host) ||
    /^169\.254\./.test(host) ||
    host.endsWith('.local') ||
    host.endsWith('.internal') ||
    /^f[cd][0-9a-f]{2}:/.test(host) ||
    /^fe80:/.test(host);
  if (privateNet) return 'this-network';
  return url.protocol === 'https:' ? 'public' : 'not-https';
}

/**
 * What the connect instructions and the prompt say, by who can reach the relay: cloud
 * assistants (ChatGPT, claude.ai) call from their own servers and only over HTTPS, so for any
 * other address they are not offered, and the notice says why.
 */
export const REACH = {
  public: {
    notice: '',
    connector: 'Add a custom connector once (Claude: Settings → Connectors; ChatGPT: Settings → Apps & Connectors, developer mode)',
    agent: '(A plain chat cannot make requests: use a connector or a custom GPT there.)',
    mcp: 'Claude, ChatGPT connectors',
  },
  'this-computer': {
    notice:
      'This relay is only reachable from this computer; ChatGPT and claude.ai cannot call it — use a desktop client or deploy the relay.',
    connector: 'In a desktop client on this computer (Cursor, Claude Code, a local agent), add an MCP server (Streamable HTTP)',
    agent: '(The agent has to run on this computer. A plain chat cannot make requests.)',
    mcp: 'an MCP client on this computer',
  },
  'this-network': {
    notice:
      'This relay is only reachable on this network; ChatGPT and claude.ai cannot call it — use a desktop client on this network or deploy the relay.',
    connector: 'In a desktop client on this network (Cursor, Claude Code, a local agent), add an MCP server (Streamable HTTP)',
    agent: '(The agent has to run on this network. A plain chat cannot make requests.)',
    mcp: 'an MCP client on this network',
  },
  'not-https': {
    notice:
      "This relay's address is plain http; ChatGPT and claude.ai only call https addresses — put the relay behind HTTPS (PUBLIC_BASE_URL) or use a desktop client.",
    connector: 'In a desktop client (Cursor, Claude Code, a local agent), add an MCP server (Streamable HTTP)',
    agent: '(A plain chat cannot make requests.)',
    mcp: 'a desktop MCP client',
  },
};

/** `text` safe inside HTML text and attribute values (the element's heading goes into its markup). */
export function escape(text) {
  return String(text).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
}
